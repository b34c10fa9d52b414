"""analyze --overlay: Model Explorer node data, checked with Model Explorer's own classes and ONNX adapter."""

from __future__ import annotations

import json

import onnx
import pytest
from click.testing import CliRunner

from fusecli.cli import main
from fusecli.report.overlay import fusion_path, model_explorer_ids
from tests.builders import Net
from tests.conftest import assert_savedmodel_refused


def _traps(save_model) -> str:
    """conv -> bn -> relu with an unnamed conv and a relu named like the bn (Model Explorer renames)."""
    net = Net(x=(2, 3, 8, 8))
    y = net.act("Relu", net.bn(net.conv()), name="relu")
    model = net.model(y)
    model.graph.node[0].name = ""
    model.graph.node[2].name = "bn"
    return save_model(model)


def _overlay(tmp_path, model: str) -> tuple[dict, dict]:
    out = str(tmp_path / "overlay.json")
    r = CliRunner().invoke(main, ["analyze", model, "-q", "--overlay", out])
    assert r.exit_code == 0, r.output
    assert "Model Explorer node data" in r.stderr
    with open(out) as f, open(fusion_path(out)) as g:
        return json.load(f), json.load(g)


def test_overlay_content_on_a_known_match(tmp_path, save_model):
    saved, fusion = _overlay(tmp_path, _traps(save_model))
    assert list(saved["results"]) == ["node", "bn", "bn_1"]  # Model Explorer's ids, not fusecli's
    assert saved["results"]["node"]["value"] == 2 * 4 * 8 * 8 * 4  # conv's output, kept by BN's backward
    assert fusion["results"]["node"] == {"value": "conv_bn_act: inference only", "bgColor": "#fcad70"}
    assert fusion["results"]["bn_1"]["value"] == "conv_bn_act: inference only; bn_act: training-safe"
    assert fusion["results"]["bn_1"]["bgColor"] == "#81c995"  # the best verdict colours the node


def test_overlay_loads_with_model_explorers_builder_classes(tmp_path, save_model):
    """Parsed strictly into node_data_builder's dataclasses (unknown keys fail), written back by its own
    to_json_string unchanged; in the form its web app loads for the graph shown (``results`` at the top)."""
    builder = pytest.importorskip("model_explorer.node_data_builder")
    dacite = pytest.importorskip("dacite")
    saved, fusion = _overlay(tmp_path, _traps(save_model))
    for doc, check_types in ((saved, True), (fusion, False)):
        # the fusion file's values are text, which Model Explorer shows (and summarises on group nodes,
        # showExpandedSummaryOnGroupNode) though NodeDataResult's annotation says Num
        parsed = dacite.from_dict(builder.GraphNodeData, doc,
                                  config=dacite.Config(strict=True, check_types=check_types))
        again = json.loads(parsed.to_json_string())
        assert {k: again[k] for k in doc} == doc
        assert all(isinstance(r, builder.NodeDataResult) for r in parsed.results.values())
        assert "results" not in doc["results"]  # else the web app reads it as graph id -> node data
    assert all(isinstance(g, builder.GradientItem) for g in dacite.from_dict(
        builder.GraphNodeData, saved, config=dacite.Config(strict=True)).gradient)
    assert all(isinstance(r["value"], str) for r in fusion["results"].values())


def test_overlay_keys_are_the_node_ids_of_model_explorers_onnx_adapter(tmp_path, save_model):
    adapter = pytest.importorskip("model_explorer_onnx.main")
    model = _traps(save_model)
    saved, fusion = _overlay(tmp_path, model)
    graph = adapter.ONNXAdapter().convert(model, {})["graphs"][0]
    ops = {n.id for n in graph.nodes if not n.id.startswith("[value]")}
    assert set(saved["results"]) == ops and set(fusion["results"]) <= ops


def test_model_explorer_ids_follow_its_name_fix_pass():
    """Unnamed nodes 'node', 'node_1', ...; duplicates 'name_1', ... skipping names already taken."""
    names = ["", "r", "r", "", "node", "r_1"]
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], [f"y{i}"], name=n)
                                    for i, n in enumerate(names)], "g", [], [])
    assert model_explorer_ids(graph) == ["node", "r", "r_1", "node_1", "node_2", "r_1_1"]


def test_overlay_refuses_a_savedmodel_and_a_wrong_extension(tmp_path, sample):
    assert_savedmodel_refused(tmp_path, "--overlay", str(tmp_path / "o.json"))
    r = CliRunner().invoke(main, ["analyze", sample("conv_bn_relu"), "--overlay", str(tmp_path / "o.txt")])
    assert r.exit_code == 2 and ".json" in r.stderr
    assert not list(tmp_path.glob("o*"))

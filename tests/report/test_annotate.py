"""analyze --annotate: a copy of the ONNX model carrying fusecli's results as metadata (Netron shows it)."""

from __future__ import annotations

import os

import onnx
from click.testing import CliRunner
from onnx import numpy_helper

from fusecli.cli import main
from tests.conftest import assert_savedmodel_refused


def _strip(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model without its metadata_props (model and nodes)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    del copy.metadata_props[:]
    for n in copy.graph.node:
        del n.metadata_props[:]
    return copy


def test_annotated_copy_has_same_graph_and_weights_and_the_match(tmp_path, sample):
    src = sample("conv_bn_relu")
    out = str(tmp_path / "annotated.onnx")
    r = CliRunner().invoke(main, ["analyze", src, "--batch", "2", "-q", "--annotate", out])
    assert r.exit_code == 0, r.output
    assert f"wrote {out}" in r.stderr
    model, original = onnx.load(out), onnx.load(src)
    onnx.checker.check_model(model, full_check=True)
    assert _strip(model).SerializeToString() == original.SerializeToString()  # graph and weights as they were
    for a, b in zip(model.graph.initializer, original.graph.initializer, strict=True):
        assert (numpy_helper.to_array(a) == numpy_helper.to_array(b)).all()
    props = {n.name: dict((p.key, p.value) for p in n.metadata_props) for n in model.graph.node}
    assert props["conv"] == {"fusecli.saved_bytes": str(2 * 8 * 16 * 16 * 4),
                             "fusecli.pattern": "conv_bn_act", "fusecli.verdict": "inference only"}
    assert props["bn"]["fusecli.pattern"] == "conv_bn_act, bn_act"
    assert props["bn"]["fusecli.verdict"] == "inference only, training-safe"
    totals = {p.key: p.value for p in model.metadata_props}
    assert totals["fusecli.core.dims"] == "N=2" and int(totals["fusecli.saved_bytes"]) > 0
    assert "conv_bn_act: 1 inference only" in totals["fusecli.matches"]


def test_annotate_again_replaces_its_own_entries(tmp_path, sample):
    first, second = str(tmp_path / "a.onnx"), str(tmp_path / "b.onnx")
    for src, out in ((sample("conv_bn_relu"), first), (first, second)):
        assert CliRunner().invoke(main, ["analyze", src, "-q", "--annotate", out]).exit_code == 0
    keys = [p.key for p in onnx.load(second).graph.node[0].metadata_props]
    assert sorted(keys) == sorted(set(keys))


def test_annotate_refuses_savedmodel_input_and_external_data(tmp_path, sample):
    assert_savedmodel_refused(tmp_path, "--annotate", str(tmp_path / "a.onnx"))
    model = onnx.load(sample("conv_bn_relu"))
    ext = str(tmp_path / "ext.onnx")
    onnx.save(model, ext, save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
              size_threshold=0)
    r = CliRunner().invoke(main, ["analyze", ext, "--annotate", str(tmp_path / "a.onnx")])
    assert r.exit_code == 1 and "external data" in r.stderr and len(r.stderr.splitlines()) == 1
    assert not os.path.exists(tmp_path / "a.onnx")


def test_annotate_refuses_to_overwrite_the_input(tmp_path, sample):
    src = str(tmp_path / "m.onnx")
    onnx.save(onnx.load(sample("conv_bn_relu")), src)
    before = open(src, "rb").read()
    r = CliRunner().invoke(main, ["analyze", src, "--annotate", src])
    assert r.exit_code == 1 and "refusing to overwrite the input" in r.stderr
    assert open(src, "rb").read() == before and os.listdir(tmp_path) == ["m.onnx"]


def _reversed(sample, tmp_path) -> str:
    """conv_bn_relu with its nodes listed consumers first (onnxruntime loads it; onnx's checker does not)."""
    model = onnx.load(sample("conv_bn_relu"))
    nodes = list(model.graph.node)[::-1]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    src = str(tmp_path / "reversed.onnx")
    onnx.save(model, src)
    return src


def test_annotated_copy_of_an_out_of_order_model_is_written_in_order(tmp_path, sample):
    out = str(tmp_path / "annotated.onnx")
    r = CliRunner().invoke(main, ["analyze", _reversed(sample, tmp_path), "-q", "--annotate", out])
    assert r.exit_code == 0, r.output
    model = onnx.load(out)
    onnx.checker.check_model(model, full_check=True)
    assert [n.name for n in model.graph.node] == ["conv", "bn", "relu"]
    props = {n.name: {p.key for p in n.metadata_props} for n in model.graph.node}
    assert all("fusecli.saved_bytes" in keys for keys in props.values())


def test_annotated_copy_failing_the_check_is_not_written(tmp_path, sample, monkeypatch):
    """What onnx's checker or onnxruntime refuses never replaces the output (a metadata entry that breaks
    the node stands in for any bug)."""
    import fusecli.report.annotate as annotate

    real = annotate.annotate_model

    def breaking(a, model):
        count = real(a, model)
        model.graph.node[0].input[0] = "nothing_makes_this"
        return count

    monkeypatch.setattr(annotate, "annotate_model", breaking)
    out = tmp_path / "annotated.onnx"
    out.write_bytes(b"before")
    r = CliRunner().invoke(main, ["analyze", sample("conv_bn_relu"), "-q", "--annotate", str(out)])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 1 and len(lines) == 1 and "nothing written" in lines[0], r.stderr
    assert out.read_bytes() == b"before" and sorted(os.listdir(tmp_path)) == ["annotated.onnx"]

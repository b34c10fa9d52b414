"""render: each view's structure, read back through Graphviz's own parser (dot -Tjson)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from click.testing import CliRunner
from onnx import helper

from fusecli.cli import main
from fusecli.errors import FuseError
from fusecli.pipeline import Options, analyze
from fusecli.render import COLORS, build_dot, scope_of
from tests.conftest import ZOO, make_model, vi

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")


def layout(source: str) -> dict:
    """Graphviz's parse of the DOT: {'objects': [...], 'edges': [...]} (fails on invalid DOT)."""
    done = subprocess.run(["dot", "-Tjson"], input=source.encode(), capture_output=True, check=True)
    return json.loads(done.stdout)


def labels(g: dict) -> list[str]:
    return [o.get("label", "") for o in g.get("objects", [])]


def edges(g: dict) -> list[tuple[str, str, dict]]:
    names = {o["_gvid"]: o.get("label", "") for o in g.get("objects", [])}
    return [(names[e["tail"]], names[e["head"]], e) for e in g.get("edges", [])]


@needs_dot
@pytest.mark.parametrize("name", ["conv_bias_relu", "conv_bn_relu", "bn_add_relu", "conv_squeeze_bias",
                                  "matmul_bias_relu"])
@pytest.mark.parametrize("view", ["before", "after", "backward"])
def test_every_view_of_every_sample_is_valid_dot(sample, name, view):
    source, count = build_dot(analyze(sample(name), Options(batch=2)), view)
    g = layout(source)
    assert count == len([o for o in g["objects"] if "nodes" not in o]) - (3 if view == "after" else 0)


@needs_dot
def test_before_view_draws_every_op_with_shape(sample):
    g = layout(build_dot(analyze(sample("conv_bn_relu"), Options(batch=2)), "before")[0])
    ops = [lab for lab in labels(g) if lab.split("\\n")[0] in ("Conv", "BatchNormalization", "Relu")]
    assert len(ops) == 3 and all("[N, 8, 16, 16] float32" in lab for lab in ops)
    assert sorted((a.split("\\n")[0], b.split("\\n")[0]) for a, b, _ in edges(g)) == [
        ("BatchNormalization", "Relu"), ("Conv", "BatchNormalization"), ("x", "Conv")]


@needs_dot
def test_after_view_of_conv_bn_relu_is_one_fused_group(sample):
    a = analyze(sample("conv_bn_relu"), Options(batch=2))
    g = layout(build_dot(a, "after", mode="inference")[0])
    fused = [lab for lab in labels(g) if lab.startswith("conv_bn_act")]
    assert len(fused) == 1 and "conv > bn > relu" in fused[0] and "inference only" in fused[0]
    assert not any(lab.split("\\n")[0] in ("Conv", "Relu") for lab in labels(g))
    clusters = [o for o in g["objects"] if "nodes" in o]
    assert [c["label"] for c in clusters] == ["verdict"]  # the legend
    g = layout(build_dot(a, "after", mode="training")[0])
    assert any(lab.startswith("bn_act") and "training-safe" in lab for lab in labels(g))
    assert any(lab.split("\\n")[0] == "Conv" for lab in labels(g))


@needs_dot
def test_backward_view_marks_the_blocking_conv_output(sample):
    g = layout(build_dot(analyze(sample("conv_bn_relu"), Options(batch=2, wrt_inputs=True)), "backward")[0])
    saved = {e["label"].split(" ")[0]: (tail.split("\\n")[0], head.split("\\n")[0], e["color"])
             for tail, head, e in edges(g) if "label" in e and "B" in e["label"].split(" ")[-1]}
    assert saved["conv_out"] == ("Conv", "BatchNormGrad", COLORS["none"])
    assert saved["y"][:2] == ("Relu", "ReluGrad") and saved["y"][2] != COLORS["none"]
    assert saved["x"][1] == "ConvBackpropFilter" and saved["w"][1] == "ConvBackpropInput"
    assert {"ReluGrad", "BatchNormGrad", "ConvBackpropInput", "ConvBackpropFilter"} <= {
        lab.split("\\n")[0] for lab in labels(g)}


@needs_dot
def test_names_that_need_escaping(save_model):
    odd = 'a"b\\c:d/e{f}<g> h\nnext'
    nodes = [helper.make_node("Relu", ["x"], [odd], name=odd),
             helper.make_node("Sigmoid", [odd], ["y"], name="s;ig")]
    path = save_model(make_model(nodes, [vi("x", 2, 3)], [vi("y", 2, 3)]))
    for view in ("before", "after", "backward"):
        source = build_dot(analyze(path, Options(wrt_inputs=True)), view)[0]
        svg = subprocess.run(["dot", "-Tsvg"], input=source.encode(), capture_output=True, check=True)
        assert "a&quot;b\\c:d/e{f}&lt;g&gt; h next" in svg.stdout.decode()  # drawn as written


@needs_dot
def test_focus_draws_a_small_neighbourhood_of_a_resnet_block():
    a = analyze(str(ZOO / "light_resnet50.onnx"), Options())
    full = build_dot(a, "after")[1]
    source, count = build_dot(a, "after", focus="bn_add_act:3", hops=1)
    assert count < 12 < full
    assert any(lab.startswith("bn_add_act") for lab in labels(layout(source)))
    node = next(n.name for n in a.graph.nodes if n.op_type == "MaxPool")
    assert build_dot(a, "before", focus=node, hops=0)[1] == 2  # the node and the tensor entering it
    with pytest.raises(FuseError, match="no node or pattern"):
        build_dot(a, "after", focus="no_such_thing")


def test_scope_collapse(save_model):
    assert scope_of("block1/conv/Conv", 1) == "block1" and scope_of("Conv_3", 1) is None
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="block1/r1"),
             helper.make_node("Relu", ["a"], ["b"], name="block1/r2"),
             helper.make_node("Relu", ["b"], ["y"], name="head")]
    a = analyze(save_model(make_model(nodes, [vi("x", 2)], [vi("y", 2)])), Options())
    assert build_dot(a, "before")[1] == 4
    assert build_dot(a, "before", collapse=1)[1] == 3


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_cli_dot_to_stdout_and_files(sample, tmp_path):
    r = run("render", sample("conv_bias_relu"), "--dot", "--view", "before", "--batch", "1")
    assert r.exit_code == 0 and r.stdout.startswith("digraph")
    out = tmp_path / "g.dot"
    assert run("render", sample("conv_bias_relu"), "-o", str(out), "--batch", "1").exit_code == 0
    assert out.read_text().startswith("digraph")


@needs_dot
def test_cli_writes_svg_and_png(sample, tmp_path):
    for ext, magic in (("svg", b"<?xml"), ("png", b"\x89PNG")):
        out = tmp_path / f"g.{ext}"
        r = run("render", sample("bn_add_relu"), "--view", "backward", "-o", str(out), "--batch", "2")
        assert r.exit_code == 0, r.output
        assert out.read_bytes().startswith(magic)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".fusecli-")] == []


@pytest.mark.parametrize("args,message", [
    (["--max-nodes", "1", "-o", "{tmp}/g.svg"], "too many to lay out"),
    (["-o", "{tmp}/g.jpg"], "must end in one of"),
    (["-o", "{model}"], "refusing to overwrite the input model"),
    (["--focus", "nothing_here", "--dot"], "no node or pattern"),
])
def test_cli_refusals_are_one_line(sample, tmp_path, args, message):
    model = sample("conv_bias_relu")
    args = [a.format(tmp=tmp_path, model=model) for a in args]
    before = open(model, "rb").read()
    r = run("render", model, "--batch", "1", *args)
    assert r.exit_code == 1 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert open(model, "rb").read() == before
    assert list(tmp_path.iterdir()) == []


def test_missing_dot_says_how_to_install(sample, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda _: None)
    r = run("render", sample("conv_bias_relu"), "-o", str(tmp_path / "g.svg"), "--batch", "1")
    assert r.exit_code == 1 and "apt-get install graphviz" in r.stderr and "--dot" in r.stderr
    assert list(tmp_path.iterdir()) == []

"""render: each view's structure, read back through Graphviz's own parser (dot -Tjson)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from fusecli.cli import main
from fusecli.core.scopes import node_scope
from fusecli.pipeline import Options, analyze
from fusecli.render.views import (
    COLORS,
    PNG_MAX_INCHES,
    FocusError,
    RenderOptions,
    build_dot,
    count_nodes,
    scope_of,
)
from tests.conftest import ZOO, make_model, vi

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")


def layout(source: str) -> dict:
    """Graphviz's parse of the DOT: {'objects': [...], 'edges': [...]} (fails on invalid DOT)."""
    done = subprocess.run(["dot", "-Tjson"], input=source.encode(), capture_output=True, check=True)
    return json.loads(done.stdout)


def labels(g: dict) -> list[str]:
    """Labels of the drawn nodes (not the legend's)."""
    return [o.get("label", "") for o in drawn(g)]


def drawn(g: dict) -> list[dict]:
    return [o for o in g.get("objects", []) if "nodes" not in o and not o["name"].startswith("legend_")]


def legend(g: dict) -> list[str]:
    return [o.get("label", "") for o in g.get("objects", []) if o["name"].startswith("legend_")]


def edges(g: dict) -> list[tuple[str, str, dict]]:
    names = {o["_gvid"]: o.get("label", "") for o in g.get("objects", [])}
    return [(names[e["tail"]], names[e["head"]], e) for e in g.get("edges", [])]


def saved_notes(g: dict) -> dict[str, tuple[str, list[str], str]]:
    """The saved-tensor notes: name -> (its maker's op type, the reading ops' types, colour)."""
    ops = {o["_gvid"]: o.get("label", "").split("\\n")[0] for o in g.get("objects", [])}
    out = {}
    for o in drawn(g):
        if o.get("shape") == "note":
            into = [e for e in g.get("edges", []) if e["head"] == o["_gvid"]]
            readers = sorted(ops[e["head"]] for e in g.get("edges", []) if e["tail"] == o["_gvid"])
            out[o["label"].split("\\n")[0]] = (ops[into[0]["tail"]], readers, o["color"])
    return out


def crossed_text(g: dict) -> list[str]:
    """Edge labels and note texts that an edge not ending at them passes through (dot's layout, the
    edges' Bezier curves sampled)."""
    import numpy as np

    curves = []
    for e in g.get("edges", []):
        pts = [np.array(d["points"]) for d in e.get("_draw_", []) if d["op"] == "b"]
        t = np.linspace(0, 1, 20)[:, None]
        samples = [((1 - t) ** 3) * p[k] + 3 * ((1 - t) ** 2) * t * p[k + 1] + 3 * (1 - t) * t * t * p[k + 2]
                   + t ** 3 * p[k + 3] for p in pts for k in range(0, len(p) - 3, 3)]
        curves.append((e, np.concatenate(samples) if samples else np.zeros((0, 2))))
    texts = [(e.get("_ldraw_", []), {id(e)}, e.get("label", "")) for e in g.get("edges", [])]
    ends = {o["_gvid"]: {id(e) for e in g.get("edges", []) if o["_gvid"] in (e["tail"], e["head"])}
            for o in drawn(g)}
    texts += [(o.get("_ldraw_", []), ends[o["_gvid"]],
               o.get("label", "")) for o in drawn(g) if o.get("shape") == "note"]
    crossed = []
    for draws, own, label in texts:
        for d in draws:
            if d["op"] != "T":
                continue
            (x, y), w = d["pt"], d["width"]
            x0 = {"c": x - w / 2, "l": x}.get(d["align"], x - w)
            if any(((p[:, 0] > x0) & (p[:, 0] < x0 + w) & (p[:, 1] > y - 2) & (p[:, 1] < y + 9)).any()
                   for e, p in curves if id(e) not in own):
                crossed.append(label)
    return crossed


@needs_dot
@pytest.mark.parametrize("name", ["conv_bias_relu", "conv_bn_relu", "bn_add_relu", "conv_squeeze_bias",
                                  "matmul_bias_relu"])
@pytest.mark.parametrize("view", ["before", "after", "backward"])
def test_every_view_of_every_sample_is_valid_dot(sample, name, view):
    a = analyze(sample(name), Options(batch=2))
    source, count = build_dot(a, view)
    g = layout(source)
    assert count == len(drawn(g)) == count_nodes(a, RenderOptions(view=view))  # the dry count agrees
    assert [c["label"] for c in g["objects"] if "nodes" in c] and legend(g)  # every view has a legend


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
    fused = [o for o in drawn(g) if o["label"].startswith("conv_bn_act")]
    assert len(fused) == 1 and "inference only" in fused[0]["label"]
    assert fused[0]["tooltip"].startswith("conv > bn > relu: inference only")  # names and reason
    assert not any(lab.split("\\n")[0] in ("Conv", "Relu") for lab in labels(g))
    clusters = [o for o in g["objects"] if "nodes" in o]
    assert [c["label"] for c in clusters] == ["fused for inference"]  # the legend
    assert "fused: inference only" in legend(g) and "forward op" in legend(g)
    g = layout(build_dot(a, "after", mode="training")[0])
    assert any(lab.startswith("bn_act") and "training-safe" in lab for lab in labels(g))
    assert any(lab.split("\\n")[0] == "Conv" for lab in labels(g))


@needs_dot
@pytest.mark.parametrize("name", ["conv_bn_relu", "bn_add_relu"])
def test_training_mode_draws_no_inference_only_box(sample, name):
    a = analyze(sample(name), Options(batch=2))
    assert any(not m.verdict.training_safe and m.verdict.inference_safe for m in a.matches)
    g = layout(build_dot(a, "after", mode="training")[0])
    assert not any("inference only" in lab for lab in labels(g) + legend(g))
    assert not any(o.get("color") == COLORS["inference"] for o in drawn(g))
    assert any("training-safe" in lab for lab in labels(g))


@needs_dot
def test_backward_view_marks_the_blocking_conv_output(sample):
    g = layout(build_dot(analyze(sample("conv_bn_relu"), Options(batch=2, wrt_inputs=True)), "backward")[0])
    saved = {name: (maker, readers[0], colour) for name, (maker, readers, colour) in saved_notes(g).items()}
    assert saved["conv_out"] == ("Conv", "BatchNormGrad", COLORS["none"])
    assert saved["y"][:2] == ("Relu", "ReluGrad") and saved["y"][2] != COLORS["none"]
    assert saved["x"][1] == "ConvBackpropFilter" and saved["w"][1] == "ConvBackpropInput"
    assert {"ReluGrad", "BatchNormGrad", "ConvBackpropInput", "ConvBackpropFilter"} <= {
        lab.split("\\n")[0] for lab in labels(g)}


@needs_dot
@pytest.mark.parametrize("name", ["conv_bn_relu", "bn_add_relu"])
@pytest.mark.parametrize("view", ["backward", "fused-training"])
def test_no_edge_runs_through_a_saved_tensors_text(sample, name, view):
    """Issue 27: saved tensors' names and bytes are notes dot places, not edge labels it sets after routing
    (those were crossed by other edges: 1 of 9 on conv_bn_relu's backward view)."""
    g = layout(build_dot(analyze(sample(name), Options(batch=8)), view)[0])
    assert saved_notes(g) and crossed_text(g) == []


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


@pytest.fixture(scope="module")
def resnet():
    return analyze(str(ZOO / "light_resnet50.onnx"), Options())


def _views(source: str) -> tuple[dict[str, str], dict[str, str]]:
    """op name -> how the view draws it: 'fused <tooltip>' for a fused group, 'op' for a plain op."""
    g = layout(source)
    how, plain = {}, {}
    for o in drawn(g):
        tip = o.get("tooltip", "")
        if o.get("shape") == "box" and "bold" in o.get("style", ""):
            for name in tip.split(": ", 1)[0].split(" > "):
                how[name] = f"fused {tip}"
        elif o.get("shape") == "box":
            plain[tip] = "op"
    return how, plain


@needs_dot
@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize("focus", ["bn_add_act:3", "conv_bn_act:0", "conv_bn_act:7"])
def test_focus_draws_what_the_full_view_draws(resnet, mode, focus):
    full_fused, full_plain = _views(build_dot(resnet, "after", mode=mode)[0])
    source, count = build_dot(resnet, "after", focus=focus, hops=1, mode=mode)
    fused, plain = _views(source)
    assert fused and count < 20
    for name, how in fused.items():
        assert full_fused[name] == how  # the same group, drawn fused in both
    for name in plain:
        assert name in full_plain and name not in full_fused


@needs_dot
def test_focus_of_a_node_and_bad_focus_values(resnet):
    node = next(n.name for n in resnet.graph.nodes if n.op_type == "MaxPool")
    assert build_dot(resnet, "before", focus=node, hops=0)[1] == 2  # the node and the tensor entering it
    with pytest.raises(FocusError, match="no node or pattern.*PATTERN:K"):
        build_dot(resnet, "after", focus="no_such_thing")
    n = sum(m.pattern.name == "bn_add_act" for m in resnet.matches)
    for bad in ("bn_add_act:x", f"bn_add_act:{n}", "bn_add_act:-1"):
        with pytest.raises(FocusError, match=f"K is 0 to {n - 1}"):
            build_dot(resnet, "after", focus=bad)


def test_scope_collapse_below_the_scope_every_name_shares(save_model):
    assert scope_of("block1/conv/Conv", 1) == "block1" and scope_of("Conv_3", 1) is None
    assert scope_of("model/block1/conv/Conv", 1, "model/") == "block1"
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="model/block1/r1"),
             helper.make_node("Relu", ["a"], ["b"], name="model/block1/r2"),
             helper.make_node("Relu", ["b"], ["c"], name="model/block2/r1"),
             helper.make_node("Relu", ["c"], ["y"], name="model/head")]
    a = analyze(save_model(make_model(nodes, [vi("x", 2)], [vi("y", 2)])), Options())
    assert build_dot(a, "before")[1] == 5
    assert build_dot(a, "before", collapse=1)[1] == 4  # block1, block2, head and the input


def _long_names_model(save_model, length: int) -> str:
    scope = "model/" + "s" * length + "/"
    nodes = [helper.make_node("Relu", ["x"], [scope + "a"], name=scope + "layer_one/Relu"),
             helper.make_node("Sigmoid", [scope + "a"], ["y"], name=scope + "layer_two/Sigmoid")]
    return save_model(make_model(nodes, [vi("x", 2, 3)], [vi("y", 2, 3)]))


@needs_dot
def test_long_names_short_labels_full_tooltips(save_model):
    a = analyze(_long_names_model(save_model, 100), Options(wrt_inputs=True))
    g = layout(build_dot(a, "before")[0])
    relu = next(o for o in drawn(g) if o["label"].startswith("Relu"))
    assert relu["label"].split("\\n")[1] == "layer_one/Relu"  # the scope every name shares is left out
    assert relu["tooltip"] == "model/" + "s" * 100 + "/layer_one/Relu"


@needs_dot
@pytest.mark.parametrize("view", ["before", "after", "backward"])
def test_names_past_dot_string_limit_still_lay_out(save_model, view):
    a = analyze(_long_names_model(save_model, 20_000), Options(wrt_inputs=True))
    g = layout(build_dot(a, view)[0])  # dot refuses quoted strings over 16,384 characters
    assert all(len(lab) <= 200 for lab in labels(g))


def test_png_is_size_capped(sample):
    source = build_dot(analyze(sample("bn_add_relu"), Options(batch=2)), "after", fmt="png")[0]
    assert f'size="{PNG_MAX_INCHES},{PNG_MAX_INCHES}"' in source and "dpi=96" in source


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


@pytest.mark.parametrize("args,message,code", [
    (["--max-nodes", "1", "-o", "{tmp}/g.svg"], "too many to lay out", 1),
    (["-o", "{tmp}/g.jpg"], "must end in", 2),
    (["-o", "{model}"], "refusing to overwrite the input model", 1),
    (["--focus", "nothing_here", "--dot"], "no node or pattern", 2),
    (["--focus", "conv_bias_act:x", "--dot"], "PATTERN:K", 2),
])
def test_cli_refusals_are_one_line(sample, tmp_path, args, message, code):
    model = sample("conv_bias_relu")
    args = [a.format(tmp=tmp_path, model=model) for a in args]
    before = open(model, "rb").read()
    r = run("render", model, "--batch", "1", *args)
    assert r.exit_code == code and message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("error: ")
    assert open(model, "rb").read() == before
    assert list(tmp_path.iterdir()) == []


def test_too_many_nodes_refused_before_any_dot_is_built(sample, tmp_path, monkeypatch):
    import fusecli.render.views

    def no_dot(*args, **kw):
        raise AssertionError("DOT built")

    monkeypatch.setattr(fusecli.render.views, "build_dot", no_dot)
    r = run("render", sample("bn_add_relu"), "--max-nodes", "2", "-o", str(tmp_path / "g.svg"),
            "--batch", "1")
    assert r.exit_code == 1 and "too many to lay out" in r.stderr


def test_missing_dot_says_how_to_install(sample, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda _: None)
    r = run("render", sample("conv_bias_relu"), "-o", str(tmp_path / "g.svg"), "--batch", "1")
    assert r.exit_code == 1 and "apt-get install graphviz" in r.stderr and "--dot" in r.stderr
    assert list(tmp_path.iterdir()) == []


def _boxes(source: str) -> list[str]:
    """Every op box a DOT source draws, as its attributes (label, tooltip, style): ids differ between
    views, what is drawn does not. Ellipses (tensors entering a focused drawing) are left out."""
    boxes = [m.group(1) for m in re.finditer(r"^\tn\d+ \[(.*)\]$", source, re.M)]
    return [b for b in boxes if "shape=ellipse" not in b]


@pytest.mark.parametrize("view", ["before", "after", "backward", "fused-training"])
def test_every_view_honours_focus(hf_onnx, view):
    """Issue 27: --focus draws fewer boxes than the full view, and the same ones the full view draws
    (the fused-training view drew all 249 of 249 boxes under --focus attention)."""
    a = analyze(hf_onnx("bert", dynamic=False), Options(batch=2))
    full, count = build_dot(a, view, mode="training")
    focused, focused_count = build_dot(a, view, focus="attention", hops=2, mode="training")
    assert focused_count < count and count == count_nodes(a, RenderOptions(view=view, mode="training"))
    assert focused_count == count_nodes(a, RenderOptions(view=view, focus="attention", mode="training"))
    boxes, full_boxes = _boxes(focused), set(_boxes(full))
    assert 0 < len(boxes) < len(full_boxes)
    assert [b for b in boxes if b not in full_boxes] == []


def test_collapsed_scopes_keep_their_leading_slash(save_model):
    """Issue 27: PyTorch's '/m/block1/Relu' collapses to '/m/block1', as the model names it."""
    assert scope_of("/m/block1/Relu", 2) == "/m/block1" and scope_of("/m/Relu", 2) is None
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="/m/block1/r1"),
             helper.make_node("Relu", ["a"], ["y"], name="/m/block2/r1")]
    a = analyze(save_model(make_model(nodes, [vi("x", 2)], [vi("y", 2)])), Options())
    source = build_dot(a, "before", collapse=2)[0]
    assert re.findall(r'label="([^"\\]*)\\n\(collapsed scope\)"', source) == ["/m/block1/…", "/m/block2/…"]


def test_render_takes_the_analysis_options_analyze_takes(sample):
    """Issue 27: --patterns, --autodiff and --constant-weights reach render's analysis."""
    model = sample("conv_bn_relu")
    full = run("render", model, "--dot", "--batch", "2")
    only = run("render", model, "--dot", "--batch", "2", "--patterns", "bn_act", "--autodiff", "tensorflow",
               "--constant-weights", "constants")
    assert full.exit_code == 0 and only.exit_code == 0, only.output
    assert 'label="conv_bn_act' in full.stdout and 'label="conv_bn_act' not in only.stdout
    assert 'label="bn_act' in only.stdout
    bad = run("render", model, "--dot", "--patterns", "nope")
    assert bad.exit_code == 2 and "unknown pattern" in bad.stderr


def test_after_view_names_only_kernels_rewrite_emits(hf_onnx):
    """Issue 27: BERT's 3-D matmul_bias boxes said 'Gemm', which rewrite never writes there."""
    a = analyze(hf_onnx("bert", dynamic=False), Options(batch=2))
    source = build_dot(a, "after")[0]
    boxes = re.findall(r'label="(matmul_bias|attention)\\n([^"\\]*)', source)
    assert ("matmul_bias", "Gemm") not in boxes and ("attention", "MultiHeadAttention") in boxes


def _blocks_model(save_model, n_blocks: int = 4, ops: int = 30, odd: dict | None = None) -> str:
    """``n_blocks`` blocks '/m/layers.K/opJ' of ``ops`` chained LeakyRelu/Add ops each (Add reads the op
    before and the block's input). ``odd``: block -> 'attr' (one alpha differs) or 'wiring' (an Add
    reads two ops back instead of the block's input)."""
    odd = odd or {}
    nodes, prev = [], "x"
    for b in range(n_blocks):
        start, last = prev, prev
        for j in range(ops):
            name, out = f"/m/layers.{b}/op{j}", f"/m/layers.{b}/op{j}_out"
            if j % 2 == 0:
                alpha = 0.2 if odd.get(b) == "attr" and j == 4 else 0.1
                nodes.append(helper.make_node("LeakyRelu", [last], [out], name=name, alpha=alpha))
            else:
                other = nodes[-2].output[0] if odd.get(b) == "wiring" and j == 5 else start
                nodes.append(helper.make_node("Add", [last, other], [out], name=name))
            last = out
        prev = last
    nodes.append(helper.make_node("Relu", [prev], ["y"], name="/m/head/Relu"))
    return save_model(make_model(nodes, [vi("x", 2, 3)], [vi("y", 2, 3)]))


def _draws(source: str, name: str) -> bool:
    """A box with this full name in its tooltip: its own, or a fused group's 'a > b: reason' (graphviz
    quotes only names that need it)."""
    return re.search(r'(tooltip="?|> )' + re.escape(name) + r'("|:| >|[ \]])', source) is not None


def _fold_labels(source: str) -> list[str]:
    return re.findall(r'subgraph cluster_fold_\d+ \{ label="([^"]*)"', source)


@pytest.mark.parametrize("view", ["before", "after", "backward", "fused-training"])
def test_equal_blocks_fold_and_unfold(save_model, view):
    a = analyze(_blocks_model(save_model), Options(wrt_inputs=True))
    source, count = build_dot(a, view)
    full, full_count = build_dot(a, view, unfold=True)
    assert count < full_count and count == count_nodes(a, RenderOptions(view=view))
    assert full_count == count_nodes(a, RenderOptions(view=view, unfold=True))
    assert [lab.split("\\n")[0] for lab in _fold_labels(source)] == ["m/layers.* x4 (0…3)"]
    assert _fold_labels(full) == []
    for b in range(4):  # --unfold draws every block's ops; folded, only the first block's
        assert _draws(full, f"/m/layers.{b}/op7")
        assert _draws(source, f"/m/layers.{b}/op7") == (b == 0)
    if view in ("backward", "fused-training"):
        assert "backward keeps" in _fold_labels(source)[0]


@pytest.mark.parametrize("how", ["attr", "wiring"])
def test_blocks_that_differ_structurally_are_not_folded_together(save_model, how):
    a = analyze(_blocks_model(save_model, odd={2: how}), Options())
    source, _ = build_dot(a, "before")
    assert [lab.split("\\n")[0] for lab in _fold_labels(source)] == ["m/layers.* x3 (0, 1, 3)"]
    assert _draws(source, "/m/layers.2/op7") and not _draws(source, "/m/layers.1/op7")


def test_small_graphs_are_not_folded(save_model):
    a = analyze(_blocks_model(save_model, ops=20), Options())  # 81 ops: under the fold threshold
    source, count = build_dot(a, "before")
    assert _fold_labels(source) == [] and count == build_dot(a, "before", unfold=True)[1]


def test_shape_plumbing_hidden_unless_asked(save_model):
    """Shape -> Gather -> Unsqueeze -> Concat feeds only Reshape's target: hidden; a Shape read as data
    (Cast to float, multiplied in) stays."""
    i64 = TensorProto.INT64
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "zero"], ["d0"], name="gather", axis=0),
             helper.make_node("Unsqueeze", ["d0", "axes"], ["d0u"], name="unsqueeze"),
             helper.make_node("Concat", ["d0u", "minus1"], ["target"], name="concat", axis=0),
             helper.make_node("Reshape", ["x", "target"], ["r"], name="reshape"),
             helper.make_node("Shape", ["r"], ["s2"], name="shape_data"),
             helper.make_node("Cast", ["s2"], ["s2f"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["s2f"], ["n"], name="sum", keepdims=0),
             helper.make_node("Mul", ["r", "n"], ["y"], name="mul")]
    inits = [helper.make_tensor("zero", i64, [], [0]), helper.make_tensor("axes", i64, [1], [0]),
             helper.make_tensor("minus1", i64, [1], [-1])]
    a = analyze(save_model(make_model(nodes, [vi("x", "N", 3)], [vi("y", "N", 3)], inits)), Options())
    for view in ("before", "after", "backward", "fused-training"):
        hidden, _ = build_dot(a, view)
        shown, _ = build_dot(a, view, shape_ops=True)
        for name in ("shape", "gather", "unsqueeze", "concat"):
            assert not _draws(hidden, name) and _draws(shown, name), (view, name)
        assert _draws(hidden, "shape_data") and _draws(hidden, "reshape")


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("view", ["before", "after"])
def test_a_4_layer_gpt2_folds_to_one_layer(hf_onnx, exporter, view):
    """Issue 27: repeated decoder layers drawn once as 'x4'; --unfold draws every layer's ops."""
    a = analyze(hf_onnx("gpt2", exporter, attn="default", layers=4), Options(batch=2))
    source, count = build_dot(a, view)
    full, full_count = build_dot(a, view, unfold=True)
    everything, every_count = build_dot(a, view, unfold=True, shape_ops=True)
    assert count < full_count < every_count and count < 80
    assert any(lab.startswith("inner/h.* x4 (0…3)") for lab in _fold_labels(source))
    layer_ops = {k: [n for n in a.graph.nodes if len(node_scope(n)) > 1 and node_scope(n)[1] == f"h.{k}"
                     and n.op_type in ("Gemm", "LayerNormalization")] for k in range(4)}
    for k, ops in layer_ops.items():
        assert ops and all(_draws(everything, n.name) for n in ops)
        if view == "before":
            assert all(_draws(full, n.name) for n in ops)
            assert all(_draws(source, n.name) == (k == 0) for n in ops if n.op_type == "Gemm"), k
    shape_ops = [n for n in a.graph.nodes if n.op_type == "Shape" and _draws(everything, n.name)]
    assert shape_ops and sum(_draws(full, n.name) for n in shape_ops) < len(shape_ops)

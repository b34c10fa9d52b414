"""diff/compare.py: two exports compared, every number checked against fusecli's own analysis of each file."""

from __future__ import annotations

from collections import Counter

import onnx
import pytest

from fusecli.core.dims import parse_dim
from fusecli.core.errors import UsageError
from fusecli.core.scopes import node_scope
from fusecli.diff.compare import DiffOptions, analyze_pair, compare
from fusecli.pipeline import Options, analyze
from fusecli.report.document import to_json
from tests.builders import Net


def mlp(acts=("Relu", "Relu"), hidden=(16, 16), bias=(True, True), block="block", shape=("batch", 8)):
    """A 2-block MLP with TorchScript-style names: /block.<i>/fc/MatMul, /block.<i>/act/<Act>."""
    net = Net(x=shape)
    x, cin = "x", shape[-1]
    for i, (act, h, b) in enumerate(zip(acts, hidden, bias, strict=True)):
        x = net.op("MatMul", f"/{block}.{i}/fc/MatMul", x, net.param(f"{block}.{i}.fc.weight", cin, h))
        if b:
            x = net.op("Add", f"/{block}.{i}/fc/Add", x, net.param(f"{block}.{i}.fc.bias", h))
        x = net.op(act, f"/{block}.{i}/act/{act}", x)
        cin = h
    return net.model(x, opset=20)


@pytest.fixture
def mlps(tmp_path):
    def save(name: str, **kw) -> str:
        path = str(tmp_path / f"{name}.onnx")
        onnx.save(mlp(**kw), path)
        return path

    return save


def run(old: str, new: str, batch=4, dims=None, wrt_inputs=False, **kw) -> dict:
    a, b, notes, rename = analyze_pair(old, new, batch, dims or {}, wrt_inputs=wrt_inputs)
    return compare(a, b, DiffOptions(notes=notes, dim_rename=rename, **kw))


def of(doc: dict, kind: str) -> list[dict]:
    return [d for d in doc["differences"] if d["kind"] == kind]


def pattern_counts(path: str, **dims) -> Counter:
    return Counter(p["pattern"] for p in to_json(analyze(path, Options(**dims)))["patterns"])


def net_fusions(doc: dict) -> Counter:
    """Per pattern: matches gained minus matches lost, as the diff says."""
    out: Counter = Counter()
    for d in doc["differences"]:
        if d["kind"] in ("fusion_gained", "fusion_lost"):
            out[d["pattern"]] += d["count"] if d["kind"] == "fusion_gained" else -d["count"]
    return out


def assert_counts_reconcile(doc: dict, old: str, new: str, **dims) -> None:
    """The fusions gained and lost add up to the difference of the two analyses' pattern counts."""
    a, b = pattern_counts(old, **dims), pattern_counts(new, **dims)
    expected = {p: b[p] - a[p] for p in set(a) | set(b) if b[p] != a[p]}
    assert {p: c for p, c in net_fusions(doc).items() if c} == expected


def test_identical_files_have_no_difference(mlps):
    path = mlps("a")
    doc = run(path, path)
    assert doc["differences"] == [] and doc["summary"]["exit"] == 0
    assert doc["pairing"]["unpaired_old"] == doc["pairing"]["unpaired_new"] == []


def test_one_blocks_activation_changed_is_named(mlps):
    old, new = mlps("relu"), mlps("gelu", acts=("Relu", "Gelu"))
    doc = run(old, new)
    assert_counts_reconcile(doc, old, new, batch=4)
    # the verdict of block 1's matmul+bias+activation, as each file's own analysis says it
    states = []
    for path in (old, new):
        m = next(p for p in to_json(analyze(path, Options(batch=4)))["patterns"]
                 if p["pattern"] == "matmul_bias_act" and any("/block.1/" in n for n in p["nodes"]))
        states.append(m["verdict"])
    assert states[0] != states[1]
    (worse,) = [d for d in doc["differences"] if d["kind"] in ("verdict_worse", "verdict_better")]
    assert (worse["pattern"], worse["old"], worse["new"]) == ("matmul_bias_act", *states)
    assert worse["scope"] == "block.*" and any("/block.1/act/Gelu" == n for n in worse["nodes"])
    assert worse["kind"] == "verdict_worse" and doc["summary"]["exit"] == 1
    assert "verdicts" in doc["summary"]["failing"]
    # the saved tensor that block 1's backward reads moved from the Relu to another op
    vanished = {(d["scope"], d["op"]) for d in of(doc, "saved_vanished")}
    assert ("block.*/act", "Relu") in vanished
    assert DiffOptions().fail_on == ("fusions", "verdicts", "memory")
    assert run(old, new, fail_on=("memory",))["summary"]["exit"] == 0


def test_lost_fusion_exits_1_and_fail_on_selects(mlps):
    old, new = mlps("bias"), mlps("nobias", bias=(True, False))
    doc = run(old, new)
    assert_counts_reconcile(doc, old, new, batch=4)
    lost = of(doc, "fusion_lost")
    assert lost and all(d["regression"] for d in lost)
    from fusecli.rewrite.kernels.registry import EMITTERS

    assert all(d["rewrite"] == (d["pattern"] in EMITTERS) for d in lost)
    assert any(d["rewrite"] for d in lost) and any(not d["rewrite"] for d in lost)  # relu_grad_bias_grad
    assert doc["summary"]["exit"] == 1 and doc["summary"]["failing"] == ["fusions"]
    assert run(old, new, fail_on=("memory", "verdicts"))["summary"]["exit"] == 0
    assert run(new, old, fail_on=("fusions",))["summary"]["exit"] == 0  # the other way round: gained


def test_memory_growth_is_checked_against_both_analyses(mlps):
    old, new = mlps("narrow"), mlps("wide", hidden=(16, 64))
    doc = run(old, new)
    mem = [to_json(analyze(p, Options(batch=4)))["memory"] for p in (old, new)]
    for d in of(doc, "memory"):
        assert (d["old"], d["new"]) == (mem[0][d["total"]], mem[1][d["total"]])
        assert d["regression"] == (d["new"] > d["old"] * 1.02)
    assert {d["total"] for d in of(doc, "memory")} == {"saved_bytes", "saved_activation_bytes", "peak_bytes"}
    # the formulas, term by term, as the analyses print them
    p, q = parse_dim(mem[0]["formula"]["saved_bytes"]), parse_dim(mem[1]["formula"]["saved_bytes"])
    terms = {d["term"]: (d["old"], d["new"]) for d in of(doc, "formula_term") if d["total"] == "saved_bytes"}
    assert terms == {str(parse_dim("batch")) if m else "1": (p.terms.get(m, 0), q.terms.get(m, 0))
                     for m in set(p.terms) | set(q.terms) if p.terms.get(m, 0) != q.terms.get(m, 0)}
    assert doc["summary"]["failing"] == ["memory"]
    assert run(old, new, fail_on=("fusions", "verdicts"))["summary"]["exit"] == 0
    grown = max(d["change"] for d in of(doc, "memory"))
    assert run(old, new, tolerance=grown + 0.01)["summary"]["exit"] == 0
    assert run(old, new, tolerance=grown - 0.01)["summary"]["exit"] == 1


def test_renamed_blocks_pair_by_structure_and_say_what_did_not_pair(mlps):
    old, new = mlps("block"), mlps("layer", block="layer")
    doc = run(old, new)
    assert not of(doc, "fusion_lost") and not of(doc, "fusion_gained")
    assert doc["summary"]["exit"] == 0
    assert "block.*/fc" in doc["pairing"]["unpaired_old"] and "layer.*/fc" in doc["pairing"]["unpaired_new"]
    assert {(d["side"], d["scope"]) for d in of(doc, "unpaired_scope")} >= {("OLD", "block.*")}


def test_dims_in_one_model_only(mlps):
    old, new = mlps("seq", shape=("batch", "seq", 8)), mlps("len", shape=("batch", "len", 8))
    doc = run(old, new, dims={"seq": 4})
    assert doc["old"]["dims"] == {"batch": 4, "seq": 4} and doc["new"]["dims"] == {"batch": 4, "len": 1}
    assert any("'seq' exists in OLD only (--dim seq=4 applies to OLD only)" in n for n in doc["notes"])
    assert any("'len' exists in NEW only" in n for n in doc["notes"])
    with pytest.raises(UsageError, match="neither model has a dim"):
        analyze_pair(old, new, 4, {"width": 3})



def test_eager_vs_sdpa_names_the_attention_change(hf_onnx):
    old, new = hf_onnx("roberta", attn="eager"), hf_onnx("roberta", attn="default")
    dims = {"batch": 2, "dims": {"seq": 64}}
    a, b = (analyze(p, Options(**dims)) for p in (old, new))
    docs = [to_json(x) for x in (a, b)]
    doc = compare(a, b)
    assert_counts_reconcile(doc, old, new, **dims)
    kernels = [sorted(p["attention"]["kernel"] for p in d["patterns"] if p["pattern"] == "attention")
               for d in docs]
    assert kernels[0] != kernels[1]
    (change,) = of(doc, "attention_kernel")
    assert [change["old"]] * change["count"] == kernels[0] and [change["new"]] * change["count"] == kernels[1]
    assert change["scope"] == "inner/encoder/layer.*/attention/self"
    # the seq^2 term of the saved bytes, with each analysis's own coefficient
    square = parse_dim("batch*seq^2")
    (mono,) = square.terms
    coef = [parse_dim(d["memory"]["formula"]["saved_bytes"]).terms.get(mono, 0) for d in docs]
    assert coef[0] != coef[1]
    (term,) = [d for d in of(doc, "formula_term") if d["total"] == "saved_bytes" and d["term"] == str(square)]
    assert (term["old"], term["new"]) == tuple(coef)
    # the peak's terms are those of the step that peaks at these sizes, on each side
    from fusecli.diff.compare import _poly

    for d in docs:
        assert _poly(d["memory"]["formula"]["peak_bytes"], d["dims"]).evaluate(d["dims"]) == \
            d["memory"]["peak_bytes"]
    assert {d["total"] for d in of(doc, "formula_term")} >= {"saved_bytes", "peak_bytes"}
    verdicts = {(d["kind"], d["pattern"]) for d in doc["differences"] if d["kind"].startswith("verdict")}
    states = [Counter(p["verdict"] for p in d["patterns"] if p["pattern"] == "attention") for d in docs]
    assert (states[0] != states[1]) == any(p == "attention" for _, p in verdicts)
    # fusions the eager spelling had inside its attention are not regressions while the attention stays
    assert all(d["within"] == "attention" and not d["regression"] for d in of(doc, "fusion_lost"))


def test_torchscript_vs_dynamo_pairs_blocks_across_naming(hf_onnx):
    old, new = hf_onnx("roberta", "torchscript"), hf_onnx("roberta", "dynamo")
    dims = {"batch": 2, "dims": {"seq": 64}}
    a, b = (analyze(p, Options(**dims)) for p in (old, new))
    doc = compare(a, b)
    assert_counts_reconcile(doc, old, new, **dims)
    # dynamo's node names carry no scope: its module path does, and pairs with TorchScript's names
    assert any(n.name.startswith("node_") for n in b.graph.nodes)
    attn = next(m for m in b.matches if m.pattern.name == "attention")
    assert node_scope(attn.root)[:3] == ("inner", "encoder", "layer.0")
    assert doc["pairing"]["paired"] > 0.8 * doc["pairing"]["scopes_new"]
    counts = [Counter(m.pattern.name for m in x.matches) for x in (a, b)]
    assert counts[0]["attention"] == counts[1]["attention"] == 2
    assert not [d for d in doc["differences"] if d.get("pattern") == "attention"]
    for d in of(doc, "unpaired_scope"):
        assert d["scope"] in doc["pairing"]["unpaired_" + d["side"].lower()]


@pytest.fixture(scope="session")
def keras_and_tf2onnx(tmp_path_factory):
    """A small Keras 3 CNN exported as a SavedModel, and tf2onnx's conversion of that SavedModel.
    Biases are random: tf2onnx drops an Add of zeros, which would change the fusions."""
    import os
    import subprocess
    import sys

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    keras = pytest.importorskip("keras")
    pytest.importorskip("tf2onnx")
    keras.utils.set_random_seed(0)
    layers = keras.layers
    x = inp = keras.Input((16, 16, 3), name="x")
    for i in range(2):
        x = layers.Conv2D(8, 3, padding="same", activation="relu", name=f"block{i}_conv",
                          bias_initializer="random_normal")(x)
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    x = layers.Dense(4, activation="relu", name="head", bias_initializer="random_normal")(x)
    folder = tmp_path_factory.mktemp("keras_diff")
    saved, path = str(folder / "cnn"), str(folder / "cnn.onnx")
    keras.Model(inp, x).export(saved, verbose=False)
    done = subprocess.run([sys.executable, "-m", "tf2onnx.convert", "--saved-model", saved, "--opset", "17",
                           "--output", path], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return saved, path


def test_savedmodel_vs_tf2onnx_pairs_blocks_across_formats(keras_and_tf2onnx):
    old, new = keras_and_tf2onnx
    a, b, notes, rename = analyze_pair(old, new, 2, {})
    assert (a.graph.format, b.graph.format) == ("savedmodel", "onnx")
    doc = compare(a, b, DiffOptions(notes=notes, dim_rename=rename))
    assert_counts_reconcile(doc, old, new, batch=2)
    counts = [Counter(m.pattern.name for m in x.matches if m.pattern.phase == "forward") for x in (a, b)]
    assert counts[0] == counts[1] and counts[0]["conv_bias_act"] == 2
    # every match's scope pairs across the two formats' names: nothing lost, gained or unpaired
    kinds = {d["kind"] for d in doc["differences"]}
    assert not kinds & {"fusion_lost", "fusion_gained", "unpaired_scope", "verdict_worse", "verdict_better"}
    # tf2onnx names its batch dim unk__N: the formulas compare under OLD's name, coefficients as analysed
    (old_batch,), (new_batch,) = doc["old"]["dims"], doc["new"]["dims"]
    assert rename == {new_batch: old_batch} and any("named differently" in n for n in notes)
    assert not any("only" in n for n in notes)  # the batch dims are not said to be in one model only
    p, q = (parse_dim(d["formula"]["saved_bytes"]) for d in (doc["old"], doc["new"]))
    mono, new_mono = ((old_batch, 1),), ((new_batch, 1),)
    terms = {d["term"]: (d["old"], d["new"]) for d in of(doc, "formula_term") if d["total"] == "saved_bytes"}
    if p.terms.get(mono) != q.terms.get(new_mono):
        assert terms[old_batch] == (p.terms.get(mono), q.terms.get(new_mono))
    assert new_batch not in terms



def test_lost_attention_comes_with_the_near_miss_that_says_why(save_model):
    from tests.fusion.test_attention_default import _attention_graph

    old, new = save_model(_attention_graph(None), "old.onnx"), save_model(_attention_graph("Abs"), "new.onnx")
    doc = run(old, new, batch=None, wrt_inputs=True)
    assert doc["old"]["backward_nodes"] > 0
    (lost,) = [d for d in of(doc, "fusion_lost") if d["pattern"] == "attention"]
    assert lost["regression"] and doc["summary"]["exit"] == 1
    (miss,) = of(doc, "near_miss_gained")
    (expected,) = to_json(analyze(new, Options(wrt_inputs=True)))["near_misses"]
    assert [miss[k] for k in ("node", "op", "reason")] == [expected[k] for k in ("node", "op", "reason")]

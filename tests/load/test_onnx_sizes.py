"""Sizes of real exports: every tensor's bytes as onnxruntime makes it when it runs the model, the dynamic
export against the static one, and the memory formulas against fresh analyses.

The models are small `transformers` models exported with `dynamic_axes` (TorchScript exporter) and with
`dynamic_shapes` (dynamo exporter), as users export them (tests/hf_models.py).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from fusecli.cli import main
from fusecli.memory.formulas import evaluate_formula, memory_formulas
from fusecli.pipeline import Options, analyze
from tests import hf_models
from tests.conftest import make_model, vi

MODELS = ["bert", "distilbert", "gpt2", "llama", "t5_encoder"]
EXPORTERS = ["torchscript", "dynamo"]
CASES = [(m, e) for m in MODELS for e in EXPORTERS]
TOTALS = ("saved_bytes", "saved_activation_bytes", "peak_bytes")


def ort_tensor_bytes(path: str, name: str, batch: int, seq: int) -> dict[str, int]:
    """Bytes of every tensor onnxruntime makes when it runs the model on inputs of (batch, seq)."""
    import onnxruntime as ort

    model = onnx.shape_inference.infer_shapes(onnx.load(path))
    types = {v.name: v.type.tensor_type.elem_type for v in (*model.graph.value_info, *model.graph.output)
             if v.type.HasField("tensor_type")}
    listed = {o.name for o in model.graph.output}
    for n in model.graph.node:
        for o in n.output:
            if o and o not in listed and o in types:
                model.graph.output.append(helper.make_tensor_value_info(o, types[o], None))
                listed.add(o)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {i: a.numpy() for i, a in zip(hf_models.spec(name).inputs,
                                          hf_models.example_inputs(name, batch, seq), strict=True)}
    names = [o.name for o in session.get_outputs()]
    return {n: np.asarray(v).nbytes for n, v in zip(names, session.run(names, feeds), strict=True)}


# window and patch sizes computed with float arithmetic on shapes: sized by evaluating those computations
SHAPE_ARITHMETIC = [("swin", "torchscript"), ("mobilevit", "torchscript")]


@pytest.mark.parametrize("name, exporter", CASES + SHAPE_ARITHMETIC)
def test_every_tensor_is_sized_as_onnxruntime_makes_it(hf_onnx, name, exporter):
    """At the analysed sizes and, through the formulas, at other sizes: each tensor's bytes equal what
    onnxruntime allocates for it when it runs the export; no tensor is of unknown size."""
    path = hf_onnx(name, exporter)
    a = analyze(path, Options(batch=2, dims={"seq": 16} if hf_models.spec(name).seq_axis else {}))
    assert a.unknown_sizes == {} and a.liveness.unknown == set()
    activations = [t for t in a.graph.tensors.values() if t.producer is not None]
    for (batch, seq) in ((2, 16), (3, 24)):
        real = ort_tensor_bytes(path, name, batch, seq)
        values = {"batch": batch, "seq": seq}
        wrong = [(t.name, t.shape, a.sizes.formula(t), real[t.name]) for t in activations if t.name in real
                 and a.sizes.formula(t).evaluate({**a.sizes, **values}) != real[t.name]]
        assert not wrong, f"{len(wrong)} of {len(activations)} tensors sized wrongly, e.g. {wrong[:3]}"
        assert len([t for t in activations if t.name in real]) > 0.9 * len(activations)


def value_dependent(graph) -> set[str]:
    """Tensors whose values depend on the graph inputs' values (not only on their shapes): a static
    export folds the others (position ids, rotary tables, bucket indices) into constants."""
    dep = {t.name for t in graph.inputs}
    for n in graph.nodes:
        if n.op_type in ("Shape", "Size"):
            continue
        if any(t is not None and t.name in dep for t in n.inputs):
            dep.update(t.name for t in n.outputs if t is not None)
    return dep


@pytest.mark.parametrize("name, exporter", CASES)
def test_dynamic_export_sizes_as_the_static_one(hf_onnx, name, exporter):
    """--batch 2 --dim seq=128 on the dynamic export: the saved activations of the static (2, 128) export,
    within 1%, once the tensors that the static export folds into constants are set aside."""
    dynamic = analyze(hf_onnx(name, exporter), Options(batch=2, dims={"seq": 128}))
    static = analyze(hf_onnx(name, exporter, dynamic=False, batch=2, seq=128), Options())
    assert dynamic.unknown_sizes == {} and static.unknown_sizes == {}

    def activation_bytes(a):
        dep = value_dependent(a.graph)
        return sum(s.bytes for s in a.liveness.saved
                   if s.tensor.kind == "activation" and s.tensor.name in dep)

    d, s = activation_bytes(dynamic), activation_bytes(static)
    assert abs(d - s) <= 0.01 * s, (d, s)
    assert dynamic.liveness.saved_activation_bytes >= d  # the shape-only tensors are still counted


@pytest.mark.parametrize("name, exporter", CASES)
def test_memory_formula_equals_a_fresh_analysis(hf_onnx, name, exporter):
    """The formulas found at (2, 128), evaluated at (4, 256), give a fresh analysis's numbers exactly."""
    path = hf_onnx(name, exporter)
    first = analyze(path, Options(batch=2, dims={"seq": 128}))
    formulas = memory_formulas(first.liveness, first.joint)
    fresh = analyze(path, Options(batch=4, dims={"seq": 256}))
    assert fresh.sizes.opaque == {} and first.sizes.opaque == {}
    at = {"batch": 4, "seq": 256}
    for key in TOTALS:
        assert "unknown" not in formulas[key]
        assert evaluate_formula(formulas[key], at) == getattr(fresh.liveness, key), key
        assert evaluate_formula(formulas[key], first.sizes) == getattr(first.liveness, key), key
    assert "batch*seq^2" in formulas["saved_activation_bytes"]  # attention probabilities
    for s in first.liveness.saved:  # per tensor too
        assert first.sizes.formula(s.tensor).evaluate(at) == s.tensor.nbytes(at)


def _data_dependent_model():
    """NonZero's output length depends on the input's values: no tool can size it."""
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Cast", ["nz"], ["nzf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["nzf", "w"], ["y"])]
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 1], [2.0, 3.0])  # a trainable weight: dw reads nzf
    return make_model(nodes, [vi("x", "batch", 4)], [vi("y", 2, None)], [w])


def test_a_dim_nothing_can_size_is_warned_about_and_marked(save_model):
    path = save_model(_data_dependent_model())
    r = CliRunner().invoke(main, ["analyze", path, "--json", "--batch", "2"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    warning = next(line for line in r.stderr.splitlines() if "data-dependent" in line)
    assert warning == ("warning: 3 tensors (Cast x1, Mul x1, NonZero x1) have a data-dependent size (after "
                       "NonZero at node 'NonZero_0'): not counted in the byte totals; no --dim can size them")
    assert "--dim NAME=VALUE" not in r.stderr  # every dim was given: no --dim sizes these
    assert doc["memory"]["unknown_tensors"] == 3
    assert "saved_activation_bytes" in doc["memory"]["incomplete"]
    nzf = next(s for s in doc["saved"] if s["name"] == "nzf")  # Mul's backward reads it
    assert nzf["bytes"] is None and nzf["bytes_formula"] == "8*unk__0"  # the dim nothing could size, named
    formula = doc["memory"]["formula"]["saved_activation_bytes"]
    assert "unk__0" in formula and evaluate_formula(formula, doc["dims"]) is None


def _top_k_model(k_from: str, opaque: bool = False):
    """TopK of x along its last axis, k computed from x's shape (``shape``: a --dim sizes it) or from
    the values of an input (``values``: nothing can); ``opaque``: an op no shape tool knows after x."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["h"])]
    if opaque:
        nodes += [helper.make_node("Opaque", ["x"], ["o"], domain="custom"),
                  helper.make_node("Neg", ["o"], ["p"])]
    if k_from == "shape":
        nodes += [helper.make_node("Shape", ["x"], ["s"], start=1, end=2),
                  helper.make_node("Div", ["s", "two"], ["k"])]
    else:
        nodes += [helper.make_node("ReduceMax", ["n"], ["k"], keepdims=1)]
    nodes += [helper.make_node("TopK", ["h", "k"], ["v", "i"], name="topk"),
              helper.make_node("Tanh", ["v"], ["y"])]
    inits = [helper.make_tensor("w", TensorProto.FLOAT, [1, 8], np.linspace(0.5, 1, 8)),
             helper.make_tensor("two", TensorProto.INT64, [1], [2])]
    inputs = [vi("x", "batch", "seq")] + ([vi("n", 1, dtype=TensorProto.INT64)] if k_from == "values" else [])
    return make_model(nodes, inputs, [vi("y", "batch", None)] + ([vi("p", None)] if opaque else []), inits)


def test_top_k_with_k_from_values_is_data_dependent(save_model):
    """A TopK whose k is computed from values is sized by no --dim, and the warning says so; one whose k
    is computed from shapes is sized by the dims."""
    a = analyze(save_model(_top_k_model("values")), Options(batch=2, dims={"seq": 8}))
    dependent = [w for w in a.warnings if "data-dependent" in w]
    assert len(dependent) == 1 and "after TopK at node 'topk'" in dependent[0], a.warnings
    assert not any("--dim NAME=VALUE" in w for w in a.warnings), a.warnings
    sized = analyze(save_model(_top_k_model("shape"), "shape.onnx"), Options(batch=2, dims={"seq": 8}))
    assert sized.unknown_sizes == {} and not any("data-dependent" in w for w in sized.warnings)
    assert next(s for s in sized.liveness.saved if s.tensor.name == "y").bytes == 2 * 4 * 4


def test_an_open_size_and_a_data_dependent_size_are_told_apart(save_model):
    """An op no shape tool knows leaves sizes open (the old warning); the data-dependent sizes are told
    apart from them."""
    a = analyze(save_model(_top_k_model("values", opaque=True)), Options(batch=2, dims={"seq": 8}))
    dependent = [w for w in a.warnings if "data-dependent" in w]
    open_ = [w for w in a.warnings if "with unknown dims" in w]
    assert len(dependent) == 1 and len(open_) == 1, a.warnings
    assert "TopK" in dependent[0] and "Opaque x1" in open_[0] and "TopK" not in open_[0]
    assert "--dim" not in open_[0]  # every dim was given: the hint says so rather than ask for one
    left = analyze(save_model(_top_k_model("values", opaque=True), "left.onnx"), Options(batch=2))
    assert any("with unknown dims" in w and w.endswith("set --dim seq=VALUE") for w in left.warnings), \
        left.warnings  # the model's own dim left at 1, named

"""Arrays a rewrite makes from a shape the file declares (scales, biases, broadcast parameters, folded
constants, mask probes) are checked against the ARRAY_ELEMENTS budget before they are allocated: one
``error:`` line naming the budget, nothing written. Small budgets here (FUSECLI_MAX_ARRAY_ELEMENTS), and the
issue's file (a LayerNorm declaring its last dim 2^31) in a child process capped in memory."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from fusecli.cli import main
from fusecli.core.errors import FuseError
from fusecli.rewrite.graph.fold import channel_vector
from tests.test_hostile import assert_one_error, run_cli

BUDGET = "FUSECLI_MAX_ARRAY_ELEMENTS"


def spelled_layer_norm(width: int, param_shape: list[int]) -> onnx.ModelProto:
    """ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add over x [1, 4, width]; gamma and beta of
    ``param_shape``."""
    inits = [numpy_helper.from_array(np.full(param_shape, 1.5, np.float32), "gamma"),
             numpy_helper.from_array(np.full(param_shape, 0.1, np.float32), "beta"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["mu"], "mean"),
             helper.make_node("Sub", ["x", "mu"], ["d"], "sub"),
             helper.make_node("Pow", ["d", "two"], ["sq"], "pow"),
             helper.make_node("ReduceMean", ["sq", "axes"], ["var"], "var"),
             helper.make_node("Add", ["var", "eps"], ["ve"], "add_eps"),
             helper.make_node("Sqrt", ["ve"], ["sd"], "sqrt"),
             helper.make_node("Div", ["d", "sd"], ["n"], "div"),
             helper.make_node("Mul", ["n", "gamma"], ["g"], "mul"),
             helper.make_node("Add", ["g", "beta"], ["y"], "add")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, width])
    graph = helper.make_graph(nodes, "layer_norm", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def _weight(shape: tuple[int, ...]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.random.default_rng(0).standard_normal(shape).astype(np.float32), "w")


def conv_clip_folded(n: int) -> onnx.ModelProto:
    """Conv -> Clip whose max is ReduceMax(ConstantOfShape([n], 6)): a constant subgraph the emitter
    folds to read the bound, through a tensor of n elements."""
    w = _weight((4, 4, 1, 1))
    count = numpy_helper.from_array(np.array([n], np.int64))
    nodes = [helper.make_node("Constant", [], ["n"], "n", value=count),
             helper.make_node("ConstantOfShape", ["n"], ["big"], "fill",
                              value=numpy_helper.from_array(np.array([6.0], np.float32))),
             helper.make_node("ReduceMax", ["big"], ["hi"], "max", keepdims=0),
             helper.make_node("Conv", ["x", "w"], ["c"], "conv"),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"], "clip")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 3, 3])
    lo = numpy_helper.from_array(np.array(0.0, np.float32), "lo")
    graph = helper.make_graph(nodes, "conv_clip", [x], [y], [w, lo])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def conv_relu_without_bias() -> onnx.ModelProto:
    w = _weight((8, 4, 1, 1))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], "conv"),
             helper.make_node("Relu", ["c"], ["y"], "relu")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 3, 3])
    graph = helper.make_graph(nodes, "conv_relu", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _rewrite(tmp_path, model: onnx.ModelProto, *extra: str):
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, str(src))
    return CliRunner().invoke(main, ["rewrite", str(src), "-o", str(out), *extra]), out


def _refused(r, out, pattern: str) -> None:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("warning:")]
    assert r.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert "internal error" not in lines[0] and f"(raise it with {BUDGET}=N)" in lines[0], lines[0]
    assert pattern in lines[0], lines[0]
    assert not out.exists()


CASES = {  # name: (model, rewrite options, what the error names)
    "scale filled to the declared width": (
        lambda: spelled_layer_norm(64, [16]), ["--no-verify"],
        "the normalization scale made for 'x' of shape [64]"),
    "gamma broadcast to the declared width": (
        lambda: spelled_layer_norm(64, [1]), [],
        "'gamma' broadcast to a full normalization parameter of shape [64]"),
    "folded constant": (
        lambda: conv_clip_folded(64), [], "the constant 'big' (folded for 'hi') of shape [64]"),
    "zero bias for CUDA's FusedConv": (
        conv_relu_without_bias, ["--target", "cuda"], "the zero bias made for 'conv' of shape [8]"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_array_over_the_budget_is_refused_before_it_is_made(tmp_path, monkeypatch, case):
    build, options, named = CASES[case]
    monkeypatch.setenv(BUDGET, "4")
    r, out = _rewrite(tmp_path, build(), *options)
    _refused(r, out, named)


@pytest.mark.parametrize("case", ["gamma broadcast to the declared width", "folded constant",
                                  "zero bias for CUDA's FusedConv"])
def test_within_the_default_budget_the_same_files_are_rewritten(tmp_path, case):
    build, options, _ = CASES[case]
    r, out = _rewrite(tmp_path, build(), *options)
    assert r.exit_code == 0, r.output
    assert out.exists()


def test_a_per_channel_copy_of_a_scalar_is_checked(monkeypatch):
    monkeypatch.setenv(BUDGET, "32")
    assert channel_vector(np.array([2.0], np.float32), 3, 32).shape == (32,)
    with pytest.raises(FuseError, match=rf"a per-channel copy of a scalar of shape \[64\]: .*{BUDGET}"):
        channel_vector(np.array([2.0], np.float32), 3, 64)


@pytest.mark.parametrize("build, named", ids=["layer_norm_scale", "folded_constant"], argvalues=[
    (lambda: spelled_layer_norm(2**31, [16]),
     r"the normalization scale made for 'x' of shape \[2147483648\]"),
    (lambda: conv_clip_folded(2**31), r"the constant 'big' \(folded for 'hi'\) of shape \[2147483648\]"),
])
def test_the_issues_files_end_in_one_line_within_the_memory_cap(tmp_path, build, named):
    """rewrite once tried to allocate 8 GiB (np.full of the declared width; the reference evaluator's
    ConstantOfShape) and ended in 'internal error MemoryError'."""
    src = str(tmp_path / "in.onnx")
    onnx.save(build(), src)
    result = run_cli("rewrite", src, "-o", str(tmp_path / "out.onnx"), "--no-verify")
    assert_one_error(result, named + rf".*over fusecli's budget of 268,435,456 .*{BUDGET}=N")
    assert not (tmp_path / "out.onnx").exists()


def _mask_weights(fold: bool):
    """A mask computed from the shape of a fixed [1, 16] input (and, with ``fold``, a constant subgraph of
    64 elements): what the attention emitters probe with onnxruntime."""
    from fusecli.rewrite.graph.values import Weights

    nodes = [helper.make_node("Shape", ["ids"], ["s"], "shape"),
             helper.make_node("Cast", ["s"], ["m0"], "cast", to=TensorProto.FLOAT)]
    if fold:
        nodes += [helper.make_node("ConstantOfShape", ["n"], ["big"], "fill"),
                  helper.make_node("ReduceMax", ["big"], ["c"], "max", keepdims=0),
                  helper.make_node("Add", ["m0", "c"], ["mask"], "add")]
    else:
        nodes.append(helper.make_node("Identity", ["m0"], ["mask"], "id"))
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 16])
    out = helper.make_tensor_value_info("mask", TensorProto.FLOAT, None)
    n = numpy_helper.from_array(np.array([64], np.int64), "n")
    graph = helper.make_graph(nodes, "mask", [ids], [out], [n])
    return Weights(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))


@pytest.mark.parametrize("fold, named", [(False, r"the mask probe's input 'ids' of shape \[1, 16\]"),
                                         (True, r"the constant 'big' \(folded for 'c'\) of shape \[64\]")])
def test_a_mask_probe_over_the_budget_is_refused_not_taken_for_a_reason(monkeypatch, fold, named):
    """A mask's probe inputs and its folded constants: over the budget, the rewrite is refused (an
    OverBudget is not one more reason the mask is not causal)."""
    from fusecli.core.errors import OverBudget
    from fusecli.rewrite.kernels.mask_band import causal_window

    monkeypatch.setenv(BUDGET, "8")
    with pytest.raises(OverBudget, match=named + rf".*{BUDGET}=N"):
        causal_window(_mask_weights(fold), "mask", "add")
    monkeypatch.delenv(BUDGET)
    assert isinstance(causal_window(_mask_weights(fold), "mask", "add"), str)  # within it: a reason, no error

"""One small model per kernel: what the rewrite emits on each target and mode; it computes the same."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fusecli.rewrite import RewriteOptions, rewrite
from tests.builders import Net
from tests.rewrite.helpers import assert_cuda_kernels_only, assert_same_outputs, attr, init, nodes, ops


def _rewrite(save_model, model, target="cpu", mode="inference", **kw):
    path = save_model(model)
    r = rewrite(path, RewriteOptions(target=target, mode=mode, batch=2, **kw))
    assert r.verification.ok if not r.unchanged else r.verification is None and not r.applied
    assert_same_outputs(path, r.model, dims=kw.get("dims"))
    if target == "cuda":
        assert_cuda_kernels_only(r.model)
    return r


# -- --target cuda never emits a kernel the CUDA provider lacks ---------------------------------------
def _gemm_relu() -> onnx.ModelProto:
    net = Net(x=("N", 16))
    y = net.op("Gemm", "gemm", "x", net.param("w", 8, 16), net.param("b", 8), transB=1)
    return net.model(net.op("Relu", "relu", y))


def test_gemm_relu_cuda_keeps_gemm_and_relu(save_model):
    r = _rewrite(save_model, _gemm_relu(), "cuda")
    assert ops(r.model) == {"Gemm": 1, "Relu": 1} and r.applied == []


def test_gemm_relu_cpu_is_fused_gemm_with_gemm_attributes(save_model):
    r = _rewrite(save_model, _gemm_relu(), "cpu")
    assert ops(r.model) == {"com.microsoft.FusedGemm": 1}
    (g,) = nodes(r.model, "FusedGemm")
    assert attr(g, "activation") == "Relu" and attr(g, "transB") == 1


def _conv_bias_act(act: str, **attrs) -> onnx.ModelProto:
    net = Net()
    y = net.bias(net.conv(), (4, 1, 1))
    if act == "Clip":
        return net.model(net.op("Clip", "act", y, net.param("lo", value=0.0), net.param("hi", value=6.0)))
    return net.model(net.op(act, "act", y, **attrs))


@pytest.mark.parametrize("act,attrs", [("LeakyRelu", {"alpha": 0.1}), ("Sigmoid", {}), ("Tanh", {}),
                                       ("Clip", {}), ("HardSigmoid", {})])
def test_cuda_conv_takes_relu_only(save_model, act, attrs):
    """CUDA: no FusedConv for other activations; the bias still folds into the Conv, the activation stays."""
    r = _rewrite(save_model, _conv_bias_act(act, **attrs), "cuda")
    assert "com.microsoft.FusedConv" not in ops(r.model)
    assert ops(r.model) == {"Conv": 1, act: 1}
    assert len(nodes(r.model, "Conv")[0].input) == 3


@pytest.mark.parametrize("act,attrs,params", [("LeakyRelu", {"alpha": 0.1}, [0.1]), ("Sigmoid", {}, None),
                                              ("Tanh", {}, None), ("Clip", {}, [0.0, 6.0]),
                                              ("Relu", {}, None)])
def test_cpu_conv_activations(save_model, act, attrs, params):
    r = _rewrite(save_model, _conv_bias_act(act, **attrs), "cpu")
    assert ops(r.model) == {"com.microsoft.FusedConv": 1}
    (fc,) = nodes(r.model, "FusedConv")
    assert attr(fc, "activation") == act
    if params:
        np.testing.assert_allclose(attr(fc, "activation_params"), params, rtol=1e-6)


def test_hard_sigmoid_becomes_a_cpu_fused_conv(save_model):
    """FusedConv's CPU kernel has HardSigmoid (alpha, beta as activation_params)."""
    r = _rewrite(save_model, _conv_bias_act("HardSigmoid"), "cpu")
    assert ops(r.model) == {"com.microsoft.FusedConv": 1}
    (fc,) = nodes(r.model, "FusedConv")
    assert attr(fc, "activation") == "HardSigmoid"


def test_cuda_relu_conv_without_bias_gets_a_zero_bias(save_model):
    net = Net()
    r = _rewrite(save_model, net.model(net.op("Relu", "relu", net.conv())), "cuda")
    (fc,) = nodes(r.model, "FusedConv")
    assert len(fc.input) == 3 and not init(r.model, fc.input[2]).any()


# -- BatchNorm folding -------------------------------------------------------------------------------
def test_keras3_decomposed_batch_norm_folds_for_inference_only(save_model):
    """Conv -> x * scale + shift (per channel, as Keras 3 exports BatchNorm) -> ReLU."""
    net = Net()
    y = net.op("Mul", "bn_mul", net.conv(), net.param("bn_s", 1, 4, 1, 1))
    y = net.op("Add", "bn_add", y, net.param("bn_t", 1, 4, 1, 1))
    model = net.model(net.op("Relu", "relu", y))
    r = _rewrite(save_model, model, "cpu", "inference")
    assert ops(r.model) == {"com.microsoft.FusedConv": 1}
    (fc,) = nodes(r.model, "FusedConv")
    w, s, t = (init(model, n) for n in ("conv_w", "bn_s", "bn_t"))
    np.testing.assert_allclose(init(r.model, fc.input[1]), w * s.reshape(4, 1, 1, 1), rtol=1e-6)
    np.testing.assert_allclose(init(r.model, fc.input[2]), t.reshape(4), rtol=1e-6)
    r = _rewrite(save_model, model, "cpu", "training")
    assert ops(r.model) == ops(model)


def test_batch_norm_then_residual_add_relu_takes_two_passes(save_model):
    """Pass 1 folds BN into the Conv; pass 2 sees Conv + Add(z) + ReLU and makes FusedConv with Z."""
    net = Net(x=("N", 4, 8, 8))
    y = net.bn(net.conv("x", cin=4))
    model = net.model(net.op("Relu", "relu", net.op("Add", "add", y, "x")))
    r = _rewrite(save_model, model, "cpu")
    assert r.passes == 2 and ops(r.model) == {"com.microsoft.FusedConv": 1}
    (fc,) = nodes(r.model, "FusedConv")
    assert list(fc.input)[0] == "x" and list(fc.input)[3] == "x"


def test_shared_weight_is_not_changed_for_the_other_conv(save_model):
    net = Net()
    w = net.param("w", 4, 3, 3, 3)
    a = net.op("BatchNormalization", "bn", net.op("Conv", "conv_a", "x", w, pads=[1] * 4),
               *(net.param(f"bn_{k}", 4, positive=k == "var") for k in ("scale", "shift", "mean", "var")))
    b = net.op("Conv", "conv_b", "x", w, pads=[1] * 4)
    model = net.model(a, b)
    r = _rewrite(save_model, model)
    conv_b = next(n for n in r.model.graph.node if n.output[0] == b)
    assert conv_b.input[1] == "w"
    np.testing.assert_array_equal(init(r.model, "w"), init(model, "w"))


def test_constant_of_shape_weights_are_folded_where_needed(save_model):
    """Weights made by ConstantOfShape (as the zoo models do) are computed, folded, and the nodes dropped."""
    net = Net()
    shape = net.ints("w_shape", 4, 3, 3, 3)
    net.nodes.append(helper.make_node("ConstantOfShape", [shape], ["w"], "make_w",
                                      value=numpy_helper.from_array(np.array([0.05], np.float32))))
    y = net.bn(net.op("Conv", "conv", "x", "w", pads=[1] * 4))
    r = _rewrite(save_model, net.model(net.op("Relu", "relu", y)))
    assert ops(r.model) == {"com.microsoft.FusedConv": 1} and r.folded_constants == 1
    assert not any(t.name == "w_shape" for t in r.model.graph.initializer)


def test_patterns_option_limits_the_rewrite(sample):
    r = rewrite(sample("conv_bn_relu"), RewriteOptions(patterns=("conv_bn",), batch=2))
    assert r.verification.ok and ops(r.model) == {"Conv": 1, "Relu": 1}


# -- MatMul scale, GELU, LayerNorm, SkipLayerNorm -------------------------------------------------------
@pytest.mark.parametrize("form", ["mul_after", "div_after", "scale_a", "scale_b"])
def test_matmul_scale_is_fused_matmul(save_model, form):
    net = Net(a=("N", 2, 5, 8), b=("N", 2, 8, 6))
    c = net.param("c", value=8.0 if form == "div_after" else 0.125)
    if form == "mul_after":
        y = net.op("Mul", "scale", net.op("MatMul", "mm", "a", "b"), c)
    elif form == "div_after":
        y = net.op("Div", "scale", net.op("MatMul", "mm", "a", "b"), c)
    elif form == "scale_a":
        y = net.op("MatMul", "mm", net.op("Mul", "scale", "a", c), "b")
    else:
        y = net.op("MatMul", "mm", "a", net.op("Mul", "scale", c, "b"))
    for target in ("cpu", "cuda"):
        r = _rewrite(save_model, net.model(y), target)
        assert ops(r.model) == {"com.microsoft.FusedMatMul": 1}
        (fm,) = nodes(r.model, "FusedMatMul")
        assert list(fm.input) == ["a", "b"] and attr(fm, "alpha") == pytest.approx(0.125)


def test_matmul_transpose_is_fused_matmul_trans_b(save_model):
    """x @ Transpose(w[e]) (a MoE expert's weight selected at run time) -> FusedMatMul(x, w[e], transB=1)."""
    net = Net(x=("N", 5, 8))
    experts = net.param("experts", 4, 6, 8)
    net.inits.append(numpy_helper.from_array(np.array(2, np.int64), "e"))  # a scalar index: a select
    w = net.op("Gather", "select", experts, "e", axis=0)
    y = net.op("MatMul", "mm", "x", net.op("Transpose", "t", w, perm=[1, 0]))
    for target in ("cpu", "cuda"):
        r = _rewrite(save_model, net.model(y), target)
        (fm,) = nodes(r.model, "FusedMatMul")
        assert list(fm.input) == ["x", w] and attr(fm, "transB") == 1
        assert not nodes(r.model, "Transpose")  # read in place, then pruned


def _gelu(net: Net, x: str, tanh: bool) -> str:
    if tanh:
        cube = net.op("Pow", "cube", x, net.param("three", value=3.0))
        inner = net.op("Add", "inner", x, net.op("Mul", "k", cube, net.param("c", value=0.044715)))
        t = net.op("Tanh", "tanh", net.op("Mul", "s", inner, net.param("sq", value=math.sqrt(2 / math.pi))))
        one_plus = net.op("Add", "one_plus", t, net.param("one", value=1.0))
    else:
        e = net.op("Erf", "erf", net.op("Div", "div", x, net.param("sqrt2", value=math.sqrt(2))))
        one_plus = net.op("Add", "one_plus", e, net.param("one", value=1.0))
    return net.op("Mul", "gelu", net.op("Mul", "half_x", x, net.param("half", value=0.5)), one_plus)


@pytest.mark.parametrize("tanh", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gelu_forms(save_model, tanh, with_bias):
    net = Net(x=("N", 5, 16))
    x = net.bias("x", (16,)) if with_bias else "x"
    model = net.model(_gelu(net, x, tanh))
    op = "FastGelu" if tanh else ("BiasGelu" if with_bias else "Gelu")
    for target in ("cpu", "cuda"):
        for mode in ("inference", "training"):
            r = _rewrite(save_model, model, target, mode)
            assert ops(r.model) == {f"com.microsoft.{op}": 1}
            assert len(r.model.graph.node[0].input) == (2 if with_bias else 1)


def _layer_norm(net: Net, x: str, affine: bool = True) -> str:
    mean = net.op("ReduceMean", "mean", x, axes=[-1])
    d = net.op("Sub", "d", x, mean)
    var = net.op("ReduceMean", "var", net.op("Pow", "sq", d, net.param("two", value=2.0)), axes=[-1])
    std = net.op("Sqrt", "std", net.op("Add", "eps_add", var, net.param("eps", value=1e-5)))
    y = net.op("Div", "normalize", d, std)
    if affine:
        y = net.op("Mul", "gamma_mul", y, net.param("gamma", 16))
        y = net.op("Add", "beta_add", y, net.param("beta", 16))
    return y


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(save_model, opset, affine):
    """ONNX's LayerNormalization from opset 17; below that, onnxruntime's own op of the same name."""
    net = Net(x=("N", 5, 16))
    model = net.model(_layer_norm(net, "x", affine), opset=opset)
    if opset < 17:  # ReduceMean's axes stay an attribute until opset 18
        assert model.opset_import[0].version == opset
    r = _rewrite(save_model, model)
    assert ops(r.model) == {"LayerNormalization": 1}
    (ln,) = nodes(r.model, "LayerNormalization")
    assert attr(ln, "axis") == -1 and attr(ln, "epsilon") == pytest.approx(1e-5)
    assert len(ln.input) == (3 if affine else 2)


def test_skip_layer_norm_absorbs_the_dense_bias(save_model):
    """LayerNorm(x @ w + b + residual): SkipLayerNormalization(input, skip, gamma, beta, bias)."""
    net = Net(x=("N", 5, 16))
    dense = net.bias(net.op("MatMul", "dense", "x", net.param("w", 16, 16)), (16,), "dense_bias")
    y = _layer_norm(net, net.op("Add", "residual", dense, "x"))
    for target in ("cpu", "cuda"):
        r = _rewrite(save_model, net.model(y), target)
        assert ops(r.model) == {"MatMul": 1, "com.microsoft.SkipLayerNormalization": 1}
        (sk,) = nodes(r.model, "SkipLayerNormalization")
        assert len(sk.input) == 5 and sk.input[4] == "dense_bias_b"


def test_skip_layer_norm_op_form(save_model):
    """Add + ONNX LayerNormalization (what opset-17 exports write) with a (1, S, H) skip."""
    net = Net(x=("N", 5, 16), pos=(1, 5, 16))
    y = net.op("LayerNormalization", "ln", net.op("Add", "add", "x", "pos"), net.param("g", 16),
               net.param("b", 16), epsilon=1e-6)
    r = _rewrite(save_model, net.model(y))
    assert ops(r.model) == {"com.microsoft.SkipLayerNormalization": 1}
    (sk,) = nodes(r.model, "SkipLayerNormalization")
    assert list(sk.input[:2]) == ["x", "pos"] and attr(sk, "epsilon") == pytest.approx(1e-6)


def test_non_float32_is_left_alone(save_model):
    """The contrib kernels are emitted for float32 only: a float64 MatMul * alpha stays as it is."""
    c = numpy_helper.from_array(np.array(0.125), "c")
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["m"], "mm"),
                               helper.make_node("Mul", ["m", "c"], ["y"], "scale")], "g",
                              [helper.make_tensor_value_info(n, TensorProto.DOUBLE, ["N", 4, 4])
                               for n in "ab"],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)], [c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    r = rewrite(save_model(model), RewriteOptions(batch=2))
    assert r.unchanged and r.verification is None and ops(r.model) == {"MatMul": 1, "Mul": 1}

"""The matmul family: each pattern on a small model that has it."""

from __future__ import annotations

import pytest

from fusecli.rewrite import RewriteOptions, rewrite
from tests.fusion.families.cover import assert_matches
from tests.fusion.models import Net, analyze_model, found, only
from tests.rewrite.helpers import assert_same_outputs, ops


def _matmul(then: str):
    net = Net(x=("N", 8))
    y = net.op("MatMul", "mm", "x", net.param("w", 8, 16))
    if then == "scale":
        return net.model(net.op("Mul", "scale", y, net.param("alpha", value=0.5)))
    y = net.bias(y, shape=(16,))
    return net.model(net.act("Relu", y) if then == "act" else y)


def _layer_scale(scale_shape=(16,), x=("N", 5, 8)):
    """ConvNeXt's / BEiT's layer scale: (x @ w + b) * gamma, gamma per output column."""
    net = Net(x=x)
    y = net.bias(net.op("MatMul", "mm", "x", net.param("w", 8, 16)), shape=(16,))
    return net.model(net.op("Mul", "scale", y, net.param("gamma", *scale_shape)))


def _matmul_transpose():
    net = Net(x=("N", 8))
    return net.model(net.op("MatMul", "mm", "x", net.op("Transpose", "t", net.param("w", 6, 8), perm=[1, 0])))


GRAPHS = {
    "matmul_bias_scale": _layer_scale,
    "matmul_bias_act": lambda: _matmul("act"),
    "matmul_bias": lambda: _matmul("bias"),
    "matmul_scale": lambda: _matmul("scale"),
    "matmul_transpose": _matmul_transpose,
}


@pytest.mark.parametrize("name", GRAPHS)
def test_each_pattern_matches_its_graph(tmp_path, name):
    assert_matches(GRAPHS[name], name, tmp_path)


@pytest.mark.parametrize("shape, hit", [((16,), True), ((1, 1, 16), True), ((5, 1), False)])
def test_layer_scale_is_per_output_column(tmp_path, shape, hit):
    a = analyze_model(_layer_scale(shape), tmp_path)
    assert found(a, "matmul_bias_scale") == ([["mm", "bias", "scale"]] if hit else [])
    if hit:
        assert only(a, "matmul_bias_scale").verdict.state == "inference only"  # dg reads x @ w + b


@pytest.mark.parametrize("x", [("N", 5, 8), ("N", 8)])
def test_layer_scale_folded_into_the_weights_agrees_with_onnxruntime(save_model, x):
    path = save_model(_layer_scale(x=x))
    r = rewrite(path, RewriteOptions(batch=2))
    assert r.verification.ok and [a.pattern for a in r.applied][0] == "matmul_bias_scale"
    assert "Mul" not in ops(r.model)  # 2-D: the MatMul + Add become a Gemm in the next pass
    assert_same_outputs(path, r.model)
    training = rewrite(path, RewriteOptions(batch=2, mode="training"))
    assert "matmul_bias_scale" not in [a.pattern for a in training.applied]  # dg reads x @ w + b

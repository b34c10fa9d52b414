"""The matmul family: each pattern on a small model that has it."""

from __future__ import annotations

import pytest

from tests.fusion.families.cover import assert_matches
from tests.fusion.models import Net


def _matmul(then: str):
    net = Net(x=("N", 8))
    y = net.op("MatMul", "mm", "x", net.param("w", 8, 16))
    if then == "scale":
        return net.model(net.op("Mul", "scale", y, net.param("alpha", value=0.5)))
    y = net.bias(y, shape=(16,))
    return net.model(net.act("Relu", y) if then == "act" else y)


def _matmul_transpose():
    net = Net(x=("N", 8))
    return net.model(net.op("MatMul", "mm", "x", net.op("Transpose", "t", net.param("w", 6, 8), perm=[1, 0])))


GRAPHS = {
    "matmul_bias_act": lambda: _matmul("act"),
    "matmul_bias": lambda: _matmul("bias"),
    "matmul_scale": lambda: _matmul("scale"),
    "matmul_transpose": _matmul_transpose,
}


@pytest.mark.parametrize("name", GRAPHS)
def test_each_pattern_matches_its_graph(tmp_path, name):
    assert_matches(GRAPHS[name], name, tmp_path)

"""The conv family: each pattern on a small model that has it."""

from __future__ import annotations

import pytest

from tests.fusion.families.cover import assert_matches
from tests.fusion.models import Net, conv_act, conv_bn_act, conv_squeeze


def _conv_bias_add_act():
    net = Net(x=("N", 3, 8, 8), z=("N", 4, 8, 8))
    return net.model(net.act("Relu", net.op("Add", "res", net.bias(net.conv()), "z")))


def _conv_bias_bn(act: str | None):
    net = Net()
    y = net.bn(net.bias(net.conv()))
    return net.model(net.act(act, y) if act else y)


def _bn(add: bool):
    net = Net(x=("N", 3, 8, 8), z=("N", 3, 8, 8))
    y = net.bn("x", c=3)
    return net.model(net.act("Relu", net.op("Add", "res", y, "z") if add else y))


def _conv_mul():
    net = Net()
    return net.model(net.op("Mul", "scale", net.conv(own_bias=True), net.param("s", 1, 4, 1, 1)))


def _conv_bias():
    net = Net()
    return net.model(net.bias(net.conv()))


GRAPHS = {
    "conv_bias_add_act": _conv_bias_add_act,
    "conv_bias_act": lambda: conv_act("Relu", "add"),
    "conv_bias": _conv_bias,
    "conv_bias_bn_act": lambda: _conv_bias_bn("Relu"),
    "conv_bias_bn": lambda: _conv_bias_bn(None),
    "conv_bn_act": lambda: conv_bn_act("op"),
    "conv_bn": lambda: conv_bn_act("op", act=None),
    "bn_add_act": lambda: _bn(add=True),
    "bn_act": lambda: _bn(add=False),
    "conv_mul": _conv_mul,
    "conv_squeeze_bias": lambda: conv_squeeze("bias"),
}


@pytest.mark.parametrize("name", GRAPHS)
def test_each_pattern_matches_its_graph(tmp_path, name):
    assert_matches(GRAPHS[name], name, tmp_path)

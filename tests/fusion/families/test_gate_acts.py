"""The gate_acts family: each pattern on a small model that has it."""

from __future__ import annotations

import pytest

from tests.fusion.families.cover import assert_matches
from tests.fusion.models import Net
from tests.transformer_graphs import llama_block


def _silu():
    net = Net(x=("N", 16))
    return net.model(net.op("Mul", "silu", "x", net.op("Sigmoid", "sig", "x")))


def _hard_swish():
    net = Net(x=("N", 16))
    return net.model(net.op("Mul", "hs", "x", net.op("HardSigmoid", "gate", "x", alpha=1 / 6, beta=0.5)))


GRAPHS = {"swiglu": llama_block, "silu": _silu, "hard_swish": _hard_swish}


@pytest.mark.parametrize("name", GRAPHS)
def test_each_pattern_matches_its_graph(tmp_path, name):
    assert_matches(GRAPHS[name], name, tmp_path, run=name != "swiglu")

"""The epilogues family: each pattern on a small model that has it."""

from __future__ import annotations

import pytest

from tests.fusion.families.cover import assert_matches
from tests.fusion.models import Net


def _bias_softmax():
    net = Net(x=("N", 4, 16))
    return net.model(net.op("Softmax", "sm", net.op("Add", "mask_add", "x", net.param("mask", 1, 4, 16)),
                            axis=-1))


def _bias_dropout():
    net = Net(x=("N", 4, 16), z=("N", 4, 16))
    d = net.op("Dropout", "drop", net.op("Add", "bias", "x", net.param("b", 16)))
    return net.model(net.op("Add", "res", d, "z"))


GRAPHS = {"bias_softmax": _bias_softmax, "bias_dropout": _bias_dropout}


@pytest.mark.parametrize("name", GRAPHS)
def test_each_pattern_matches_its_graph(tmp_path, name):
    assert_matches(GRAPHS[name], name, tmp_path)

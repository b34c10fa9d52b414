"""The backward family: each pattern on the joint graph of a small model whose backward has it."""

from __future__ import annotations

import pytest

from tests.fusion.families.cover import assert_matches
from tests.fusion.models import conv_act, conv_bn_act

GRAPHS = {"relu_grad_bias_grad": lambda: conv_act("Relu", "add"), "bn_grad_relu_grad": conv_bn_act}


@pytest.mark.parametrize("name", GRAPHS)
def test_each_pattern_matches_its_graph(tmp_path, name):
    assert_matches(GRAPHS[name], name, tmp_path)

"""The gelu family: each pattern on a small model that has it."""

from __future__ import annotations

import pytest

from tests.fusion.families.cover import assert_matches
from tests.fusion.models import gelu_erf
from tests.rewrite.test_peer_graphs import fast_gelu_mlp

GRAPHS = {"matmul_fast_gelu": fast_gelu_mlp, "bias_gelu": lambda: gelu_erf(bias=True), "gelu": gelu_erf}


@pytest.mark.parametrize("name", GRAPHS)
def test_each_pattern_matches_its_graph(tmp_path, name):
    assert_matches(GRAPHS[name], name, tmp_path)

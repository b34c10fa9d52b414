"""The gelu family: each pattern on a small model that has it."""

from __future__ import annotations

import pytest

from tests.fusion.families.cover import assert_matches
from tests.fusion.models import gelu_erf

GRAPHS = {"bias_gelu": lambda: gelu_erf(bias=True), "gelu": gelu_erf}


@pytest.mark.parametrize("name", GRAPHS)
def test_each_pattern_matches_its_graph(tmp_path, name):
    assert_matches(GRAPHS[name], name, tmp_path)

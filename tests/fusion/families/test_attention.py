"""The attention family: its pattern on a hand-built Llama block (sdpa's decomposition)."""

from __future__ import annotations

import pytest

from tests.fusion.families.cover import assert_matches
from tests.transformer_graphs import llama_block

GRAPHS = {"attention": llama_block}


@pytest.mark.parametrize("name", GRAPHS)
def test_each_pattern_matches_its_graph(tmp_path, name):
    assert_matches(GRAPHS[name], name, tmp_path, run=False)

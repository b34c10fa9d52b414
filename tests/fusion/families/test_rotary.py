"""The rotary family: its pattern on q rotated as transformers' apply_rotary_pos_emb does."""

from __future__ import annotations

import pytest

from tests.fusion.families.cover import assert_matches
from tests.transformer_graphs import rotary_model

GRAPHS = {"rotary": rotary_model}


@pytest.mark.parametrize("name", GRAPHS)
def test_each_pattern_matches_its_graph(tmp_path, name):
    assert_matches(GRAPHS[name], name, tmp_path, run=False)

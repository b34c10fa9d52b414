"""The layer_norm family: each pattern on a small model that has it."""

from __future__ import annotations

import pytest

from tests.fusion.families.cover import assert_matches
from tests.fusion.models import layer_norm
from tests.rewrite.test_peer_graphs import embedding_model

GRAPHS = {"embed_layer_norm": embedding_model, "skip_layer_norm": lambda: layer_norm(skip="add"),
          "layer_norm": layer_norm}
NOT_RUN = {"embed_layer_norm"}  # int64 ids: the random float feeds cannot fill them


@pytest.mark.parametrize("name", GRAPHS)
def test_each_pattern_matches_its_graph(tmp_path, name):
    assert_matches(GRAPHS[name], name, tmp_path, run=name not in NOT_RUN)

"""A region whose cut-out says the rest of the graph would read a tensor nothing makes any more is left
out of the pass (said and counted); the others stay with their cases."""

from __future__ import annotations

from types import SimpleNamespace

from fusecli.rewrite.run import _drop_miswired


def test_miswired_emission_is_left_out_said_and_counted():
    good, bad = SimpleNamespace(pattern="gelu", at="n1"), SimpleNamespace(pattern="skip_layer_norm", at="n2")
    skipped: list[str] = []
    left_out: list[str] = []
    kept, cases = _drop_miswired([good, bad], ["case-1", "wiring: x drops 't', which other nodes read"],
                                 skipped, left_out)
    assert kept == [good] and cases == ["case-1"]
    assert skipped == left_out == ["skip_layer_norm at n2: x drops 't', which other nodes read"]
    _drop_miswired([bad], ["wiring: x drops 't', which other nodes read"], skipped, left_out)
    assert len(left_out) == 1  # a later pass meeting the same region says it once


def test_uncut_but_not_miswired_regions_stay():
    e = SimpleNamespace(pattern="attention", at="n3")
    kept, cases = _drop_miswired([e], ["a node with a subgraph"], None, None)
    assert kept == [e] and cases == ["a node with a subgraph"]

"""Issue 27: what "if every recomputable fusion is taken" counts. A recompute that keeps at least as many
bytes as it frees is left out, so the total never exceeds today's saved bytes; recomputes that share
what they keep (one attention mask read by every layer) are taken together when together they free."""

from __future__ import annotations

from types import SimpleNamespace

from fusecli.fusion.recompute import Recompute, recompute_all, saved_if_recomputed


def _live(**saved: int) -> SimpleNamespace:
    by_name = {n: SimpleNamespace(bytes=b) for n, b in saved.items()}
    return SimpleNamespace(saved_bytes=sum(saved.values()), saved_by_name=by_name)


def _match(freed: list[str], freed_bytes: int, kept: dict[str, int]) -> SimpleNamespace:
    rc = Recompute(freed, 10, freed_bytes, sum(kept.values()), list(kept), "r", dict(kept))
    return SimpleNamespace(verdict=SimpleNamespace(recompute=rc))


def test_net_bytes_and_frees_nothing():
    rc = _match(["p"], 100, {"q": 300}).verdict.recompute
    assert rc.net_bytes_freed == -200 and rc.frees_nothing
    assert rc.to_json()["net_bytes_freed"] == -200
    even = _match(["p"], 100, {"q": 100}).verdict.recompute
    assert even.net_bytes_freed == 0 and even.frees_nothing
    good = _match(["p"], 100, {"s": 4}).verdict.recompute
    assert good.net_bytes_freed == 96 and not good.frees_nothing
    unknown = Recompute(["p"], None, None, 4)
    assert unknown.net_bytes_freed is None and not unknown.frees_nothing


def test_a_recompute_that_keeps_more_than_it_frees_is_not_taken():
    live = _live(p=100, other=1000)
    r = recompute_all([_match(["p"], 100, {"q": 300})], live)
    assert r.saved_bytes == live.saved_bytes and r.taken == 0 and r.recomputable == 1
    assert saved_if_recomputed([_match(["p"], 100, {"q": 300})], live) <= live.saved_bytes


def test_only_the_recomputes_that_free_are_taken():
    live = _live(p1=100, p2=100, other=1000)
    matches = [_match(["p1"], 100, {"s1": 4}), _match(["p2"], 100, {"q": 300})]
    r = recompute_all(matches, live)
    assert r.saved_bytes == live.saved_bytes - 96 and r.taken == 1 and r.recomputable == 2


def test_a_shared_kept_input_pays_off_together():
    """Each layer alone keeps the mask (150 B) to free its P (100 B); four layers keep it once."""
    live = _live(p0=100, p1=100, p2=100, p3=100, other=1000)
    matches = [_match([f"p{i}"], 100, {"mask": 150}) for i in range(4)]
    assert all(m.verdict.recompute.frees_nothing for m in matches)
    r = recompute_all(matches, live)
    assert r.saved_bytes == live.saved_bytes - 400 + 150 and r.taken == 4


def test_a_kept_name_saved_today_costs_nothing_and_a_freed_one_kept_by_another_stays():
    live = _live(p=100, x=50, other=1000)
    # the second keeps p, which the first frees: p stays saved, only x leaves
    matches = [_match(["p"], 100, {"x": 50}), _match(["x"], 50, {"p": 100})]
    r = recompute_all(matches, live)
    assert r.saved_bytes <= live.saved_bytes
    assert recompute_all([_match(["p"], 100, {"x": 50})], live).saved_bytes == live.saved_bytes - 100


def test_an_unknown_kept_size_makes_the_total_unknown():
    live = _live(p=100, other=1000)
    rc = Recompute(["p"], 10, 100, None, ["q"], "r", {"q": None})
    assert recompute_all([SimpleNamespace(verdict=SimpleNamespace(recompute=rc))], live).saved_bytes is None

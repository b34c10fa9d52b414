"""The peak formula's candidate steps: the rows no other row bounds, found a block at a time."""

from __future__ import annotations

from math import prod

import numpy as np
import pytest

from fusecli.memory.formulas import PARETO_BLOCK, _distinct, _pareto_front, candidate_steps, fold_opaque


def brute_front(rows: np.ndarray) -> set[tuple[int, ...]]:
    """Rows that no other (different) row bounds coefficient by coefficient, by comparing every pair."""
    out = set()
    for i, r in enumerate(rows):
        if not any(j != i and np.all(o >= r) for j, o in enumerate(rows)):
            out.add(tuple(r.tolist()))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_the_front_is_every_row_no_other_bounds(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 4 * PARETO_BLOCK))  # one block, a few, a partial last one
    k = int(rng.integers(1, 6))
    rows = _distinct(rng.integers(-4, 5, size=(n, k)))
    front = _pareto_front(rows)
    got = [tuple(r.tolist()) for r in front]
    assert len(got) == len(set(got)) and set(got) == brute_front(rows)
    totals = [sum(r) for r in got]
    assert totals == sorted(totals, reverse=True)


def test_distinct_rows_are_numpys_unique_rows():
    rng = np.random.default_rng(7)
    for _ in range(50):
        rows = rng.integers(-3, 4, size=(int(rng.integers(1, 60)), int(rng.integers(1, 5))))
        assert np.array_equal(_distinct(rows), np.unique(rows, axis=0))


@pytest.mark.parametrize("seed", range(10))
def test_the_front_is_exact_past_int64(seed):
    """Python-int rows (object dtype, what peak_formula uses past int64) give the same front, exactly: a
    unit of 2^70 plus small offsets, which float rounding or int64 would merge or wrap."""
    rng = np.random.default_rng(seed)
    small = _distinct(rng.integers(-4, 5, size=(int(rng.integers(1, 3 * PARETO_BLOCK)), 3)))
    big = np.array([[int(c) * 2**70 + int(c) for c in r] for r in small.tolist()], dtype=object)
    got = {tuple(r.tolist()) for r in _pareto_front(_distinct(big))}
    want = {tuple(int(c) * 2**70 + int(c) for c in r) for r in brute_front(small)}
    assert got == want


MONOMIALS = [(), (("batch", 1),), (("seq", 1),), (("batch", 1), ("seq", 1)), (("batch", 1), ("seq", 2))]


def _value(row, dims) -> int:
    return sum(int(c) * prod(dims[s] ** e for s, e in m) for c, m in zip(row, MONOMIALS, strict=True))


@pytest.mark.parametrize("seed", range(20))
def test_candidate_steps_give_the_exact_peak_at_every_size(seed):
    """max over the candidates == max over every step, at sizes >= 1; no candidate is bounded at every
    size by another (checked on a grid), and the candidates are a subset of the coefficient-wise front."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(-50, 200, size=(int(rng.integers(1, 3 * PARETO_BLOCK)), len(MONOMIALS)))
    got = candidate_steps(rows, MONOMIALS, int(np.abs(rows).sum()))
    grid = [{"batch": b, "seq": s} for b in (1, 2, 3, 8) for s in (1, 2, 5, 64)]
    for dims in grid:
        assert max(_value(r, dims) for r in got) == max(_value(r, dims) for r in rows)
    assert {tuple(r.tolist()) for r in got} <= brute_front(_distinct(rows))


def test_a_step_below_another_at_every_size_from_1_is_dropped():
    """18285408 + 58513408*N is below 18284800 + 58519552*N for every N >= 1 (not coefficient-wise)."""
    rows = np.array([[18284800, 58519552], [18285408, 58513408]])
    got = candidate_steps(rows, [(), (("N", 1),)], int(rows.sum()))
    assert [r.tolist() for r in got] == [[18284800, 58519552]]


def test_opaque_dims_of_one_value_fold_into_one_term():
    """Issue 27: Wav2Vec2's ~40 unkN dims, all 31 frames, are one term for people; others stay apart."""
    texts = {"saved_bytes": "48 + 4*batch*unk1 + 4*batch*unk2 + 8*batch*unk10 + 2*unk3 + 4*seq",
             "peak_bytes": "4*batch*unk2 + unk3 + 4 + unknown (2 tensors of unknown size)"}
    opaque = {"unk1": 31, "unk2": 31, "unk10": 31, "unk3": 7}
    folded, notes = fold_opaque(texts, opaque)
    assert folded == {"saved_bytes": "48 + 4*seq + 2*unk3 + 16*batch*unk_31",
                      "peak_bytes": "4 + unk3 + 4*batch*unk_31 + unknown (2 tensors of unknown size)"}
    assert notes == ["unk_31: 3 inner dims of 31 here (unk1, ..., unk10; --json: each)"]
    assert fold_opaque({"x": "4*unk1 + 4*unk3"}, opaque) == ({"x": "4*unk1 + 4*unk3"}, [])
    assert fold_opaque({"x": "max(1, 2)"}, opaque) == ({"x": "max(1, 2)"}, [])

"""The peak formula's candidate steps: the rows no other row bounds, found a block at a time."""

from __future__ import annotations

import numpy as np
import pytest

from fusecli.memory import PARETO_BLOCK, _distinct, _pareto_front


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

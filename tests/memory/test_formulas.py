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


# --- empty and all-unknown sets: no monomial at all ------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.int64, object])
@pytest.mark.parametrize("steps", [0, 1, 3])
def test_rows_without_a_monomial(dtype, steps):
    """Every tensor unsized and nothing resident: each step's polynomial is the empty row (zero)."""
    rows = np.zeros((steps, 0), dtype=dtype)
    assert _distinct(rows).shape == (min(steps, 1), 0)
    if steps:
        assert [r.tolist() for r in candidate_steps(rows, [], 0)] == [[]]


def _strict_json(text: str) -> dict:
    """json.loads refusing NaN and Infinity (not JSON)."""
    import json

    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _malformed(name: str):
    """Small malformed graphs whose tensors are all unsized, or that keep nothing for backward."""
    from onnx import TensorProto, helper

    def model(nodes, inputs, outputs):
        graph = helper.make_graph(nodes, name, inputs, outputs)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)

    def t(n, elem=TensorProto.FLOAT, shape=None):
        return helper.make_tensor_value_info(n, elem, shape)

    mish = [helper.make_node("Mish", ["x"] * 5, ["a", "b", "c"], "mish"),
            helper.make_node("Gemm", ["a", "b"], ["y"], "gemm")]
    relus = [helper.make_node("Relu", ["x"], ["a"], "r"), helper.make_node("Sigmoid", ["a"], ["b"], "s"),
             helper.make_node("Mul", ["a", "b"], ["y"], "m")]
    return {
        "mish_bool_unsized": lambda: model(mish, [t("x", TensorProto.BOOL)], [t("y")]),
        "mish_bool_1x3x4x4": lambda: model(mish, [t("x", TensorProto.BOOL, [1, 3, 4, 4])], [t("y")]),
        "mish_string_unsized": lambda: model(mish, [t("x", TensorProto.STRING)], [t("y")]),
        "unsized_chain": lambda: model(relus, [t("x")], [t("y")]),
        "no_nodes": lambda: model([], [t("x")], [t("x")]),
    }[name]()


@pytest.mark.parametrize("wrt", ["parameters", "inputs"])
@pytest.mark.parametrize("name", ["mish_bool_unsized", "mish_bool_1x3x4x4", "mish_string_unsized",
                                  "unsized_chain", "no_nodes"])
def test_analyze_json_of_graphs_with_nothing_sized(tmp_path, name, wrt):
    """A Mish given five inputs and three outputs on an unsized bool input, feeding a Gemm, ended in
    'internal error ValueError: cannot reshape array of size 0 into shape (0)' (the peak formula's rows
    had no monomial); the text report worked."""
    import onnx
    from click.testing import CliRunner

    from fusecli.cli import main

    path = str(tmp_path / f"{name}.onnx")
    onnx.save(_malformed(name), path)
    r = CliRunner().invoke(main, ["analyze", path, "--json", "--wrt", wrt])
    assert r.exit_code == 0, r.output
    doc = _strict_json(r.stdout)
    memory = doc["memory"]
    assert set(memory["formula"]) == {"saved_bytes", "saved_activation_bytes", "peak_bytes"}
    assert all(isinstance(v, str) and v for v in memory["formula"].values())
    assert memory["peak_bytes"] >= 0 and memory["saved_bytes"] >= 0
    assert CliRunner().invoke(main, ["analyze", path, "--wrt", wrt]).exit_code == 0  # the text report too

"""Memory totals as exact formulas in the model's input dims (saved, saved activations, peak).

Saved totals are sums of their tensors' byte polynomials (``sizes.tensor_formula``). The peak is the
largest of the per-step live totals, each a polynomial; which step peaks depends on the sizes (weights
dominate at small sizes, attention's seq^2 tensors at large ones), so the peak's formula is
``max(P1, P2, ...)`` over the steps that no other step bounds at every size. Input dims are >= 1, so each
step's polynomial is rewritten in d - 1 (``batch = 1 + b``: coefficients of ``(1 + b)^k`` by the binomial
theorem); a step whose shifted coefficients another's bound, one by one, is never the largest alone and is
dropped (``18285408 + 58513408*N`` under ``18284800 + 58519552*N``): exact at every size.
Tensors of unknown size are named in the formula, never dropped silently.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from functools import cache
from math import comb, prod

import numpy as np

from ..core.dims import DimParseError, Poly, parse_dim
from ..core.ir import Graph, Tensor
from .liveness import Liveness
from .sizes import tensor_formula

TOTALS = ("saved_bytes", "saved_activation_bytes", "peak_bytes")
PARETO_BLOCK = 64  # rows compared at once: big enough to amortise numpy's calls, small enough for block^2
INT64_SAFE = 1 << 62  # a bound on every partial sum below it: int64 arithmetic, else exact Python ints


def memory_formulas(live: Liveness, joint: Graph) -> dict[str, str]:
    """Each total as a formula string (see the module docstring)."""
    saved: dict[tuple, int] = {}  # tensors per (shape, dtype), as in grouped_total
    activations: dict[tuple, int] = {}
    for s in live.saved:
        t = s.tensor
        key = (t.shape, t.dtype)
        saved[key] = saved.get(key, 0) + 1
        if t.kind == "activation":
            activations[key] = activations.get(key, 0) + 1
    out = {}
    for name, counts in (("saved_bytes", saved), ("saved_activation_bytes", activations)):
        poly, missing = _counted_total(counts)
        out[name] = str(poly) + _unknown_note(missing)
    out["peak_bytes"] = peak_formula(live, joint)
    return out


def grouped_total(tensors: Iterable[Tensor]) -> tuple[Poly, int]:
    """``sizes.total_formula``, one polynomial per distinct (shape, dtype) times its count."""
    counts: dict[tuple, int] = {}
    for t in tensors:
        key = (t.shape, t.dtype)
        counts[key] = counts.get(key, 0) + 1
    return _counted_total(counts)


def _counted_total(counts: Mapping[tuple, int]) -> tuple[Poly, int]:
    """Sum of count times the byte polynomial of each (shape, dtype); how many have an unknown size."""
    total: dict = {}
    missing = 0
    for key, n in counts.items():
        f = tensor_formula(*key)
        if f is None:
            missing += n
            continue
        for m, c in f.terms.items():
            total[m] = total.get(m, 0) + c * n
    return Poly(total), missing


def _unknown_note(missing: int) -> str:
    return f" + unknown ({missing} tensor{'s' if missing > 1 else ''} of unknown size)" if missing else ""


def peak_formula(live: Liveness, joint: Graph) -> str:
    """``max(...)`` of the step totals that can be the peak at some size (one polynomial when one can)."""
    resident: list[Tensor] = []
    index_of: dict[tuple, int] = {}  # per distinct (shape, dtype), its polynomial's index (-1: unknown)
    polys: list[Poly] = []
    borns: list[int] = []
    lasts: list[int] = []
    which: list[int] = []
    missing = 0
    # live.spans[k] is tensor k's lifetime where live.tensors[k] is joint's k-th tensor (always, unless
    # joint changed after its liveness): no lookup by name, no live.lifetimes dict
    known, spans, n = live.tensors, live.spans, len(live.tensors)
    storage = live.storage
    for k, t in enumerate(joint.tensors.values()):
        if storage and t in storage:  # a view or never allocated: its base's bytes, or none
            continue
        if t.kind in ("parameter", "constant"):
            resident.append(t)
            continue
        if "stands_for_parameters" in t.meta:  # the parameters the export folded it from (liveness)
            resident.append(t)
        span = spans[k] if k < n and known[k] is t else live.lifetimes.get(t.name)
        if span is None:
            continue
        key = (t.shape, t.dtype)
        k = index_of.get(key)
        if k is None:  # most tensors share a few (shape, dtype)s: one formula each
            f = tensor_formula(*key)
            k = index_of[key] = -1 if f is None else len(polys)
            if f is not None:
                polys.append(f)
        if k < 0:
            missing += 1
        else:
            borns.append(span[0])
            lasts.append(span[1])
            which.append(k)
    for t, step in live.transients:  # a backward formula's second buffer, for one step
        f = tensor_formula(t.shape, t.dtype)
        if f is not None:
            borns.append(step)
            lasts.append(step)
            which.append(len(polys))
            polys.append(f)
    total, unknown = grouped_total(resident)
    return max_text(_peak_rows(total, polys, borns, lasts, which, len(live.schedule))) + \
        _unknown_note(missing + unknown)


def max_text(polys: list[Poly]) -> str:
    """One polynomial as itself, several as ``max(P1, P2, ...)`` (what ``evaluate_formula`` reads)."""
    return str(polys[0]) if len(polys) == 1 else "max(" + ", ".join(str(p) for p in polys) + ")"


def peak_polys(resident: Poly, changes: list[tuple[int, int, Poly]], steps: int) -> list[Poly]:
    """The step totals that can be the peak at some size: ``resident`` plus each interval's bytes
    (alive at steps born..last inclusive, born -1 before the first step), Pareto-reduced, sorted."""
    index_of: dict[int, int] = {}  # one row of coefficients per distinct polynomial object
    polys: list[Poly] = []
    borns, lasts, which = [], [], []
    for born, last, f in changes:
        k = index_of.get(id(f))
        if k is None:
            k = index_of[id(f)] = len(polys)
            polys.append(f)
        borns.append(born)
        lasts.append(last)
        which.append(k)
    return _peak_rows(resident, polys, borns, lasts, which, steps)


def _peak_rows(resident: Poly, polys: list[Poly], borns: list[int], lasts: list[int], which: list[int],
               steps: int) -> list[Poly]:
    """``peak_polys`` of the intervals ``borns[j]..lasts[j]`` of ``polys[which[j]]`` bytes each."""
    monomials = sorted({m for f in polys for m in f.terms} | set(resident.terms))
    index = {m: i for i, m in enumerate(monomials)}
    # every step total, row sum and difference is at most the sum of all |coefficients|
    uses = np.bincount(np.array(which, dtype=np.int64), minlength=len(polys)).tolist()
    bound = sum(n * sum(abs(c) for c in f.terms.values()) for f, n in zip(polys, uses, strict=True)) + \
        sum(abs(c) for c in resident.terms.values())
    dtype = np.int64 if bound < INT64_SAFE else object
    coefficients = np.zeros((len(polys), len(monomials)), dtype=dtype)
    for k, f in enumerate(polys):
        for m, c in f.terms.items():
            coefficients[k, index[m]] = c
    delta = np.zeros((steps + 2, len(monomials)), dtype=dtype)
    if which:
        rows = coefficients[np.array(which, dtype=np.int64)]
        np.add.at(delta, np.array(borns, dtype=np.int64) + 1, rows)  # alive from step born + 1's total on
        np.subtract.at(delta, np.array(lasts, dtype=np.int64) + 2, rows)  # freed after its last step
    base = np.zeros(len(monomials), dtype=dtype)
    for m, c in resident.terms.items():
        base[index[m]] += c
    rows = np.cumsum(delta, axis=0)[1:steps + 1] + base  # liveness's timeline, one polynomial per step
    front = candidate_steps(rows, monomials, bound) if steps else [base + delta[0]]
    out = [Poly({monomials[i]: int(c) for i, c in enumerate(r) if c}) for r in front]
    out.sort(key=str)
    return out


def candidate_steps(rows: np.ndarray, monomials: list, bound: int) -> list[np.ndarray]:
    """The distinct step polynomials (rows over ``monomials``, every |coefficient| sum at most ``bound``)
    that no other one bounds at every size >= 1: compared in the shifted dims (module docstring)."""
    rows = _distinct(rows)
    shift = _shift_matrix(monomials)  # unitriangular, so distinct rows stay distinct
    exact = rows.dtype == object or bound * max((prod(2 ** e for _, e in m) for m in monomials),
                                                default=1) >= INT64_SAFE
    shifted = rows.astype(object) @ shift if exact else rows @ shift.astype(np.int64)
    return [rows[i] for i in _front_indices(shifted)]


def _distinct(rows: np.ndarray) -> np.ndarray:
    """The distinct rows, sorted (np.unique(axis=0)'s answer, without the numpy.ma import it costs)."""
    if not rows.shape[1]:  # no monomial (every tensor unsized): the rows are all the one empty row
        return rows[:1]
    if rows.dtype == object or not rows.size:  # Python ints, or nothing to sort by
        return np.array(sorted(set(map(tuple, rows.tolist()))), dtype=rows.dtype).reshape(-1, rows.shape[1])
    rows = rows[np.lexsort(rows.T[::-1])]  # lexicographic: the first column is the primary key
    keep = np.ones(len(rows), dtype=bool)
    keep[1:] = (rows[1:] != rows[:-1]).any(axis=1)
    return rows[keep]


def _shift_matrix(monomials: list) -> np.ndarray:
    """Coefficients of each monomial in d - 1 (one column per monomial that divides one of them):
    x^a = sum_k C(a, k) (x - 1)^k, so a row times this matrix is the step's polynomial in the shifted dims."""
    columns: dict = {}
    expansions = []
    for m in monomials:
        terms = [((), 1)]
        for s, e in m:
            terms = [(t + ((s, k),) if k else t, c * comb(e, k)) for t, c in terms for k in range(e + 1)]
        expansions.append(terms)
        for t, _ in terms:
            columns.setdefault(t, len(columns))
    out = np.zeros((len(monomials), len(columns)), dtype=object)
    for i, terms in enumerate(expansions):
        for t, c in terms:
            out[i, columns[t]] += c
    return out


def _front_indices(rows: np.ndarray) -> list[int]:
    """Indices of the rows (distinct) no other row bounds coefficient by coefficient, in order of
    decreasing total. A row that bounds another has the larger total, so rows are taken in that order, a
    block at a time: a block's rows are checked against the front so far, then against each other, all
    vectorised."""
    order = np.argsort(-rows.sum(axis=1), kind="stable")
    rows = rows[order]
    front, kept = rows[:0], []
    for start in range(0, len(rows), PARETO_BLOCK):
        b, idx = rows[start:start + PARETO_BLOCK], order[start:start + PARETO_BLOCK]
        if len(front):
            keep = ~_bounded_by(b, front)
            b, idx = b[keep], idx[keep]
        if len(b) > 1:
            keep = ~_bounded_by(b, b)
            b, idx = b[keep], idx[keep]
        front = np.concatenate([front, b])
        kept.extend(int(i) for i in idx)
    return kept


def _pareto_front(rows: np.ndarray) -> list[np.ndarray]:
    """Rows (distinct) no other row bounds coefficient by coefficient, in order of decreasing total."""
    return [rows[i] for i in _front_indices(rows)]


def _bounded_by(rows: np.ndarray, others: np.ndarray) -> np.ndarray:
    """For each row, whether another row of ``others`` is >= it in every coefficient."""
    ge = (others[None, :, :] >= rows[:, None, :]).all(axis=2)
    if others is rows:
        np.fill_diagonal(ge, False)
    return ge.any(axis=1)


def evaluate_formula(text: str, values: Mapping[str, int]) -> int | None:
    """A formula fusecli prints (a polynomial, or ``max`` of several) evaluated at ``values``; None when
    it names a tensor of unknown size or a dim without a value."""
    if "unknown" in text:
        return None
    tree = ast.parse(text.replace("^", "**"), mode="eval").body
    if isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and tree.func.id == "max":
        parts = [parse_dim(ast.unparse(a)).evaluate(values) for a in tree.args]
        return None if any(p is None for p in parts) else max(parts)
    return parse_dim(text).evaluate(values)


def tensor_bytes_formula(t: Tensor) -> str | None:
    """One tensor's bytes as a formula, or None when its rank or a dim is unknown."""
    return formula_text(t.shape, t.dtype)


@cache
def formula_text(shape, dtype: str) -> str | None:
    """``tensor_bytes_formula`` of a (shape, dtype), written once per distinct pair."""
    f = tensor_formula(shape, dtype)
    return None if f is None else str(f)


def fold_opaque(texts: Mapping[str, str], opaque: Mapping[str, int]) -> tuple[dict[str, str], list[str]]:
    """Formulas for people: the opaque dims (``unk1``, ``unk2``: sized by the shape tools only as numbers)
    that have one value here become one name, ``unk_31``, their terms summed; and a note per name saying
    what it stands for. Exact at these sizes only, so the JSON keeps every term."""
    polys: dict[str, tuple[Poly, str]] = {}
    for key, text in texts.items():
        body, sep, rest = text.partition(" + unknown (")
        try:
            polys[key] = (parse_dim(body), sep + rest)
        except DimParseError:
            pass
    by_value: dict[int, list[str]] = {}
    present = set().union(*(p.symbols() for p, _ in polys.values())) & opaque.keys()
    for name in sorted(present, key=_natural):
        by_value.setdefault(opaque[name], []).append(name)
    rename = {name: f"unk_{v}" for v, names in by_value.items() if len(names) > 1 for name in names}
    if not rename:
        return dict(texts), []
    out = dict(texts)
    for key, (poly, rest) in polys.items():
        terms: dict = {}
        for m, c in poly.terms.items():
            exps: dict[str, int] = {}
            for name, e in m:
                exps[rename.get(name, name)] = exps.get(rename.get(name, name), 0) + e
            mono = tuple(sorted(exps.items()))
            terms[mono] = terms.get(mono, 0) + c
        out[key] = str(Poly(terms)) + rest
    notes = [f"unk_{v}: {len(names)} inner dims of {v} here ({names[0]}, ..., {names[-1]}; --json: each)"
             for v, names in by_value.items() if len(names) > 1]
    return out, notes


def _natural(name: str) -> tuple:
    """unk2 before unk10."""
    digits = name.lstrip("abcdefghijklmnopqrstuvwxyz_")
    return (name[:len(name) - len(digits)], int(digits) if digits.isdigit() else -1, name)

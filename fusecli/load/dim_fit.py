"""Dims known only as numbers fitted to integer polynomials in the model's input dims.

A shape tool (ONNX's, onnxruntime's, TensorFlow's) is run at more integer points, each input dim moved, and
the numbers it gives for one dim are solved for the coefficients of a polynomial of degree <= 2; the fit
is kept only when it reproduces every point and the user's own.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Mapping

import numpy as np

from ..core.dims import Poly, dim_poly
from ..core.ir import Graph

MAX_FIT_VARIABLES = 4  # degree-2 fits in more variables need too many inference runs
Numbers = Callable[[Mapping[str, int], set], dict]  # (values, tensors needed) -> name -> dims (None: open)


def over_variables(d, variables: tuple[str, ...]) -> bool:
    """Whether the dim is an int or a polynomial over the input variables only."""
    if isinstance(d, int):
        return True
    p = dim_poly(d)
    return p is not None and p.symbols() <= set(variables)


def pending_tensors(graph: Graph, variables: tuple[str, ...]) -> set[str]:
    """Tensors made by a node whose rank or some dim is not a polynomial over the input dims."""
    out = set()
    settled: dict[tuple, bool] = {}  # shape -> every dim over the variables (asked once per distinct shape)
    for t in graph.tensors.values():
        if t.producer is None:
            continue
        shape = t.shape
        if shape is None:
            out.add(t.name)
            continue
        ok = settled.get(shape)
        if ok is None:
            ok = settled[shape] = all(over_variables(d, variables) for d in shape)
        if not ok:
            out.add(t.name)
    return out


def monomials(variables: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The monomials of degree <= 2 in the input dims, the constant first: (), (v,), (a, b)."""
    mons: list[tuple[str, ...]] = [()]
    mons += [(v,) for v in variables]
    mons += [pair for pair in itertools.combinations_with_replacement(variables, 2)]
    return mons


def monomial_poly(c: int, m: tuple[str, ...]) -> Poly:
    """``c`` times the monomial ``m``."""
    term = Poly.const(c)
    for v in m:
        term = term * Poly.var(v)
    return term


def _probe_points(variables: tuple[str, ...], count: int) -> list[dict[str, int]]:
    """Distinct small points (3..40: under any model's position limit, above broadcast's special 1)."""
    rng = random.Random(0x5EED)
    points, seen = [], set()
    while len(points) < count:
        p = tuple(rng.randint(3, 40) for _ in variables)
        if p not in seen:
            seen.add(p)
            points.append(dict(zip(variables, p, strict=True)))
    return points


def fit_polynomials(numbers: Numbers, positions: list[tuple[str, int]], values: Mapping[str, int],
         at_user: dict, variables: tuple[str, ...]) -> dict[tuple[str, int], str]:
    """Integer polynomials (degree <= 2 in the input dims) for the dims at ``positions`` (tensor, axis),
    known at the user's ``values`` only as numbers (``at_user``); ``numbers`` runs the shape tool."""
    free = variables
    if not positions or not free or len(free) > MAX_FIT_VARIABLES:
        return {}
    mons = monomials(free)
    points = _probe_points(free, len(mons) + 2)
    columns: list[dict] = []
    need = {name for name, _ in positions}
    for p in points:
        columns.append(numbers({**values, **p}, need))
    design = np.array([[_mono_value(m, p) for m in mons] for p in points], dtype=np.float64)
    if np.linalg.matrix_rank(design) < len(mons):
        return {}
    ys = np.array([[_at(col, pos) for pos in positions] for col in columns], dtype=np.float64)
    ok_rows = ~np.isnan(ys).any(axis=0)
    coef, *_ = np.linalg.lstsq(design, np.nan_to_num(ys), rcond=None)
    out: dict[tuple[str, int], str] = {}
    for j, pos in enumerate(positions):
        if not ok_rows[j]:
            continue
        c = np.rint(coef[:, j]).astype(np.int64)
        poly = Poly()
        for m, k in zip(mons, c, strict=True):
            if k:
                poly = poly + monomial_poly(int(k), m)
        exact = all(poly.evaluate({**values, **p}) == _at(col, pos) for p, col in zip(points, columns,
                                                                                        strict=True))
        if exact and poly.evaluate(values) == at_user[pos[0]][pos[1]]:
            out[pos] = str(poly) if poly.constant is None else poly.constant
    return out


def _mono_value(m: tuple[str, ...], p: Mapping[str, int]) -> float:
    v = 1.0
    for s in m:
        v *= p[s]
    return v


def _at(col: dict, pos: tuple[str, int]) -> float:
    s = col.get(pos[0])
    if s is None or pos[1] >= len(s) or s[pos[1]] is None:
        return float("nan")
    return float(s[pos[1]])


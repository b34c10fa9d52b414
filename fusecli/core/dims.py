"""Dims as integer polynomials over named dims: ``2*seq``, ``seq + 1``, ``batch*seq`` parse; ``floor(...)``,
``Max(...)`` and division do not (such a dim is known only as a number, at given sizes)."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from functools import cache

Monomial = tuple[tuple[str, int], ...]  # sorted (symbol, exponent) pairs; () is the constant term


class Poly:
    """A polynomial with integer coefficients over named dims: {monomial: coefficient}."""

    __slots__ = ("terms",)

    def __init__(self, terms: Mapping[Monomial, int] | None = None) -> None:
        self.terms = {m: c for m, c in (terms or {}).items() if c != 0}

    @staticmethod
    def const(c: int) -> Poly:
        return Poly({(): c})

    @staticmethod
    def var(name: str) -> Poly:
        return Poly({((name, 1),): 1})

    def __add__(self, other: Poly) -> Poly:
        terms = dict(self.terms)
        for m, c in other.terms.items():
            terms[m] = terms.get(m, 0) + c
        return Poly(terms)

    def __neg__(self) -> Poly:
        return Poly({m: -c for m, c in self.terms.items()})

    def __sub__(self, other: Poly) -> Poly:
        return self + (-other)

    def __mul__(self, other: Poly) -> Poly:
        terms: dict[Monomial, int] = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in other.terms.items():
                m = _mono_mul(m1, m2)
                terms[m] = terms.get(m, 0) + c1 * c2
        return Poly(terms)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Poly) and self.terms == other.terms

    def __hash__(self) -> int:
        return hash(frozenset(self.terms.items()))

    def symbols(self) -> set[str]:
        return {s for m in self.terms for s, _ in m}

    def evaluate(self, values: Mapping[str, int]) -> int | None:
        """The value at ``values``; None when a symbol has none."""
        total = 0
        for m, c in self.terms.items():
            for s, e in m:
                v = values.get(s)
                if v is None:
                    return None
                c *= v ** e
            total += c
        return total

    @property
    def constant(self) -> int | None:
        """The value when the polynomial has no symbol, else None."""
        if not self.terms:
            return 0
        return self.terms.get(()) if len(self.terms) == 1 else None

    def __str__(self) -> str:
        """'98304*batch*seq + 2048*batch*seq^2': highest degree last, as the issue's examples read."""
        if not self.terms:
            return "0"
        parts = []
        for m, c in sorted(self.terms.items(), key=lambda mc: (sum(e for _, e in mc[0]), mc[0])):
            body = "*".join(s if e == 1 else f"{s}^{e}" for s, e in m)
            mag = abs(c)
            text = body if mag == 1 and body else (f"{mag}*{body}" if body else str(mag))
            parts.append(("- " if c < 0 else "+ ") + text)
        out = " ".join(parts)
        return out[2:] if out.startswith("+ ") else "-" + out[2:]

    __repr__ = __str__


def _mono_mul(a: Monomial, b: Monomial) -> Monomial:
    exps = dict(a)
    for s, e in b:
        exps[s] = exps.get(s, 0) + e
    return tuple(sorted(exps.items()))


_CONSTANT_NAMES = frozenset({"None", "True", "False"})  # names Python parses as constants, not variables


class DimParseError(ValueError):
    """The expression is not an integer polynomial over names (floor, Max, division...)."""


@cache
def parse_dim(text: str) -> Poly:
    """'2*seq', 'seq + 1', 'batch*heads', 'seq**2' -> Poly; DimParseError for anything else."""
    if text.isascii() and text.isidentifier() and text not in _CONSTANT_NAMES:
        return Poly.var(text)  # what the parser makes of a plain name, without running it
    try:
        tree = ast.parse(text.strip().replace("^", "**"), mode="eval")  # seq^2 as fusecli prints it
    except (SyntaxError, ValueError):
        if text.isidentifier() or _name_like(text):
            return Poly.var(text)
        raise DimParseError(text) from None
    return _poly_of(tree.body, text)


def _name_like(text: str) -> bool:
    """Dim names exporters write that are not Python identifiers ('s0.1', 'unk__3', 'batch size')."""
    return bool(text) and len(text) <= 200 and not any(c in text for c in "+-*/()^%, ")


def _poly_of(node: ast.AST, text: str) -> Poly:
    if isinstance(node, ast.Name):
        return Poly.var(node.id)
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return Poly.const(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_poly_of(node.operand, text)
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.Pow):
            exp = node.right
            if isinstance(exp, ast.Constant) and isinstance(exp.value, int) and 0 <= exp.value <= 8:
                base, out = _poly_of(node.left, text), Poly.const(1)
                for _ in range(exp.value):
                    out = out * base
                return out
            raise DimParseError(text)
        left, right = _poly_of(node.left, text), _poly_of(node.right, text)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
    raise DimParseError(text)


def dim_poly(d) -> Poly | None:
    """One dim as a polynomial: ints are constants, names and expressions parse, None is unknown."""
    if isinstance(d, int):
        return Poly.const(d)
    if isinstance(d, str):
        try:
            return parse_dim(d)
        except DimParseError:
            return None
    return None


def dim_value(d, values: Mapping[str, int]) -> int | None:
    """A dim's value at ``values``: ints as they are, names and expressions evaluated, else None."""
    if isinstance(d, int):
        return d
    if not isinstance(d, str):
        return None
    v = values.get(d)
    if v is not None:
        return v
    p = dim_poly(d)
    return None if p is None else p.evaluate(values)


_SAMPLES = (3, 5, 7, 11, 13, 17, 19, 23)  # sizes each name takes, in turn, where a dim does not parse


def same_dim(a, b) -> bool:
    """Whether two known dims are the same: equal ints or polynomials; where one does not parse (dynamo's
    '((seq**2)//seq)'), equal values at every one of several sizes of its names. Unknown dims are not."""
    if a is None or b is None or isinstance(a, bool) or isinstance(b, bool):
        return False
    if a == b:
        return True
    pa, pb = dim_poly(a), dim_poly(b)
    if pa is not None and pb is not None:
        return pa == pb
    if isinstance(a, int) and isinstance(b, int):
        return False
    names = sorted(_names(a) | _names(b))
    for i in range(len(_SAMPLES)):
        values = {n: _SAMPLES[(i + j) % len(_SAMPLES)] for j, n in enumerate(names)}
        va, vb = _evaluate(a, values), _evaluate(b, values)
        if va is None or va != vb:
            return False
    return True


def _names(d) -> set[str]:
    if not isinstance(d, str):
        return set()
    try:
        tree = ast.parse(d.strip().replace("^", "**"), mode="eval")
    except (SyntaxError, ValueError):
        return {d}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


_INT_OPS = {ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y, ast.Mult: lambda x, y: x * y,
            ast.FloorDiv: lambda x, y: x // y, ast.Mod: lambda x, y: x % y}


def _evaluate(d, values: Mapping[str, int]) -> int | None:
    """An int dim expression (+, -, *, //, %, small powers) at ``values``; None where it is none."""
    if isinstance(d, int):
        return d
    if not isinstance(d, str):
        return None
    if d in values:
        return values[d]
    try:
        return _eval_node(ast.parse(d.strip().replace("^", "**"), mode="eval").body, values)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None


def _eval_node(node: ast.AST, values: Mapping[str, int]) -> int | None:
    if isinstance(node, ast.Name):
        return values.get(node.id)
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _eval_node(node.operand, values)
        return None if v is None else -v
    if isinstance(node, ast.BinOp):
        x, y = _eval_node(node.left, values), _eval_node(node.right, values)
        if x is None or y is None:
            return None
        if isinstance(node.op, ast.Pow):
            return x ** y if 0 <= y <= 8 else None
        op = _INT_OPS.get(type(node.op))
        return None if op is None else op(x, y)
    return None

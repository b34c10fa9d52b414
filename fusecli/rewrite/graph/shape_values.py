"""Small integer tensors computed from static dims, such as torchscript's Slice bound Shape(x)[3] / 2.

``int_value(t, weights)`` evaluates Shape, Gather, Slice, Unsqueeze, Squeeze, Concat, Cast, Identity and
integer Add / Sub / Mul / Div over constants and the dims the IR knows; a symbolic or unknown dim the result
reads, another op, or a long chain makes it None.
"""

from __future__ import annotations

import numpy as np

from ...core.ir import Tensor
from .values import Weights

MAX_NODES = 32  # producers walked per value
MAX_ELEMENTS = 64


def _div(x: int, y: int) -> int | None:
    """ONNX's integer Div: truncated toward zero."""
    if y == 0:
        return None
    q = abs(x) // abs(y)
    return q if (x < 0) == (y < 0) else -q


_ARITH = {"Add": lambda x, y: x + y, "Sub": lambda x, y: x - y, "Mul": lambda x, y: x * y, "Div": _div}
_UFUNCS = {k: np.frompyfunc(lambda x, y, f=f: None if x is None or y is None else f(x, y), 2, 1)
           for k, f in _ARITH.items()}
LIMIT = 2**63


def int_value(t: Tensor | None, weights: Weights) -> np.ndarray | None:
    """The int64 value of ``t`` when constants and known dims fix it, else None."""
    budget = [MAX_NODES]
    v = _eval(t, weights, budget)
    if v is None or v.size > MAX_ELEMENTS or any(e is None or not -LIMIT <= e < LIMIT for e in v.flat):
        return None
    return v.astype(np.int64)


def _eval(t: Tensor | None, weights: Weights, budget: list[int]) -> np.ndarray | None:
    """Python ints in an object array, None where a dim is unknown (None spreads through arithmetic)."""
    if t is None:
        return None
    if weights.is_constant(t.name):
        v = weights.value(t.name)
        if v is None or v.dtype.kind not in "iu" or v.size > MAX_ELEMENTS:
            return None
        return np.array(v.tolist(), dtype=object)
    node = t.producer
    budget[0] -= 1
    if node is None or budget[0] < 0 or node.domain not in ("", "ai.onnx"):
        return None
    op, a = node.op_type, node.attrs
    if op == "Shape":
        x = node.input(0)
        if x is None or x.shape is None:
            return None
        dims = np.array([d if isinstance(d, int) else None for d in x.shape], dtype=object)
        start, end = int(a.get("start", 0)), a.get("end")
        return dims[start:None if end is None else int(end)]
    args = [_eval(i, weights, budget) for i in node.inputs[:2]] if op in (*_ARITH, "Gather") \
        else [_eval(node.input(0), weights, budget)]
    if any(v is None for v in args):
        return None
    x = args[0]
    if op in _ARITH:
        try:
            return np.asarray(_UFUNCS[op](x, args[1]), dtype=object)
        except ValueError:
            return None  # shapes that do not broadcast
    if op in ("Cast", "Identity"):
        return x
    if op == "Gather":
        idx = args[1]
        if int(a.get("axis", 0)) != 0 or any(e is None for e in idx.flat) or x.ndim != 1:
            return None
        i = idx.astype(np.int64)
        return np.asarray(np.take(x, i), dtype=object) if np.all((-x.size <= i) & (i < x.size)) else None
    if op in ("Unsqueeze", "Squeeze"):
        if x.size != 1:
            return None  # only a scalar's rank changes here: the element order is all that matters
        return x.reshape(-1) if op == "Unsqueeze" else x.reshape(())
    if op == "Concat":
        parts = [_eval(i, weights, budget) for i in node.inputs]
        if any(p is None or p.ndim != 1 for p in parts):
            return None
        return np.concatenate(parts)
    if op == "Slice" and x.ndim == 1:  # Shape(q)[-1:] (TorchScript's head size read): constant bounds
        bounds = [_eval(node.input(k), weights, budget) if node.input(k) is not None else None
                  for k in range(1, 5)]
        if any(b is None for b in bounds[:2]) or any(b is not None and b.size != 1 or
                                                     b is not None and None in b.flat for b in bounds):
            return None
        axes, steps = bounds[2], bounds[3]
        if axes is not None and int(axes.reshape(-1)[0]) not in (0, -1):
            return None
        start, end = (int(b.reshape(-1)[0]) for b in bounds[:2])
        step = 1 if steps is None else int(steps.reshape(-1)[0])
        return x[slice(start, end, step)] if step != 0 else None
    return None

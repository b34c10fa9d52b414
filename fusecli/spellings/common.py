"""What every spelling module shares: the writer tags, ``Spelling`` and ``select``, the one ``ADD``, and the
tensor checks trees use."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import numpy as np

from ..core.ir import Tensor
from ..core.trees import Op, Var, op

# who writes a spelling: the PyTorch exporters, Keras, tf2onnx, onnxscript's model zoo, or a user's own math
WRITERS = frozenset({"torchscript", "dynamo", "keras3", "tf-keras", "tf2onnx", "onnxscript", "hand-written"})
TORCH = frozenset({"torchscript", "dynamo"})
TENSORFLOW = frozenset({"keras3", "tf-keras"})

ADD = frozenset({"add", "sum", "bias_add"})  # any addition (bias_add: one operand is a parameter)
SUM = frozenset({"add", "sum"})  # an addition the loader did not call a bias add (a residual)


@dataclass(frozen=True)
class Spelling:
    """One op tree of a family and who writes it."""

    tree: Op
    by: frozenset[str]

    def __post_init__(self) -> None:
        unknown = set(self.by) - WRITERS
        if unknown:
            raise ValueError(f"unknown writers {sorted(unknown)}")


def spell(trees: Iterable[Op], *by: str) -> tuple[Spelling, ...]:
    """Each tree as a Spelling written by ``by``."""
    return tuple(Spelling(t, frozenset(by)) for t in trees)


def select(spellings: Iterable[Spelling], by: Iterable[str] | None = None) -> tuple[Op, ...]:
    """The trees (in their listed order) written by any of ``by``; every tree when ``by`` is None."""
    wanted = None if by is None else frozenset(by)
    return tuple(s.tree for s in spellings if wanted is None or s.by & wanted)


def is_param(t: Tensor) -> bool:
    return t.kind in ("parameter", "constant")


def is_activation(t: Tensor) -> bool:
    return t.kind in ("input", "activation")


def scalar(value: float | None = None, rel: float = 1e-3) -> Callable[[Tensor], bool]:
    """A one-element constant (equal to ``value`` within ``rel`` when given)."""

    def check(t: Tensor) -> bool:
        v = t.meta.get("value")
        if v is None or np.size(v) != 1 or not is_param(t):
            return False
        return value is None or math.isclose(float(np.reshape(v, -1)[0]), value, rel_tol=rel)

    return check


def named(arg: Op, name: str) -> Op:
    """``arg`` with its output bound to ``name`` (so a later ``Var(name)`` must be the same tensor)."""
    return replace(arg, name=name)


def optional(kinds: str | set[str] | frozenset[str], arg: Op | Var, *rest: Op | Var, **kw) -> Op:
    """``kinds(arg, *rest)``, or ``arg`` alone when that node is absent."""
    return op(kinds, arg, *rest, optional=True, **kw)


def swaps_last_two(n) -> bool:
    """A Transpose that swaps its last two axes only (what a GEMM's transB reads in place)."""
    perm = n.attrs.get("perm")
    return perm is not None and len(perm) >= 2 and list(perm) == [*range(len(perm) - 2), len(perm) - 1,
                                                                  len(perm) - 2]

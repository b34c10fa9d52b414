"""softmax and log_softmax written out, as the torch exporters decompose F.softmax / F.log_softmax."""

from __future__ import annotations

from ..core.trees import Op, Var, op
from .common import spell


def _softmax_trees(log: bool) -> tuple[Op, ...]:
    """softmax = exp(x - max) / sum(exp(x - max)); log_softmax = (x - max) - log(sum(exp(x - max)))."""
    shifted = (op("sub", Var("x"), op("reduce_max", Var("x"), more=True), name="s"), Var("x", check=None))
    trees = []
    for s in shifted:
        s_ref = Var("s") if isinstance(s, Op) else Var("x")
        if log:
            trees.append(op("sub", s, op("log", op("reduce_sum", op("exp", s_ref), more=True))))
        else:
            e = op("exp", s, name="e")
            trees.append(op("div", e, op("reduce_sum", Var("e"), more=True)))
    return tuple(trees)


SOFTMAX = spell(_softmax_trees(False), "torchscript", "dynamo")
LOG_SOFTMAX = spell(_softmax_trees(True), "torchscript", "dynamo")

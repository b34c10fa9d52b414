"""Rotary embedding: x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x2, x1) (transformers'
apply_rotary_pos_emb)."""

from __future__ import annotations

from ..core.trees import Op, Var, op
from .common import is_activation, select, spell


def _rotary_trees() -> tuple[Op, ...]:
    x = Var("x", check=is_activation)
    half = op("concat", op("neg", op("slice", Var("x"), more=True)), op("slice", Var("x"), more=True),
              role="rotate_half", more=True)
    return (op("add", op("mul", x, Var("cos"), commutative=True, role="cos"),
               op("mul", half, Var("sin"), commutative=True, role="sin"), commutative=True, role="rotary"),)


ROTARY = select(spell(_rotary_trees(), "torchscript", "dynamo", "onnxscript", "hand-written"))

"""Rotary embedding: x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x2, x1) (transformers'
apply_rotary_pos_emb), or on interleaved pairs, GPT-J's rotate_every_two(x) = stack(-x[..., 1::2],
x[..., ::2], -1) flattened (Cohere, GLM, DeepSeek), with tables whose entries repeat in pairs."""

from __future__ import annotations

from ..core.trees import Op, Var, op
from .common import is_activation, select, spell


def _rotated(half: Op) -> Op:
    x = Var("x", check=is_activation)
    return op("add", op("mul", x, Var("cos"), commutative=True, role="cos"),
              op("mul", half, Var("sin"), commutative=True, role="sin"), commutative=True, role="rotary")


def _rotary_trees() -> tuple[Op, ...]:
    half = op("concat", op("neg", op("slice", Var("x"), more=True)), op("slice", Var("x"), more=True),
              role="rotate_half", more=True)
    return (_rotated(half),)


def _interleaved_trees() -> tuple[Op, ...]:
    """rotate_every_two: the odd and even entries, each given a new last axis, joined on it (-x_odd first)
    and flattened back: Reshape(Concat(Unsqueeze(Neg(Slice(x))), Unsqueeze(Slice(x))))."""
    pairs = op("concat", op("unsqueeze", op("neg", op("slice", Var("x"), more=True)), more=True),
               op("unsqueeze", op("slice", Var("x"), more=True), more=True), role="rotate_pairs", more=True)
    return (_rotated(op("reshape", pairs, more=True, role="pairs_flat")),)


ROTARY = select(spell(_rotary_trees(), "torchscript", "dynamo", "onnxscript", "hand-written")
                + spell(_interleaved_trees(), "dynamo", "hand-written"))

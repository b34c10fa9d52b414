"""Op trees of the transformer-era forms, as the exporters write them (one tree or tuple per form).

PyTorch's TorchScript and dynamo exporters, Keras 3 / tf-keras SavedModels and tf2onnx each spell
attention, RMSNorm, SiLU and rotary embeddings a little differently; every spelling seen in a real
export is here, so the catalogue (patterns.py) and the autodiff composites can share them. No-op casts
(float32 -> float32, which TorchScript writes around softmax and RMSNorm) are looked through by the
matcher itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ..ir import Tensor
from .match import Op, Var, op

ADD = frozenset({"add", "sum", "bias_add"})


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


# -- activations of the x * gate(x) family: silu / swish, quick_gelu, hard_swish -------------------------
def _gate_acts(arg: Op | Var, name: str = "act_in") -> tuple[Op, ...]:
    """x * sigmoid(x) (silu), x * sigmoid(beta x) (swish; beta = 1.702 is quick_gelu), hard_swish as the
    op, as x * hard_sigmoid(x) and as x * relu6(x + 3) / 6; ``arg`` is the x all of them share."""
    xa = named(arg, name) if isinstance(arg, Op) else Var(name, check=arg.check)
    x = Var(name)
    sig = op("sigmoid", x, role="act_gate")
    beta = op("sigmoid", op("mul", x, Var(check=scalar()), commutative=True, role="act_beta"),
              role="act_gate")
    relu6 = op({"relu6", "clip"}, op(ADD, x, Var(check=scalar(3.0)), commutative=True), role="act_gate",
               more=True)
    six = Var(check=scalar(6.0))
    sixth = Var(check=scalar(1 / 6))
    return (op("mul", xa, sig, commutative=True, role="act"),
            op("mul", xa, beta, commutative=True, role="act"),
            op("hard_swish", arg, role="act"),
            op("mul", xa, op("hard_sigmoid", x, role="act_gate", more=True), commutative=True, role="act"),
            op("div", op("mul", xa, relu6, commutative=True), six, role="act"),
            op("mul", op("mul", xa, relu6, commutative=True), sixth, commutative=True, role="act"),
            op("mul", xa, op("mul", relu6, sixth, commutative=True), commutative=True, role="act"))


def gate_acts(arg: Op | Var) -> tuple[Op, ...]:
    return _gate_acts(arg)


SILU = _gate_acts(Var(check=lambda t: t.is_float))[:2]  # x * sigmoid(x), x * sigmoid(beta x)
HARD_SWISH = _gate_acts(Var(check=lambda t: t.is_float))[2:]


def gate_act_kind(roles: dict) -> str | None:
    """silu, swish (beta), quick_gelu (beta = 1.702) or hard_swish for a match of a gate activation."""
    a = roles.get("act")
    if a is None:
        return None
    if a.kind == "hard_swish":
        return "hard_swish"
    gate = roles.get("act_gate")
    if gate is None or a.kind not in ("mul", "div"):
        return a.kind
    if gate.kind != "sigmoid":
        return "hard_swish"
    b = roles.get("act_beta")
    if b is None:
        return "silu"
    beta = next((t for t in b.inputs if t is not None and t.meta.get("value") is not None), None)
    return "quick_gelu" if beta is not None and scalar(1.702)(beta) else "swish"


# -- RMSNorm: x * rsqrt(mean(x^2) + eps) * g (Llama, T5, Mistral, Qwen2) ----------------------------------
def _rms_norm_trees() -> tuple[Op, ...]:
    x = Var("x")
    squares = (op("pow", x, Var(check=scalar(2.0))), op("mul", x, x), op("square", x))
    trees: list[Op] = []
    for sq in squares:
        ms_eps = op(ADD, op("reduce_mean", sq, more=True, role="mean_square"), Var(check=scalar()),
                    commutative=True)
        root = op("sqrt", ms_eps)
        normed = (op("mul", x, op("div", Var(check=scalar(1.0)), root), commutative=True, role="normalize"),
                  op("mul", x, op("reciprocal", root), commutative=True, role="normalize"),
                  op("mul", x, op("rsqrt", ms_eps), commutative=True, role="normalize"),
                  op("div", x, root, role="normalize"))
        trees += [op("mul", n, Var(check=is_param), commutative=True, role="rms_norm") for n in normed]
        trees += list(normed)
    return tuple(trees)


RMS_NORM = _rms_norm_trees()


# -- rotary embedding: x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x2, x1) ---------------------
def _rotary_trees() -> tuple[Op, ...]:
    x = Var("x", check=is_activation)
    half = op("concat", op("neg", op("slice", Var("x"), more=True)), op("slice", Var("x"), more=True),
              role="rotate_half", more=True)
    return (op("add", op("mul", x, Var("cos"), commutative=True, role="cos"),
               op("mul", half, Var("sin"), commutative=True, role="sin"), commutative=True, role="rotary"),)


ROTARY = _rotary_trees()

"""Activations of the x * gate(x) family: silu / swish, quick_gelu, hard_swish."""

from __future__ import annotations

from ..core.trees import Op, Var, op
from .common import ADD, named, scalar, spell


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




# F.silu: x * sigmoid(x); F.hardswish below opset 14: x * HardSigmoid(x) (torch exporters)
SILU_OP = spell((op("mul", Var("x"), op("sigmoid", Var("x")), commutative=True),), "torchscript", "dynamo")
HARDSWISH_OP = spell((op("mul", Var("x"), op("hard_sigmoid", Var("x")), commutative=True),), "torchscript",
                     "dynamo")

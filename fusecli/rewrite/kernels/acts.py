"""Gate activations written out -> one op: QuickGelu (com.microsoft) and ONNX's HardSwish.

silu(x) = x sigmoid(x), swish(x) = x sigmoid(beta x), quick_gelu = swish with beta 1.702: all are
QuickGelu(X; alpha = beta), which onnxruntime has on CPU (float32) and CUDA. hard_swish written as
x relu6(x + 3) / 6 or x hard_sigmoid(x) is HardSwish(X) (ONNX opset 14; CPU only: onnxruntime's
CUDA provider registers no HardSwish kernel).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...spellings.acts import gate_act_kind
from ..graph.kit import MS, Context, Emission, attr_value, clip_bounds, dtype_of, make_node, out_name

if TYPE_CHECKING:  # annotations only
    from ...fusion.match import Match


def _beta(m: Match, ctx: Context) -> float | None:
    b = m.roles.get("act_beta")
    if b is None:
        return 1.0
    t = next((t for t in b.inputs if t is not None and t.meta.get("value") is not None), None)
    v = None if t is None else ctx.weights.value(t.name)
    return None if v is None or np.size(v) != 1 else float(np.reshape(v, -1)[0])


def silu(m: Match, ctx: Context) -> Emission | None:
    x = m.bound.get("act_in")
    if x is None or dtype_of(m) != "float32" or gate_act_kind(m.roles) not in ("silu", "swish", "quick_gelu"):
        return None
    alpha = _beta(m, ctx)
    if alpha is None:
        return None
    node = make_node("QuickGelu", [x.name], out_name(m.root), m.root.name, MS, alpha=alpha)
    return Emission(m.pattern.name, f"QuickGelu (alpha {alpha:.4g})", [n.name for n in m.nodes], [node])


def swiglu(m: Match, ctx: Context) -> Emission | None:
    """silu(a) * b: the silu as QuickGelu, the product stays a Mul (no CPU kernel does both)."""
    x, up = m.bound.get("act_in"), m.bound.get("up")
    if x is None or up is None or dtype_of(m) != "float32" or gate_act_kind(m.roles) != "silu":
        return None
    gated = ctx.names.new(f"{x.name}_silu")
    act = make_node("QuickGelu", [x.name], gated, ctx.names.new(f"{m.root.name}_silu"), MS, alpha=1.0)
    mul = make_node("Mul", [gated, up.name], out_name(m.root), m.root.name)
    return Emission(m.pattern.name, "QuickGelu (SwiGLU gate) + Mul", [n.name for n in m.nodes], [act, mul])


def _is_hard_sigmoid(m: Match, ctx: Context) -> bool:
    """The gate is max(0, min(1, x / 6 + 1/2)): HardSigmoid(1/6, 1/2), or relu6(x + 3) with the / 6."""
    gate = m.roles.get("act_gate")
    if gate is None:
        return False
    if gate.kind == "hard_sigmoid":
        p = ctx.protos[gate.name]
        alpha, beta = attr_value(p, "alpha", 0.2), attr_value(p, "beta", 0.5)
        return abs(alpha - 1 / 6) < 1e-6 and abs(beta - 0.5) < 1e-6
    if gate.op_type == "Clip":
        return clip_bounds(gate, ctx) == (0.0, 6.0)
    return gate.kind == "relu6"


def hard_swish(m: Match, ctx: Context) -> Emission | None:
    x = m.bound.get("act_in")
    if x is None or ctx.opset < 14 or ctx.target == "cuda" or dtype_of(m) != "float32" \
            or m.root.kind == "hard_swish" or not _is_hard_sigmoid(m, ctx):
        return None
    node = make_node("HardSwish", [x.name], out_name(m.root), m.root.name)
    return Emission(m.pattern.name, "HardSwish", [n.name for n in m.nodes], [node])

"""GELU written out -> Gelu, FastGelu (tanh approximation) or BiasGelu / FastGelu with the bias
(com.microsoft); the tanh form after a MatMul and its bias -> GemmFastGelu for --target cuda (the CPU
provider has no kernel for it: verification runs its CPU stand-in, cuda.cpu_stand_ins).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..graph.kit import (
    MS,
    Context,
    Emission,
    attr_value,
    dtype_of,
    last_axis_vector,
    make_node,
    other_input,
    out_name,
    param_of,
)

if TYPE_CHECKING:  # annotations only
    from ...fusion.match import Match


# -- GELU ----------------------------------------------------------------------------------------------
def gelu(m: Match, ctx: Context) -> Emission | None:
    if dtype_of(m) != "float32":
        return None
    tanh = any(n.kind == "tanh" for n in m.nodes)
    x = m.bound["x"]
    remove = [n.name for n in m.nodes]
    name = m.roles["gelu"].name
    if m.pattern.name == "bias_gelu":
        bnode, inits = x.producer, []
        bias = last_axis_vector(ctx, param_of(bnode), x, inits)
        if bias is not None:
            a = other_input(bnode, param_of(bnode)).name
            op = "FastGelu" if tanh else "BiasGelu"
            node = make_node(op, [a, bias], out_name(m.root), name, MS)
            return Emission(m.pattern.name, op, remove, [node], inits)
        remove = [n for n in remove if n != bnode.name]  # a bias off the last axis stays an Add
    op = "FastGelu" if tanh else "Gelu"
    return Emission(m.pattern.name, op, remove, [make_node(op, [x.name], out_name(m.root), name, MS)])


def gemm_fast_gelu(m: Match, ctx: Context) -> Emission | None:
    """fast_gelu(x @ W + b) -> GemmFastGelu(x, W, b) on --target cuda; on cpu None (no CPU kernel: the
    bias_gelu match inside becomes FastGelu with the bias)."""
    gelu_op = m.roles["gelu"]
    tanh = any(n.kind == "tanh" for n in m.nodes) or (
        gelu_op.op_type == "Gelu" and attr_value(ctx.protos[gelu_op.name], "approximate", "none") == "tanh")
    if ctx.target != "cuda" or dtype_of(m) != "float32" or not tanh:
        return None
    x = m.bound["x"]
    bnode, inits = x.producer, []
    bias = last_axis_vector(ctx, param_of(bnode), x, inits)
    mm = m.bound["product"].producer
    if bias is None:
        return None
    node = make_node("GemmFastGelu", [mm.inputs[0].name, mm.inputs[1].name, bias], out_name(m.root),
                     gelu_op.name, MS)
    return Emission(m.pattern.name, "GemmFastGelu", [n.name for n in m.nodes], [node], inits)

"""GELU written out -> Gelu, FastGelu (tanh approximation) or BiasGelu / FastGelu with the bias
(com.microsoft).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .kit import MS, Context, Emission, dtype_of, last_axis_vector, make_node, other_input, out_name, param_of

if TYPE_CHECKING:  # annotations only: fusion's families import these emitters
    from ..fusion.match import Match


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

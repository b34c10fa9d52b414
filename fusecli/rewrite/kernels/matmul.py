"""MatMul family -> Gemm / FusedGemm (A, B, C?; activation), FusedMatMul (A, B; alpha, transA, transB),
BiasGelu / FastGelu where a 3-D MatMul keeps its bias + Gelu op: matmul_bias(_act), matmul_scale,
matmul_transpose.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...spellings.common import swaps_last_two
from ..graph.fold import channel_vector
from ..graph.kit import (
    MS,
    Context,
    Emission,
    attr_value,
    attrs_of,
    dtype_of,
    gemm_activation,
    last_axis_vector,
    make_node,
    new_initializer,
    other_input,
    out_name,
    param_of,
    same_shape,
)

if TYPE_CHECKING:  # annotations only
    from ...fusion.match import Match


# -- MatMul family: matmul_bias(_act) -> Gemm / FusedGemm, matmul_scale -> FusedMatMul ----------------------
def matmul_family(m: Match, ctx: Context) -> Emission | str | None:
    if "act_gate" in m.roles:
        return None  # a silu-family act spans two nodes: no FusedGemm activation for it
    mm, act, bias = m.roles["matmul"], m.roles.get("act"), m.roles.get("bias")
    p = ctx.protos[mm.name]
    spec = gemm_activation(act, ctx) if act is not None and dtype_of(m) == "float32" else None
    if mm.kind == "gemm":
        if spec is None:
            return None
        node = make_node("FusedGemm", list(p.input), out_name(m.root), mm.name, MS, attrs_of(p), **spec)
        return Emission(m.pattern.name, f"FusedGemm({spec['activation']})", [n.name for n in m.nodes], [node])
    a, b = mm.inputs[0], mm.inputs[1]
    param = param_of(bias)
    two_d = a.shape is not None and len(a.shape) == 2 and b.shape is not None and len(b.shape) == 2 \
        and param.shape is not None and len(param.shape) <= 2 and same_shape(bias.outputs[0], mm.outputs[0])
    inputs = [p.input[0], p.input[1], param.name]
    if two_d and spec is not None:
        node = make_node("FusedGemm", inputs, out_name(m.root), mm.name, MS, **spec)
        return Emission(m.pattern.name, f"FusedGemm({spec['activation']})", [n.name for n in m.nodes], [node])
    if act is not None and act.op_type == "Gelu" and dtype_of(m) == "float32":  # ONNX's Gelu op (opset 20)
        inits: list = []
        vec = last_axis_vector(ctx, param, bias.outputs[0], inits)
        if vec is not None:  # MatMul kept; bias + Gelu -> BiasGelu (FastGelu for the tanh approximation)
            tanh = attr_value(ctx.protos[act.name], "approximate", "none") == "tanh"
            op = "FastGelu" if tanh else "BiasGelu"
            node = make_node(op, [out_name(mm), vec], out_name(m.root), act.name, MS)
            return Emission(m.pattern.name, op, [bias.name, act.name], [node], inits)
    if not two_d:  # said: analyze counts the match, and ONNX Runtime's MatMulAddFusion takes 2-D too
        rank = None if a.shape is None else len(a.shape)
        return f"x @ w + b with a rank-{rank} x: Gemm takes 2-D operands" if rank != 2 else None
    node = make_node("Gemm", inputs, out_name(bias), mm.name)
    return Emission(m.pattern.name, "Gemm", [mm.name, bias.name], [node])


def matmul_scale(m: Match, ctx: Context) -> Emission | None:
    mm, sc = m.roles["matmul"], m.roles["scale"]
    if dtype_of(m) != "float32":
        return None
    consts = [i for i, t in enumerate(sc.inputs[:2]) if t.kind in ("parameter", "constant")]
    if len(consts) != 1 or (sc.kind == "div" and consts != [1]):
        return None
    c_t = sc.inputs[consts[0]]
    c, x_t = ctx.weights.value(c_t.name), sc.inputs[1 - consts[0]]
    if c is None or c.size != 1 or float(c.reshape(-1)[0]) == 0.0:
        return None
    alpha = float(c.reshape(-1)[0])
    alpha = 1.0 / alpha if sc.kind == "div" else alpha
    a, b = mm.inputs[0], mm.inputs[1]
    scaled = sc.outputs[0]
    if a is scaled and b is scaled:
        return None
    if a is scaled:
        a = x_t
    elif b is scaled:
        b = x_t
    if any(t.shape is None or len(t.shape) < 2 for t in (a, b)) or c.ndim > len(x_t.shape or ()):
        return None
    # a swap of the last two axes on the scaled operand (q @ (k^T / sqrt d)) is read in place too, as ONNX
    # Runtime's MatMulScaleFusion + MatMulTransposeFusion make one FusedMatMul; the Transpose, if nothing
    # else reads it, is pruned
    flags = {}
    for key, t in (("transA", a), ("transB", b)):
        p = t.producer
        if t is x_t and p is not None and p.kind == "transpose" and swaps_last_two(p) and p.inputs \
                and p.inputs[0] is not None and p.inputs[0].shape is not None and len(p.inputs[0].shape) >= 2:
            flags[key] = 1
    a = a.producer.inputs[0] if "transA" in flags else a
    b = b.producer.inputs[0] if "transB" in flags else b
    node = make_node("FusedMatMul", [a.name, b.name], out_name(m.root), mm.name, MS, alpha=alpha, **flags)
    kernel = "FusedMatMul" + "".join(f"({k})" for k in flags)
    return Emission(m.pattern.name, kernel, [n.name for n in m.nodes], [node])


def matmul_transpose(m: Match, ctx: Context) -> Emission | None:
    """x @ Transpose(w) -> FusedMatMul(x, w, transB=1): the GEMM reads w in place (the Transpose, no
    longer read, is pruned)."""
    mm = m.roles["matmul"]
    a, w = mm.inputs[0], mm.inputs[1].producer.inputs[0]  # the Transpose: a weight's view, or in the match
    if dtype_of(m) != "float32" or any(t.shape is None or len(t.shape) < 2 for t in (a, w)):
        return None
    node = make_node("FusedMatMul", [a.name, w.name], out_name(m.root), mm.name, MS, transB=1)
    return Emission(m.pattern.name, "FusedMatMul(transB)", [n.name for n in m.nodes], [node])


# -- matmul_bias_scale: the layer scale folded into constant weights ---------------------------------------
def matmul_bias_scale(m: Match, ctx: Context) -> Emission | None:
    """(x @ w + b) * g -> MatMul(x, w g) + b g: the layer scale folded into constant weights (float32)."""
    mm, add, sc = m.roles["matmul"], m.roles["bias"], m.roles["scale"]
    y = sc.outputs[0]
    if mm.kind != "matmul" or y.dtype != "float32" or not y.shape:
        return None
    w_t, b_t, g_t = mm.inputs[1], param_of(add), other_input(sc, add.outputs[0])
    w, b, g = (ctx.weights.value(t.name) for t in (w_t, b_t, g_t))
    if w is None or b is None or g is None or w.ndim != 2 or w.dtype != np.float32:
        return None
    rank, cols = len(y.shape), w.shape[1]
    gv, bv = channel_vector(g, rank, cols, axis=rank - 1), channel_vector(b, rank, cols, axis=rank - 1)
    if gv is None or bv is None:
        return None
    gv = gv.astype(np.float64)
    inits: list = []
    w2 = new_initializer(ctx, f"{w_t.name}_scaled", (w.astype(np.float64) * gv).astype(np.float32), inits)
    b2 = new_initializer(ctx, f"{b_t.name}_scaled", (bv.astype(np.float64) * gv).astype(np.float32), inits)
    nodes = [make_node("MatMul", [mm.inputs[0].name, w2], out_name(mm), mm.name),
             make_node("Add", [out_name(mm), b2], out_name(sc), add.name)]
    return Emission(m.pattern.name, "MatMul + Add (scale folded)", [mm.name, add.name, sc.name], nodes, inits)

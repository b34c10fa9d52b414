"""Grouped-query causal self-attention -> ONNX Runtime's GroupQueryAttention (com.microsoft; CPU float32).

softmax(c tanh(q k^T s / c) + causal) v (c: Gemma2's soft-cap, when there is one) with K and V of Nkv heads
repeated to q's N (repeat_kv: head h reads K/V head h // (N / Nkv)). GroupQueryAttention(query, key, value,
-, -, seqlens_k, total_sequence_length, cos_cache?, sin_cache?; num_heads=N, kv_num_heads=Nkv, scale=s,
softcap=c, local_window_size, do_rotary) reads the K/V heads unrepeated, packed as (B, L, Nkv H), and
applies the causal mask itself. Its contract for a prompt without past: key length = query length S,
seqlens_k = S - 1 for every batch row, total_sequence_length = S, both computed from the query's shape.
So the export's mask must be the causal mask (a sliding window: local_window_size), computed from shapes
alone and checked by running it (mask_band). A padding mask made from the inputs' values, a KV cache, a
position bias, a Tile repeat (head h reads h mod Nkv), a head size not a multiple of 16 (onnxruntime's
CPU kernel refuses it) or the CUDA target (onnxruntime registers its CUDA kernel for float16 and bfloat16
only) fall back to MultiHeadAttention, with the reason. Where the rotary matches of q and of the
unrepeated k feed it and share one table, the rotation goes inside (do_rotary, rotary_interleaved=0: for
a prompt without past, position s reads cache row s, as RotaryEmbedding does).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ...core.ir import Node, Tensor
from ...core.trees import is_noop
from ...spellings.attention import LAYOUT, AttentionForm, depends_on_input, read_attention
from ...spellings.common import ADD
from ..graph.kit import MS, Context, Emission, attr_value, make_node
from ..graph.shape_values import int_value
from .attention import (
    Builder,
    common_refusal,
    heads_of,
    key_input,
    multi_head_attention,
    scalar_of,
    write_output,
)
from .mask_band import causal_window
from .rotary import RotaryParts, rotary_parts

if TYPE_CHECKING:  # annotations only
    from ...fusion.match import Match

SHAPE_DTYPES = frozenset({"int64", "int32", "bool"})  # what shape computations make (Equal: bool)
MAX_DEAD = 256  # shape reads of removed tensors taken out with them, per emission


def grouped(m: Match) -> bool:
    """K and V both reach the scores through a grouped-query repeat."""
    return "repeat_k" in m.roles and "repeat_v" in m.roles


def _repeat_axis(ctx: Context, expand: Node) -> bool:
    """repeat_kv's form: Reshape(Expand(Unsqueeze(x, 2))) of a (B, Nkv, L, H) x (head h reads h // rep)."""
    if expand.kind != "expand" or not expand.inputs or expand.inputs[0] is None:
        return False
    u = expand.inputs[0].producer
    if u is None or u.kind != "unsqueeze" or u.name not in ctx.protos:
        return False
    axes = attr_value(ctx.protos[u.name], "axes")
    if axes is None and len(u.inputs) > 1 and u.inputs[1] is not None:
        v = int_value(u.inputs[1], ctx.weights)
        axes = None if v is None else [int(a) for a in np.reshape(v, -1)]
    return axes is not None and len(axes) == 1 and axes[0] % 5 == 2


def _score_scales(m: Match, ctx: Context) -> tuple[float, float | None] | str:
    """(scale, softcap) as GroupQueryAttention takes them, from the chain q k^T -> softmax: factors before
    a soft-cap's tanh (and on q and k) scale the product; c tanh(x / c) is the soft-cap; a factor after the
    tanh, or a layout op that moves values, does not fit."""
    inside = {id(n) for n in m.nodes}
    qk, t = m.roles["qk"], m.roles["softmax"].inputs[0]
    before, after, softcap = 1.0, 1.0, None
    for _ in range(64):
        p = t.producer
        if p is qk:
            break
        if p is None or id(p) not in inside:
            return "the score chain leaves the match"
        if p.kind in LAYOUT:
            if not is_noop(p) and p.kind not in ("unsqueeze", "squeeze", "reshape"):
                return f"{p.op_type} {p.name} between the scores and the softmax"
            t = p.inputs[0]
            continue
        ins = [x for x in p.inputs if x is not None]
        inner = [x for x in ins if x.producer is not None and id(x.producer) in inside]
        if p.kind in ADD or p.kind == "where":
            if len(inner) != 1:
                return f"{p.op_type} {p.name} joins two score chains"
            t = inner[0]
            continue
        if p.kind not in ("mul", "div") or len(ins) != 2 or len(inner) != 1:
            return f"{p.op_type} {p.name} between the scores and the softmax"
        x = inner[0]
        other = ins[1] if ins[0] is x else ins[0]
        c = scalar_of(ctx, other)
        if c is None or c == 0 or (p.kind == "div" and ins[1] is not other):
            return f"{p.op_type} {p.name} scales the scores by no constant"
        c = c if p.kind == "mul" else 1.0 / c
        if p.kind == "mul" and x.producer.kind == "tanh" and softcap is None and after == 1.0:
            softcap, t = c, x.producer.inputs[0]
            continue
        if softcap is None:
            after *= c
        else:
            before *= c
        t = x
    else:
        return "the score chain is too long"
    for role in ("q_scale", "k_scale"):
        node = m.roles.get(role)
        if node is not None:
            values = (scalar_of(ctx, x) for x in node.inputs if x is not None)
            c = next((v for v in values if v is not None), None)
            if c is None or c == 0 or (node.kind == "div" and scalar_of(ctx, node.inputs[1]) is None):
                return "the scale on q or k is not one constant"
            before *= c if node.kind == "mul" else 1.0 / c
    if softcap is None:
        scale = before * after  # no tanh: every factor scales q k^T (the causal 0 / -inf mask stays so)
        return (scale, None) if scale > 0 else "a scale that is not positive"
    if after != 1.0 or softcap <= 0:
        return "a scale after the soft-cap"
    return before * softcap, softcap  # c tanh(q k^T b / c) with b = s / c


def _mask_window(m: Match, form: AttentionForm, ctx: Context, q: Tensor) -> float | str:
    """The causal window of the attention's one mask (math.inf: plain causal), or why it does not fit."""
    if "position_bias" in m.roles:
        return "a position bias beside the mask"
    masks = len(form.terms) + len(form.bool_masks)
    if masks == 0:
        return "no mask: the attention is not causal"
    if masks > 1:
        return f"{masks} masks"
    node = m.roles.get("mask")
    if node is None:
        return "the mask's node is not known"
    if node.kind == "where":
        cond, a, b = node.inputs[0], node.inputs[1], node.inputs[2]
        inside = a.producer is not None and any(a.producer is n for n in m.nodes)
        fill = scalar_of(ctx, b if inside else a)
        mask, kind, keep = cond, "where", inside
    else:
        mask, kind, keep, fill = form.terms[0], "add", True, None
    if depends_on_input(mask, {}):
        return ("the mask depends on the inputs' values (a padding mask): GroupQueryAttention takes padding "
                "only as right-padded key lengths, which the mask does not prove")
    s = q.shape[2]
    return causal_window(ctx.weights, mask.name, kind, keep, fill, s if isinstance(s, int) else None)


def _rotary(ctx: Context, m: Match, x: Tensor) -> tuple[Match, RotaryParts, list[Node]] | None:
    """The rotary match that makes ``x`` (through a one-input Concat: TorchScript's update of an empty KV
    cache), read only by the attention (the Concat's shape reads go with it), its parts, and the Concat;
    else None."""
    inside = {id(n) for n in m.nodes}
    through: list[Node] = []
    p = x.producer
    if p is not None and p.op_type == "Concat" and len(p.inputs) == 1 and p.name in ctx.protos \
            and p.name not in ctx.claimed and x.name not in ctx.graph_outputs:
        through, x = [p], p.inputs[0]
        inside.add(id(p))
        p = x.producer
    r = None if p is None else ctx.by_root.get(p.name)
    if r is None or r.pattern.name != "rotary" or any(n.name in ctx.claimed for n in r.nodes):
        return None
    if x.name in ctx.graph_outputs or any(id(c) not in inside for c in x.consumers):
        return None
    parts = rotary_parts(r, ctx)
    return None if parts is None else (r, parts, through)


def _dead_readers(ctx: Context, removed: set[int], nodes: list[Node], kept: set[str]) -> list[Node]:
    """Shape computations outside the emission (Shape, Size, integer and bool ops) whose every output only
    removed nodes read (the export's Shape reads of the repeated K): removed with it, so that no reader is
    left without its tensor. ``kept``: tensors the new nodes read."""
    out: list[Node] = []
    stack = list(nodes)
    while stack and len(out) < MAX_DEAD:
        n = stack.pop()
        for t in n.inputs:
            p = None if t is None else t.producer
            if p is None or id(p) in removed or p.name in ctx.claimed or p.name not in ctx.protos \
                    or p.domain not in ("", "ai.onnx") \
                    or any(o is not None and o.name in kept for o in p.outputs):
                continue
            if p.kind not in ("shape", "size") \
                    and not all(o is None or o.dtype in SHAPE_DTYPES for o in p.outputs):
                continue
            if all(o is None or (o.name not in ctx.graph_outputs and o.consumers
                                 and all(id(c) in removed for c in o.consumers)) for o in p.outputs):
                removed.add(id(p))
                out.append(p)
                stack.append(p)
    return out


def _moved_shape_reads(ctx: Context, b: Builder, remove_nodes: list[Node], q: Tensor) -> list[Node]:
    """Shape / Size nodes that stay and read a removed tensor of q's own shape (the repeated V whose
    ``value.shape[-1]`` transformers' sdpa path reads): each made again reading ``q``, which the kernel
    reads and keeps. Same shape: both are (B, N, S, H) by the shape inference's dims, symbol for symbol
    (the repeat makes N heads of q's size from the keys of q's length). Returns the readers replaced."""
    removed = {id(n) for n in remove_nodes}
    shape = tuple(q.shape or ())
    if len(shape) != 4 or any(d is None for d in shape):
        return []
    out: list[Node] = []
    for n in remove_nodes:
        for t in n.outputs:
            if t is None or t.name in ctx.graph_outputs or tuple(t.shape or ()) != shape:
                continue
            readers = [c for c in t.consumers if id(c) not in removed]
            if not readers or not all(c.op_type in ("Shape", "Size") and c.domain in ("", "ai.onnx")
                                      and c.name in ctx.protos and c.name not in ctx.claimed
                                      for c in readers):
                continue
            for c in readers:
                p = ctx.protos[c.name]
                b.nodes.append(make_node(p.op_type, [q.name], p.output[0], ctx.names.new(f"{c.name}_of_q"),
                                         attrs=list(p.attribute)))
                removed.add(id(c))
                out.append(c)
    return out


def group_query_attention(m: Match, ctx: Context) -> Emission | str:
    """GroupQueryAttention for the match, or why its contract does not fit."""
    if ctx.target != "cpu":
        return f"its {ctx.target.upper()} kernel takes float16 and bfloat16 only"
    refusal = common_refusal(m, ctx)
    if refusal:
        return refusal
    r, pv = m.roles, m.roles["pv"]
    form = read_attention(pv)
    if not isinstance(form, AttentionForm) or form.k_kv is None or form.v_kv is None:
        return "the attention's form cannot be read again"
    if form.kv_cache:
        return "a KV cache (past keys joined in): the past_key / past_value contract is not derived"
    if not (_repeat_axis(ctx, r["repeat_k"]) and _repeat_axis(ctx, r["repeat_v"])):
        return "K/V are not repeated as repeat_kv does (head h reading K/V head h // groups)"
    key = key_input(m, ctx)
    if isinstance(key, str) or key[0] is not form.k or key[1] != [0, 1, 3, 2] or pv.inputs[1] is not form.v:
        return "K^T is not the repeated K with its last two axes swapped"
    q, k_kv, v_kv = m.bound["q"], form.k_kv, form.v_kv
    if k_kv.dtype != q.dtype or v_kv.dtype != q.dtype:
        return f"K or V is cast to {q.dtype} after its repeat (autocast): GroupQueryAttention takes one dtype"
    qh, kh, vh = heads_of(q), heads_of(k_kv), heads_of(v_kv)
    if qh is None or kh is None or vh is None:
        return "the head count or head size of q, k or v is unknown"
    (heads, size), (kv_heads, k_size) = qh, kh
    if size % 16:  # onnxruntime's kernel refuses other sizes at run time (1.32, CPU)
        return f"head size {size} is not a multiple of 16, which onnxruntime's kernel requires"
    if k_size != size or vh != kh or heads % kv_heads or kv_heads >= heads:
        return f"q has {heads} heads of {size}, K {kh} and V {vh}: no grouping GroupQueryAttention takes"
    if any(a is None or b is None or a != b for a, b in zip(q.shape[::2], k_kv.shape[::2], strict=True)) \
            or tuple(k_kv.shape) != tuple(v_kv.shape):
        return "the keys are not the queries' own (a cross-attention, or lengths that differ)"
    scales = _score_scales(m, ctx)
    if isinstance(scales, str):
        return scales
    window = _mask_window(m, form, ctx, q)
    if isinstance(window, str):
        return window
    scale, softcap = scales
    attrs = {"num_heads": heads, "kv_num_heads": kv_heads, "scale": float(scale)}
    if softcap is not None:
        attrs["softcap"] = float(softcap)
    if window != math.inf:
        attrs["local_window_size"] = int(window)
    q_rot, k_rot = _rotary(ctx, m, q), _rotary(ctx, m, k_kv)
    if q_rot is not None and k_rot is not None and q_rot[1].cos is k_rot[1].cos \
            and q_rot[1].sin is k_rot[1].sin:  # one table for q and k: GroupQueryAttention has one cache
        inside = [*q_rot[0].nodes, *k_rot[0].nodes, *q_rot[2], *k_rot[2]]
        e = _build(ctx, m, attrs, (q_rot[1].x, k_rot[1].x, v_kv), q_rot[1], inside)
        if not isinstance(e, str):
            return e  # else: a tensor of the rotation is read elsewhere; the rotation stays outside
    return _build(ctx, m, attrs, (q, k_kv, v_kv), None, [])


def _build(ctx: Context, m: Match, attrs: dict, qkv: tuple[Tensor, Tensor, Tensor],
           rotary: RotaryParts | None, taken: list[Node]) -> Emission | str:
    """The GroupQueryAttention emission reading q, k, v as (B, N, S, H), with the rotation inside when
    ``rotary`` is given (``taken``: the rotary matches' nodes it replaces too); why not when a tensor it
    removes is read by a node that stays."""
    pv = m.roles["pv"]
    heads, kv_heads = attrs["num_heads"], attrs["kv_num_heads"]
    size = qkv[0].shape[3]
    b = Builder(ctx, pv.name)
    caches: list[str] = []
    if rotary is not None:
        b.nodes += rotary.nodes
        b.inits += rotary.inits
        caches = rotary.caches
        attrs = dict(attrs, do_rotary=1, rotary_interleaved=int(rotary.interleaved))
    q3 = b.packed(qkv[0], [0, 2, 1, 3], heads * size)
    k3 = b.packed(qkv[1], [0, 2, 1, 3], kv_heads * size)
    v3 = b.packed(qkv[2], [0, 2, 1, 3], kv_heads * size)
    total = b.node("Cast", [b.node("Reshape", [_dim(b, q3, 1), b.const("scalar", np.zeros(0, np.int64))])],
                   to=6)  # int32
    last = b.node("Sub", [total, b.const("one32", np.array(1, np.int32))])
    seqlens = b.node("Expand", [last, _dim(b, q3, 0)])  # (B,) int32: S - 1 for every row
    o3 = b.node("GroupQueryAttention", [q3, k3, v3, "", "", seqlens, total, *caches], domain=MS, **attrs)
    remove_nodes = [*m.nodes, *taken]
    removed = {id(n) for n in remove_nodes}
    remove_nodes += _dead_readers(ctx, removed, remove_nodes, {i for n in b.nodes for i in n.input})
    remove_nodes += _moved_shape_reads(ctx, b, remove_nodes, qkv[0])
    remove = [n.name for n in remove_nodes]
    write_output(m, ctx, b, o3, heads, size, remove)
    removed = {id(n) for n in remove_nodes} | {id(n) for n in pv.outputs[0].consumers if n.name in remove}
    made = {o for n in b.nodes for o in n.output}
    for n in remove_nodes:
        for t in n.outputs:
            if t is not None and t.name not in made and (t.name in ctx.graph_outputs or any(
                    id(c) not in removed for c in t.consumers)):
                return f"{t.name} is read outside the attention"
    kernel = "GroupQueryAttention (rotary)" if rotary is not None else "GroupQueryAttention"
    return Emission(m.pattern.name, kernel, remove, b.nodes, b.inits)


def _dim(b: Builder, t: str, axis: int) -> str:
    """Shape(t)[axis:axis + 1] (a 1-D int64 of one element)."""
    if b.ctx.opset >= 15:
        return b.node("Shape", [t], start=axis, end=axis + 1)
    return b.node("Slice", [b.node("Shape", [t]), b.const(f"from{axis}", np.array([axis], np.int64)),
                            b.const(f"to{axis}", np.array([axis + 1], np.int64))])


def attention(m: Match, ctx: Context) -> Emission | None:
    """The match as GroupQueryAttention where it is a grouped-query decoder's causal self-attention and the
    kernel's contract fits, else as MultiHeadAttention; None, with the reason in ``ctx.skipped``,
    for a form neither runs (every attention the rewrite leaves is said, never silently missed)."""
    pv = m.roles["pv"]
    why_not_gqa = None
    if grouped(m):
        emission = group_query_attention(m, ctx)
        if not isinstance(emission, str):
            return emission
        why_not_gqa = emission
    emission = multi_head_attention(m, ctx)
    if isinstance(emission, str):
        extra = f" (GroupQueryAttention: {why_not_gqa})" if why_not_gqa else ""
        ctx.skipped.append(f"attention at {pv.name}: {emission}{extra}")
        return None
    if why_not_gqa:
        ctx.skipped.append(f"GroupQueryAttention at {pv.name}: {why_not_gqa}; MultiHeadAttention over the "
                           "repeated K/V instead")
    return emission

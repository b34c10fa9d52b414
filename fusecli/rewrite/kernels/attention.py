"""Attention written out -> ONNX Runtime's MultiHeadAttention (com.microsoft; CPU float32, CUDA).

softmax(q k^T s + bias) v with q, k, v as (B, N, S, H) heads: MultiHeadAttention takes them packed as
(B, S, N H), so each goes through Transpose(0, 2, 1, 3) + Reshape(0, 0, N H) (pairs ONNX Runtime's
transpose optimizer cancels against the export's own head split), and the output is split back the
same way. The additive bias (B|1, N|1, S, L) is the export's mask (Add), a causal Where turned into an
additive one, and T5's position bias, broadcast to (., ., S, L) (a scalar bias too: the kernel checks
both lengths). Grouped-query K/V enter after their repeat (the repeat nodes stay) where
GroupQueryAttention (gqa.py) does not fit; a Dropout is the identity in inference. Heads-merged
attention (BLOOM: q, K^T, v and the scores as (B N, ., .), split to (B, N, S, L) before the softmax;
Whisper, older GPT-2: the softmax over (B N, S, L) itself) is read through its merges (merged_heads).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ...core.ir import Node, Tensor
from ...core.trees import is_noop
from ...spellings.attention import (
    ABSORBING,
    LAYOUT,
    AttentionForm,
    depends_on_input,
    read_attention,
    scalar_value,
    terms_refusal,
    where_fill,
)
from ...spellings.common import ADD
from ..graph.kit import MS, Context, Emission, attr_value, dtype_of, make_node, new_initializer, same_dims
from ..graph.shape_values import int_value
from .mask_band import rows_kept
from .merged_heads import merged_terms, read_merged, write_shapes

if TYPE_CHECKING:  # annotations only
    from ...fusion.match import Match



def scalar_of(ctx: Context, t: Tensor | None, depth: int = 8) -> float | None:
    """A one-element value: a constant, or float arithmetic on constants and static dims (TorchScript's
    sdpa scale 1 / sqrt(Shape(q)[-1]) with the head size known); None otherwise."""
    if t is None:
        return None
    v = ctx.weights.value(t.name)
    if v is not None:
        return None if np.size(v) != 1 else float(np.reshape(v, -1)[0])
    i = int_value(t, ctx.weights)
    if i is not None:
        return None if i.size != 1 else float(i.reshape(-1)[0])
    p = t.producer
    if p is None or depth == 0 or p.op_type not in _FLOAT_OPS:
        return None
    args = [scalar_of(ctx, x, depth - 1) for x in p.inputs if x is not None]
    if not args or any(a is None for a in args) or len(args) != _FLOAT_OPS[p.op_type][0]:
        return None
    try:
        return float(_FLOAT_OPS[p.op_type][1](*args))
    except (ArithmeticError, ValueError):
        return None


_FLOAT_OPS = {  # op: (inputs, value); the shape-computed scales exporters write
    "Cast": (1, lambda x: x), "Identity": (1, lambda x: x), "Sqrt": (1, math.sqrt),
    "Reciprocal": (1, lambda x: 1.0 / x), "Div": (2, lambda x, y: x / y), "Mul": (2, lambda x, y: x * y),
    "Pow": (2, lambda x, y: x ** y),
}


def attention_scale(m: Match, ctx: Context) -> float | None:
    """The product of the constant scales on q, k^T and q k^T (sdpa scales q and k^T by sqrt(s) each)."""
    scale = 1.0
    for role in ("scale", "q_scale", "k_scale"):
        node = m.roles.get(role)
        if node is None:
            continue
        values = (scalar_of(ctx, t) for t in node.inputs if t is not None)
        c = next((v for v in values if v is not None), None)
        if c is None or c == 0 or (node.kind == "div" and scalar_of(ctx, node.inputs[1]) is None):
            return None
        scale *= c if node.kind == "mul" else 1.0 / c
    return scale


def _mha_form(m: Match, layouts: bool = False) -> AttentionForm | str:
    """The attention's form when MultiHeadAttention runs it as written (at most a mask and a position bias,
    one scale and that on q k^T itself, no layout op between the scores and the softmax unless
    ``layouts``: the caller reads them), else why not."""
    form = read_attention(m.roles["pv"])
    if not isinstance(form, AttentionForm):
        return "the attention's form cannot be read again"
    if form.softcap is not None:
        return ("soft-capped scores: MultiHeadAttention has no soft-cap (GroupQueryAttention's softcap is "
                "not emitted)")
    qk, scale = m.roles["qk"], m.roles.get("scale")
    scales = sum(r in m.roles for r in ("scale", "q_scale", "k_scale"))
    on_product = scale is None or any(t is qk.outputs[0] for t in scale.inputs)
    if len(form.scales) != scales or not on_product:
        return "a scale on the masked scores, not on q k^T: MultiHeadAttention scales before its bias"
    if layouts:
        return form
    if any(n.kind in LAYOUT and not is_noop(n) and between_scores(n, m) for n in m.nodes):
        return "a layout op between the scores and the softmax: no attention_bias shape fits"
    return terms_refusal(form, merged=False) or form


def fill_note(form: AttentionForm, at: str) -> str:
    """The warning for a Where whose fill does not absorb, written additively beside a term made from the
    inputs' values (a padding mask): the one place the two differ, else ''."""
    where, fill = where_fill(form)
    if where is None or fill is None or fill <= ABSORBING or not form.terms \
            or not any(depends_on_input(t, {}) for t in form.terms):
        return ""
    return (f"attention at {at}: MultiHeadAttention adds the mask's fill {fill:g} to the scores where the "
            f"export's Where puts {fill:g} in their place: equal wherever a query keeps a key, different on "
            "a query whose every key the padding mask hides (a padding position's own row)")


def rows_checked(ctx: Context) -> Callable[[Node], str | None]:
    """terms_refusal's ``kept`` for this graph: a Where whose condition is computed from shapes alone and,
    run at probe sizes (mask_band.rows_kept), leaves every query a key."""
    def kept(where: Node) -> str | None:
        cond, score = where.inputs[0], where.inputs[1]
        if depends_on_input(cond, {}):
            return "the mask depends on the inputs' values"
        keep_true = score.producer is not None and scalar_value(score) is None
        return rows_kept(ctx.weights, cond.name, keep_true)
    return kept


def between_scores(node: Node, m: Match) -> bool:
    """A node on the path from q k^T to the softmax (not on the q, k or v side)."""
    inside = {id(n) for n in m.nodes}
    t, qk = m.roles["softmax"].inputs[0], m.roles["qk"]
    for _ in range(64):
        p = t.producer
        if p is None or p is qk or id(p) not in inside:
            return False
        if p is node:
            return True
        t = next((x for x in p.inputs if x is not None and x.producer is not None
                  and id(x.producer) in inside), None)
        if t is None:
            return False
    return False


def perm_of(ctx: Context, node: Node) -> list[int] | None:
    p = attr_value(ctx.protos[node.name], "perm")
    return None if p is None else [int(a) for a in p]


def heads_of(t: Tensor) -> tuple[int, int] | None:
    """(N, H) of a (B, N, S, H) tensor whose head count and size are known."""
    s = t.shape
    if s is None or len(s) != 4 or not isinstance(s[1], int) or not isinstance(s[3], int):
        return None
    return s[1], s[3]


class Builder:
    """New nodes and initializers of one emission, with unique names."""

    def __init__(self, ctx: Context, base: str):
        self.ctx, self.base, self.nodes, self.inits = ctx, base, [], []

    def node(self, op: str, inputs: list[str], output: str | None = None, domain: str = "", **kw) -> str:
        out = output or self.ctx.names.new(f"{self.base}_{op}")
        self.nodes.append(make_node(op, inputs, out, self.ctx.names.new(f"{self.base}_{op}"), domain, **kw))
        return out

    def const(self, name: str, value: np.ndarray) -> str:
        return new_initializer(self.ctx, f"{self.base}_{name}", value, self.inits)

    def packed(self, t: Tensor, perm: list[int], hidden: int, keep_transpose: bool = False) -> str:
        """``t`` seen through ``perm`` as (B, S, N, H), then (B, S, N H). Where ``t`` is itself a
        Transpose of the export's head split, its input is read instead (one transpose, or none),
        unless ``keep_transpose``."""
        src = t.producer
        if src is not None and src.op_type == "Transpose" and src.name in self.ctx.protos \
                and not keep_transpose:
            p0 = perm_of(self.ctx, src)
            if p0 is not None and len(p0) == 4:
                t, perm = src.inputs[0], [p0[i] for i in perm]
        moved = t.name if perm == [0, 1, 2, 3] else self.node("Transpose", [t.name], perm=perm)
        return self.node("Reshape", [moved, self.const("packed_shape", np.array([0, 0, hidden], np.int64))])


def _bias(m: Match, ctx: Context, b: Builder, q3: str, k3: str) -> str | None:
    """The additive attention bias as a (B|1, N|1, S, L) tensor name, '' when there is none: the additive
    terms (a mask, a position bias) and each bool mask's Where on the scores made additive."""
    terms = [m.bound[role].name for role in ("mask", "position_bias")
             if role in m.roles and m.roles[role].kind in ADD]
    for node in m.nodes:  # GPT-2: Where(causal, s, c) + the padding mask
        if node.kind == "where" and between_scores(node, m):
            term = where_term(m, ctx, b, node, node.inputs[0].name)
            if term is None:
                return None
            terms.append(term)
    return bias_of(ctx, b, terms, q3, k3)


def where_term(m: Match, ctx: Context, b: Builder, where: Node, cond: str) -> str | None:
    """where(cond, s, c) or where(cond, c, s) as an additive term: the constant c where the condition says
    (``cond``: the condition's name, in the bias's layout); None when c is no one constant."""
    a, c = where.inputs[1], where.inputs[2]
    fill = c if a.producer is not None and any(a.producer is n for n in m.nodes) else a
    value = scalar_of(ctx, fill)
    if value is None:
        return None
    zero, fv = b.const("zero", np.zeros((), np.float32)), b.const("fill", np.array(value, np.float32))
    return b.node("Where", [cond, zero, fv] if fill is c else [cond, fv, zero])


def bias_of(ctx: Context, b: Builder, terms: list[str], q3: str, k3: str) -> str:
    """The sum of ``terms`` broadcast to (., ., S, L) (MultiHeadAttention wants the query and key lengths
    there: a scalar or size-1 bias is expanded on both); '' for none."""
    if not terms:
        return ""
    bias = terms[0]
    for t in terms[1:]:
        bias = b.node("Add", [bias, t])
    # (1, 1, S, L): Expand broadcasts, so a (B|1, N|1, S|1, L|1) bias keeps its own B and N
    shape = b.node("Concat", [b.const("ones", np.array([1, 1], np.int64)), length_of(ctx, b, q3),
                              length_of(ctx, b, k3)], axis=0)
    return b.node("Expand", [bias, shape])


def length_of(ctx: Context, b: Builder, packed: str) -> str:
    """The sequence length (axis 1) of a packed (B, S, N H) tensor, as a 1-D int64."""
    if ctx.opset >= 15:
        return b.node("Shape", [packed], start=1, end=2)
    return b.node("Slice", [b.node("Shape", [packed]), b.const("one", np.array([1], np.int64)),
                            b.const("two", np.array([2], np.int64))])


def common_refusal(m: Match, ctx: Context) -> str | None:
    """Why neither attention kernel runs the match as written (dtype, ops, opset, softmax axis, a Dropout
    that may be live), else None."""
    r = m.roles
    qk, pv, softmax = r["qk"], r["pv"], r["softmax"]
    if dtype_of(m) != "float32":
        return f"the attention kernels here run float32 only, not {dtype_of(m)}"
    if qk.kind != "matmul" or pv.kind != "matmul":
        return "the scores or the output are no MatMul (a batched GEMM, or one Einsum and one MatMul)"
    if ctx.opset < 13:
        return f"opset {ctx.opset} < 13"
    shape = qk.outputs[0].shape
    rank = 4 if shape is None else len(shape)
    axis = attr_value(ctx.protos[softmax.name], "axis", -1)
    if rank not in (3, 4):
        return f"rank-{rank} scores: the kernels take (B, N, S, L) or heads-merged (B N, S, L)"
    if axis % rank != rank - 1:  # (B, N, S, L) or heads-merged (B N, S, L): the keys are the last axis
        return f"the softmax is over axis {axis} of rank-{rank} scores, not the keys (axis {rank - 1})"
    d = r.get("dropout")
    if d is not None and len(ctx.protos[d.name].input) > 2 and ctx.protos[d.name].input[2]:
        return "a Dropout with a training_mode input (not provably the identity)"
    return None


def key_input(m: Match, ctx: Context) -> tuple[Tensor, list[int]] | str:
    """(k_in, P) with K^T (B, N, H, L) = transpose(k_in, P), or why K^T is no such transpose."""
    r = m.roles
    kt = r.get("k_transpose")
    k_in, p = (kt.inputs[0], perm_of(ctx, kt)) if kt is not None else (r["qk"].inputs[1], [0, 1, 2, 3])
    if "k_transpose_3d" in r:
        k_in, p = m.bound["k"], transposed_3d(r["k_transpose_3d"], m.bound["k"], ctx)
    if p is None or sorted(p) != [0, 1, 2, 3]:
        return "K^T is no 4-D transpose of a (batch, heads, keys, head size) K"
    return k_in, p


def write_output(m: Match, ctx: Context, b: Builder, o3: str, heads: int, head_size: int,
                 remove: list[str], out: Tensor | None = None) -> None:
    """The kernel's (B, S, N H) output written where the attention's (B, N, S, H) output ``out`` (P @ V's
    by default) went: the export's own merge transpose is written directly (and joins ``remove``), else a
    split and transpose back."""
    out = out or m.roles["pv"].outputs[0]
    heads_shape = b.const("heads_shape", np.array([0, 0, heads, head_size], np.int64))
    merge = merge_heads(out, ctx)
    if merge is not None:  # the export's own (B, N, S, H) -> (B, S, N, H) transpose: written directly
        b.node("Reshape", [o3, heads_shape], merge.outputs[0].name)
        remove.append(merge.name)
    else:
        split = b.node("Reshape", [o3, heads_shape])
        b.node("Transpose", [split], out.name, perm=[0, 2, 1, 3])


def multi_head_attention(m: Match, ctx: Context) -> Emission | str:
    pv = m.roles["pv"]
    if m.roles["qk"].kind == "einsum" and pv.kind == "einsum":  # Keras's attention (tf2onnx, lowering off)
        if dtype_of(m) != "float32":
            return f"the attention kernels here run float32 only, not {dtype_of(m)}"
        form = _mha_form(m)
        return form if isinstance(form, str) else _einsum_attention(m, ctx)
    refusal = common_refusal(m, ctx)
    if refusal:
        return refusal
    form = _mha_form(m, layouts=True)
    if isinstance(form, str):
        return form
    merged = read_merged(m, ctx)  # scores, q, k and v as (B N, ., .): read the (B, N, ., .) they merge
    if isinstance(merged, str):
        return merged
    why = terms_refusal(form, merged is not None, rows_checked(ctx))
    if why:
        return why
    if merged is not None:
        q, k_in, kperm, v_in = merged.q, merged.k, merged.kperm, merged.v
    else:
        q = m.bound["q"]
        key = key_input(m, ctx)
        if isinstance(key, str):
            return key
        k_in, p = key
        if p[0] != 0:
            return "K's batch axis moved"
        kperm = [p[0], p[3], p[1], p[2]]  # (B, L, N, H) is k_in through this
        v_in = pv.inputs[1]
    qh, vh = heads_of(q), heads_of(v_in)
    ks = k_in.shape
    if qh is None or vh is None or ks is None or len(ks) != 4 or vh[0] != qh[0]:
        return "the head count or head size of q, k or v is unknown"
    scale = attention_scale(m, ctx)
    if scale is None:
        return "the scale is not one constant"
    heads, size = qh
    b = Builder(ctx, pv.name)
    q3 = b.packed(q, [0, 2, 1, 3], heads * size)
    k3 = b.packed(k_in, kperm, heads * size)
    v3 = b.packed(v_in, [0, 2, 1, 3], heads * vh[1])
    if merged is None:
        bias = _bias(m, ctx, b, q3, k3)
    else:
        terms = merged_terms(m, ctx, b, merged, lambda node, cond: where_term(m, ctx, b, node, cond))
        bias = None if terms is None else bias_of(ctx, b, terms, q3, k3)
    if bias is None:
        return ("a bool mask whose fill value is not one constant" if merged is None else
                "a score term whose layout is not (B N, ., .), or a bool mask whose fill is not one constant")
    o3 = b.node("MultiHeadAttention", [q3, k3, v3, "", "", bias], domain=MS, num_heads=heads, scale=scale)
    if form.guard:  # sdpa's NaN guard: a row whose every key is masked gives zeros, not NaN
        o3 = b.node("Where", [b.node("IsNaN", [o3]), b.const("guard_zero", np.zeros((), np.float32)), o3])
    keep = feeding(m, [k_in, v_in])
    remove = [n.name for n in m.nodes if id(n) not in keep]
    if merged is None:
        write_output(m, ctx, b, o3, heads, vh[1], remove)
    else:  # where the export split P @ V's (B N, S, Hv) output into (B, N, S, Hv)
        remove += write_shapes(ctx, b, m, merged, q3, k3) + [merged.out_split.name]
        write_output(m, ctx, b, o3, heads, vh[1], remove, merged.out_split.outputs[0])
    return Emission(m.pattern.name, "MultiHeadAttention", remove, b.nodes, b.inits,
                    note=fill_note(form, pv.name))


def _equation(ctx: Context, node: Node) -> tuple[list[str], str] | None:
    """An Einsum's explicit equation as (input subscripts, output subscript), letters only."""
    eq = attr_value(ctx.protos[node.name], "equation", "").replace(" ", "")
    if "->" not in eq or "." in eq:
        return None
    ins, out = eq.split("->")
    ins = ins.split(",")
    if not all(x.isalpha() for x in (*ins, out)) or any(len(set(x)) != len(x) for x in (*ins, out)):
        return None
    return ins, out


def _einsum_attention(m: Match, ctx: Context) -> Emission | str:
    """Keras's attention: scores = einsum(q, k) -> (B, N, T, S) ('btnh,bsnh->bnts', or older Keras's
    'aecd,abcd->acbe' with the key first), out = einsum(P, v) -> (B, T, N, H) ('bnts,bsnh->btnh'):
    q, k and v are packed as (B, T|S, N H) by a Transpose where their layout is not that already."""
    r = m.roles
    qk, pv, softmax = r["qk"], r["pv"], r["softmax"]
    eqs = _equation(ctx, qk), _equation(ctx, pv)
    if eqs[0] is None or eqs[1] is None or len(eqs[0][0]) != 2 or len(eqs[1][0]) != 2:
        return "an Einsum equation that is not two explicit operands"
    (a, b), scores = eqs[0]
    (p_sub, v_sub), out = eqs[1]
    if len(scores) != 4 or any(len(x) != 4 for x in (a, b, p_sub, v_sub, out)):
        return "Einsum operands that are not (batch, heads, sequence, head size)"
    contracted = set(a) & set(b) - set(scores)
    shared = [c for c in scores if c in a and c in b]
    own = [c for c in scores if (c in a) != (c in b)]
    if len(contracted) != 1 or len(shared) != 2 or len(own) != 2:
        return f"the scores' Einsum {'->'.join((a + ',' + b, scores))} is no q k^T per batch and head"
    bat, heads, h = shared[0], shared[1], contracted.pop()  # the first shared axis of the scores is batch
    t_, s_ = own
    qi = 0 if t_ in a else 1  # the query holds the scores' first own axis (rows), the key the second
    q, k = (m.bound["q"], m.bound["k"]) if qi == 0 else (m.bound["k"], m.bound["q"])
    q_sub, k_sub = (a, b) if qi == 0 else (b, a)
    axis = attr_value(ctx.protos[softmax.name], "axis", -1)
    if axis % 4 != scores.index(s_):
        return (f"the softmax is over axis {axis} ({scores[axis % 4]}) of the scores {scores}, not the keys "
                f"(axis {scores.index(s_)}, {s_})")
    if (m.roles.get("mask") is not None or m.roles.get("position_bias") is not None) \
            and scores != bat + heads + t_ + s_:
        return "a mask on scores that are not (batch, heads, queries, keys)"
    if pv.inputs[1] is not m.bound["v"]:
        return "P @ V's Einsum reads the value first"
    hv = "#v"  # the value's head size: its own letter, whatever the scores' equation calls its letters
    role = dict(zip(p_sub, scores, strict=True))  # P's letters -> the scores' letters
    v_role = {c: role.get(c, hv) for c in v_sub}
    out_role = {c: role.get(c, hv) for c in out}
    want_v, want_out = {bat, s_, heads, hv}, {bat, t_, heads, hv}
    if set(v_role.values()) != want_v or set(out_role.values()) != want_out:
        return f"P @ V's Einsum {p_sub},{v_sub}->{out} is no attention output per batch and head"
    v = m.bound["v"]
    dims: dict[str, int] = {}
    for t, names in ((q, q_sub), (k, k_sub), (v, [v_role[c] for c in v_sub])):
        if t.shape is None or len(t.shape) != 4:
            return "the rank of q, k or v is unknown"
        for c, d in zip(names, t.shape, strict=True):
            if c in (heads, h, hv):
                if not isinstance(d, int) or dims.setdefault(c, d) != d:
                    return "the head count or head size of q, k or v is unknown or differs"
    if dims[h] == 0 or dims[heads] == 0:
        return "zero heads or a zero head size"
    scale = attention_scale(m, ctx)
    if scale is None:
        return "the scale is not one constant"
    n, size, vsize = dims[heads], dims[h], dims[hv]
    b_ = Builder(ctx, pv.name)
    q3 = b_.packed(q, [q_sub.index(c) for c in (bat, t_, heads, h)], n * size, keep_transpose=True)
    k3 = b_.packed(k, [k_sub.index(c) for c in (bat, s_, heads, h)], n * size, keep_transpose=True)
    v_names = [v_role[c] for c in v_sub]
    v3 = b_.packed(v, [v_names.index(c) for c in (bat, s_, heads, hv)], n * vsize, keep_transpose=True)
    bias = _bias(m, ctx, b_, q3, k3)
    if bias is None:
        return "a bool mask whose fill value is not one constant"
    o3 = b_.node("MultiHeadAttention", [q3, k3, v3, "", "", bias], domain=MS, num_heads=n, scale=scale)
    heads_shape = b_.const("heads_shape", np.array([0, 0, n, vsize], np.int64))
    have = [bat, t_, heads, hv]  # the kernel's output, split: (B, T, N, Hv)
    perm = [have.index(out_role[c]) for c in out]
    if perm == [0, 1, 2, 3]:
        b_.node("Reshape", [o3, heads_shape], pv.outputs[0].name)
    else:
        b_.node("Transpose", [b_.node("Reshape", [o3, heads_shape])], pv.outputs[0].name, perm=perm)
    return Emission(m.pattern.name, "MultiHeadAttention", [x.name for x in m.nodes], b_.nodes, b_.inits)


def transposed_3d(t: Node, k: Tensor, ctx: Context) -> list[int] | None:
    """[0, 1, 3, 2] when Reshape(Transpose(Reshape(k, (B N, S, H)), (0, 2, 1)), (B, N, H, S)) is K^T of a
    (B, N, S, H) k with N and H known (the split of B N back into B, N undoes the merge), else None."""
    merged, split = t.inputs[0], t.outputs[0].consumers
    ks = k.shape
    if merged is None or merged.producer is None or merged.producer.inputs[0] is not k or len(split) != 1 \
            or ks is None or len(ks) != 4 or not isinstance(ks[1], int) or not isinstance(ks[3], int) \
            or perm_of(ctx, t) != [0, 2, 1]:
        return None
    out = split[0].outputs[0].shape
    if merged.shape is None or len(merged.shape) != 3 or not same_dims(merged.shape[1:], ks[2:], ctx.sizes) \
            or out is None or not same_dims(out[1:], (ks[1], ks[3], ks[2]), ctx.sizes) or ks[2] is None:
        return None
    return [0, 1, 3, 2]


def merge_heads(out: Tensor, ctx: Context) -> Node | None:
    """The one consumer of the attention output when it is Transpose(0, 2, 1, 3), else None."""
    if out.name in ctx.graph_outputs or len(out.consumers) != 1:
        return None
    t = out.consumers[0]
    if t.op_type != "Transpose" or t.name not in ctx.protos or t.name in ctx.claimed \
            or perm_of(ctx, t) != [0, 2, 1, 3]:
        return None
    return t


def feeding(m: Match, ts: list[Tensor]) -> set[int]:
    """ids of the match's nodes that make ``ts`` (the grouped-query repeats): they stay."""
    inside = {id(n): n for n in m.nodes}
    keep, stack = set(), [t.producer for t in ts if t.producer is not None]
    while stack:
        n = stack.pop()
        if id(n) in inside and id(n) not in keep:
            keep.add(id(n))
            stack += [t.producer for t in n.inputs if t is not None and t.producer is not None]
    return keep


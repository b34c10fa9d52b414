"""Heads-merged attention (BLOOM's baddbmm and bmm): q, K^T and v reshaped from (B, N, S, H) to (B N, S, H),
the scores q k^T s + terms computed as (B N, S, L), split to (B, N, S, L) by one Reshape (a 4-D mask added
there), and P merged back to (B N, S, L) for P @ V, whose (B N, S, H) output the export splits into heads
again. Whisper and older GPT-2 exports never split the scores: the softmax runs over (B N, S, L) (axis 2),
K^T a Transpose(0, 2, 1) of the merged K.

MultiHeadAttention reads the (B, N, ., H) tensors the merges were made of; a (B N, ., .) score term is split
the same way (Unsqueeze + Reshape to (B, N, ., .), sizes read at run time) into its attention_bias; the
kernel's output is written where the export's split of P @ V's output wrote, and the Shape ops that read
P @ V's output read the same sizes from q's merge instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ...core.dims import same_dim
from ...core.ir import Node, Tensor
from ...core.trees import is_noop
from ...spellings.attention import LAYOUT
from ..graph.kit import Context, attr_value

if TYPE_CHECKING:  # annotations only
    from ...fusion.match import Match


@dataclass
class MergedHeads:
    """Where a heads-merged attention's (B, N, ., .) tensors are."""

    q: Tensor  # (B, N, S, H): what q's (B N, S, H) merge reads
    k: Tensor  # K: k through kperm is (B, L, N, H)
    kperm: list[int]
    v: Tensor  # (B, N, L, Hv)
    heads: int
    chain: list[tuple[Node, Tensor]]  # the score ops from the softmax back to q k^T, with their chain input
    merged: set[int] = field(default_factory=set)  # ids of the chain's ops on (B N, S, L) scores
    out_split: Node | None = None  # P @ V's output (B N, S, Hv) -> (B, N, S, Hv)
    shapes: list[Node] = field(default_factory=list)  # Shape ops reading the replaced tensors


def score_chain(m: Match) -> list[tuple[Node, Tensor]]:
    """The match's ops from the softmax's input back to q k^T (exclusive), each with the input it reads
    the scores from."""
    inside = {id(n) for n in m.nodes}
    qk, out = m.roles["qk"], []
    t = m.roles["softmax"].inputs[0]
    for _ in range(64):
        p = t.producer if t is not None else None
        if p is None or p is qk or id(p) not in inside:
            return out
        nxt = next((x for x in p.inputs if x is not None and x.producer is not None
                    and id(x.producer) in inside), None)
        if nxt is None:
            return out
        out.append((p, nxt))
        t = nxt
    return out


def merge_of(t3: Tensor, t4: Tensor, heads: int | None = None) -> bool:
    """Whether (B N, S, X) ``t3`` and (B, N, S, X) ``t4`` hold the same values as a Reshape relates them:
    the trailing sizes agree (so the leading ones are N B merged, row-major), N known (and ``heads``)."""
    s3, s4 = t3.shape, t4.shape
    if s3 is None or s4 is None or len(s3) != 3 or len(s4) != 4 or not isinstance(s4[1], int):
        return False
    return (heads is None or s4[1] == heads) and same_dim(s3[1], s4[2]) and same_dim(s3[2], s4[3])


def unmerged(t: Tensor, heads: int | None = None) -> Tensor | None:
    """The (B, N, S, H) tensor a (B N, S, H) ``t`` is a Reshape of (N known), else None."""
    p = t.producer
    if p is None or p.op_type != "Reshape" or not p.inputs or p.inputs[0] is None:
        return None
    src = p.inputs[0]
    return src if merge_of(t, src, heads) else None


def perm_of(ctx: Context, node: Node) -> list[int] | None:
    p = attr_value(ctx.protos[node.name], "perm")
    return None if p is None else [int(a) for a in p]


def read_merged(m: Match, ctx: Context) -> MergedHeads | str | None:
    """The heads-merged form of the match; None where no layout op sits between the scores and the
    softmax (the (B, N, S, L) form); why not where one does and this is no such form."""
    chain = score_chain(m)
    layout = [i for i, (n, _) in enumerate(chain) if n.kind in LAYOUT and not is_noop(n)]
    if not layout and scores_rank(m) != 3:
        return None
    why = _read(m, ctx, chain, layout)
    if isinstance(why, str) and not layout:
        return f"heads-merged (B N, S, L) scores: {why}"
    if isinstance(why, str):
        return f"a layout op between the scores and the softmax: no attention_bias shape fits ({why})"
    return why


def scores_rank(m: Match) -> int | None:
    """The rank of q k^T's output, None where unknown."""
    s = m.roles["qk"].outputs[0].shape
    return None if s is None else len(s)


def _read(m: Match, ctx: Context, chain: list[tuple[Node, Tensor]], layout: list[int]) -> MergedHeads | str:
    r = m.roles
    if layout:  # BLOOM: the scores split to (B, N, S, L) by one Reshape before the softmax
        split, _ = chain[layout[0]]
        if len(layout) != 1 or split.op_type != "Reshape":
            return "more than one, or one that is no Reshape"
        shape = split.outputs[0].shape
        heads = shape[1] if shape and len(shape) == 4 else None
        if not isinstance(heads, int) or not merge_of(split.inputs[0], split.outputs[0]):
            return "the Reshape is no split of (B N, S, L) scores into (B, N, S, L)"
    else:  # Whisper, older GPT-2: the softmax over (B N, S, L) scores; N from q's merge
        src = unmerged(m.bound["q"])
        heads = src.shape[1] if src is not None else None
        if heads is None:
            return "q is no Reshape of a (B, N, S, H) tensor with N known"
    if any(x in r for x in ("k_transpose_3d", "repeat_k", "repeat_v")):
        return "heads-merged scores with a repeated K or V, or dynamo's 3-D K^T"
    q = unmerged(m.bound["q"], heads)
    k = unmerged(m.bound["k"], heads)
    pv = r["pv"]
    v = unmerged(pv.inputs[1], heads)
    kt = r.get("k_transpose")
    if kt is not None and perm_of(ctx, kt) != [0, 2, 1]:
        return "K^T is no (0, 2, 1) transpose of a heads-merged K"
    if q is None or k is None or v is None:
        return "q, k or v is no Reshape of a (B, N, S, H) tensor with N known"
    if not isinstance(q.shape[3], int) or not isinstance(v.shape[3], int):
        return "the head size of q or v is unknown"
    kperm = [0, 2, 1, 3] if kt is not None else [0, 3, 1, 2]  # K or K^T (B, N, H, L) -> (B, L, N, H)
    if k.shape[kperm[3]] != q.shape[3]:
        return "q and k differ in head size"
    sm = r["softmax"]
    if layout and not merge_of(pv.inputs[0], sm.outputs[0], heads):
        return "the probabilities are not merged back to (B N, S, L) for P @ V"
    on_merged = chain[layout[0] + 1:] if layout else chain
    mh = MergedHeads(q, k, kperm, v, heads, chain, {id(n) for n, _ in on_merged})
    out = pv.outputs[0]
    if out.name in ctx.graph_outputs:
        return "P @ V's (B N, S, H) output is a graph output"
    for c in out.consumers:
        if c.name not in ctx.protos or c.name in ctx.claimed:
            return f"{c.op_type} {c.name} reads P @ V's output and is rewritten already"
        if c.op_type == "Shape":
            mh.shapes.append(c)
        elif c.op_type == "Reshape" and c.inputs[0] is out and mh.out_split is None \
                and merge_of(out, c.outputs[0], heads):
            mh.out_split = c
        else:
            return f"{c.op_type} {c.name} reads P @ V's (B N, S, H) output (not its split into heads)"
    if mh.out_split is None:
        return "P @ V's (B N, S, H) output is not split into heads"
    inside = {id(n) for n in m.nodes}
    for n in m.nodes:  # the export reads the scores' sizes too (TorchScript: the split's target)
        for t in n.outputs:
            for c in t.consumers if t is not out else ():
                if id(c) not in inside and c.op_type == "Shape" and c.name in ctx.protos \
                        and c.name not in ctx.claimed:
                    mh.shapes.append(c)
    for c in mh.shapes:
        if any(_size(mh, m, d) is None for d in c.inputs[0].shape or [None]):
            return f"{c.op_type} {c.name} reads a size that is not (B N, B, N, S, L or H)"
    if not same_dim(m.bound["q"].shape[0], out.shape[0]) or not same_dim(q.shape[2], out.shape[1]):
        return "P @ V's output and q differ in batch or length"
    return mh


def merged_terms(m: Match, ctx: Context, b, mh: MergedHeads, where_term) -> list[str] | None:
    """The score terms as names of tensors that broadcast over (B, N, S, L): 4-D terms as they are,
    (B N, ., .) terms split into (B, N, ., .), a Where's condition made additive by
    ``where_term(node, cond)``; None for a term whose layout is unknown."""
    scores3 = mh.chain[-1][1] if mh.chain else None
    out = []
    for node, on in mh.chain:
        merged = id(node) in mh.merged
        if node.kind in ("add", "sum", "bias_add"):
            xs = [x for x in node.inputs if x is not None and x is not on]
        elif node.kind == "where":
            xs = [node.inputs[0]]
        else:
            continue
        for x in xs:
            name = x.name
            if merged:
                s = x.shape
                if s is None:
                    return None
                if len(s) == 3 and s[0] != 1:  # (B N, ., .): split the heads out
                    if scores3 is None or not same_dim(s[0], scores3.shape[0]):
                        return None
                    axes = b.const("unsqueeze_axes", np.array([1], np.int64))
                    shape = b.const("split_shape", np.array([-1, mh.heads, 0, 0], np.int64))
                    name = b.node("Reshape", [b.node("Unsqueeze", [name, axes]), shape])
                elif len(s) > 3:
                    return None
            if node.kind == "where":
                name = where_term(node, name)
                if name is None:
                    return None
            out.append(name)
    return out


def _size(mh: MergedHeads, m: Match, d) -> str | int | None:
    """What dim ``d`` of a replaced tensor is: 'BN', 'B', 'S' or 'L' (read at run time), a known size, or
    None."""
    if isinstance(d, int):
        return d
    k_len = mh.k.shape[mh.kperm[1]]
    for key, dim in (("BN", m.bound["q"].shape[0]), ("B", mh.q.shape[0]), ("S", mh.q.shape[2]), ("L", k_len)):
        if same_dim(d, dim):
            return key
    return None


def write_shapes(ctx: Context, b, m: Match, mh: MergedHeads, packed_q: str, packed_k: str) -> list[str]:
    """The Shape ops that read the replaced tensors (P @ V's output, the scores), their sizes read from the
    kernel's (B, S, N H) query and (B, L, N H) key instead (no other tensor: a region cut around the kernel
    reads what it reads); their names, to remove."""
    if not mh.shapes:
        return []
    q_sizes, k_sizes = b.node("Shape", [packed_q]), b.node("Shape", [packed_k])

    def part(sizes: str, i: int) -> str:
        return b.node("Slice", [sizes, b.const("from", np.array([i], np.int64)),
                                b.const("to", np.array([i + 1], np.int64))])

    pieces: dict = {}

    def piece(key) -> str:
        if key not in pieces:
            if isinstance(key, int):
                pieces[key] = b.const("size", np.array([key], np.int64))
            elif key == "BN":
                pieces[key] = b.node("Mul", [piece("B"), b.const("heads", np.array([mh.heads], np.int64))])
            else:
                pieces[key] = part(*{"B": (q_sizes, 0), "S": (q_sizes, 1), "L": (k_sizes, 1)}[key])
        return pieces[key]

    for s in mh.shapes:
        full = b.node("Concat", [piece(_size(mh, m, d)) for d in s.inputs[0].shape], axis=0)
        start, end = attr_value(ctx.protos[s.name], "start"), attr_value(ctx.protos[s.name], "end")
        if start is None and end is None:
            b.node("Identity", [full], s.outputs[0].name)
        else:
            rank = len(s.inputs[0].shape)
            lo = b.const("shape_start", np.array([0 if start is None else int(start)], np.int64))
            hi = b.const("shape_end", np.array([rank if end is None else int(end)], np.int64))
            b.node("Slice", [full, lo, hi], s.outputs[0].name)
    return [s.name for s in mh.shapes]

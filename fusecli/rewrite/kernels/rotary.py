"""Rotary embeddings written out -> ONNX Runtime's RotaryEmbedding (com.microsoft; CPU and CUDA, float32).

y = x cos + rotate_half(x) sin with rotate_half(x) = concat(-x[..., D/2:], x[..., :D/2]) on heads laid out
(B, N, S, D) (transformers' ``apply_rotary_pos_emb``, onnxscript's model zoo). RotaryEmbedding(input,
position_ids, cos_cache, sin_cache; interleaved=0) reads the tables as (rows, D/2) and takes row p + s
for position s when position_ids is the 1D [p]: it computes the same when the tables' two halves are
equal (cos = c(concat(f, f)) with c elementwise) and they vary along S alone. The caches are then
c(f) reshaped to (S, D/2), computed from the export's own angle table f, or the first half of a folded
constant table (whose halves are checked equal), with position_ids [0]. GPT-J's interleaved rotation
(rotate_every_two: pairs (x0, x1), (x2, x3), ...) is interleaved=1, whose kernel reads the same (S, D/2)
caches: the export's tables must repeat each angle twice in a row (repeat_interleave: Unsqueeze, Expand or
Tile by 2 on the new last axis, Reshape; a folded table is checked pair by pair). Anything else (a
(B, S, N, D) layout, a table with a batch axis, an odd or unknown head size) stays unfused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx

from ...core.ir import Node, Tensor
from ...core.trees import through_noops
from ..graph.kit import MS, Context, Emission, attr_value, make_node, new_initializer, same_dims
from ..graph.shape_values import int_value

if TYPE_CHECKING:  # annotations only
    from ...fusion.match import Match

INT_MAX = 2**62  # a Slice end at or past this means "to the end"
ELEMENTWISE = frozenset({"Cos", "Sin", "Cast", "Identity"})  # what may stand between concat(f, f) and a table


def _const_ints(ctx: Context, node: Node, i: int) -> list[int] | None:
    """Input i's values when constants and known dims fix them (a bound computed from Shape), else None."""
    v = int_value(node.input(i), ctx.weights)
    return None if v is None else [int(a) for a in np.reshape(v, -1)]


def _slice_range(ctx: Context, node: Node, rank: int, size: int) -> tuple[int, int] | None:
    """[start, end) a one-axis, step-1 Slice of the last axis takes (clamped to [0, size]), else None."""
    r = _strided_range(ctx, node, rank, size)
    return None if r is None or r[2] != 1 else r[:2]


def _strided_range(ctx: Context, node: Node, rank: int, size: int) -> tuple[int, int, int] | None:
    """(start, end, step) of a one-axis Slice of the last axis with a positive step (start and end clamped
    to [0, size]), else None."""
    p = ctx.protos.get(node.name)
    if p is None or p.op_type != "Slice":
        return None
    if ctx.opset < 10:
        starts, ends = attr_value(p, "starts"), attr_value(p, "ends")
        axes, steps = attr_value(p, "axes"), None
    else:
        starts, ends = _const_ints(ctx, node, 1), _const_ints(ctx, node, 2)
        axes, steps = _const_ints(ctx, node, 3), _const_ints(ctx, node, 4)
        if (len(p.input) > 3 and p.input[3] and axes is None) or (len(p.input) > 4 and p.input[4]
                                                                  and steps is None):
            return None
    if starts is None or ends is None or len(starts) != 1 or len(ends) != 1:
        return None
    axis = axes[0] if axes else 0
    step = 1 if steps is None else steps[0] if len(steps) == 1 else 0
    if (axes is not None and len(axes) != 1) or step < 1 or not -rank <= axis < rank \
            or axis % rank != rank - 1:
        return None

    def clamp(v: int) -> int:
        return min(max(v + size if v < 0 else v, 0), size)

    return clamp(starts[0]), clamp(min(ends[0], INT_MAX)), step


def _rotate_half(m: Match, ctx: Context, x: Tensor, d: int) -> bool:
    """rotate_half is concat(-x[..., D/2:], x[..., :D/2]) on the last axis, reading the x the match scales."""
    concat = m.roles["rotate_half"]
    cp = ctx.protos.get(concat.name)
    if cp is None or len(concat.inputs) != 2 or attr_value(cp, "axis", 0) % 4 != 3:
        return False
    slices = _negated_and_plain_slices(x, through_noops(concat.inputs[0]).producer,
                                       through_noops(concat.inputs[1]).producer)
    if slices is None:
        return False
    hi, lo = slices
    return _slice_range(ctx, hi, 4, d) == (d // 2, d) and _slice_range(ctx, lo, 4, d) == (0, d // 2)


def _negated_and_plain_slices(x: Tensor, negated: Node | None,
                              plain: Node | None) -> tuple[Node, Node] | None:
    """The two Slices of x that rotate_half and rotate_every_two join: (s1, s2) where ``negated`` is
    Neg(s1) and ``plain`` is s2, both slicing the x the match scales (no-op casts looked through)."""
    inner = None if negated is None or negated.kind != "neg" else through_noops(negated.inputs[0]).producer
    if inner is None or plain is None or inner.kind != "slice" or plain.kind != "slice":
        return None
    source = through_noops(x)
    if through_noops(inner.inputs[0]) is not source or through_noops(plain.inputs[0]) is not source:
        return None
    return inner, plain


def _unsqueeze_axes(ctx: Context, node: Node) -> list[int] | None:
    """An Unsqueeze's axes: its attribute before opset 13, its constant second input since."""
    return attr_value(ctx.protos[node.name], "axes") if ctx.opset < 13 else _const_ints(ctx, node, 1)


def _rotate_pairs(m: Match, ctx: Context, x: Tensor, d: int) -> bool:
    """rotate_every_two is Reshape(Concat(Unsqueeze(-x[..., 1::2]), Unsqueeze(x[..., ::2])) on a new last
    axis) back to x's shape, reading the x the match scales: (-x1, x0, -x3, x2, ...)."""
    concat, flat = m.roles["rotate_pairs"], m.roles["pairs_flat"]
    cp = ctx.protos.get(concat.name)
    if cp is None or len(concat.inputs) != 2 or attr_value(cp, "axis", 0) % 5 != 4 \
            or not same_dims(flat.outputs[0].shape, x.shape, ctx.sizes):
        return False
    ends = []
    for t in concat.inputs:
        u = t.producer
        if u is None or u.kind != "unsqueeze" or u.name not in ctx.protos:
            return False
        axes = _unsqueeze_axes(ctx, u)
        if axes is None or [a % 5 for a in axes] != [4]:
            return False
        ends.append(through_noops(u.inputs[0]).producer)
    slices = _negated_and_plain_slices(x, *ends)
    if slices is None:
        return False
    odd, even = slices
    return _strided_range(ctx, odd, 4, d) in ((1, d, 2), (1, d - 1, 2)) \
        and _strided_range(ctx, even, 4, d) in ((0, d, 2), (0, d - 1, 2))


def _table_shape_fits(t: Tensor, x: Tensor, d: int) -> bool:
    """The table broadcasts against x (B, N, S, D) varying along S and D alone, with x's S."""
    s = t.shape
    if s is None or not 2 <= len(s) <= 4 or s[-1] != d or any(v != 1 for v in s[:-2]):
        return False
    return s[-2] is not None and s[-2] == x.shape[-2]


def _pairs_source(ctx: Context, node: Node, d: int) -> str | None:
    """f where ``node`` is Reshape(Expand|Tile(Unsqueeze(f, last axis), 2 on that axis), (..., D)): every
    entry of f twice in a row (repeat_interleave(f, 2, -1)); else None."""
    if node.op_type != "Reshape" or node.outputs[0].shape is None or node.outputs[0].shape[-1] != d:
        return None
    rep = node.inputs[0].producer
    if rep is None or rep.op_type not in ("Expand", "Tile") or rep.outputs[0].shape is None:
        return None
    times = _const_ints(ctx, rep, 1)
    u = rep.inputs[0].producer
    if times is None or u is None or u.op_type != "Unsqueeze" or u.name not in ctx.protos \
            or len(times) != len(rep.outputs[0].shape) or times[-1] != 2 or any(v != 1 for v in times[:-1]):
        return None  # Expand by (1, ..., 1, 2) or Tile by the same: the new axis doubled, nothing else
    rank = len(rep.outputs[0].shape)
    axes = _unsqueeze_axes(ctx, u)
    f = u.inputs[0]
    if axes is None or [a % rank for a in axes] != [rank - 1] or f.shape is None or f.shape[-1] != d // 2:
        return None
    return f.name


def _computed_cache(ctx: Context, t: Tensor, d: int, nodes: list[onnx.NodeProto], inits: list,
                    interleaved: bool = False) -> str | None:
    """The (S, D/2) cache of a table computed as c(concat(f, f)) on its last axis (``interleaved``: as
    c(repeat_interleave(f, 2, -1))) (Unsqueeze, no-op casts and scalar scales around it): the same
    elementwise ops applied to f, reshaped; None when not so."""
    steps: list[onnx.NodeProto] = []
    cur = t
    for _ in range(16):
        node = cur.producer
        p = None if node is None else ctx.protos.get(node.name)
        if p is None:
            return None
        if interleaved and p.op_type == "Reshape":
            f = _pairs_source(ctx, node, d)
            if f is None:
                return None
            break
        if p.op_type == "Concat" and not interleaved:
            if len(p.input) != 2 or p.input[0] != p.input[1] or cur.shape is None \
                    or attr_value(p, "axis", 0) % len(cur.shape) != len(cur.shape) - 1:
                return None
            f = p.input[0]
            break
        if p.op_type == "Unsqueeze":
            axes = _unsqueeze_axes(ctx, node)
            rank = len(cur.shape or ())
            if axes is None or not rank or any(a % rank == rank - 1 for a in axes):
                return None  # a new last axis would move D
        elif p.op_type in ("Mul", "Div"):
            scalars = [i for i, n in enumerate(p.input[:2]) if (v := ctx.weights.value(n)) is not None
                       and np.size(v) == 1]
            if len(p.input) != 2 or not scalars or (p.op_type == "Div" and scalars[-1] != 1):
                return None
            steps.append(p)
            cur = node.inputs[1 - scalars[-1]]
            continue
        elif p.op_type in ELEMENTWISE:
            steps.append(p)
        else:
            return None
        cur = node.inputs[0]
    else:
        return None
    value = f
    for p in reversed(steps):  # from f outwards, as the export applies them
        out = ctx.names.new(f"{value}_cache")
        k = _data_input(ctx, p)
        inputs = [value if i == k else n for i, n in enumerate(p.input)]
        nodes.append(make_node(p.op_type, inputs, out, ctx.names.new(f"{p.name or p.op_type}_cache"),
                               attrs=list(p.attribute)))
        value = out
    shape = new_initializer(ctx, f"{t.name}_cache_shape", np.array([-1, d // 2], np.int64), inits)
    out = ctx.names.new(f"{t.name}_cache")
    nodes.append(make_node("Reshape", [value, shape], out, ctx.names.new(f"{t.name}_cache_reshape")))
    return out


def _data_input(ctx: Context, p: onnx.NodeProto) -> int:
    """Which input of an elementwise step carries the table (the other one of a scalar Mul / Div)."""
    if p.op_type not in ("Mul", "Div"):
        return 0
    v = ctx.weights.value(p.input[0])
    return 1 if v is not None and np.size(v) == 1 else 0


def _constant_cache(ctx: Context, t: Tensor, d: int, inits: list, interleaved: bool = False) -> str | None:
    """A folded table's first half as an (S, D/2) initializer, when its halves are equal (``interleaved``:
    its even entries, when each equals the odd one after it)."""
    v = ctx.weights.value(t.name)
    if v is None or v.dtype != np.float32 or v.shape[-1:] != (d,):
        return None
    rows = v.reshape(-1, d)
    first, second = (rows[:, 0::2], rows[:, 1::2]) if interleaved else (rows[:, : d // 2], rows[:, d // 2:])
    if not np.array_equal(first, second):
        return None
    return new_initializer(ctx, f"{t.name}_cache", np.ascontiguousarray(first), inits)


def _interior_private(m: Match, ctx: Context) -> bool:
    """Only the root's output leaves the match (the kernel writes nothing else)."""
    inside = {id(n) for n in m.nodes}
    return all(t is None or (t.name not in ctx.graph_outputs and all(id(c) in inside for c in t.consumers))
               for n in m.nodes[:-1] for t in n.outputs)


@dataclass
class RotaryParts:
    """A rotary match as ONNX Runtime's kernels read it: x (B, N, S, D), the (S, D/2) cos and sin caches
    and the nodes and initializers that make them."""

    x: Tensor
    cos: Tensor  # the export's tables (B|1, 1, S, D), to tell whether two matches share them
    sin: Tensor
    caches: list[str]
    nodes: list[onnx.NodeProto]
    inits: list[onnx.TensorProto]
    interleaved: bool = False  # the pairs rotated are (x0, x1), (x2, x3), ... (GPT-J), not (x_i, x_i+D/2)


def rotary_parts(m: Match, ctx: Context) -> RotaryParts | None:
    """The rotary match's input and caches where RotaryEmbedding (or GroupQueryAttention's do_rotary, which
    computes the same for a prompt without past) runs it, else None."""
    x, cos, sin = m.bound.get("x"), m.bound.get("cos"), m.bound.get("sin")
    if x is None or cos is None or sin is None or x.dtype != "float32" or x.shape is None \
            or len(x.shape) != 4 or m.root.outputs[0].dtype != "float32":
        return None
    d = x.shape[-1]
    interleaved = "rotate_pairs" in m.roles
    rotated = _rotate_pairs if interleaved else _rotate_half
    if not isinstance(d, int) or d < 2 or d % 2 or not rotated(m, ctx, x, d) \
            or not _interior_private(m, ctx) or not same_dims(m.root.outputs[0].shape, x.shape, ctx.sizes):
        return None
    if not _table_shape_fits(cos, x, d) or not _table_shape_fits(sin, x, d):
        return None
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    caches = []
    for t in (cos, sin):
        cache = _constant_cache(ctx, t, d, inits, interleaved) if ctx.weights.is_constant(t.name) \
            else _computed_cache(ctx, t, d, nodes, inits, interleaved)
        if cache is None:
            return None
        caches.append(cache)
    return RotaryParts(x, cos, sin, caches, nodes, inits, interleaved)


def rotary(m: Match, ctx: Context) -> Emission | None:
    parts = rotary_parts(m, ctx)
    if parts is None:
        return None
    nodes, inits = parts.nodes, parts.inits
    pos = new_initializer(ctx, f"{m.root.name}_position_offset", np.zeros(1, np.int64), inits)
    nodes.append(make_node("RotaryEmbedding", [parts.x.name, pos, *parts.caches], m.root.outputs[0].name,
                           m.root.name, MS, interleaved=int(parts.interleaved)))
    return Emission(m.pattern.name, "RotaryEmbedding", [n.name for n in m.nodes], nodes, inits)

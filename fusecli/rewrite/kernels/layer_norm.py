"""LayerNorm written out -> LayerNormalization (ONNX domain), and with its residual Add ->
SkipLayerNormalization(input, skip, gamma, beta?, bias?; epsilon) (com.microsoft), whose 4th output is
the sum; over BERT's embedding sum -> EmbedLayerNormalization (com.microsoft).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...core.ir import Node, Tensor
from ...spellings.attention import depends_on_input
from ...spellings.norms import embedding_sum
from ..graph.kit import (
    MS,
    Context,
    Emission,
    affine_param,
    attr_value,
    dtype_of,
    last_axis_vector,
    make_node,
    new_initializer,
    other_input,
    out_name,
    param_of,
    reduce_axes,
    same_shape,
    skip_operands,
    unused_extra_outputs,
)

if TYPE_CHECKING:  # annotations only
    from ...fusion.match import Match


# -- LayerNorm -----------------------------------------------------------------------------------------
@dataclass
class _Norm:
    x: Tensor
    axis: int  # first normalized axis, non-negative
    eps: float
    gamma: Tensor | None
    beta: Tensor | None


def _decomposed(m: Match, ctx: Context) -> _Norm | None:
    """x, axis, eps, gamma and beta of a decomposed LayerNorm match ((x - mean) / sqrt(var + eps) forms)."""
    x, d = m.bound.get("x"), m.bound.get("d")
    if "ln_inv" in m.roles:
        return _moments(m, ctx)
    if x is None or d is None or "normalize" not in m.roles or x.shape is None:
        return None  # TensorFlow's own moments form (Rsqrt, SquaredDifference) never comes out of ONNX
    first = _normalized_axis(m, ctx, len(x.shape))
    if first is None:
        return None
    normalize = m.roles["normalize"]
    eps_add = normalize.inputs[1].producer.inputs[0].producer
    eps_t = next((t for t in eps_add.inputs if t.kind in ("parameter", "constant")), None)
    eps = None if eps_t is None else ctx.weights.value(eps_t.name)
    if eps is None or eps.size != 1 or d.producer is None:
        return None
    gamma = beta = None
    affine = m.roles.get("layer_norm")
    if affine is not None:
        mul = next(t.producer for t in affine.inputs if t.producer is not None and t.producer.kind == "mul")
        gamma, beta = other_input(mul, normalize.outputs[0]), other_input(affine, mul.outputs[0])
    return _Norm(x, first, float(eps.reshape(-1)[0]), gamma, beta)


def _normalized_axis(m: Match, ctx: Context, rank: int) -> int | None:
    """The first normalized axis when the match's two ReduceMeans (mean, variance) both reduce the same
    trailing axes, else None."""
    means = [n for n in m.nodes if n.kind == "reduce_mean"]
    axes = [reduce_axes(n, ctx) for n in means]
    if len(means) != 2 or any(a is None for a in axes):
        return None
    norm_axes = [sorted(a % rank for a in ax) for ax in axes]
    first = norm_axes[0][0] if norm_axes[0] else rank
    if norm_axes[0] != norm_axes[1] or norm_axes[0] != list(range(first, rank)) or first >= rank:
        return None
    return first


def _moments(m: Match, ctx: Context) -> _Norm | None:
    """x, axis, eps, gamma and beta of tf2onnx's moments LayerNorm: x * inv + (beta - mean * inv),
    inv = gamma / sqrt(mean((x - mean)^2) + eps), both means over the same trailing axes."""
    x = m.bound.get("x")
    if x is None or x.shape is None:
        return None
    first = _normalized_axis(m, ctx, len(x.shape))
    if first is None:
        return None
    eps_add, inv = m.roles["ln_eps"], m.roles["ln_inv"]
    eps_t = next((t for t in eps_add.inputs if t.kind in ("parameter", "constant")), None)
    eps = None if eps_t is None else ctx.weights.value(eps_t.name)
    if eps is None or eps.size != 1:
        return None
    gamma = next((t for t in inv.inputs if t.kind == "parameter" or t.kind == "constant"), None) \
        if inv.kind == "mul" else None
    shift = m.roles.get("ln_shift")
    beta = None if shift is None else next(t for t in shift.inputs if t.kind in ("parameter", "constant"))
    return _Norm(x, first, float(eps.reshape(-1)[0]), gamma, beta)


def layer_norm(m: Match, ctx: Context) -> Emission | None:
    if dtype_of(m) != "float32":
        return None
    n = _decomposed(m, ctx)
    if n is None:
        return None
    inits: list = []
    scale = affine_param(ctx, n.gamma, n.x, n.axis, 1.0, inits)
    bias = affine_param(ctx, n.beta, n.x, n.axis, None, inits)
    if scale is None or bias is None:
        return None
    node = make_node("LayerNormalization", [n.x.name, scale, bias], out_name(m.root), m.root.name,
                 axis=n.axis - len(n.x.shape), epsilon=n.eps)
    return Emission(m.pattern.name, "LayerNormalization", [x.name for x in m.nodes], [node], inits)


def _absorb_bias(ctx: Context, m: Match, x: Tensor, inits: list) -> tuple[Tensor, str, str] | None:
    """(y, bias name, bias node name) when x = y + bias (last axis) can join the kernel."""
    p = x.producer
    if p is None or p.kind != "bias_add" or p.domain not in ("", "ai.onnx") or p.name in ctx.claimed \
            or p.name not in ctx.protos or any(n is p for n in m.nodes) or len(x.consumers) != 1 \
            or x.name in ctx.graph_outputs:
        return None
    y = other_input(p, param_of(p))
    if not same_shape(y, x):
        return None
    bias = last_axis_vector(ctx, param_of(p), x, inits)
    return None if bias is None else (y, bias, p.name)


def _norm_over_last_axis(m: Match, ctx: Context, x: Tensor | None) -> _Norm | None:
    """The match's LayerNorm over the last axis: the LayerNormalization op reading ``x`` (its Mean and
    InvStdDev unread), or, with ``x`` None, the written-out form; None on another axis."""
    if x is None:
        norm = _decomposed(m, ctx)
        return norm if norm is not None and norm.axis == len(norm.x.shape) - 1 else None
    ln = m.roles["layer_norm"]
    p = ctx.protos[ln.name]
    if x.shape is None or attr_value(p, "axis", -1) % len(x.shape) != len(x.shape) - 1 \
            or not unused_extra_outputs(ln, ctx):
        return None
    return _Norm(x, len(x.shape) - 1, float(attr_value(p, "epsilon", 1e-5)), ln.inputs[1], ln.input(2))


def skip_layer_norm(m: Match, ctx: Context) -> Emission | str | None:
    if dtype_of(m) != "float32" or "skip_layout" in m.roles:
        return None  # a Reshape between the sum and the norm: the kernel's sum output has another shape
    inits: list = []
    add = m.roles.get("add")  # Add + LayerNormalization op
    norm = _norm_over_last_axis(m, ctx, None if add is None else add.outputs[0])
    if norm is None:
        return None
    add = add or norm.x.producer
    operands = skip_operands(add, ctx.sizes)
    gamma = affine_param(ctx, norm.gamma, norm.x, norm.axis, 1.0, inits)
    beta = affine_param(ctx, norm.beta, norm.x, norm.axis, None, inits)
    if gamma is None or beta is None:
        return None
    if operands is None:  # shapes do not prove the skip's broadcast: LayerNorm alone, the Add kept
        if "add" in m.roles:  # already a LayerNormalization op
            return ("the residual sum's operands are not (B, S, H) and (B|1, S, H) or (S, H) by their dims "
                    "(at the analysis's sizes), the shapes the kernel's input and skip take")
        node = make_node("LayerNormalization", [norm.x.name, gamma, beta], out_name(m.root), m.root.name,
                     axis=-1, epsilon=norm.eps)
        return Emission(m.pattern.name, "LayerNormalization", [n.name for n in m.nodes if n is not add],
                        [node], inits)
    inp, skip = operands
    remove = [n.name for n in m.nodes]
    bias, kernel = "", "SkipLayerNormalization"
    absorbed = _absorb_bias(ctx, m, inp, inits)
    if absorbed is None and same_shape(skip, inp):
        absorbed = _absorb_bias(ctx, m, skip, inits)
        if absorbed is not None:
            inp, skip = skip, inp
    if absorbed is not None:
        inp, bias, bias_node = absorbed
        remove.append(bias_node)
        kernel += " (bias)"
    node = make_node("SkipLayerNormalization", [inp.name, skip.name, gamma, beta, bias], out_name(m.root),
                 m.root.name, MS, epsilon=norm.eps)
    inside = {id(n) for n in m.nodes}
    total = add.outputs[0]
    if total.name in ctx.graph_outputs or any(id(c) not in inside for c in total.consumers):
        node.output.extend(["", "", total.name])  # pre-LN: the sum is read again, the kernel's 4th output
    return Emission(m.pattern.name, kernel, remove, [node], inits)


# -- EmbedLayerNorm ------------------------------------------------------------------------------------
def _embedding_roles(gathers: list[Node]) -> tuple[Node, Node, Node | None] | None:
    """(word, position, segment) among the embedding Gathers: word the largest table read with ids from the
    inputs' values, position one whose ids do not depend on them (a slice of a position buffer, a Range) or
    are named for positions, segment the other. The kernel sums the three rows alike, and every id goes in
    explicitly, so only the shapes must fit: word and segment ids (B, S), position ids (S,), (1, S) or
    (B, S); None where they do not."""
    memo: dict[int, bool] = {}
    word = min(gathers, key=lambda g: (not depends_on_input(g.inputs[1], memo), -(g.inputs[0].shape[0] or 0)))
    rest = sorted((g for g in gathers if g is not word),
                  key=lambda g: (depends_on_input(g.inputs[1], memo) and "position" not in g.inputs[1].name))
    ids = word.inputs[1].shape
    other = rest[1] if len(rest) > 1 else None
    for pos, seg in ((rest[0], other), (other, rest[0]) if other is not None else (rest[0], None)):
        p = pos.inputs[1].shape
        if ids is not None and len(ids) == 2 and p is not None and len(p) in (1, 2) \
                and (seg is None or seg.inputs[1].shape == ids):
            return word, pos, seg
    return None


def embed_layer_norm(m: Match, ctx: Context) -> Emission | None:
    """LayerNorm(word[ids] + position[pos] (+ segment[seg])) -> EmbedLayerNormalization: the ids cast to
    int32, the position ids passed as (1|B, S) (the kernel's own 0..S-1 is not assumed)."""
    if dtype_of(m) != "float32" or "skip_layout" in m.roles:
        return None
    x = m.bound["x"]
    norm = _norm_over_last_axis(m, ctx, x if "add" in m.roles else None)  # "add": the LayerNormalization op
    if norm is None:
        return None
    parts = embedding_sum(x)
    inside = {id(n) for n in m.nodes}
    if parts is None or x.name in ctx.graph_outputs or any(id(c) not in inside for c in x.consumers):
        return None
    roles = _embedding_roles(parts[0])
    if roles is None:
        return None  # SkipLayerNormalization takes the last sum
    word, pos, seg = roles
    ids = word.inputs[1]
    inits: list = []
    gamma = affine_param(ctx, norm.gamma, x, norm.axis, 1.0, inits)
    beta = affine_param(ctx, norm.beta, x, norm.axis, 0.0, inits)
    if gamma is None or beta is None:
        return None
    nodes: list = []

    def step(op: str, inputs: list[str], **kw) -> str:
        out = ctx.names.new(f"{m.root.name}_{op}")
        nodes.append(make_node(op, inputs, out, ctx.names.new(f"{m.root.name}_{op}"), **kw))
        return out

    int32 = 6  # TensorProto.INT32
    pos_ids = pos.inputs[1].name
    if len(pos.inputs[1].shape) == 1:  # (S,) -> (1, S)
        pos_ids = step("Unsqueeze", [pos_ids, new_initializer(ctx, "axis0", np.array([0], np.int64), inits)])
    kernel = make_node("EmbedLayerNormalization",
                       [step("Cast", [ids.name], to=int32),
                        "" if seg is None else step("Cast", [seg.inputs[1].name], to=int32),
                        word.inputs[0].name, pos.inputs[0].name, "" if seg is None else seg.inputs[0].name,
                        gamma, beta, "", step("Cast", [pos_ids], to=int32)],
                       out_name(m.root), m.root.name, MS, epsilon=norm.eps)
    kernel.output.append(ctx.names.new(f"{m.root.name}_mask_index"))  # the kernel's (B,) mask index, unread
    return Emission(m.pattern.name, "EmbedLayerNormalization", [n.name for n in m.nodes], [kernel, *nodes],
                    inits)

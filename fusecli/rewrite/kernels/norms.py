"""RMSNorm matches -> ONNX Runtime's SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization.

y = x rsqrt(mean(x^2, last axis) + eps) g. SimplifiedLayerNormalization(X, scale; axis, epsilon) is
registered by onnxruntime in the ONNX domain (CPU and CUDA); SkipSimplifiedLayerNormalization(input,
skip, gamma; epsilon) is com.microsoft, and its 4th output is input + skip, written where a pre-norm
block reads the residual sum again (Llama's decoder layers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...core.ir import Tensor
from ...spellings.common import ADD
from ..graph.kit import (
    MS,
    Context,
    Emission,
    affine_param,
    dtype_of,
    make_node,
    out_name,
    reduce_axes,
    skip_operands,
)

if TYPE_CHECKING:  # annotations only
    from ...fusion.match import Match


def _rms_parts(m: Match, ctx: Context) -> tuple[Tensor, float, Tensor | None] | str:
    """(x, eps, gain) of a float32 RMSNorm match normalizing x's last axis; why not for any other one."""
    if dtype_of(m) != "float32":
        return f"the kernel here runs float32 only, not {dtype_of(m)}"
    x = m.bound.get("x")
    mean = next((n for n in m.nodes if n.kind == "reduce_mean"), None)
    if x is None or mean is None or x.shape is None or not x.shape:
        return "x's rank is unknown"
    axes = reduce_axes(mean, ctx)
    if axes is None or [a % len(x.shape) for a in axes] != [len(x.shape) - 1]:
        return f"the mean is over axes {axes}, not the last axis alone"
    eps_add = next((n for n in m.nodes if n.kind in ADD and mean.outputs[0] in n.inputs), None)
    if eps_add is None:
        return "no epsilon is added to the mean"
    eps_t = next((t for t in eps_add.inputs if t is not mean.outputs[0]), None)
    eps = None if eps_t is None else ctx.weights.value(eps_t.name)
    if eps is None or np.size(eps) != 1:
        return "epsilon is not one constant"
    gain = None
    affine = m.roles.get("rms_norm")
    if affine is not None:
        normed = m.roles["normalize"].outputs[0]
        gain = next((t for t in affine.inputs if t is not normed), None)
    return x, float(np.reshape(eps, -1)[0]), gain


NO_SCALE = "the gain is no constant of the normalized axis's size (or that axis's size is unknown)"


def rms_norm(m: Match, ctx: Context) -> Emission | str:
    parts = _rms_parts(m, ctx)
    if isinstance(parts, str):
        return parts
    x, eps, gain = parts
    inits: list = []
    scale = affine_param(ctx, gain, x, len(x.shape) - 1, 1.0, inits)
    if not scale:
        return NO_SCALE
    node = make_node("SimplifiedLayerNormalization", [x.name, scale], out_name(m.root), m.root.name, axis=-1,
                 epsilon=eps)
    return Emission(m.pattern.name, "SimplifiedLayerNormalization", [n.name for n in m.nodes], [node], inits)


def skip_rms_norm(m: Match, ctx: Context) -> Emission | str:
    parts = _rms_parts(m, ctx)
    if isinstance(parts, str):
        return parts
    x, eps, gain = parts
    inside = {id(n) for n in m.nodes}
    chain = [x]  # the sum and the no-op casts of it the matcher looked through: all one value
    while chain[-1].producer is not None and chain[-1].producer.kind == "cast" \
            and id(chain[-1].producer) in inside:
        chain.append(chain[-1].producer.inputs[0])
    x = chain[-1]
    add = x.producer
    if add is None or add.kind not in ADD or id(add) not in inside:
        return "the normalized value is not the residual sum the match read"
    operands = skip_operands(add, ctx.sizes)
    if operands is None:
        return ("the residual sum's operands are not (B, S, H) and (B|1, S, H) or (S, H), the shapes the "
                "kernel's input and skip take")
    inits: list = []
    scale = affine_param(ctx, gain, x, len(x.shape) - 1, 1.0, inits)
    if not scale:
        return NO_SCALE
    inp, skip = operands
    node = make_node("SkipSimplifiedLayerNormalization", [inp.name, skip.name, scale], out_name(m.root),
                     m.root.name, MS, epsilon=eps)
    nodes = [node]
    read = [t for t in reversed(chain)
            if t.name in ctx.graph_outputs or any(id(c) not in inside for c in t.consumers)]
    if read:  # the residual sum, read again by the next block: the kernel's 4th output
        node.output.extend(["", "", read[0].name])
        nodes += [make_node("Identity", [read[0].name], t.name, ctx.names.new(f"{t.name}_sum"))
                  for t in read[1:]]
    return Emission(m.pattern.name, "SkipSimplifiedLayerNormalization", [n.name for n in m.nodes], nodes,
                    inits)

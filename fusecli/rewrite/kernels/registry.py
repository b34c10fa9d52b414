"""One match -> the ONNX Runtime nodes that replace it (an Emission), or why no kernel fits it (a string, or
None where the emitter gives no reason: rewrite.plan says that no kernel takes it as written).

The registry: each fusion family names its patterns' kernels by a key (``KERNELS`` in fusion/families/);
``BY_KEY`` here maps each key to its emitter, so fusion imports nothing of rewrite. A new kernel is one
entry here and one in its family's KERNELS (docs/layout.md). What an emitter reads and writes, and the
helpers they share, are in ``graph.kit``. ``--target cuda`` keeps to what the CUDA provider has; where an
activation has no kernel, the foldable part is still folded and the activation kept.
"""

from __future__ import annotations

from ...fusion.families import KERNELS
from ...fusion.match import Match
from ..graph.kit import Context, Emission
from . import acts, gelu, gqa, layer_norm, layout, matmul, norms, rotary

__all__ = ["BY_KEY", "EMITTERS", "emit"]

BY_KEY = {  # kernel key -> emitter
    "attention": gqa.attention,  # GroupQueryAttention, else MultiHeadAttention (attention.py)
    "conv_through_layout": layout.through_layout,  # FusedConv (conv.py), through tf2onnx's layout
    "embed_layer_norm": layer_norm.embed_layer_norm,
    "gelu": gelu.gelu,
    "gemm_fast_gelu": gelu.gemm_fast_gelu,
    "hard_swish": acts.hard_swish,
    "layer_norm": layer_norm.layer_norm,
    "matmul_bias_scale": matmul.matmul_bias_scale,
    "matmul_family": matmul.matmul_family,
    "matmul_scale": matmul.matmul_scale,
    "matmul_transpose": matmul.matmul_transpose,
    "rms_norm": norms.rms_norm,
    "rotary": rotary.rotary,
    "silu": acts.silu,
    "skip_layer_norm": layer_norm.skip_layer_norm,
    "skip_rms_norm": norms.skip_rms_norm,
    "swiglu": acts.swiglu,
}
EMITTERS = {pattern: BY_KEY[key] for pattern, key in KERNELS.items()}  # pattern name -> emitter


def emit(m: Match, ctx: Context) -> Emission | str | None:
    """The Emission for ``m`` on ctx's target and mode, or why not (None: no reason given)."""
    fn = EMITTERS.get(m.pattern.name)
    if fn is None or any(n.domain not in ("", "ai.onnx") or n.name not in ctx.protos for n in m.nodes):
        return None
    return fn(m, ctx)

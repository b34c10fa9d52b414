"""One match -> the ONNX Runtime nodes that replace it (an Emission), or why no kernel fits it (a string, or
None where the emitter gives no reason: rewrite.plan says that no kernel takes it as written).

The registry: each fusion family names its patterns' kernels by a key (``KERNELS`` in fusion/families/);
``BY_KEY`` here maps each key to its emitter, so fusion imports nothing of rewrite. A new kernel is one
entry here and one in its family's KERNELS (docs/layout.md). What an emitter reads and writes, and the
helpers they share, are in ``kit``. ``--target cuda`` keeps to what the CUDA provider has; where an
activation has no kernel, the foldable part is still folded and the activation kept.
"""

from __future__ import annotations

from ..fusion.families import KERNELS
from ..fusion.match import Match
from . import (
    emit_acts,
    emit_gelu,
    emit_gqa,
    emit_layer_norm,
    emit_layout,
    emit_matmul,
    emit_norms,
    emit_rotary,
)
from .kit import Context, Emission

__all__ = ["BY_KEY", "EMITTERS", "emit"]

BY_KEY = {  # kernel key -> emitter
    "attention": emit_gqa.attention,  # GroupQueryAttention, else MultiHeadAttention (emit_attention)
    "conv_through_layout": emit_layout.through_layout,  # FusedConv (emit_conv), through tf2onnx's layout
    "embed_layer_norm": emit_layer_norm.embed_layer_norm,
    "gelu": emit_gelu.gelu,
    "gemm_fast_gelu": emit_gelu.gemm_fast_gelu,
    "hard_swish": emit_acts.hard_swish,
    "layer_norm": emit_layer_norm.layer_norm,
    "matmul_bias_scale": emit_matmul.matmul_bias_scale,
    "matmul_family": emit_matmul.matmul_family,
    "matmul_scale": emit_matmul.matmul_scale,
    "matmul_transpose": emit_matmul.matmul_transpose,
    "rms_norm": emit_norms.rms_norm,
    "rotary": emit_rotary.rotary,
    "silu": emit_acts.silu,
    "skip_layer_norm": emit_layer_norm.skip_layer_norm,
    "skip_rms_norm": emit_norms.skip_rms_norm,
    "swiglu": emit_acts.swiglu,
}
EMITTERS = {pattern: BY_KEY[key] for pattern, key in KERNELS.items()}  # pattern name -> emitter


def emit(m: Match, ctx: Context) -> Emission | str | None:
    """The Emission for ``m`` on ctx's target and mode, or why not (None: no reason given)."""
    fn = EMITTERS.get(m.pattern.name)
    if fn is None or any(n.domain not in ("", "ai.onnx") or n.name not in ctx.protos for n in m.nodes):
        return None
    return fn(m, ctx)

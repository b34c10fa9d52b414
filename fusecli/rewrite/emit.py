"""One match -> the ONNX Runtime nodes that replace it (an Emission), or None where no kernel fits.

The registry is the union of the kernel family modules' EMITTERS; what an emitter reads and writes, and
the helpers they share, are in ``kit``. ``--target cuda`` keeps to what the CUDA provider has; where an
activation has no kernel, the foldable part is still folded and the activation kept.
"""

from __future__ import annotations

from collections.abc import Callable

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

EMITTERS: dict[str, Callable[[Match, Context], Emission | None]] = {}
for _family in (emit_matmul, emit_gelu, emit_layer_norm, emit_acts, emit_gqa, emit_norms, emit_layout,
                emit_rotary):
    EMITTERS.update(_family.EMITTERS)  # emit_layout's conv entries cover emit_conv's plain ones too


def emit(m: Match, ctx: Context) -> Emission | None:
    """The Emission for ``m`` on ctx's target and mode, or None."""
    fn = EMITTERS.get(m.pattern.name)
    if fn is None or any(n.domain not in ("", "ai.onnx") or n.name not in ctx.protos for n in m.nodes):
        return None
    return fn(m, ctx)

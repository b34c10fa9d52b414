"""One match -> the ONNX Runtime nodes that replace it (an Emission), or why no kernel fits it (a string, or
None where the emitter gives no reason: rewrite.plan says that no kernel takes it as written).

The registry is the union of the fusion families' EMITTERS (fusion/families/); what an emitter reads and
writes, and the helpers they share, are in ``kit``. ``--target cuda`` keeps to what the CUDA provider has;
where an activation has no kernel, the foldable part is still folded and the activation kept.
"""

from __future__ import annotations

from ..fusion.families import EMITTERS
from ..fusion.match import Match
from .kit import Context, Emission

__all__ = ["EMITTERS", "emit"]


def emit(m: Match, ctx: Context) -> Emission | str | None:
    """The Emission for ``m`` on ctx's target and mode, or why not (None: no reason given)."""
    fn = EMITTERS.get(m.pattern.name)
    if fn is None or any(n.domain not in ("", "ai.onnx") or n.name not in ctx.protos for n in m.nodes):
        return None
    return fn(m, ctx)

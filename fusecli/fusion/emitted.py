"""What `fusecli rewrite` emits for a match, read from the match's structure alone (no weights).

The after view labels each fused box with a kernel; a label the rewrite never writes misleads (a 3-D
``matmul_bias`` is no Gemm, a conv + bias + swish is no FusedConv). Each family keeps the label beside its
emitter (``LABELS``, fusion/families/); a match it cannot vouch for gets no kernel (None), and the label
falls back to the pattern's name. Weights or attributes the emitter reads may still make it pass a match
over, so this is what the rewrite would write when its values allow.
"""

from __future__ import annotations

from .families import LABELS
from .match import Match


def emitted_kernel(m: Match, mode: str = "inference") -> str | None:
    """The op `fusecli rewrite` writes for ``m`` (CPU), or None when it writes none or this cannot say."""
    label = LABELS.get(m.pattern.name)
    return label(m, mode) if label is not None else m.pattern.kernel.split(" / ")[0]

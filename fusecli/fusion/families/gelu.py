"""GELU written out (erf, erfc, tanh forms), with or without the bias before it."""

from __future__ import annotations

from ...rewrite import emit_gelu
from ...spellings import gelu
from ...spellings.common import select
from ..pattern_kit import (
    GELU,
    Pattern,
    made_by,
)

PATTERNS: tuple[Pattern, ...] = (
    Pattern("bias_gelu", select(gelu.OP) + GELU, "BiasGelu / FastGelu with bias",
            "y = gelu(x + b)", fused_kind="bias_gelu", include_producers=("x",),
            require=lambda roles, bound: made_by("bias_add")(bound["x"])),
    Pattern("gelu", GELU, "Gelu / FastGelu",
            "y = x Phi(x): erf form, or the tanh approximation", fused_kind="gelu"),
)

EMITTERS = {"gelu": emit_gelu.gelu, "bias_gelu": emit_gelu.gelu}

"""RMSNorm x rsqrt(mean(x^2) + eps) g, and with the residual add before it."""

from __future__ import annotations

from ...rewrite import emit_norms
from ..pattern_kit import (
    RESIDUAL_X,
    RMS_NORM,
    Pattern,
)

PATTERNS: tuple[Pattern, ...] = (
    Pattern("skip_rms_norm", RMS_NORM, "SkipSimplifiedLayerNormalization",
            "y = rms_norm(x + skip), the sum written out as the kernel's extra output", fused_kind="rms_norm",
            include_producers=("x",), side_outputs=("x",),
            require=lambda roles, bound: RESIDUAL_X.check(bound["x"])),
    Pattern("rms_norm", RMS_NORM, "SimplifiedLayerNormalization (RMSNorm)",
            "y = x rsqrt(mean(x^2) + eps) g: backward reads x, g and the row rsqrt", fused_kind="rms_norm"),
)

EMITTERS = {"rms_norm": emit_norms.rms_norm, "skip_rms_norm": emit_norms.skip_rms_norm}

"""RMSNorm x rsqrt(mean(x^2) + eps) g, and with the residual add before it."""

from __future__ import annotations

from ..match import Match
from ..notes_kit import verdict
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

KERNELS = {"rms_norm": "rms_norm", "skip_rms_norm": "skip_rms_norm"}


def _ort_rms_norm(m: Match) -> dict:
    """SimplifiedLayerNormFusion, which misses the Reciprocal / Rsqrt spelling."""
    if any(n.kind in ("reciprocal", "rsqrt") for n in m.nodes):
        return verdict(False, False, "SimplifiedLayerNormFusion matches x / sqrt(...) and "
                       "x * (1 / sqrt(...)), not this Reciprocal / Rsqrt spelling")
    return verdict(True, True, "SimplifiedLayerNormalization (SimplifiedLayerNormFusion)")


NOTES = {
    "skip_rms_norm": {
        "onnxruntime": (None, None, "SkipSimplifiedLayerNormalization (onnxruntime.transformers.optimizer), "
                        "the sum as its 4th output"),
        "pytorch": (None, None, "torch.compile fuses the residual add into the norm")},
    "rms_norm": {
        "onnxruntime": _ort_rms_norm,
        "pytorch": (True, True, "F.rms_norm (a fused kernel from PyTorch 2.4; torch.compile fuses the eager "
                    "form)")},
}

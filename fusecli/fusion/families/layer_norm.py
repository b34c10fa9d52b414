"""LayerNorm written out, and the residual Add before a LayerNorm (SkipLayerNormalization)."""

from __future__ import annotations

from ...rewrite import emit_layer_norm
from ..match import op
from ..pattern_kit import (
    LAYER_NORM,
    RESIDUAL_X,
    SKIP_LAYOUT,
    Pattern,
    Z,
)

PATTERNS: tuple[Pattern, ...] = (
    Pattern("skip_layer_norm", (op("layer_norm", op("add", Z, Z, role="add", name="x"), role="layer_norm",
                                   more=True),
                                # OPT: Add -> Reshape (b s, h) -> LayerNorm; values kept, rows flattened
                                op("layer_norm", op(SKIP_LAYOUT, op("add", Z, Z, role="add", name="x"),
                                                    more=True, role="skip_layout", name="x_view"),
                                   role="layer_norm", more=True)) + LAYER_NORM, "SkipLayerNormalization",
            "y = layer_norm(x + skip); pre-LN blocks read the sum again: the kernel's optional 4th output",
            fused_kind="layer_norm", include_producers=("x",), side_outputs=("x", "x_view"),
            require=lambda roles, bound: "add" in roles or RESIDUAL_X.check(bound["x"])),
    Pattern("layer_norm", LAYER_NORM, "LayerNormalization",
            "y = (x - mean) / sqrt(var + eps) * gamma + beta", fused_kind="layer_norm"),
)

EMITTERS = {"layer_norm": emit_layer_norm.layer_norm, "skip_layer_norm": emit_layer_norm.skip_layer_norm}

"""MatMul / Gemm epilogues: bias (+ activation), a scalar scale, a weight transposed at run time."""

from __future__ import annotations

from ...rewrite import emit_matmul
from ..match import Var, op
from ..pattern_kit import (
    Pattern,
    W,
    X,
    acts,
    bias,
    not_param,
    scaled,
    swaps_last_two,
    transposed_weight,
)

PATTERNS: tuple[Pattern, ...] = (
    Pattern("matmul_bias_act", (*acts(bias(op("matmul", X, W, role="matmul"))),
                                *acts(op("gemm", X, W, role="matmul", more=True))),
            "FusedGemm / _FusedMatMul", "y = act(x @ w + b): backward reads x, w and y"),
    Pattern("matmul_bias", (bias(op("matmul", X, W, role="matmul")),), "Gemm / _FusedMatMul",
            "y = x @ w + b: the bias joins the GEMM's epilogue"),
    Pattern("matmul_scale", (*scaled(op("matmul", X, W, role="matmul")),
                             *(op("matmul", s, W, role="matmul") for s in scaled(X)),
                             *(op("matmul", X, s, role="matmul") for s in scaled(W))),
        "FusedMatMul (alpha)", "y = alpha (a @ b): attention's Q K^T / sqrt(d) [ORT MatMulScaleFusion]"),
    Pattern("matmul_transpose", (op("matmul", X, Var(check=transposed_weight), role="matmul"),
                                 op("matmul", X, op("transpose", Var(check=not_param), role="transpose",
                                                    check=swaps_last_two), role="matmul")),
            "FusedMatMul (transB)", "y = x @ w^T for w transposed at run time (a MoE expert's w[e], "
            "DeBERTa's position keys): the GEMM reads w in place [ORT MatMulTransposeFusion]"),
)

EMITTERS = {"matmul_bias_act": emit_matmul.matmul_family, "matmul_bias": emit_matmul.matmul_family,
            "matmul_scale": emit_matmul.matmul_scale, "matmul_transpose": emit_matmul.matmul_transpose}

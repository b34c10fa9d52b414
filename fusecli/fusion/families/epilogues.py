"""Elementwise epilogues of a bias: softmax (BiasSoftmax) and dropout (BiasDropout); no kernel emitted yet."""

from __future__ import annotations

from ...core.trees import Var, op
from ...spellings.common import ADD, SUM
from ..pattern_kit import (
    Pattern,
    X,
    Z,
    bias,
    is_activation,
)

PATTERNS: tuple[Pattern, ...] = (
    Pattern("bias_softmax", (op("softmax", op(ADD, Var(check=is_activation), Var(),
                                              commutative=True, role="bias"), role="softmax", more=True),),
            "BiasSoftmax", "y = softmax(x + b): softmax's backward reads y, Add's nothing"),
    Pattern("bias_dropout", (op(SUM, op("dropout", bias(X), role="dropout", more=True), Z, role="add",
                                commutative=True),
                             op("dropout", bias(X), role="dropout", more=True)),
            "BiasDropout", "y = dropout(x + b) (+ residual): backward reads only the dropout mask"),
)

KERNELS: dict[str, str] = {}

NOTES = {
    "bias_softmax": {"onnxruntime": (False, True, "BiasSoftmax (BiasSoftmaxFusion, CUDA and ROCm only)")},
    "bias_dropout": {"onnxruntime": (False, None, "BiasDropout (BiasDropoutFusion, CUDA; inference removes "
                                     "Dropout)")},
}

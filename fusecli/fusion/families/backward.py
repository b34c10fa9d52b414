"""Backward-graph fusions: the second seed post's ReluGrad + BiasAddGrad and BatchNormGrad + ReluGrad."""

from __future__ import annotations

from ...core.trees import Var, op
from ..pattern_kit import (
    Pattern,
)

PATTERNS: tuple[Pattern, ...] = (
    Pattern("relu_grad_bias_grad", (op("BiasAddGrad", op("ReluGrad", Var(), Var(), role="relu_grad"),
                                       role="bias_grad"),),
            "ReluGrad + BiasAddGrad in one pass", "db = sum(dy * (y > 0)): one read of dy",
            phase="backward"),
    Pattern("bn_grad_relu_grad", (op("BatchNormGrad", op("ReluGrad", Var(), Var(), role="relu_grad"),
                                     role="bn_grad", more=True),),
            "cudnnBatchNormalizationBackwardEx (BN_ADD_ACTIVATION)",
            "dx, dgamma, dbeta, dz from dy and y in one kernel [seed post 2]", phase="backward"),
)

KERNELS: dict[str, str] = {}

NOTES = {"bn_grad_relu_grad": {"tensorflow": (False, True, "_FusedBatchNormGradEx on GPU (the backward of "
                                              "_FusedBatchNormEx)")}}

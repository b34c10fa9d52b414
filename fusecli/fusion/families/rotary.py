"""Rotary embeddings x cos + rotate_half(x) sin, or GPT-J's rotate_every_two(x) sin on interleaved pairs."""

from __future__ import annotations

from ...spellings.rotary import ROTARY
from ..pattern_kit import (
    Pattern,
)

PATTERNS: tuple[Pattern, ...] = (
    Pattern("rotary", ROTARY, "RotaryEmbedding", "y = x cos + rotate_half(x) sin: backward rotates dy back",
            fused_kind="rotary"),
)

KERNELS = {"rotary": "rotary"}

NOTES = {"rotary": {"onnxruntime": (None, None, "com.microsoft RotaryEmbedding "
                                    "(onnxruntime.transformers.optimizer)")}}

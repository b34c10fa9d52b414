"""Rotary embeddings x cos + rotate_half(x) sin, or GPT-J's rotate_every_two(x) sin on interleaved pairs."""

from __future__ import annotations

from ...rewrite import emit_rotary
from ...spellings.rotary import ROTARY
from ..pattern_kit import (
    Pattern,
)

PATTERNS: tuple[Pattern, ...] = (
    Pattern("rotary", ROTARY, "RotaryEmbedding", "y = x cos + rotate_half(x) sin: backward rotates dy back",
            fused_kind="rotary"),
)

EMITTERS = {"rotary": emit_rotary.rotary}

NOTES = {"rotary": {"onnxruntime": (None, None, "com.microsoft RotaryEmbedding "
                                    "(onnxruntime.transformers.optimizer)")}}

"""The fusion catalogue: the union of the family modules' entries (fusion/families/), one short declarative
``Pattern`` per fusion; ``Pattern`` and the tree builders are in pattern_kit."""

from __future__ import annotations

from .families import CATALOGUE
from .pattern_kit import Pattern

BY_NAME: dict[str, Pattern] = {p.name: p for p in CATALOGUE}

__all__ = ["BY_NAME", "CATALOGUE", "Pattern"]

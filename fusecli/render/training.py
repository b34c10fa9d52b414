"""The fused-training view as DOT: the seed's Fig. 4 for any model (drawn by render.training_view)."""

from __future__ import annotations

from ..pipeline import Analysis
from .views import build_dot


def build_training_dot(a: Analysis) -> tuple[str, int]:
    """The DOT source of the fused-training view and the number of nodes it draws."""
    return build_dot(a, "fused-training")

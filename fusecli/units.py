"""How sizes and shapes are written for people."""

from __future__ import annotations


def format_bytes(n: int | float | None) -> str:
    """1536 -> '1.5 KiB'; None (a size that is not known) -> '?'."""
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def sum_bytes(values) -> int | None:
    """The sum, or None when any size is unknown."""
    total = 0
    for v in values:
        if v is None:
            return None
        total += v
    return total


def format_shape(shape) -> str:
    """('N', 3, None) -> '[N, 3, ?]'."""
    if shape is None:
        return "?"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"

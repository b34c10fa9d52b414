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


# decimal units are powers of 1000, binary ones (KiB...) of 1024, as IEC 80000-13 writes them
BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
              "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int | None:
    """'24GiB' -> 25769803776, '500MB' -> 500000000, '1.5 GiB', '4096' (plain bytes); None when the text
    is not a positive size (no number, an unknown unit, zero or less)."""
    s = text.strip().lower().replace("_", "")
    i = 0
    while i < len(s) and (s[i].isdigit() or s[i] == "."):
        i += 1
    number, unit = s[:i], s[i:].strip()
    if not number or number.count(".") > 1 or number == "." or unit not in BYTE_UNITS:
        return None
    value = int(float(number) * BYTE_UNITS[unit]) if "." in number else int(number) * BYTE_UNITS[unit]
    return value if value > 0 else None

"""--bench in words: each rewritten model against the original at the same level, inside the spread.

A difference is measurable only when the interquartile ranges do not overlap (rewritten's 25th
percentile above the original's 75th is "slower", its 75th below the original's 25th "faster") and
the medians differ by at least MARGIN; otherwise the verdict is "no measurable difference".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MARGIN = 0.02  # medians closer than 2% are within timer and scheduling noise even when the IQRs part


@dataclass
class Spread:
    """min / 25th / median / 75th / max of one session's latencies (ms)."""

    low: float
    q1: float
    median: float
    q3: float
    high: float

    @classmethod
    def of(cls, times_ms: list[float]) -> Spread:
        low, q1, med, q3, high = np.percentile(np.asarray(times_ms, dtype=float), [0, 25, 50, 75, 100])
        return cls(float(low), float(q1), float(med), float(q3), float(high))


@dataclass
class Comparison:
    """One rewritten session against its original at the same optimization level."""

    original: str
    rewritten: str
    ratio: float  # original median / rewritten median: above 1 is faster
    verdict: str  # "faster", "slower", "no measurable difference"

    def words(self) -> str:
        if self.verdict == "no measurable difference":
            return f"no measurable difference ({self.ratio:.2f}x, inside the spread)"
        return f"{self.verdict}: {self.ratio:.2f}x the original's speed"


def compare(original: Spread, rewritten: Spread) -> str:
    """'faster' / 'slower' when the interquartile ranges are apart, else 'no measurable difference'."""
    if rewritten.q1 > original.q3 and rewritten.median > original.median * (1 + MARGIN):
        return "slower"
    if rewritten.q3 < original.q1 and rewritten.median < original.median * (1 - MARGIN):
        return "faster"
    return "no measurable difference"


def comparisons(timings: list) -> list[Comparison]:
    """Pair every 'rewritten...' timing with the 'original...' one of the same label suffix."""
    by = {t.label: t for t in timings}
    out = []
    for t in timings:
        if not t.label.startswith("rewritten"):
            continue
        ref = by.get("original" + t.label[len("rewritten"):])
        if ref is None or not t.times_ms or not ref.times_ms:
            continue
        a, b = Spread.of(ref.times_ms), Spread.of(t.times_ms)
        out.append(Comparison(ref.label, t.label, a.median / b.median, compare(a, b)))
    return out


def slowdown(timings: list) -> Comparison | None:
    """The first measurable slowdown among the comparisons, or None."""
    return next((c for c in comparisons(timings) if c.verdict == "slower"), None)

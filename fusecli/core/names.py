"""Names for people: the scope prefix every name shares, middle cuts that keep rows apart, name patterns.

Each function is linear in the length of the names (a model may have 50k-character names).
"""

from __future__ import annotations

import os
import re
from collections import Counter

ELLIPSIS = "…"
_DIGITS = re.compile(r"(\d+)")
MAX_SCOPE_DEPTH = 16  # scope levels looked at for the common prefix (linear in the names' length)


def common_scope(names: list[str], share: float = 0.8) -> str:
    """The '/'-ended scope prefix that at least ``share`` of the names start with ('' if none): printed
    once and shown as '…/' (Keras exports put almost every node under one call and model scope)."""
    if len(names) < 2:
        return ""
    prefix = ""
    for _ in range(MAX_SCOPE_DEPTH):
        counts: Counter[str] = Counter()
        for n in names:
            j = n.find("/", len(prefix)) if n.startswith(prefix) else -1
            if j > len(prefix):
                counts[n[len(prefix):j + 1]] += 1
        if not counts:
            return prefix
        segment, c = counts.most_common(1)[0]
        if c < share * len(names):
            return prefix
        prefix += segment
    return prefix


def cut_end(text: str, width: int) -> str:
    """A list cut at the end: '1 A, 2 B, …'."""
    return text if len(text) <= width else text[:max(1, width - 1)] + ELLIPSIS


def cut(text: str, width: int, head: int | None = None) -> str:
    """``text`` in at most ``width`` characters: the middle replaced by '…' (``head`` chars kept first)."""
    if len(text) <= width:
        return text
    width = max(width, 3)
    head = max(1, min(width - 2, head if head is not None else width // 3))
    return text[:head] + ELLIPSIS + text[len(text) - (width - head - 1):]


def fit_unique(texts: list[str], width: int) -> list[str]:
    """Cut each text to ``width`` keeping enough of its head to tell it from every other text:
    the head reaches one character past the longest prefix it shares with any other (its sorted
    neighbours), so two different texts never read the same when that fits."""
    long = [i for i, t in enumerate(texts) if len(t) > width]
    if not long:
        return list(texts)
    order = sorted(range(len(texts)), key=texts.__getitem__)
    rank = {i: r for r, i in enumerate(order)}
    out = list(texts)
    for i in long:
        t, r, shared = texts[i], rank[i], 0
        for j in (r - 1, r + 1):
            if 0 <= j < len(order) and texts[order[j]] != t:
                shared = max(shared, len(os.path.commonprefix([t, texts[order[j]]])))
        first = t.find("/", 2 if t.startswith(ELLIPSIS + "/") else 1) + 1  # keep the first scope whole
        head = max(width // 3, first if first <= width * 0.7 else 0, shared + 2)
        if head <= width - 2:
            out[i] = cut(t, width, head)
            continue
        # they differ far in: the head, then as much of the end as fits, or a window on the difference
        h = max(width // 4, min(first, width - 1 - (len(t) - shared)))
        rest = width - h - 1
        if len(t) - rest <= shared:
            out[i] = t[:h] + ELLIPSIS + t[len(t) - rest:]
        else:
            out[i] = t[:h] + ELLIPSIS + t[shared + 2 - (rest - 1):shared + 2] + ELLIPSIS
    return out


def name_pattern(names: list[str]) -> str:
    """'conv2_block1_1_conv', 'conv2_block2_1_conv' -> 'conv2_block*_1_conv' (same skeleton assumed)."""
    parts = [_DIGITS.split(n) for n in names]
    first = parts[0]
    if any(len(p) != len(first) for p in parts):
        return names[0]
    return "".join(tok if k % 2 == 0 or all(p[k] == tok for p in parts) else "*"
                   for k, tok in enumerate(first))


def skeleton(name: str) -> str:
    return _DIGITS.sub("#", name)


def last_segments(name: str, prefix: str = "", limit: int = 40) -> str:
    """A short label: the name without ``prefix``, then as many of its last '/'-segments as fit in
    ``limit`` characters ('…/' marks the ones left out); a last segment longer than that is cut."""
    if prefix and name.startswith(prefix):
        name = name[len(prefix):]
    if len(name) <= limit:
        return name
    start = len(name) - (limit - 2)  # room for '…/'
    j = name.find("/", start - 1)
    if 0 <= j < len(name) - 1 and len(name) - j > limit // 2:
        return ELLIPSIS + "/" + name[j + 1:]
    return cut(name, limit, head=limit // 3)  # the last segments alone would say little: head and tail

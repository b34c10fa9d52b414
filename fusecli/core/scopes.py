"""Where a node sits in its model, whoever exported it: a scope (the module path, list indices kept with
their list, digit runs folded: ``encoder/layer.*/attention``) from dynamo's recorded module path
(``node.meta["module"]``) or the node name, and the pairing of two models' scopes (``fusecli diff``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

from .ir import Node

_DIGITS = re.compile(r"\d+")


def node_scope(node: Node) -> tuple[str, ...]:
    """The module path of a node as segments, list indices kept with their list ('layer.0'): dynamo's
    recorded module, else the node name without its last '/' segment."""
    module = node.meta.get("module")
    text = module if module else ".".join(node.name.split("/")[:-1])
    out: list[str] = []
    for seg in text.split("."):
        if not seg:
            continue
        if seg.isdigit() and out:
            out[-1] += "." + seg
        else:
            out.append(seg)
    return tuple(out)


def scoper(a):
    """node -> scope for the nodes of ``a``'s joint graph: a backward node is 'gradients' under the scope
    of the forward node it differentiates (dynamo's backward nodes are named after node names)."""
    forward = {n.name: n for n in a.graph.nodes}
    cache: dict[int, tuple[str, ...]] = {}

    def scope(node: Node) -> tuple[str, ...]:
        s = cache.get(id(node))
        if s is None:
            f = forward.get(node.meta.get("forward")) if node.phase != "forward" else None
            s = cache[id(node)] = ("gradients", *node_scope(f)) if f is not None else node_scope(node)
        return s

    return scope


def fold(scope: Iterable[str]) -> str:
    """'inner/encoder/layer.*/attention': segments joined by '/', digit runs as '*'."""
    return "/".join(_DIGITS.sub("*", s) for s in scope)


def shared(scopes: list[tuple[str, ...]]) -> tuple[str, ...]:
    first = scopes[0]
    k = len(first)
    for s in scopes[1:]:
        k = min(k, len(s))
        for i in range(k):
            if s[i] != first[i]:
                k = i
                break
    return first[:k]


def _suffix(a: str, b: str) -> bool:
    """One scope ends with the other at a segment boundary."""
    return a.endswith("/" + b) or b.endswith("/" + a)


def pair_scopes(old: set[str], new: set[str]) -> dict[str, str]:
    """NEW scope -> OLD scope: equal ones, then a unique segment-suffix partner left on both sides."""
    pairs = {s: s for s in new if s in old}
    left_old = sorted(old - set(pairs.values()) - {""}, key=len)
    left_new = sorted(new - set(pairs) - {""}, key=len)
    by_last: dict[str, list[str]] = defaultdict(list)
    for o in left_old:
        by_last[o.rsplit("/", 1)[-1]].append(o)
    taken = set(pairs.values())
    for n in left_new:
        cands = [o for o in by_last.get(n.rsplit("/", 1)[-1], ()) if o not in taken and _suffix(o, n)]
        if len(cands) == 1:
            pairs[n] = cands[0]
            taken.add(cands[0])
    return pairs


def scope_sets(a) -> tuple[set[str], set[str]]:
    """Folded scopes holding forward nodes directly (those the report lists when unpaired), and every
    scope with its prefixes, backward nodes' too (those that pair)."""
    direct, every = set(), set()
    scope = scoper(a)
    for n in a.joint.nodes:
        s = scope(n)
        if n.phase == "forward":
            direct.add(fold(s))
        for k in range(len(s) + 1):
            every.add(fold(s[:k]))
    return direct, every

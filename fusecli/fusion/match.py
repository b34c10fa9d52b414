"""Every occurrence of the catalogue's patterns in a graph: each node tried as a root against the forms
whose root takes its kind (the trees and the matcher are in fusecli/core/trees.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.ir import Graph, Node, Tensor
from ..core.trees import dataflow_order, is_noop, match_at, node_key, root_may_match


@dataclass
class Match:
    """One occurrence of a pattern: its nodes in data-flow order, roles and bound tensors."""

    pattern: object  # fusion.patterns.Pattern
    nodes: list[Node]
    roles: dict[str, Node] = field(default_factory=dict)
    bound: dict[str, Tensor] = field(default_factory=dict)
    verdict: object = None  # fusion.verdict.Verdict, filled by the verdict pass
    inner: list[Match] = field(default_factory=list)  # smaller matches inside it that the report leaves out

    @property
    def root(self) -> Node:
        return self.nodes[-1]

    def interior(self) -> list[Tensor]:
        """Tensors made and read inside the match: what the fused kernel no longer writes out.

        Other outputs of matched nodes (BatchNorm's batch statistics) are side outputs the fused
        kernel still writes, like the root's output."""
        inside = {id(n) for n in self.nodes}
        return [t for n in self.nodes[:-1] for t in n.outputs
                if t is not None and any(id(c) in inside for c in t.consumers)]

    def inputs(self) -> list[Tensor]:
        """Tensors read by the match and made outside it."""
        made = {id(t) for n in self.nodes for t in n.outputs if t is not None}
        seen, out = set(), []
        for n in self.nodes:
            for t in n.inputs:
                if t is not None and id(t) not in made and id(t) not in seen:
                    seen.add(id(t))
                    out.append(t)
        return out


def _root_index(patterns, phase: str) -> tuple[dict[str, list[tuple]], int]:
    """Per root key (kind, or op type in backward): the patterns that may root there, in catalogue order,
    each as (pattern, anchor, find, forms) with only the forms whose root takes that key, each form with
    its slot in a node's cache of ``_root_may_match`` answers (forms that share a root test share one)."""
    index: dict[str, list[tuple]] = {}
    slots: dict[tuple, int] = {}
    for p in patterns:
        if p.phase != phase:
            continue
        for key in p.root.kinds:
            forms = tuple((f, slots.setdefault(f.root_test, len(slots)), f.root_test) for f in p.forms
                          if key in f.kinds)
            index.setdefault(key, []).append((p, getattr(p, "anchor", None), getattr(p, "find", None), forms))
    return index, len(slots)


def find_matches(graph: Graph, patterns, phase: str = "forward") -> list[Match]:
    """Every occurrence of every pattern, trying each node of ``phase`` as a root (linear in nodes): a node
    is tried only against the forms whose root takes its kind.

    The first form of a pattern that matches at a root wins; each pattern matches a root once.
    """
    index, slots = _root_index(patterns, phase)
    found: list[Match] = []
    for node in graph.nodes:
        if node.phase != phase:
            continue
        candidates = index.get(node_key(node))
        if not candidates or node.meta.get("constant"):  # no form matches at a constant node
            continue
        inputs = [t for t in node.inputs if t is not None]
        may: list[bool | None] = [None] * slots  # _root_may_match's answer per root test slot
        for p, anchor, finder, forms in candidates:
            if anchor is not None and not anchor(node):
                continue  # the pattern's own cheap test of the root (attention: P from a softmax)
            if finder is not None:  # a pattern read by its form, not by trees (attention)
                got = finder(node)
                if got is not None and (p.require is None or p.require(got[1], got[2])):
                    found.append(Match(p, dataflow_order(got[0]), got[1], got[2]))
                continue
            m = _first_form(p, forms, node, inputs, may)
            if m is not None:
                found.append(m)
    return found


def _first_form(p, forms: tuple, node: Node, inputs: list[Tensor], may: list[bool | None]) -> Match | None:
    """The match of the first of ``forms`` (with their root test slots) that matches at ``node``."""
    for form, slot, root_test in forms:
        ok = may[slot]
        if ok is None:
            ok = may[slot] = root_may_match(root_test, inputs)
        if not ok:
            continue  # match_at would say no: skip its set-up
        m = match_at(form, node)
        if m is None:
            continue
        nodes, roles, bound = m
        if p.require is not None and not p.require(roles, bound):
            continue
        for name in p.include_producers:  # the producer, and the no-op casts in between
            t = bound.get(name)
            while t is not None and t.producer is not None and t.producer not in nodes:  # by identity
                nodes.insert(0, t.producer)
                t = t.producer.inputs[0] if is_noop(t.producer) else None
        return Match(p, dataflow_order(nodes), roles, bound)
    return None



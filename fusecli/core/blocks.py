"""Repeated blocks: the instances of a scope that differ only by an index (``h.0 ... h.79``,
``layers.*``, ``conv2_block1 ... conv2_block3``) with the same ops, attributes and wiring inside, so
that ``render`` draws one instance as "x80" and hides the rest.

Scopes come from ``scopes.node_scope`` (the module path, list indices kept with their list); an
instance is every node under one indexed scope segment, plus the unscoped nodes all of whose neighbours
lie in that instance (dynamo leaves a few ops without a module). Instances are equal when their nodes,
in graph order, have the same op types, attributes and inputs (an input is a position inside the
instance, or an outside tensor's dtype and whether it is a weight). The outermost index whose equal
instances repeat is folded; equal instances are grouped, so a first layer that differs is drawn on its
own beside "x79".
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from .ir import Node
from .names import cut_end
from .scopes import node_scope

MIN_REPEATS = 2  # equal instances needed to fold
MIN_BLOCK_NODES = 2  # a lone op repeated is not a block
_INDEX = re.compile(r"\d+")


@dataclass
class Block:
    """Equal instances of one indexed scope; ``members[k][i]`` is the i-th node of the k-th instance."""

    scope: str  # 'inner/h.*'
    indices: list[int]
    members: list[list[Node]]

    @property
    def count(self) -> int:
        return len(self.members)

    @property
    def first(self) -> list[Node]:
        return self.members[0]

    def title(self) -> str:
        first, last = self.indices[0], self.indices[-1]
        run = self.count > 2 and last - first + 1 == self.count  # indices ascend
        span = f"{first}…{last}" if run else cut_end(", ".join(map(str, self.indices)), 40)
        return f"{self.scope} x{self.count} ({span})"


@dataclass
class Folding:
    """What a folded view draws: each block's first instance; every other instance's nodes hidden,
    each standing in for the first instance's node at its place."""

    blocks: list[Block] = field(default_factory=list)
    block_of: dict[int, Block] = field(default_factory=dict)  # id(node of a first instance) -> block
    stand_in: dict[int, Node] = field(default_factory=dict)  # id(hidden node) -> node drawn instead
    anchor: dict[int, str] = field(default_factory=dict)  # id(backward node) -> its forward op's name


def _candidates(scope: tuple[str, ...]) -> list[tuple[tuple[str, ...], str, int]]:
    """(outer segments, segment head with its index as '*', index) for each index, outermost first:
    'h.0' -> ('h.*', 0); 'conv2_block1_1_conv' -> ('conv*', 2), ('conv2_block*', 1), ..."""
    out = []
    for i, seg in enumerate(scope):
        for m in _INDEX.finditer(seg):
            head = seg[:m.start()] + "*"
            out.append((scope[:i], head, int(m.group())))
    return out


def _attrs_key(n: Node) -> str:
    return repr(sorted((k, repr(v)[:500]) for k, v in n.attrs.items()))


def _signature(nodes: list[Node]) -> tuple:
    """Op types, attributes and wiring of an instance: inputs as (position, output slot) inside it, or
    the dtype of an outside tensor and whether it is a weight (a graph input reads as any value)."""
    pos = {id(n): k for k, n in enumerate(nodes)}
    out = []
    for n in nodes:
        ins = []
        for t in n.inputs:
            if t is None:
                ins.append(None)
            elif t.producer is not None and id(t.producer) in pos:
                ins.append((pos[id(t.producer)], t.producer.outputs.index(t)))
            else:
                ins.append(("weight" if t.kind in ("parameter", "constant") else "value", t.dtype))
        out.append((n.op_type, n.domain, _attrs_key(n), tuple(ins), len(n.outputs)))
    return tuple(out)


def _adopt(nodes: list[Node], owner: dict[int, tuple]) -> None:
    """Give an unscoped node the instance every drawn neighbour of it lies in (a few passes)."""
    ids = {id(n) for n in nodes}
    for _ in range(3):
        changed = False
        for n in nodes:
            if id(n) in owner or node_scope(n):
                continue
            near = [t.producer for t in n.inputs if t is not None and t.producer is not None]
            near += [c for t in n.outputs if t is not None for c in t.consumers]
            homes = {owner.get(id(m)) for m in near if id(m) in ids}
            if len(homes) == 1 and None not in homes:
                owner[id(n)] = homes.pop()
                changed = True
        if not changed:
            return


def _shared(instance: list[Node], considered: set[int]) -> list[Node]:
    """Nodes of an instance that read nothing made inside it and feed other ``considered`` nodes too
    (the causal mask layer 0 computes for every layer): drawn apart, not part of the block."""
    ids = {id(n) for n in instance}
    out = []
    for n in instance:
        inside = any(t is not None and t.producer is not None and id(t.producer) in ids for t in n.inputs)
        outside = any(id(c) not in ids and id(c) in considered
                      for t in n.outputs if t is not None for c in t.consumers)
        if not inside and outside:
            out.append(n)
    return out


def _fold_level(nodes: list[Node], taken: set[int], depth: int, folding: Folding) -> bool:
    """Fold the candidates at index ``depth`` of each node's scope; True when any candidate existed."""
    owner: dict[int, tuple] = {}
    for n in nodes:
        if id(n) in taken:
            continue
        cands = _candidates(node_scope(n))
        if len(cands) > depth:
            outer, head, index = cands[depth]
            owner[id(n)] = (outer, head, index)
    if not owner:
        return False
    _adopt([n for n in nodes if id(n) not in taken], owner)
    considered = {id(n) for n in nodes}
    instances: dict[tuple, dict[int, list[Node]]] = defaultdict(lambda: defaultdict(list))
    for n in nodes:
        key = owner.get(id(n))
        if key is not None:
            instances[key[:2]][key[2]].append(n)
    for by_index in instances.values():
        for index, inst in by_index.items():
            drop = {id(n) for n in _shared(inst, considered)}
            if drop:
                by_index[index] = [n for n in inst if id(n) not in drop]
    for (outer, head), by_index in instances.items():
        classes: dict[tuple, list[int]] = defaultdict(list)
        for index in sorted(by_index):
            classes[_signature(by_index[index])].append(index)
        for indices in classes.values():
            if len(indices) < MIN_REPEATS or len(by_index[indices[0]]) < MIN_BLOCK_NODES:
                continue
            block = Block("/".join((*outer, head)), indices, [by_index[k] for k in indices])
            folding.blocks.append(block)
            for n in block.first:
                folding.block_of[id(n)] = block
            for inst in block.members:
                taken.update(id(n) for n in inst)
                for n, rep in zip(inst, block.first, strict=True):
                    if n is not rep:
                        folding.stand_in[id(n)] = rep
    return True


def fold_blocks(nodes: list[Node], max_depth: int = 4) -> Folding:
    """The repeated blocks among forward ``nodes`` (graph order): outermost indices first; nodes left
    unfolded at one index are tried at the next one inside."""
    folding, taken = Folding(), set()
    for depth in range(max_depth):
        if not _fold_level(nodes, taken, depth, folding):
            break
    return folding


def fold_backward(backward: list[Node], folding: Folding) -> None:
    """Let a hidden forward node's backward ops stand in by its drawn node's, when they line up. A
    backward op with no forward op (a sum of gradients) goes with the first backward op it reads that
    has one (else with what that op goes with)."""
    by_forward: dict[str, list[Node]] = defaultdict(list)
    anchor = folding.anchor
    for n in backward:  # topological order: producers first
        made = [t.producer for t in n.inputs if t is not None and t.producer is not None]
        f = n.meta.get("forward") or next((p.meta["forward"] for p in made if p.meta.get("forward")),
                                          next((anchor[id(p)] for p in made if id(p) in anchor), None))
        if f is not None:
            anchor[id(n)] = f
            by_forward[f].append(n)
    for block in folding.blocks:
        for inst in block.members[1:]:
            for n, rep in zip(inst, block.first, strict=True):
                mine, theirs = by_forward.get(n.name, []), by_forward.get(rep.name, [])
                if [b.op_type for b in mine] == [r.op_type for r in theirs]:
                    for b, r in zip(mine, theirs, strict=True):
                        folding.stand_in[id(b)] = r

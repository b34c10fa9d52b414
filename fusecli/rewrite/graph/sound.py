"""A pass's emissions checked before they go in: none may make a cycle or leave a read undefined.

A fused node stands where its region stood; a region that is not convex (a path leaves it and comes
back), or two regions that read each other, make a cycle, and a region whose removed nodes made a tensor
the fused node does not make again leaves its readers undefined. The input was checked when it was
read, so such a break is the rewrite's own fault: the emission is left out (its region stays unfused,
with the reason), the rest of the pass goes in.
"""

from __future__ import annotations

import onnx
from onnx import helper

from ...core.ir import kahn_order
from ...load.onnx_order import predecessors, reads
from .kit import Emission


def splice(old: list[onnx.NodeProto], emissions: list[Emission], protos: dict[str, onnx.NodeProto],
           as_constants: bool) -> tuple[list[onnx.NodeProto], dict[int, int]]:
    """The node list with each emission's nodes where its last removed node was (its new weights as
    Constant nodes before them when ``as_constants``); and id(new node) -> its emission's index."""
    order = {id(n): i for i, n in enumerate(old)}
    anchor: dict[int, int] = {}
    removed: set[int] = set()
    for k, e in enumerate(emissions):
        ps = [protos[name] for name in e.remove]
        anchor[id(max(ps, key=lambda p: order[id(p)]))] = k
        removed.update(id(p) for p in ps)
    nodes: list[onnx.NodeProto] = []
    owner: dict[int, int] = {}
    for n in old:
        if id(n) in anchor:
            e = emissions[anchor[id(n)]]
            new = [helper.make_node("Constant", [], [t.name], name=t.name, value=t)
                   for t in e.initializers] if as_constants else []
            new += e.nodes
            owner.update((id(x), anchor[id(n)]) for x in new)
            nodes += new
        if id(n) not in removed:
            nodes.append(n)
    return nodes, owner


def unsound(model: onnx.ModelProto, emissions: list[Emission], protos: dict[str, onnx.NodeProto],
            as_constants: bool) -> tuple[list[Emission], list[tuple[Emission, str]]]:
    """(the emissions that go in, [(emission left out, what it would break)])."""
    kept, broken = list(emissions), []
    old = list(model.graph.node)  # hold the wrappers: ids stay theirs
    while kept:
        nodes, owner = splice(old, kept, protos, as_constants)
        if _in_order(model, nodes, kept, as_constants):
            break  # every read made before it: acyclic and wired (the common case, one linear pass)
        found = _undefined(model, nodes, owner, kept, protos, as_constants) or \
            _cycle(nodes, owner, [{i for name in e.remove for i in reads(protos[name])} for e in kept])
        if found is None:
            break
        k, why = found
        broken.append((kept.pop(k), why))
    return kept, broken


def _defined(model: onnx.ModelProto, emissions: list[Emission], as_constants: bool) -> set[str]:
    g = model.graph
    defined = {v.name for v in g.input} | {t.name for t in g.initializer}
    defined |= {t.values.name for t in g.sparse_initializer}
    if not as_constants:
        defined |= {t.name for e in emissions for t in e.initializers}
    return defined


def _in_order(model, nodes, emissions, as_constants) -> bool:
    """Whether each node reads only what comes before it, and every graph output is made (no subgraphs)."""
    defined = _defined(model, emissions, as_constants)
    for n in nodes:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute) or \
                any(i and i not in defined for i in n.input):
            return False
        defined.update(n.output)
    return all(o.name in defined for o in model.graph.output)


def _undefined(model, nodes, owner, emissions, protos, as_constants) -> tuple[int, str] | None:
    g = model.graph
    defined = _defined(model, emissions, as_constants) | {o for n in nodes for o in n.output if o}
    removed_by = {o: k for k, e in enumerate(emissions) for name in e.remove
                  for o in protos[name].output if o}
    for n in nodes:
        for i in n.input:
            if not i or i in defined:
                continue
            if i in removed_by:  # the region that removed its maker, whoever reads it
                return removed_by[i], f"node {n.name or n.op_type!r} reads {i!r}, which the fused nodes no " \
                                      "longer make"
            if id(n) in owner:
                return owner[id(n)], f"the fused node reads {i!r}, which nothing makes"
    for o in g.output:
        if o.name not in defined and o.name in removed_by:
            return removed_by[o.name], f"graph output {o.name!r} would be made by no node"
    return None


def _cycle(nodes, owner, region_reads) -> tuple[int, str] | None:
    """The emission on a cycle of the spliced graph (one whose fused node reads there what its region
    never read, when one does), and the cycle said in names; None when the graph is acyclic."""
    preds = predecessors(nodes)
    placed = kahn_order([set(p) for p in preds])
    if len(placed) == len(nodes):
        return None
    stuck = set(range(len(nodes))) - set(placed)
    # every node Kahn's algorithm left has a predecessor it left too: walking back must come round
    path, seen, k = [], {}, next(iter(stuck))
    while k not in seen:
        seen[k] = len(path)
        path.append(k)
        k = next(p for p in preds[k] if p in stuck)
    loop = path[seen[k]:]  # each entry's predecessor is the next one
    fused = [(k, preds[k][loop[(i + 1) % len(loop)]]) for i, k in enumerate(loop) if id(nodes[k]) in owner]
    if not fused:
        return None  # not of an emission's making: the checks after the pass say what is wrong
    k, name = next(((k, n) for k, n in fused if n not in region_reads[owner[id(nodes[k])]]), fused[0])
    at = loop.index(k)
    via = [nodes[j].name or nodes[j].op_type for j in reversed(loop[at + 1:] + loop[:at])]
    more = ", ..." if len(via) > 3 else ""
    return owner[id(nodes[k])], (f"the fused node would read {name!r}, made from its own output "
                                 f"(a cycle through {', '.join(repr(v) for v in via[:3])}{more})")

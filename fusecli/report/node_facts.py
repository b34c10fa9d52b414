"""Per forward node, what the viewer exports show: the bytes backward keeps of its outputs and the fusion
matches it belongs to, and which node of the ONNX file each forward node is (by its output names)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..fusion.verdict import LADDER

if TYPE_CHECKING:
    import onnx

    from ..pipeline import Analysis


@dataclass
class NodeFacts:
    saved_bytes: int = 0  # bytes backward keeps of this node's outputs (known sizes only)
    saved_unknown: bool = False  # an output backward keeps has an unknown size (left out of saved_bytes)
    fusions: list[tuple[str, str]] = field(default_factory=list)  # (pattern, verdict) per match

    def best_verdict(self) -> str | None:
        return max((v for _, v in self.fusions), key=LADDER.index, default=None)


def node_facts(a: Analysis) -> dict[str, NodeFacts]:
    """Every forward node's facts, by fusecli's node name (backward-phase matches left out)."""
    facts = {n.name: NodeFacts() for n in a.graph.nodes}
    for s in a.liveness.saved:
        producer = s.tensor.producer
        f = facts.get(producer.name) if producer is not None else None
        if f is None:
            continue
        if s.bytes is None:
            f.saved_unknown = True
        else:
            f.saved_bytes += s.bytes
    for m in a.matches:
        for n in m.nodes:
            if n.name in facts:
                facts[n.name].fusions.append((m.pattern.name, m.verdict.state))
    return facts


def facts_per_proto_node(a: Analysis, graph: onnx.GraphProto) -> list[NodeFacts | None]:
    """For each node of the ONNX file's main graph, in file order, the facts of the forward node that
    makes its outputs (None where fusecli has no such node). fusecli renames unnamed and duplicate
    nodes, so nodes are matched by their output tensor names, which ONNX keeps unique."""
    facts = node_facts(a)
    by_output = {t.name: n.name for n in a.graph.nodes for t in n.outputs if t is not None}
    out: list[NodeFacts | None] = []
    for p in graph.node:
        name = next((by_output[o] for o in p.output if o in by_output), None)
        out.append(facts.get(name) if name is not None else None)
    return out

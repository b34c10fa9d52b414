"""The tensors a graph computes from its weights alone (a weight, its transpose, autocast's copy of it)."""

from __future__ import annotations

from .ir import Graph, Tensor


def made_of_weights(graph: Graph) -> dict[str, list[Tensor]]:
    """Tensor name -> the parameters it is made of, for the parameters and every tensor computed from
    parameters and constants only."""
    out: dict[str, list[Tensor]] = {}
    for t in graph.tensors.values():
        if t.kind == "parameter" and t.producer is None:
            out[t.name] = [t]
    for n in graph.nodes:
        ins = [i for i in n.inputs if i is not None]
        if ins and all(i.name in out or i.kind == "constant" for i in ins):
            made = [p for i in ins for p in out.get(i.name, ())]
            for o in n.outputs:
                if o is not None and made:
                    out[o.name] = made
    return out

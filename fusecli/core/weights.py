"""The tensors a graph computes from its weights alone (a weight, its transpose, autocast's copy of it; with
``selects``, one expert's slice of a stacked weight too)."""

from __future__ import annotations

from .ir import Graph, Tensor


def made_of_weights(graph: Graph, selects: bool = False) -> dict[str, list[Tensor]]:
    """Tensor name -> the parameters it is made of, for the parameters and every tensor computed from
    parameters and constants only; with ``selects``, also a Gather of one such tensor at a rank-0 integer
    index (PyTorch's ``w[i]``, a view of the weight: an MoE's ``gate_up_proj[expert_idx]``)."""
    out: dict[str, list[Tensor]] = {}
    for t in graph.tensors.values():
        if t.kind == "parameter" and t.producer is None:
            out[t.name] = [t]
    for n in graph.nodes:
        ins = [i for i in n.inputs if i is not None]
        if selects and n.kind == "gather" and len(ins) == 2 and ins[0].name in out and ins[1].shape == () \
                and ins[1].dtype.startswith(("int", "uint")):
            ins = ins[:1]
        if ins and all(i.name in out or i.kind == "constant" for i in ins):
            made = [p for i in ins for p in out.get(i.name, ())]
            for o in n.outputs:
                if o is not None and made:
                    out[o.name] = made
    return out

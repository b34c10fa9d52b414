"""Shape reads of tensors a fused region removes, rerouted to tensors that stay.

Exporters read the shape of interior tensors (TorchScript's ``Shape(Cast(q))`` in Falcon, OLMo and CodeGen
attention). The fused node no longer makes them, so the emission used to be left out ("reads ..., which the
fused nodes no longer make"). Where the removed tensor is its source through ops that keep the shape (a
Cast, an Identity, a unary elementwise op) or permute it (a Transpose), the Shape reads the source, and a
Gather applies the permutation: shape(transpose(x, p)) = shape(x)[p], size(transpose(x)) = size(x). The
value read is the same whether the emission then goes in or not.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...core.ir import Graph
from .kit import Emission

SAME_SHAPE = frozenset({"Cast", "Identity", "Neg", "Abs", "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt",
                        "Reciprocal", "Erf", "Softmax", "LogSoftmax", "Dropout"})


def reroute_shape_reads(model: onnx.ModelProto, graph: Graph, emissions: list[Emission],
                        protos: dict[str, onnx.NodeProto]) -> int:
    """Reroute every Shape / Size that reads a tensor some emission removes (see the module docstring), in
    the model and in its IR ``graph`` (whose readers the region checks consult); returns how many. A
    permuting Gather goes at the end of the node list: the caller sorts it (``edit.sort_nodes``)."""
    removed: dict[str, onnx.NodeProto] = {}  # tensor -> the removed node that makes it
    gone: set[int] = set()
    for e in emissions:
        for name in e.remove:
            p = protos[name]
            gone.add(id(p))
            removed.update((o, p) for o in p.output if o)
    for e in emissions:  # what a fused node makes again stays defined
        for n in e.nodes:
            for o in n.output:
                removed.pop(o, None)
    if not removed:
        return 0
    added, rerouted = [], 0
    for n in model.graph.node:
        if n.op_type not in ("Shape", "Size") or n.domain not in ("", "ai.onnx") or not n.input \
                or n.input[0] not in removed or id(n) in gone or n.input[0] not in graph.tensors \
                or n.output[0] not in graph.tensors:
            continue
        found = _source(n.input[0], removed)
        if found is None:
            continue
        source, perm = found
        ranged = any(a.name in ("start", "end") for a in n.attribute)
        if n.op_type == "Shape" and perm is not None and ranged:
            continue  # a slice of a permuted shape: left as it is
        if source not in graph.tensors:
            continue
        reader = graph.tensors[n.output[0]].producer  # the same read in the IR
        old, new = graph.tensors[n.input[0]], graph.tensors[source]
        if reader is None or reader.inputs[0] is not old:
            continue
        old.consumers.remove(reader)
        reader.inputs[0] = new
        new.consumers.append(reader)
        n.input[0] = source
        rerouted += 1
        if n.op_type == "Shape" and perm is not None:
            out = n.output[0]
            n.output[0] = f"{out}__fusecli_unpermuted"
            order = numpy_helper.from_array(np.array(perm, np.int64), f"{out}__fusecli_perm")
            added += [helper.make_node("Constant", [], [order.name], value=order),
                      helper.make_node("Gather", [n.output[0], order.name], [out], axis=0,
                                       name=f"{n.name or out}__fusecli_permuted")]
    model.graph.node.extend(added)  # appended: the nodes already there keep their wrappers
    return rerouted


def _source(t: str, removed: dict[str, onnx.NodeProto]) -> tuple[str, list[int] | None] | None:
    """The tensor outside the removed nodes whose shape, permuted by the returned perm (None: as it is),
    is ``t``'s; None when an op on the way changes the shape otherwise."""
    perm: list[int] | None = None
    while t in removed:
        p = removed[t]
        if p.op_type in SAME_SHAPE and p.input and p.output[0] == t:
            t = p.input[0]
        elif p.op_type == "Transpose" and p.input:
            given = next((list(a.ints) for a in p.attribute if a.name == "perm"), None)
            if given is None:
                return None  # the default perm reverses a rank this pass may not know
            perm = given if perm is None else [given[i] for i in perm]
            t = p.input[0]
        else:
            return None
    return t, perm

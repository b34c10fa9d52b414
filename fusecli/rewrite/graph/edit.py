"""Graph surgery on the ModelProto: put emissions in place, add the contrib opset, drop what is dead."""

from __future__ import annotations

import onnx
from onnx import helper

from ...core.ir import Graph
from ...load.onnx_order import reads, replace, sort_graph, topological
from .kit import MS, Emission
from .proto import is_big_constant
from .sound import splice, unsound


def protos_by_ir_name(model: onnx.ModelProto, graph: Graph) -> dict[str, onnx.NodeProto]:
    """IR node name -> its NodeProto, joined on the node's first output (names may be made up)."""
    by_output = {}
    for n in model.graph.node:
        first = next((o for o in n.output if o), None)
        if first is not None:
            by_output[first] = n
    out = {}
    for node in graph.nodes:
        first = next((t.name for t in node.outputs if t is not None), None)
        if first in by_output and by_output[first].op_type == node.op_type:
            out[node.name] = by_output[first]
    return out


def weights_in_constants(model: onnx.ModelProto) -> bool:
    """The model holds its weights in Constant nodes, none in initializers (onnxscript, onnx_ir)."""
    return not model.graph.initializer and any(is_big_constant(n) for n in model.graph.node)


def apply(model: onnx.ModelProto, emissions: list[Emission], protos: dict[str, onnx.NodeProto]) -> None:
    """Replace each emission's nodes by its new ones, placed where its last removed node was; new
    weights are stored as the model stores its own (initializers, or Constant nodes before the nodes)."""
    g = model.graph
    as_constants = weights_in_constants(model)
    nodes, _ = splice(list(g.node), emissions, protos, as_constants)
    replace(g.node, topological(nodes))
    listed_inputs = model.ir_version < 4  # IR 3 lists every initializer as a graph input too
    for e in emissions:
        if as_constants:
            continue
        g.initializer.extend(e.initializers)
        if listed_inputs:
            g.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                           for t in e.initializers)
    if any(n.domain == MS for e in emissions for n in e.nodes) and \
            not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS, 1))


def import_used_domains(model: onnx.ModelProto) -> list[str]:
    """Import com.microsoft (version 1) where the graph's nodes use it without the model importing it
    (onnxruntime loads such a model, onnx's checker refuses it): a warning line per domain added."""
    used = {n.domain for n in model.graph.node}
    if MS not in used or any(o.domain == MS for o in model.opset_import):
        return []
    model.opset_import.append(helper.make_opsetid(MS, 1))
    return [f"the model uses {MS} ops without importing the domain (onnxruntime loads it, onnx's checker "
            f"refuses it): the rewritten model imports {MS} version 1"]


def sort_nodes(model: onnx.ModelProto) -> None:
    """The model's nodes in topological order (``topological``), in place."""
    replace(model.graph.node, topological(list(model.graph.node)))


def sort_input(model: onnx.ModelProto) -> None:
    """The input model's nodes in topological order, before any edit: every walk below may then take the
    file's order for the data flow. FuseError (nothing done) for a cycle or an input nothing makes."""
    sort_graph(model.graph)


def sound_emissions(model: onnx.ModelProto, emissions: list[Emission], protos: dict[str, onnx.NodeProto]
                    ) -> tuple[list[Emission], list[tuple[Emission, str]]]:
    """The emissions that leave the graph acyclic and wired, and those left out with why (``sound``)."""
    return unsound(model, emissions, protos, weights_in_constants(model))


def cast_likes_to_casts(model: onnx.ModelProto, elem_type_of, targets: set[str]) -> int:
    """A CastLike that reads only the type of a tensor a fused region makes or removes (``targets``)
    becomes the Cast to that type, ``CastLike(x, like) = Cast(x, to=type(like))``: once removed, the
    tensor is made by no node; made by the fused node, a CastLike feeding that node would be a cycle
    (Whisper's LayerNorm weights, ``CastLike(w, residual sum)``). CastLikes of the regions themselves
    are left alone. ``elem_type_of(name)`` is the tensor's ONNX element type. Returns how many changed."""
    changed = 0
    for n in model.graph.node:
        if n.op_type != "CastLike" or n.domain not in ("", "ai.onnx") or len(n.input) != 2 \
                or n.input[1] not in targets or any(o in targets for o in n.output):
            continue
        to = elem_type_of(n.input[1])
        if to is None:
            continue  # left as it is: the checks of the emissions say what breaks
        n.op_type = "Cast"
        del n.input[1]
        n.attribute.append(helper.make_attribute("to", to))
        changed += 1
    return changed


def prune(model: onnx.ModelProto) -> int:
    """Drop nodes nothing reads (the folded constant subgraphs), then unused initializers; the node count.
    What is used is found from the graph outputs back through the makers, whatever the nodes' order."""
    g = model.graph
    nodes = list(g.node)  # hold the wrappers: ids below stay theirs
    keep = _needed(nodes, {o.name for o in g.output})
    dropped = len(nodes) - len(keep)
    if dropped:
        replace(g.node, [n for k, n in enumerate(nodes) if k in keep])
    used = {o.name for o in g.output} | {i for k in keep for i in reads(nodes[k]) if i}
    listed_inputs = model.ir_version < 4
    real_inputs = set() if listed_inputs else {i.name for i in g.input}
    gone = {t.name for t in g.initializer if t.name not in used and t.name not in real_inputs}
    if gone:
        replace(g.initializer, [t for t in g.initializer if t.name not in gone])
        if listed_inputs:
            replace(g.input, [i for i in g.input if i.name not in gone])
    made = {o for n in g.node for o in n.output}
    if any(v.name not in made for v in g.value_info):
        replace(g.value_info, [v for v in g.value_info if v.name in made])
    return dropped


def _needed(nodes: list[onnx.NodeProto], outputs: set[str]) -> set[int]:
    """Indices of the nodes the graph outputs need (and of nodes without outputs, kept as they are)."""
    maker = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    todo = [k for k, n in enumerate(nodes) if not any(n.output)]
    todo += [maker[o] for o in outputs if o in maker]
    keep: set[int] = set()
    while todo:
        k = todo.pop()
        if k in keep:
            continue
        keep.add(k)
        todo += [maker[i] for i in reads(nodes[k]) if i in maker]
    return keep


def undefined_read(model: onnx.ModelProto) -> str | None:
    """The first node input that nothing before it defines (graph inputs, initializers, earlier nodes'
    outputs), as a sentence; None when the graph is wired and in order. Linear in the graph."""
    g = model.graph
    defined = {v.name for v in g.input} | {t.name for t in g.initializer}
    defined |= {t.values.name for t in g.sparse_initializer}
    for n in g.node:
        for i in n.input:
            if i and i not in defined:
                return f"node {n.name or n.op_type!r} reads {i!r}, which nothing before it makes"
        defined.update(o for o in n.output if o)
    missing = next((o.name for o in g.output if o.name not in defined), None)
    return None if missing is None else f"graph output {missing!r} is made by no node"

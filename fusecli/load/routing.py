"""``--routing balanced``: a mixture-of-experts router's choices assumed spread evenly over its experts.

A router is a TopK (or ArgMax) whose indices decide, through integer tensors, the size of a data-dependent
op (NonZero, Compress: the tokens each expert gets; Mixtral, Qwen-MoE, OLMoE write
``nonzero(one_hot(topk(softmax(x W)).indices)[e])``). No shape tool can size what follows. Under the
assumption, choice j of token t goes to expert (t*k + j) mod E: each expert gets tokens*k/E choices (where
E does not divide tokens*k, the first experts get one more), and a token's k choices are distinct
experts when k <= E. The indices are written into the model the shape tools run (never the analyzed
graph) as ops on shapes alone, so NonZero and what follows it evaluate as shape computations do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: onnx is imported where a routed graph is built (--routing)
    import onnx

from ..core.ir import Graph

ROUTING = ("balanced",)
ROUTER_OPS = ("TopK", "ArgMax")
SIZED_BY_VALUES = frozenset({"NonZero", "Compress", "Unique"})  # ONNX ops whose output size is data


@dataclass(frozen=True)
class Router:
    """One router: its node, and the output whose values the assumption replaces."""

    node: str
    op: str
    indices: str
    axis: int


def find_routers(model: onnx.ModelProto) -> list[Router]:
    """TopK / ArgMax nodes whose index output reaches a SIZED_BY_VALUES op (one forward walk each)."""
    g = model.graph
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            if i:
                readers.setdefault(i, []).append(n)
    out = []
    for n in g.node:
        if n.op_type not in ROUTER_OPS or n.domain not in ("", "ai.onnx"):
            continue
        indices = n.output[1] if n.op_type == "TopK" and len(n.output) > 1 else n.output[0]
        if indices and _reaches(indices, readers):
            axis = next((a.i for a in n.attribute if a.name == "axis"), -1 if n.op_type == "TopK" else 0)
            out.append(Router(n.name or indices, n.op_type, indices, axis))
    return out


def _reaches(start: str, readers: dict[str, list[onnx.NodeProto]]) -> bool:
    stack, seen = [start], {start}
    while stack:
        for n in readers.get(stack.pop(), ()):
            if n.op_type in SIZED_BY_VALUES:
                return True
            for o in n.output:
                if o and o not in seen:
                    seen.add(o)
                    stack.append(o)
    return False


def balanced(model: onnx.ModelProto, routers: list[Router]) -> onnx.ModelProto:
    """A copy of ``model`` whose routers' indices are the balanced assignment, computed from shapes:
    Reshape(Range(0, numel) mod E, shape), E the size of the router's input along its axis."""
    import onnx
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    by_output = {r.indices: r for r in routers}
    nodes = []
    for n in g.node:
        nodes.append(n)
        for k, o in enumerate(n.output):
            r = by_output.get(o)
            if r is None or n.op_type != r.op:
                continue
            raw = f"{o}__fusecli_chosen"
            n.output[k] = raw
            nodes.extend(_assignment(n.input[0], raw, o, r.axis))
    del g.node[:]
    g.node.extend(nodes)
    return out


def _assignment(scores: str, raw: str, indices: str, axis: int) -> list[onnx.NodeProto]:
    """``indices`` = Reshape(Range(0, numel(raw)) mod shape(scores)[axis], shape(raw))."""
    import onnx
    from onnx import helper
    p = f"{indices}__fusecli_balanced"

    def const(name: str, value: int, rank0: bool = True) -> onnx.NodeProto:
        t = helper.make_tensor(f"{p}_{name}", onnx.TensorProto.INT64, [] if rank0 else [1], [value])
        return helper.make_node("Constant", [], [f"{p}_{name}"], value=t)

    return [
        const("zero", 0), const("one", 1), const("axis", axis),
        helper.make_node("Shape", [raw], [f"{p}_shape"]),
        helper.make_node("ReduceProd", [f"{p}_shape"], [f"{p}_numel"], keepdims=0),
        helper.make_node("Range", [f"{p}_zero", f"{p}_numel", f"{p}_one"], [f"{p}_flat"]),
        helper.make_node("Shape", [scores], [f"{p}_scores_shape"]),
        helper.make_node("Gather", [f"{p}_scores_shape", f"{p}_axis"], [f"{p}_experts"], axis=0),
        helper.make_node("Mod", [f"{p}_flat", f"{p}_experts"], [f"{p}_choice"]),
        helper.make_node("Reshape", [f"{p}_choice", f"{p}_shape"], [indices]),
    ]


def routers_of(graph: Graph, sizes) -> list[dict]:
    """The routers ``resolve_sizes`` found (``graph.meta["routers"]``: their index outputs): node, op, k and
    experts (E, the size of the scores along the router's axis; None where unknown)."""
    out = []
    for name in graph.meta.get("routers", ()):
        t = graph.tensors.get(name)
        node = t.producer if t is not None else None
        if node is None:
            continue
        scores = sizes.shape(node.inputs[0]) if node.inputs and node.inputs[0] is not None else None
        axis = node.attrs.get("axis", -1 if node.op_type == "TopK" else 0)
        k = 1
        if node.op_type == "TopK":
            value = node.input(1).meta.get("value") if node.input(1) is not None else None
            k = int(value.reshape(-1)[0]) if value is not None and value.size == 1 else None
        experts = scores[axis] if scores is not None and -len(scores) <= axis < len(scores) else None
        out.append({"node": node.name, "op": node.op_type, "k": k, "experts": experts})
    return out

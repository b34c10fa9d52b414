"""Each rewrite cut out as a small pair of models: the nodes it replaced and the nodes it put there.

A region is verified on its own boundary (compositionality: if every replaced region computes the same
function of its inputs, and the rest of the graph is untouched, the whole model does): its data inputs
become graph inputs fed seeded random values at the analysis's sizes, its constants are read (only these),
and tensors computed from shapes alone (a Reshape's target from Shape -> Gather -> Concat, a scale from
Sqrt(Cast(Shape))) are recomputed by pulling their producers into the region, so that they hold the
values the model gives them. Identical regions (same ops, attributes, weights and input shapes) are
verified once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...core import budgets
from ...core.ir import Graph, distinct
from ...core.kinds import reads_type_only
from ...memory.sizes import Sizes
from ..graph.values import Weights

SHAPE_OPS = frozenset({"Shape", "Size"})  # their outputs depend on an input's shape, not its values
MAX_PULLED = 256  # producers pulled in for shape-computed inputs, per region (more: the region is not cut)
MAX_BRIDGE = 16  # producers between the replaced and the fused nodes' inputs (more: not cut)
_SUBGRAPH = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


@dataclass
class DataInput:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]


@dataclass
class Case:
    """One region: ``before`` and ``after`` read ``inputs`` and ``constants`` and make ``outputs``."""

    label: str  # pattern -> kernel, for messages
    before: list[onnx.NodeProto]
    after: list[onnx.NodeProto]
    constants: dict[str, np.ndarray]
    new_weights: list[onnx.TensorProto]
    inputs: list[DataInput]
    outputs: list[str]
    signature: str = ""
    copies: int = 1  # identical regions this case stands for
    at: str = ""  # the emission it checks: "pattern at root node"


@dataclass
class Cutter:
    """Cuts cases out of one pass's model (its Weights, producers and analysis)."""

    weights: Weights
    graph: Graph
    sizes: Sizes
    graph_outputs: set[str]
    _shape_only: dict[str, bool] = field(default_factory=dict)
    _order: dict[int, int] | None = None

    def cut(self, label: str, removed: Sequence[onnx.NodeProto], added: Sequence[onnx.NodeProto],
            new_weights: Sequence[onnx.TensorProto], removed_ir: Iterable[str]) -> Case | str:
        """The case of one emission, or why it cannot be cut (then only the whole model can check it)."""
        if any(a.type in _SUBGRAPH for n in (*removed, *added) for a in n.attribute):
            return f"{label}: a node with a subgraph"
        removed_ir = set(removed_ir)
        made_before = {o for n in removed for o in n.output if o}
        made_after = {o for n in added for o in n.output if o}
        outputs = []  # what the rest of the model reads: the fused nodes must make each of them
        for name in sorted(made_before):
            t = self.graph.tensors.get(name)
            if name in self.graph_outputs or (t is not None and any(
                    c.name not in removed_ir and not reads_type_only(c, t) for c in t.consumers)):
                if name not in made_after:
                    return f"wiring: {label} drops {name!r}, which other nodes read"
                outputs.append(name)
        new_names = {t.name for t in new_weights}
        reads_before = _reads(removed) - made_before
        reads_after = _reads(added) - made_after - new_names
        bridge = self._bridge(reads_before - reads_after, reads_after)
        if isinstance(bridge, str):
            return f"{label}: {bridge}"
        made_bridge = {o for n in bridge for o in n.output if o}
        reads = (reads_before | reads_after | _reads(bridge)) - made_bridge
        pulled: list[onnx.NodeProto] = []
        constants: dict[str, np.ndarray] = {}
        inputs: dict[str, DataInput] = {}
        todo, seen = sorted(reads), set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            if self.weights.is_constant(name):
                value = self.weights.value(name)
                if value is None:
                    return f"{label}: the value of constant {name!r} cannot be read"
                constants[name] = value
            elif self._is_shape_only(name):
                node = self.weights.producer[name]
                if len(pulled) >= MAX_PULLED:
                    return f"{label}: over {MAX_PULLED} nodes compute its shape-valued inputs"
                pulled.append(node)
                for i in node.input:  # a bridge node, or a replaced one (and its fused stand-in), makes
                    if i and i not in seen and i not in made_bridge and i not in made_before:  # it already
                        if node.op_type in SHAPE_OPS:  # only its shape matters: a data input
                            problem = self._add_input(i, inputs)
                            if problem:
                                return f"{label}: {problem}"
                            seen.add(i)
                        else:
                            todo.append(i)
            else:
                problem = self._add_input(name, inputs)
                if problem:
                    return f"{label}: {problem}"
        if not outputs:
            return f"{label}: nothing outside reads it"
        pulled = [_copy(n) for n in sorted(distinct(pulled), key=self._position)]
        bridge = [_copy(n) for n in sorted(bridge, key=self._position)]
        removed = sorted(removed, key=self._position)
        # shape computations that read a bridged tensor need the bridge on the fused side too
        shared = sorted(pulled + bridge, key=self._position) if _reads(pulled) & made_bridge else pulled
        case = Case(label, _ordered(pulled + bridge + [_copy(n) for n in removed]),
                    _ordered(shared + [_copy(n) for n in added]), constants, list(new_weights),
                    sorted(inputs.values(), key=lambda d: d.name), outputs)
        case.signature = signature(case)
        return case

    def _bridge(self, only_before: set[str], reads_after: set[str]) -> list[onnx.NodeProto] | str:
        """The producers between what the replaced nodes read and what the fused ones read instead (an
        emitter that takes V before its Transpose): walked up from each data input only the replaced
        nodes read until inputs the fused nodes read; pulled into ``before`` so both see one input."""
        nodes: list[onnx.NodeProto] = []
        stack = [t for t in only_before if not self._free(t)]
        seen = set(stack)
        while stack:
            t = stack.pop()
            node = self.weights.producer.get(t)
            if node is None or len(nodes) >= MAX_BRIDGE or any(a.type in _SUBGRAPH for a in node.attribute):
                return f"input {t!r} of the replaced nodes is not computed from the fused nodes' inputs"
            nodes.append(node)
            for i in node.input:
                if i and i not in seen and i not in reads_after and not self._free(i):
                    seen.add(i)
                    stack.append(i)
        return distinct(nodes)

    def _free(self, name: str) -> bool:
        """A constant, or computed from shapes only: its value comes with the region."""
        return self.weights.is_constant(name) or self._is_shape_only(name)

    def _add_input(self, name: str, inputs: dict[str, DataInput]) -> str | None:
        t = self.graph.tensors.get(name)
        shape = self.sizes.shape(t) if t is not None else None
        if shape is None:
            return f"the size of input {name!r} is unknown"
        try:
            dtype = np.dtype(t.dtype)
        except TypeError:
            return f"input {name!r} has type {t.dtype}, which numpy has not"
        numel = 1
        for d in shape:
            if d < 0:
                return f"input {name!r} has a negative dim {shape}"
            numel *= d
        budgets.check("FEED_ELEMENTS", numel, f"verification input {name!r} of shape {list(shape)}")
        inputs[name] = DataInput(name, dtype, shape)
        return None

    def _is_shape_only(self, name: str) -> bool:
        """True when ``name`` is computed from constants and input shapes only (Shape, Size), not values
        (walked with a stack, remembered across the pass's regions: linear in the graph)."""
        known, visiting, stack = self._shape_only, set(), [name]
        while stack:
            t = stack[-1]
            if t in known:
                stack.pop()
                continue
            node = self.weights.producer.get(t)
            if node is None or any(a.type in _SUBGRAPH for a in node.attribute):
                known[t] = False
            elif node.op_type in SHAPE_OPS:
                known[t] = True
            else:
                pending = [i for i in node.input if i and i not in known and not self.weights.is_constant(i)]
                if pending and t not in visiting:
                    visiting.add(t)
                    if any(i in visiting for i in pending):
                        known[t] = False  # a cycle: not shape-only
                    else:
                        stack.extend(pending)
                        continue
                else:
                    known[t] = all(known.get(i, False) or self.weights.is_constant(i)
                                   for i in node.input if i)
            visiting.discard(t)
            stack.pop()
        return known[name]

    def _position(self, node: onnx.NodeProto) -> int:
        if self._order is None:
            self._order = {id(n): i for i, n in enumerate(self.weights.model.graph.node)}
        return self._order.get(id(node), 0)


def _ordered(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """``nodes`` in an order where each follows the producers of what it reads (a shape value pulled in
    that reads a replaced node's output, P @ V's Shape, comes after it); otherwise as given."""
    made = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    out: list[onnx.NodeProto] = []
    state: dict[int, int] = {}  # 1: on the stack, 2: placed

    def place(k: int) -> None:
        stack = [(k, iter(nodes[k].input))]
        state[k] = 1
        while stack:
            j, pending = stack[-1]
            dep = next((made[i] for i in pending if i in made and state.get(made[i]) is None), None)
            if dep is None:
                stack.pop()
                state[j] = 2
                out.append(nodes[j])
            else:
                state[dep] = 1
                stack.append((dep, iter(nodes[dep].input)))

    for k in range(len(nodes)):
        if k not in state:
            place(k)
    return out


def _reads(nodes: Iterable[onnx.NodeProto]) -> set[str]:
    return {i for n in nodes for i in n.input if i}


def _copy(node: onnx.NodeProto) -> onnx.NodeProto:
    c = onnx.NodeProto()
    c.CopyFrom(node)
    return c


def signature(case: Case) -> str:
    """A digest that is equal for regions computing the same function on same-shaped inputs: ops,
    attributes and wiring with tensor names by first use, model constants by name, new weights by
    content, data inputs by dtype and shape."""
    h = hashlib.sha1()
    local: dict[str, str] = {}
    kinds = {d.name: f"in:{d.dtype}:{d.shape}" for d in case.inputs}
    kinds.update({name: f"const:{name}" for name in case.constants})
    for t in case.new_weights:
        digest = hashlib.sha1(numpy_helper.to_array(t).tobytes()).hexdigest()
        kinds[t.name] = f"new:{t.data_type}:{list(t.dims)}:{digest}"

    def token(name: str) -> str:
        if not name:
            return ""
        if name not in local:
            local[name] = f"{kinds.get(name, 't')}#{len(local)}"
        return local[name]

    for part, nodes in (("before", case.before), ("after", case.after)):
        h.update(part.encode())
        for n in nodes:
            h.update(f"{n.domain}::{n.op_type}".encode())
            h.update(",".join(token(i) for i in n.input).encode() + b"|")
            h.update(",".join(token(o) for o in n.output).encode() + b"|")
            for a in sorted(n.attribute, key=lambda a: a.name):
                h.update(a.SerializeToString())
    h.update(",".join(token(o) for o in case.outputs).encode())
    return h.hexdigest()


def merged_models(cases: Sequence[Case], opset_imports: Sequence[onnx.OperatorSetIdProto],
                  ir_version: int) -> tuple[onnx.ModelProto, onnx.ModelProto, dict[str, tuple[int, str]]]:
    """The before and after models of all ``cases`` side by side (case k's names prefixed ``r<k>/``),
    and each merged output's (case index, original name)."""
    graphs: dict[str, tuple[list, list, list, list]] = {"before": ([], [], [], []), "after": ([], [], [], [])}
    origin: dict[str, tuple[int, str]] = {}
    for k, case in enumerate(cases):
        prefix = f"r{k}/"
        for part, nodes in (("before", case.before), ("after", case.after)):
            out_nodes, inits, ins, outs = graphs[part]
            for j, n in enumerate(nodes):
                c = _copy(n)
                c.name = f"{prefix}{part}{j}"
                _rename(c.input, prefix)
                _rename(c.output, prefix)
                out_nodes.append(c)
            needed = _reads(nodes)
            for name, value in case.constants.items():
                if name in needed:
                    inits.append(numpy_helper.from_array(value, prefix + name))
            if part == "after":
                for t in case.new_weights:
                    copy = onnx.TensorProto()
                    copy.CopyFrom(t)
                    copy.name = prefix + t.name
                    inits.append(copy)
            for d in case.inputs:
                if d.name in needed:
                    ins.append(helper.make_tensor_value_info(prefix + d.name,
                                                             helper.np_dtype_to_tensor_dtype(d.dtype),
                                                             list(d.shape)))
            for o in case.outputs:
                outs.append(onnx.ValueInfoProto(name=prefix + o))
                origin[prefix + o] = (k, o)
    models = []
    for part in ("before", "after"):
        nodes, inits, ins, outs = graphs[part]
        g = helper.make_graph(nodes, f"regions_{part}", ins, outs, inits)  # names unique: one prefix a case
        models.append(helper.make_model(g, opset_imports=list(opset_imports), ir_version=ir_version))
    return models[0], models[1], origin


def _rename(field, prefix: str) -> None:
    names = [f"{prefix}{x}" if x else "" for x in field]
    del field[:]
    field.extend(names)


def random_feeds(cases: Sequence[Case], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded values for every case's data inputs (floats standard normal, integers 0 or 1, bools)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for k, case in enumerate(cases):
        for d in case.inputs:
            if np.issubdtype(d.dtype, np.floating):
                value = rng.standard_normal(d.shape).astype(d.dtype)
            elif d.dtype == np.bool_:
                value = rng.random(d.shape) < 0.5
            else:
                value = rng.integers(0, 2, d.shape).astype(d.dtype)
            feeds[f"r{k}/{d.name}"] = value
    return feeds

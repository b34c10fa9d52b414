"""Weight values: initializers and Constant nodes, and constant subgraphs evaluated on demand with onnx's
reference runtime. Payloads left in a file (external data, or fusecli's reader's references to the model
file itself) are read only for the tensors asked for."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from ...core.budgets import check_elements
from ...core.errors import FuseError, error_text, one_line
from ...core.ir import unique_name
from ...core.kinds import value_inputs

_NOT_CONSTANT = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                           "Multinomial", "Bernoulli"})


def _value_inputs(node: onnx.NodeProto) -> list[str]:
    """The inputs whose values the node reads (not CastLike's target, read for its type)."""
    return [i for i in value_inputs(node.op_type, node.input) if i]


def tensor_array(t: onnx.TensorProto, base_dir: str = "") -> np.ndarray:
    """numpy_helper.to_array (external payloads read from ``base_dir``), with a FuseError naming the
    tensor when its data does not fit its dims."""
    try:
        return numpy_helper.to_array(t, base_dir)
    except Exception as e:  # onnx raises ValueError, TypeError or its own errors for bad payloads
        first = error_text(e)
        types = onnx.TensorProto.DataType
        dtype = types.Name(t.data_type) if t.data_type in types.values() else str(t.data_type)
        raise FuseError(f"initializer {t.name!r} (dims {list(t.dims)}, {dtype}): its data does not fit "
                        f"its dims and type ({first})") from None


_SUBGRAPH = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


class Names:
    """Unique names for new tensors and nodes of one model."""

    def __init__(self, model: onnx.ModelProto) -> None:
        g = model.graph
        self.used = {t.name for t in g.initializer} | {v.name for v in (*g.input, *g.output)}
        self.used |= {o for n in g.node for o in (*n.output, *n.input) if o} | {n.name for n in g.node}

    def new(self, base: str) -> str:
        name = unique_name(base, self.used)
        self.used.add(name)
        return name


class Weights:
    """Numpy values of a model's tensors that do not depend on graph inputs (cached)."""

    def __init__(self, model: onnx.ModelProto, base_dir: str = "",
                 dtype_of: Callable[[str], str | None] | None = None) -> None:
        g = model.graph
        self.model = model
        self.dtype_of = dtype_of or (lambda name: None)  # a tensor's numpy dtype name (CastLike's target)
        self.base_dir = base_dir  # where external data lives
        self.initializers = {t.name: t for t in g.initializer}
        self.inputs = {v.name for v in g.input} - set(self.initializers)
        self.producer = {o: n for n in g.node for o in n.output if o}
        self.folded: set[str] = set()  # tensors computed from constant subgraphs
        self._cache: dict[str, np.ndarray] = {}
        self._constant: dict[str, bool] = {}

    def is_constant(self, name: str) -> bool:
        """True for an initializer or a tensor computed only from initializers and constants (walked with
        a stack: a long constant chain costs no recursion; a cycle is not constant)."""
        known, visiting = self._constant, set()
        stack = [name]
        while stack:
            t = stack[-1]
            if t in known:
                stack.pop()
                continue
            if t in self.initializers:
                known[t] = True
            elif t in self.inputs or t not in self.producer:
                known[t] = False
            else:
                node = self.producer[t]
                if node.op_type in _NOT_CONSTANT or any(a.type in _SUBGRAPH for a in node.attribute):
                    known[t] = False
                elif t not in visiting:
                    visiting.add(t)
                    todo = [i for i in _value_inputs(node) if i not in known]
                    if any(i in visiting for i in todo):
                        known[t] = False
                    else:
                        stack.extend(todo)
                        continue
                else:
                    known[t] = all(known.get(i, False) for i in _value_inputs(node))
            visiting.discard(t)
            stack.pop()
        return known[name]

    def value(self, name: str) -> np.ndarray | None:
        """The tensor's value, or None when it depends on a graph input."""
        if name in self._cache:
            return self._cache[name]
        if not self.is_constant(name):
            return None
        node = self.producer.get(name)
        if name in self.initializers:
            value = tensor_array(self.initializers[name], self.base_dir)
        elif node is not None and node.op_type == "Constant" and len(node.attribute) == 1 \
                and node.attribute[0].name == "value" and node.attribute[0].HasField("t"):
            value = tensor_array(node.attribute[0].t, self.base_dir)
        elif node is not None and node.op_type == "CastLike":  # the target's values are never read
            dtype, source = self.dtype_of(node.input[1]), self.value(node.input[0])
            if dtype is None or source is None:
                return None
            try:
                value = source.astype(np.dtype(dtype))
            except TypeError:
                return None
        else:
            value = self._evaluate(name)
            self.folded.add(name)
        self._cache[name] = value
        return value

    def _in_memory(self, t: onnx.TensorProto) -> onnx.TensorProto:
        """``t`` with its payload in memory (a copy read from its file when it is external)."""
        if t.data_location != onnx.TensorProto.EXTERNAL:
            return t
        return numpy_helper.from_array(numpy_helper.to_array(t, self.base_dir), t.name)

    def _evaluate(self, name: str) -> np.ndarray:
        """Run the constant subgraph that makes ``name`` in onnx.reference.ReferenceEvaluator."""
        from onnx.reference import ReferenceEvaluator

        nodes, inits, seen, stack = [], [], set(), [name]
        while stack:
            t = stack.pop()
            if t in seen or not t:
                continue
            seen.add(t)
            if t in self.initializers:
                inits.append(self._in_memory(self.initializers[t]))
            else:
                node = self.producer[t]
                if all(id(node) != id(n) for n in nodes):
                    nodes.append(node)
                    if node.op_type == "CastLike" or node.op_type == "Constant" and any(
                            a.t.data_location == onnx.TensorProto.EXTERNAL for a in node.attribute):
                        array = self.value(t)  # its payload read here; CastLike cast to its target's type
                        if array is None:
                            raise FuseError(f"cannot fold {t!r}: the type CastLike casts to is unknown")
                        value = numpy_helper.from_array(array, t)
                        node = onnx.helper.make_node("Constant", [], [t], value=value)
                        nodes[-1] = node
                stack.extend(node.input)
        order = {id(n): i for i, n in enumerate(self.model.graph.node)}
        order.update({id(n): order[id(self.producer[n.output[0]])] for n in nodes if id(n) not in order})
        nodes.sort(key=lambda n: order[id(n)])
        graph = onnx.helper.make_graph(nodes, "constant", [], [onnx.ValueInfoProto(name=name)], inits)
        sub = onnx.helper.make_model(graph, opset_imports=list(self.model.opset_import),
                                     ir_version=self.model.ir_version)
        check_folded_sizes(sub, name)
        try:
            return np.asarray(ReferenceEvaluator(sub).run(None, {})[0])
        except Exception as e:
            first = e
        try:  # the reference implementation has its own bugs (GatherElements of a broadcast index): ORT's
            return _run_onnxruntime(sub)
        except Exception:
            raise FuseError(f"cannot fold the constant subgraph that makes {name!r}: {type(first).__name__}: "
                            f"{one_line(first, 300)}") from None


def check_folded_sizes(sub: onnx.ModelProto, name: str) -> None:
    """The ARRAY_ELEMENTS budget for every tensor of a constant subgraph whose shape onnx's inference
    knows (from the shapes the nodes read: ConstantOfShape, Expand, Tile), before any is computed."""
    from .proto import light_copy

    try:
        inferred = onnx.shape_inference.infer_shapes(light_copy(sub))
    except Exception:  # onnx raises several C++-mapped types; the evaluation says what is wrong
        return
    for v in (*inferred.graph.value_info, *inferred.graph.output):
        t = v.type.tensor_type if v.type.HasField("tensor_type") else None
        if t is not None and t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            dims = [d.dim_value for d in t.shape.dim]
            check_elements(dims, f"the constant {v.name!r} (folded for {name!r})")


def _run_onnxruntime(model: onnx.ModelProto) -> np.ndarray:
    """The one output of a graph without inputs, run by onnxruntime (its output typed from inference)."""
    import onnxruntime as ort  # lazily: the rewrite runs onnxruntime anyway

    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, {})[0])

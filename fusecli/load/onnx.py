"""ONNX file -> forward Graph: shape inference, constant subgraphs, external data never read."""

from __future__ import annotations

import math
import os
import sys
from functools import cache, lru_cache

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from ..core import budgets, progress
from ..core.errors import FuseError
from ..core.ir import FLOAT_DTYPES, Graph, GraphError, Node, Tensor, topological_order
from ..core.kinds import ONNX_KINDS, ONNX_MS_KINDS
from .common import mark_constant_subgraphs, mark_parameter_views, refine_bias_adds
from .constant_weights import promote_constant_weights
from .onnx_order import canonicalize
from .onnx_wire import WireError, read_structure
from .position_tables import mark_sinusoidal_tables
from .shape_tools import check_shape_costs, dims_of, infer_shapes
from .tf2onnx import for_sizing, refine_tf2onnx, restore_tf_ops, tf_ops_as_onnx
from .torch_meta import torch_node_meta

MIN_OPSET = 7  # older models are analyzed too, with a warning: their ops are read by today's kinds
SMALL_VALUE_ELEMENTS = 64  # constants this small keep their values (Clip bounds, Pow exponents, 1/sqrt(d))
_MS_DOMAINS = ("com.microsoft", "com.microsoft.nchwc")
_CONST_OPS = ("Constant", "ConstantOfShape")


@cache  # asked once per tensor
def dtype_name(elem_type: int) -> str:
    """ONNX element type enum -> numpy-style dtype name ('float32', 'int64', ...)."""
    try:
        name = onnx.TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return "float32"
    return {"float": "float32", "double": "float64", "undefined": "float32"}.get(name, name)


def read_model(path: str) -> tuple[onnx.ModelProto, set[str]]:
    """The file's structure (large weights and external data left unread) and the names of the
    initializers read without their data; FuseError with one line on bad input."""
    if not os.path.isfile(path):
        raise FuseError(f"{path}: no such file" if not os.path.exists(path) else
                        f"{path}: not a file")
    if os.path.getsize(path) == 0:
        raise FuseError(f"{path}: empty file, not an ONNX model")
    try:
        model, omitted = read_structure(path)
    except (DecodeError, WireError, RuntimeWarning, ValueError) as e:
        raise FuseError(f"{path}: not an ONNX model (protobuf parse failed: {e})") from None
    except OSError as e:
        raise FuseError(f"{path}: cannot read ({e.strerror or e})") from None
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise FuseError(f"{path}: not an ONNX model (no graph in the file)")
    return model, omitted


def tensors_of(model: onnx.ModelProto):
    """Every TensorProto of the model, with where it lives: initializers, sparse initializers, tensor
    attributes (Constant's value, ...) of nodes in the graph, in subgraphs (If/Loop/Scan) and in local
    functions. Walked with a stack, so deep nesting costs no recursion."""
    return _walk_tensors(model, labelled=True)


def _walk_tensors(model: onnx.ModelProto, labelled: bool):
    """``tensors_of``'s walk; without ``labelled`` the places are None (no text made per tensor)."""
    A = onnx.AttributeProto
    stack = [("graph", model.graph, 0)]
    for fn in model.functions:
        stack.append((f"function {fn.name!r}", fn, 0))
    while stack:
        where, g, depth = stack.pop()
        budgets.check("SUBGRAPH_DEPTH", depth, f"subgraph {where}")
        inside = "" if where == "graph" else f"{where}: "
        if isinstance(g, onnx.GraphProto):
            for t in g.initializer:
                yield (f"{inside}initializer {t.name!r}" if labelled else None), t
            for sp in g.sparse_initializer:
                where = f"{inside}sparse initializer {sp.values.name!r}"
                yield where, sp.values
                yield f"{where} (indices)", sp.indices
        for node in g.node:
            if not node.attribute:
                continue
            label = f"{inside}node {node.name or node.op_type!r}" if labelled else ""
            for a in node.attribute:
                where = f"{label} attribute {a.name!r}" if labelled else None
                if a.type == A.TENSOR or a.HasField("t"):
                    yield where, a.t
                for t in a.tensors:
                    yield where, t
                if a.HasField("sparse_tensor") or a.sparse_tensors:
                    one = [a.sparse_tensor] if a.HasField("sparse_tensor") else []
                    for sp in (*one, *a.sparse_tensors):
                        yield where, sp.values
                        yield where and f"{where} (indices)", sp.indices
                if a.HasField("g") or a.graphs:  # the depth budget names the subgraph, labelled or not
                    sub_where = f"{inside}node {node.name or node.op_type!r} attribute {a.name!r}"
                    if a.HasField("g"):
                        stack.append((sub_where, a.g, depth + 1))
                    stack.extend((sub_where, sub, depth + 1) for sub in a.graphs)


def external_location(t: onnx.TensorProto) -> str:
    return next((e.value for e in t.external_data if e.key == "location"), "")


def check_external_data(model: onnx.ModelProto, path: str) -> None:
    """Refuse external data that is missing or whose location leaves the model's folder, wherever the
    tensor lives (see ``tensors_of``)."""
    if all(t.data_location != onnx.TensorProto.EXTERNAL for _, t in _walk_tensors(model, labelled=False)):
        return
    folder = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    for where, t in tensors_of(model):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = external_location(t)
        if "\x00" in location:
            raise FuseError(f"{path}: external data location of {where} holds a NUL byte; refused")
        target = os.path.realpath(os.path.join(folder, location))
        if not location or os.path.isabs(location) or os.path.commonpath([folder, target]) != folder:
            raise FuseError(f"{path}: external data of {where} points outside the model's "
                            f"folder ({location!r}); refused")
        if not os.path.isfile(target):
            raise FuseError(f"{path}: external data file {location!r} of {where} is missing")


def opset_of(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


_SUBGRAPH_ATTRS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
# attribute types read here as onnx.helper.get_attribute_value reads them, without its chain of type tests
_NUMBER_ATTRS = {onnx.AttributeProto.INTS: lambda a: list(a.ints), onnx.AttributeProto.INT: lambda a: a.i,
                 onnx.AttributeProto.FLOATS: lambda a: list(a.floats),
                 onnx.AttributeProto.FLOAT: lambda a: a.f}


def _attrs(attributes) -> dict:
    """A node's attributes (its ``attribute`` field) by name: numbers, lists, strings as text, TensorProtos,
    and "<subgraph>" for graphs."""
    out = {}
    for a in attributes:
        kind = a.type
        number = _NUMBER_ATTRS.get(kind)
        if number is not None and not a.ref_attr_name:  # (get_attribute_value refuses references)
            out[a.name] = number(a)
        elif kind in _SUBGRAPH_ATTRS:
            out[a.name] = "<subgraph>"
        elif kind == onnx.AttributeProto.TENSOR:
            out[a.name] = a.t
        else:
            value = onnx.helper.get_attribute_value(a)
            out[a.name] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return out


# element types whose raw_data numpy_helper.to_array reads as np.frombuffer(raw_data, dtype).reshape(dims)
# (np.dtype objects: frombuffer takes them without converting a type per call)
_RAW_DTYPES = {elem_type: np.dtype(dtype) for elem_type, dtype in (
    (onnx.TensorProto.FLOAT, np.float32), (onnx.TensorProto.DOUBLE, np.float64),
    (onnx.TensorProto.INT64, np.int64), (onnx.TensorProto.INT32, np.int32),
    (onnx.TensorProto.INT8, np.int8), (onnx.TensorProto.UINT8, np.uint8),
    (onnx.TensorProto.BOOL, np.bool_), (onnx.TensorProto.FLOAT16, np.float16))}


def _small_value(tensor: onnx.TensorProto, dims: tuple[int, ...] | None = None):
    """The numpy value of a tensor of at most SMALL_VALUE_ELEMENTS elements (``dims``: its dims, when the
    caller has them), else None."""
    if dims is None:
        dims = tuple(tensor.dims)
    n = math.prod(dims)
    if n > SMALL_VALUE_ELEMENTS or tensor.data_location == onnx.TensorProto.EXTERNAL:
        return None
    raw_dtype = _RAW_DTYPES.get(tensor.data_type)
    if raw_dtype is not None and sys.byteorder == "little":
        raw = tensor.raw_data
        if raw and not tensor.HasField("segment"):
            try:  # to_array's own reading of raw_data, without its per-call set-up (a graph has thousands)
                if len(raw) == n * raw_dtype.itemsize:  # frombuffer(raw).reshape(dims) in one step
                    return np.ndarray(dims, raw_dtype, raw)  # (ValueError for negative dims, as reshape's)
                return np.frombuffer(raw, dtype=raw_dtype).reshape(dims)
            except ValueError:
                pass  # a size that does not fit the dims: let to_array say what it says
    try:
        return numpy_helper.to_array(tensor)
    except Exception:
        return None


def load_onnx(path: str, constant_weights: bool = True) -> Graph:
    """Read an ONNX file into a forward Graph (weights are never read; small constants are);
    ``constant_weights``: Constant nodes in a weight's role are trainable parameters."""
    model, omitted = read_model(path)
    check_external_data(model, path)
    graph = graph_of_model(model, os.path.basename(path), constant_weights)
    for name in omitted:
        graph.tensors[name].meta["data_omitted"] = True
    graph.meta["onnx_structure"] = (for_sizing(model), omitted)  # sized at the user's dims (load.onnx_sizes)
    refine_tf2onnx(graph)  # a tf2onnx conversion: TensorFlow's graph shapes, its folded BatchNorms
    mark_sinusoidal_tables(graph, path)  # fixed sin/cos position tables, told by their values
    return graph


def _topological(g) -> bool:
    """Whether the file lists every node after the makers of what it reads (as an exporter writes it)."""
    made = {""} | {i.name for i in g.input} | {t.name for t in g.initializer} | \
        {t.values.name for t in g.sparse_initializer}
    for n in g.node:
        if any(i not in made for i in n.input):
            return False
        made.update(n.output)
    return True


def graph_of_model(model: onnx.ModelProto, name: str, constant_weights: bool = True) -> Graph:
    """Shape inference, then the IR graph of an in-memory model (its weights may be left out); its nodes
    are first put in the canonical order, in place (``onnx_order.canonical``): every pass reads that
    order, never the file's."""
    opset = opset_of(model)
    # each node's place in the file: the order the exporter traced the ops in, which the canonical order
    # forgets (plan.sac counts a block's calls of an op in it); keyed by the node's first output
    traced = {next((o for o in n.output if o), None): i for i, n in enumerate(model.graph.node)}
    in_trace_order = _topological(model.graph)  # a reordered file (ONNX Runtime loads one) is no trace
    canonicalize(model.graph)
    progress.stage("shape inference")
    check_shape_costs(model)  # a declared shape is a promise about cost: checked before the tools read it
    renamed = tf_ops_as_onnx(model)  # tf2onnx's Erfc, which ONNX lacks, shaped as Erf for the shape tools
    inferred, warning = infer_shapes(model)
    check_shape_costs(inferred, fields=False)  # and what ONNX's inference made of it (its shapes)
    restore_tf_ops(model, renamed)
    if inferred is not model:
        restore_tf_ops(inferred, renamed)
    model = inferred
    progress.stage("building the graph")
    graph = build_graph(model, name, constant_weights)
    graph.meta["traced_order"] = in_trace_order
    for node in graph.nodes:
        first = next((o.name for o in node.outputs if o is not None), None)
        if first in traced and in_trace_order:
            node.meta["traced"] = traced[first]
    graph.meta["opset"] = opset
    if opset and opset < MIN_OPSET:
        graph.meta.setdefault("warnings", []).append(
            f"opset {opset} is older than the oldest fusecli is checked on ({MIN_OPSET}); "
            "its ops are read with today's semantics")
    if warning:
        graph.meta.setdefault("warnings", []).append(warning)
    return graph


def build_graph(model: onnx.ModelProto, name: str = "model", constant_weights: bool = True) -> Graph:
    """The IR graph of a (shape-inferred) ModelProto."""
    g = model.graph
    graph = Graph(g.name or name, fmt="onnx")
    graph.meta["producer"] = model.producer_name  # which framework made it: its autodiff profile
    graph.meta["export"] = {p.key: p.value for p in g.metadata_props}  # the exporter's notes (torch.export's
    # graph signature); per initializer in its value info (its InputSpec kind, what constant folding used)
    infos = {vi.name: vi for vi in (*g.input, *g.value_info, *g.output)}
    make = _tensor_maker(graph, infos)
    initializer_names = _add_initializers(graph, g, infos)
    for vi in g.input:
        if vi.name in initializer_names:
            continue  # IR < 4 lists initializers as inputs too
        if vi.name in graph.tensors:
            raise FuseError(f"graph input {vi.name!r} is listed twice")
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type == onnx.TensorProto.UNDEFINED:
            raise FuseError(f"graph input {vi.name!r} has no element type (UNDEFINED)")
        graph.inputs.append(make(vi.name, "input"))
    _add_nodes(graph, list(g.node), make)
    try:
        graph.nodes = topological_order(graph.nodes)
    except GraphError as e:
        raise FuseError(str(e)) from None
    graph.outputs = [graph.tensors[o.name] for o in g.output if o.name in graph.tensors]
    missing = [o.name for o in g.output if o.name not in graph.tensors]
    if missing:
        raise FuseError(f"graph output {missing[0]!r} is not defined by any node or input")
    _constant_values(mark_constant_subgraphs(graph, _CONST_OPS, weight_ops=("ConstantOfShape",)))
    _fill_missing_shapes(graph)
    refine_kinds(graph)
    promote_constant_weights(graph, constant_weights)
    mark_parameter_views(graph)
    return graph


def _tensor_maker(graph: Graph, infos: dict[str, onnx.ValueInfoProto]):
    """``make(name, kind)``: a new tensor of the graph (the caller checks that the name is free), typed and
    shaped by its value info; a type is read once per distinct TypeProto (a big graph has a few dozen
    among 100k values)."""
    tensors = graph.tensors
    typed: dict[bytes, tuple[str, tuple | None] | None] = {}

    def make(name: str, kind: str) -> Tensor:
        vi = infos.get(_text(name, "tensor name"))
        found = None
        if vi is not None:
            key = vi.type.SerializeToString()
            found = typed.get(key, False)
            if found is False:
                found = typed[key] = (dtype_name(vi.type.tensor_type.elem_type), dims_of(vi)) \
                    if vi.type.HasField("tensor_type") else None
        t = tensors[name] = Tensor(name, kind=kind) if found is None else Tensor(name, *found, kind)
        return t

    return make


def _add_initializers(graph: Graph, g: onnx.GraphProto, infos: dict[str, onnx.ValueInfoProto]) -> set[str]:
    """The initializers' tensors (small values kept, the exporter's notes from their value info), then the
    sparse initializers'; returns their names. FuseError for one defined twice. ``graph`` is new: its
    tensors are the initializers made so far."""
    tensors = graph.tensors
    for init in g.initializer:
        init_name = init.name
        if init_name in tensors:
            raise FuseError(f"initializer {init_name!r} is defined twice")
        dims = tuple(init.dims)
        t = tensors[init_name] = _weight(_text(init_name, "initializer name"), init.data_type, dims)
        value = _small_value(init, dims)
        if value is not None:
            t.meta["value"] = value
        vi = infos.get(init_name)
        if vi is not None and vi.metadata_props:
            t.meta["export"] = {p.key: p.value for p in vi.metadata_props}
    for sparse in g.sparse_initializer:  # a dense tensor of ``dims`` stored as values + indices
        init = sparse.values
        if init.name in tensors:
            raise FuseError(f"initializer {init.name!r} is defined twice")
        tensors[init.name] = _weight(init.name, init.data_type, tuple(sparse.dims))
    return set(tensors)


def _add_nodes(graph: Graph, protos: list[onnx.NodeProto], make) -> None:
    """Every node's output tensors first (a node may read a value made further down the file), then the
    nodes, in file order."""
    tensors = graph.tensors
    outputs: list[list[Tensor | None]] = []
    for node_proto in protos:
        outs: list[Tensor | None] = []
        for out in node_proto.output:
            if not out:
                outs.append(None)  # an absent optional output
                continue
            if out in tensors:
                raise FuseError(f"tensor {out!r} is defined more than once (again by node "
                                f"{node_proto.name or node_proto.op_type!r})")
            outs.append(make(out, "activation"))
        outputs.append(outs)
    for index, (node_proto, outs) in enumerate(zip(protos, outputs, strict=True)):
        op_type = _text(node_proto.op_type, "op type")
        names = node_proto.input
        inputs = [tensors.get(name) if name else None for name in names]
        if None in inputs:  # an absent optional input, or a name nothing defines
            _check_defined(node_proto, op_type, names, tensors)
        domain = _text(node_proto.domain, "domain")
        attributes = node_proto.attribute
        attrs = _attrs(attributes) if attributes else {}
        kind = "unknown" if "<subgraph>" in attrs.values() else _kind(op_type, domain)
        node = Node(graph.unique_node_name(_text(node_proto.name, "node name") or f"{op_type}_{index}"),
                    op_type, kind, inputs, outs, attrs, domain)
        if node_proto.metadata_props:  # torch's dynamo exporter: module, classes, FX arguments
            node.meta.update(torch_node_meta(node_proto.metadata_props))
        graph.add_node(node)


def _check_defined(node_proto: onnx.NodeProto, op_type: str, names, tensors: dict[str, Tensor]) -> None:
    """FuseError for the first input name of the node that no node, input or initializer defines."""
    for name in names:
        if name and name not in tensors:
            raise FuseError(f"node {node_proto.name or op_type!r} reads {name!r}, "
                            "which no node, input or initializer defines")


@lru_cache(maxsize=4096)  # asked once per node, of a few dozen (op type, domain) pairs
def _kind(op_type: str, domain: str) -> str:
    """The canonical kind of an op of ONNX's domain or com.microsoft's; other domains' are unknown."""
    if domain in ("", "ai.onnx"):
        return ONNX_KINDS.get(op_type, "unknown")
    if domain in _MS_DOMAINS:
        return ONNX_MS_KINDS.get(op_type, "unknown")
    return "unknown"


def _text(value, what: str) -> str:
    """A string field as protobuf hands it back: bytes when they are not UTF-8, refused here."""
    if isinstance(value, bytes):
        raise FuseError(f"{what} {value!r} is not valid UTF-8")
    return value


def _weight(name: str, data_type: int, dims: tuple[int, ...]) -> Tensor:
    """An initializer's (new) tensor: float weights are trainable; one-element floats (1/sqrt(d),
    epsilons) are constants, as are integer tensors."""
    dtype = dtype_name(data_type)
    return Tensor(name, dtype, dims,
                  "parameter" if dtype in FLOAT_DTYPES and math.prod(dims) > 1 else "constant")


def _constant_values(nodes: list[Node]) -> None:
    """Constant nodes' small values (and shapes, where inference left them out) onto their outputs, and
    through the value-preserving casts after them (onnxscript's ``CastLike(eps, x)``)."""
    for node in nodes:
        if node.kind in ("cast", "identity"):
            _cast_value(node)
            continue
        if node.op_type != "Constant" or not isinstance(node.attrs.get("value"), onnx.TensorProto):
            continue  # value_float(s), value_int(s) and the like carry no tensor (ONNX infers their shape)
        value, proto = _small_value(node.attrs["value"]), node.attrs["value"]
        for t in node.outputs:
            if t is None:
                continue
            if value is not None:
                t.meta["value"] = value
            if t.shape is None:
                t.shape = tuple(proto.dims)
                t.dtype = dtype_name(proto.data_type)


def _cast_value(node: Node) -> None:
    """Cast / CastLike / Identity of a known small value: the value in the output's dtype."""
    value, out = constant_value(node.input(0)), node.outputs[0] if node.outputs else None
    if value is None or out is None:
        return
    try:
        out.meta["value"] = np.asarray(value).astype(np.dtype(out.dtype))
    except (TypeError, ValueError):
        pass  # a dtype numpy has not (bfloat16, strings): the value stays unknown


def _fill_missing_shapes(graph: Graph) -> None:
    """Shapes ONNX inference leaves out: Dropout's mask is shaped like its input."""
    for node in graph.nodes:
        if node.op_type == "Dropout" and len(node.outputs) > 1 and node.outputs[1] is not None:
            mask, x = node.outputs[1], node.input(0)
            if mask.shape is None and x is not None:
                mask.shape = x.shape
                mask.dtype = "bool" if graph.meta.get("opset", 10) >= 10 else x.dtype


def constant_value(t: Tensor | None):
    """The numpy value of a small constant or initializer, else None."""
    return None if t is None else t.meta.get("value")


CHANNEL_FIRST_KINDS = frozenset({"conv", "conv_transpose", "batch_norm", "max_pool", "avg_pool",
                                 "instance_norm", "group_norm", "lrn"})  # ONNX: NCHW, channel = axis 1


def _scalar(value) -> float | None:
    """A one-element bound as a float; anything else (a vector min/max, a string) is no known bound."""
    try:
        v = np.asarray(value)
        return float(v.reshape(-1)[0]) if v.size == 1 else None
    except (TypeError, ValueError):
        return None


def refine_kinds(graph: Graph) -> None:
    """Kinds that depend on operands: per-channel constant Add -> bias_add, Clip(0, 6) -> relu6."""
    refine_bias_adds(graph, lambda x: 1 if x.producer is not None
                     and x.producer.kind in CHANNEL_FIRST_KINDS else None)
    for node in graph.nodes:
        if node.kind == "clip":
            lo, hi = node.attrs.get("min"), node.attrs.get("max")
            if lo is None and len(node.inputs) > 1:
                lo = constant_value(node.inputs[1])
                hi = constant_value(node.input(2))
            lo, hi = _scalar(lo), _scalar(hi)
            node.meta["clip_bounds"] = (lo, hi)
            if lo == 0.0 and hi == 6.0:
                node.kind = "relu6"
            elif lo == 0.0 and hi is None:
                node.kind = "relu"

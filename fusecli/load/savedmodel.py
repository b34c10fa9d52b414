"""TensorFlow SavedModel folder -> forward Graph, read from saved_model.pb without importing TensorFlow.

What is read: the meta graph tagged ``serve`` (else the first), one signature of it, and the function
that signature calls. A TF2 SavedModel's graph holds, per signature, a ``StatefulPartitionedCall`` node
whose attr ``f`` names a library function (the *signature function*); its arguments are the signature's
placeholders followed by the captured variables' handles. That function and every function it calls
(``StatefulPartitionedCall``/``PartitionedCall`` nodes, or a node whose op is a library function) are
inlined into one flat graph; only nodes that the signature's outputs depend on are kept (as
TensorFlow's runtime prunes a function).

Names:
- A node keeps its name in the function body that holds it; a node of a called function gets the call
  node's name and ``/`` before its own, so names start at the signature function's body:
  ``StatefulPartitionedCall/functional_1/conv2d_1/convolution`` (Keras 3),
  ``StatefulPartitionedCall/model/conv2d/Conv2D`` (tf-keras), ``StatefulPartitionedCall/Conv2D``
  (a ``tf.Module``). The call nodes themselves vanish, and so do ``IdentityN`` nodes (their outputs are
  their inputs); ``Identity`` nodes stay (kind ``identity``).
- A node's outputs are ``name:index``; a FunctionDef reference ``node:out_arg:k`` is mapped to its
  index through the op's OpDef (``meta_info_def.stripped_op_list``), counting ``number_attr`` and
  ``type_list_attr`` sized output args.
- Graph inputs are named by the signature's input keys (``x``, ``keras_tensor``, ``input_1``); the
  outputs are the tensors the signature's outputs come from, in key order (``graph.meta["output_names"]``
  maps each key to its tensor).

Variables: a ``ReadVariableOp`` of a captured variable is collapsed: its output becomes a tensor
without a producer (like an ONNX initializer), named after the first read (``.../ReadVariableOp:0``);
later reads of the same variable are the same tensor. Its kind is ``parameter`` when the variable is
trainable (the SavedModel's object graph says so), else ``constant`` (BatchNorm's moving statistics);
``meta["variable"]`` holds the variable's name. A ``ResourceGather`` reads its variable the same way.

Constants: ``Const`` nodes stay (kind ``constant``, ``meta["constant"]``), small values (<= 64 elements)
in ``meta["value"]``. As in the ONNX loader, a node fed only by parameters and constants computes a
weight: it is marked ``meta["constant"]`` and its float outputs are parameters when any input is one
(Keras 3's ``Squeeze(Reshape(bias))``, its inference BatchNorm's ``gamma * rsqrt(var + eps)``), else
constants. Control inputs (``^name``) and ``NoOp`` are ignored.

Shapes come from each node's ``_output_shapes`` (-1 -> None, unknown rank -> None), dtypes from the
OpDef's output types and the node's attrs (OpDef defaults fill the attrs a SavedModel strips).
"""

from __future__ import annotations

import math
import os
import re
import sys

import numpy as np
from google.protobuf.message import DecodeError

from ..core import budgets
from ..core.errors import FuseError, error_text
from ..core.ir import Graph, Node, Tensor, unique_name
from ..core.kinds import TF_KINDS
from . import tf_proto
from .common import mark_constant_subgraphs, refine_bias_adds

SMALL_VALUE_ELEMENTS = 64  # constants this small keep their values, as the ONNX loader does
_CALL_OPS = frozenset({"StatefulPartitionedCall", "PartitionedCall"})
_DTYPES = {1: "float32", 2: "float64", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 7: "string",
           8: "complex64", 9: "int64", 10: "bool", 11: "int8", 12: "uint8", 13: "int32", 14: "bfloat16",
           15: "int16", 16: "uint16", 17: "uint16", 18: "complex128", 19: "float16", 20: "resource",
           21: "variant", 22: "uint32", 23: "uint64", 24: "float8e5m2", 25: "float8e4m3fn",
           26: "float8e4m3fnuz", 28: "float8e5m2fnuz", 29: "int4", 30: "uint4"}
_NP_DTYPES = {"float32": np.float32, "float64": np.float64, "int32": np.int32, "uint8": np.uint8,
              "int16": np.int16, "int8": np.int8, "int64": np.int64, "bool": np.bool_,
              "float16": np.float16, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64,
              "complex64": np.complex64, "complex128": np.complex128}
_VAL_FIELDS = {"float32": "float_val", "float64": "double_val", "int32": "int_val", "int16": "int_val",
               "int8": "int_val", "uint8": "int_val", "uint16": "int_val", "int64": "int64_val",
               "bool": "bool_val", "uint32": "uint32_val", "uint64": "uint64_val", "float16": "half_val"}
TF1_MESSAGE = "TF1 SavedModel/session bundle not supported"


def dtype_name(enum: int) -> str:
    """TensorFlow DataType enum (reference types too) -> numpy-style dtype name."""
    return _DTYPES.get(enum - 100 if enum > 100 else enum, "float32")


_ENUMS = {name: enum for enum, name in reversed(_DTYPES.items())}  # the plain type of each name


def dtype_enum(name: str) -> int:
    """A numpy-style dtype name -> TensorFlow's DataType enum (the plain type, not the quantized twin)."""
    return _ENUMS[name]


def shape_of(shape) -> tuple | None:
    """A TensorShapeProto -> IR shape: -1 dims are None, an unknown rank is None."""
    if shape.unknown_rank:
        return None
    return tuple(None if d.size < 0 else d.size for d in shape.dim)


def tensor_value(proto) -> np.ndarray | None:
    """The numpy value of a small TensorProto, else None (strings, large or unreadable tensors)."""
    dtype = dtype_name(proto.dtype)
    shape = shape_of(proto.tensor_shape)
    if dtype not in _NP_DTYPES or shape is None or None in shape:
        return None
    n = math.prod(shape) if shape else 1  # Python ints: a huge claimed shape cannot wrap around
    if n > SMALL_VALUE_ELEMENTS:
        return None
    try:
        if proto.tensor_content:
            return np.frombuffer(proto.tensor_content, dtype=_NP_DTYPES[dtype]).reshape(shape).copy()
        field = _VAL_FIELDS.get(dtype)
        vals = list(getattr(proto, field)) if field else []
        if dtype == "float16":
            vals = np.array(vals, dtype=np.uint16).view(np.float16).tolist()
        if n and not vals:
            vals = [0]
        vals = vals[:n] + [vals[-1]] * (n - len(vals)) if n else []  # TF repeats the last value
        return np.array(vals, dtype=_NP_DTYPES[dtype]).reshape(shape)
    except (ValueError, TypeError):
        return None


def attr_value(v):
    """An AttrValue -> a plain Python value (types as dtype names, shapes as tuples)."""
    which = v.WhichOneof("value")
    if which == "list":
        lv = v.list
        for field in ("s", "i", "f", "b", "type", "shape", "func", "tensor"):
            items = getattr(lv, field)
            if items:
                if field == "s":
                    return [x.decode("utf-8", "replace") for x in items]
                if field == "type":
                    return [dtype_name(x) for x in items]
                if field == "shape":
                    return [shape_of(x) for x in items]
                if field == "func":
                    return [x.name for x in items]
                if field == "tensor":
                    return [tensor_value(x) for x in items]
                return list(items)
        return []
    if which == "s":
        return v.s.decode("utf-8", "replace")
    if which == "type":
        return dtype_name(v.type)
    if which == "shape":
        return shape_of(v.shape)
    if which == "func":
        return v.func.name
    if which == "tensor":
        return tensor_value(v.tensor)
    if which is None:
        return None
    return getattr(v, which)


class _Resource:
    """A variable handle flowing through function calls; ``tensor`` is its value once read."""

    __slots__ = ("name", "dtype", "shape", "trainable", "tensor")

    def __init__(self, name: str, dtype: str = "float32", shape: tuple | None = None,
                 trainable: bool = True) -> None:
        self.name, self.dtype, self.shape, self.trainable = name, dtype, shape, trainable
        self.tensor: Tensor | None = None


def read_saved_model(path: str):
    """Parse ``path``/saved_model.pb or raise FuseError with one line."""
    pb = os.path.join(path, "saved_model.pb")
    if not os.path.isdir(path):
        raise FuseError(f"{path}: no such folder" if not os.path.exists(path) else f"{path}: not a folder")
    if not os.path.isfile(pb):
        raise FuseError(f"{path}: a folder without saved_model.pb is not a SavedModel")
    size = os.path.getsize(pb)  # checked before reading
    budgets.check("SAVED_MODEL_BYTES", size, f"{path}: saved_model.pb of {size:,} bytes")
    with open(pb, "rb") as f:
        data = f.read()
    if not data:
        raise FuseError(f"{path}: saved_model.pb is empty, not a SavedModel")
    sm = tf_proto.SavedModel()
    try:
        sm.ParseFromString(data)
    except (DecodeError, RuntimeWarning, ValueError) as e:
        first = error_text(e)
        raise FuseError(f"{path}: saved_model.pb is not a SavedModel (protobuf parse failed: {first})") \
            from None
    if not sm.meta_graphs:
        raise FuseError(f"{path}: saved_model.pb holds no meta graph, not a SavedModel")
    return sm


def pick_meta_graph(sm):
    """The meta graph tagged 'serve', else the first."""
    return next((m for m in sm.meta_graphs if "serve" in m.meta_info_def.tags), sm.meta_graphs[0])


def signature_names(meta) -> list[str]:
    return sorted(k for k in meta.signature_def if not k.startswith("__"))


def load_savedmodel(path: str, signature: str = "serving_default") -> Graph:
    """Read a TF2 SavedModel folder into a forward Graph of one signature's function."""
    path = os.path.normpath(path)
    meta = pick_meta_graph(read_saved_model(path))
    names = signature_names(meta)
    if signature not in meta.signature_def or signature.startswith("__"):
        available = ", ".join(names) if names else "none"
        raise FuseError(f"{path}: no signature {signature!r} (available: {available})")
    depth = budgets.limit("CALL_DEPTH")
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old_limit, 4 * depth + 1000))  # a level of calls is about 3 frames
    try:
        return _Loader(path, meta, signature).build()
    except RecursionError:
        raise FuseError(f"{path}: function calls nested too deeply to follow (FUSECLI_MAX_CALL_DEPTH "
                        f"{depth})") from None
    except (ValueError, KeyError, IndexError, TypeError) as e:  # a damaged or hand-edited function library
        raise FuseError(f"{path}: saved_model.pb is inconsistent, cannot follow its graph "
                        f"({type(e).__name__}: {' '.join(str(e).split())[:120]})") from None
    finally:
        sys.setrecursionlimit(old_limit)


def _name_ends(name: str):
    """``name``, then what follows each of its ``_`` in turn: longest first."""
    yield name
    for i, c in enumerate(name):
        if c == "_":
            yield name[i + 1:]


def _split_ref(ref: str) -> tuple[str, str | None, int]:
    """``node:out_arg:k`` -> (node, out_arg, k); ``node:k`` -> (node, None, k); ``name`` -> (name, None, 0)"""
    parts = ref.split(":")
    if len(parts) >= 3:
        if not parts[-1].isdigit():
            raise ValueError(f"bad tensor reference {ref!r}")
        return ":".join(parts[:-2]), parts[-2], int(parts[-1])
    if len(parts) == 2 and parts[1].isdigit():
        return parts[0], None, int(parts[1])
    return ref, None, 0


class _Loader:
    def __init__(self, path: str, meta, signature: str) -> None:
        self.path = path
        self.meta = meta
        self.signature = signature
        self.functions = {f.signature.name: f for f in meta.graph_def.library.function}
        self.opdefs = {op.name: op for op in meta.meta_info_def.stripped_op_list.op}
        self.defaults = {name: {a.name: a.default_value for a in op.attr if a.HasField("default_value")}
                         for name, op in self.opdefs.items()}
        self.nodes: list[Node] = []
        self.tensors: dict[str, Tensor] = {}
        self.node_names: set[str] = set()
        self.stack: list[str] = []
        self.resources: dict[str, _Resource] = {}  # graph-level variable handles by node name
        self.graph = Graph(os.path.basename(path) or path, fmt="savedmodel")
        self.registered = {g.registered_op_type: g.gradient_func  # tf.custom_gradient: op type -> function
                           for g in meta.graph_def.library.registered_gradients}
        self.custom_gradients: list[dict] = []
        self.structure: dict[str, tuple] = {}  # node name -> (its NodeDef, its inputs), for load.tf_flat

    def fail(self, why: str) -> FuseError:
        return FuseError(f"{self.path}: {why}")

    # -- the graph level: the signature -> its call node -> the signature function -----------------
    def build(self) -> Graph:
        sig = self.meta.signature_def[self.signature]
        gnodes = {n.name: n for n in self.meta.graph_def.node}
        if not self.functions:
            raise self.fail(f"{TF1_MESSAGE} (the meta graph has no function library)")
        inputs_by_node: dict[str, Tensor] = {}
        for key in sorted(sig.inputs):
            info = sig.inputs[key]
            t = self.new_tensor(key, dtype_name(info.dtype), shape_of(info.tensor_shape), "input")
            self.graph.inputs.append(t)
            inputs_by_node[_split_ref(info.name)[0]] = t
        calls: dict[str, object] = {}
        for key in sorted(sig.outputs):
            node_name = _split_ref(sig.outputs[key].name)[0]
            nd = gnodes.get(node_name)
            if nd is None:
                raise self.fail(f"signature {self.signature!r} output {key!r} names {node_name!r}, "
                                "which the graph lacks")
            if not self.is_call(nd):
                raise self.fail(f"{TF1_MESSAGE} (signature {self.signature!r} reads graph node "
                                f"{node_name!r}, a {nd.op}, not a function call)")
            calls[node_name] = nd
        results: dict[str, list] = {}
        for name, nd in calls.items():
            bound = self.bound_variables(nd)
            args = [self.graph_level_value(ref, gnodes, inputs_by_node, nd, bound.get(i))
                    for i, ref in enumerate(self.data_inputs(nd))]
            prefix = "" if len(calls) == 1 else f"{name}/"
            results[name] = self.inline(self.callee(nd), prefix, args)
        out_names: dict[str, str] = {}
        seen: set[str] = set()
        for key in sorted(sig.outputs):
            node_name, _, index = _split_ref(sig.outputs[key].name)
            outs = results[node_name]
            value = outs[index] if index < len(outs) else None
            if not isinstance(value, Tensor):
                raise self.fail(f"signature {self.signature!r} output {key!r} is not a tensor fusecli "
                                "can follow")
            out_names[key] = value.name
            if value.name not in seen:
                seen.add(value.name)
                self.graph.outputs.append(value)
        return self.finish(out_names)

    def graph_level_value(self, ref: str, gnodes: dict, inputs_by_node: dict, call, saved_variable):
        """A call node's argument at graph level: a signature input, a variable, or a captured constant."""
        name, _, index = _split_ref(ref)
        if name in inputs_by_node:
            return inputs_by_node[name]
        nd = gnodes.get(name)
        if nd is None:
            raise self.fail(f"graph node {call.name!r} reads {name!r}, which the graph lacks")
        if nd.op in ("VarHandleOp", "VariableV2"):
            return self.graph_variable(nd, saved_variable)
        attrs = nd.attr
        shapes = attrs["_output_shapes"].list.shape if "_output_shapes" in attrs else ()
        shape = shape_of(shapes[index]) if index < len(shapes) else None
        dtype = dtype_name(attrs["dtype"].type) if "dtype" in attrs else "float32"
        t = self.new_tensor(f"{name}:{index}", dtype, shape, "constant")
        if nd.op == "Const" and "value" in attrs:
            value = tensor_value(attrs["value"].tensor)
            if value is not None:
                t.meta["value"] = value
            if t.shape is None:
                t.shape = shape_of(attrs["value"].tensor.tensor_shape)
        t.meta["captured"] = nd.op
        return t

    def bound_variables(self, call) -> dict[int, object]:
        """Argument position of the call -> the SavedVariable the object graph binds to it."""
        og = self.meta.object_graph_def
        fn = self.callee(call)
        if fn not in og.concrete_functions:
            return {}
        bound = list(og.concrete_functions[fn].bound_inputs)  # the captures: the last arguments
        first = len(self.data_inputs(call)) - len(bound)
        return {first + k: og.nodes[i].variable for k, i in enumerate(bound)
                if i < len(og.nodes) and og.nodes[i].HasField("variable")}

    def graph_variable(self, nd, saved_variable) -> _Resource:
        """A variable handle node; its SavedVariable (if known) says if it is trainable."""
        res = self.resources.get(nd.name)
        if res is not None:
            return res
        attrs = nd.attr
        res = self.resources[nd.name] = _Resource(
            attrs["shared_name"].s.decode() if "shared_name" in attrs and attrs["shared_name"].s else nd.name,
            dtype_name(attrs["dtype"].type) if "dtype" in attrs else "float32",
            shape_of(attrs["shape"].shape) if "shape" in attrs else None)
        if saved_variable is not None:
            res.trainable = saved_variable.trainable
            res.name = saved_variable.name or res.name
            if res.shape is None:
                res.shape = shape_of(saved_variable.shape)
        return res

    # -- functions --------------------------------------------------------------------------------
    def is_call(self, nd) -> bool:
        return (nd.op in _CALL_OPS and "f" in nd.attr) or nd.op in self.functions

    def callee(self, nd) -> str:
        return nd.attr["f"].func.name if nd.op in _CALL_OPS else nd.op

    @staticmethod
    def data_inputs(nd) -> list[str]:
        return [r for r in nd.input if not r.startswith("^")]

    def inline(self, fname: str, prefix: str, args: list) -> list:
        """Emit the body of function ``fname`` with ``args`` bound; its return values, in order."""
        fdef = self.functions.get(fname)
        if fdef is None:
            raise self.fail(f"function {fname!r} is called but not in the library")
        if fname in self.stack:
            raise self.fail(f"function {fname!r} calls itself")
        # each level is a few Python frames: refused well before the interpreter's recursion limit
        budgets.check("CALL_DEPTH", len(self.stack) + 1, f"{self.path}: function {fname!r}")
        self.stack.append(fname)
        sig = fdef.signature
        env = {a.name: (args[i] if i < len(args) else None) for i, a in enumerate(sig.input_arg)}
        body = {n.name: n for n in fdef.node_def}
        rets = [fdef.ret[a.name] if a.name in fdef.ret else "" for a in sig.output_arg]
        outputs: dict[str, list] = {}
        layouts: dict[str, dict[str, int]] = {}

        def resolve(ref: str, reader: str):
            if not ref:
                return None
            name, arg, k = _split_ref(ref)
            if name not in body:
                if ref in env:
                    return env[ref]
                if name in env and k == 0 and arg is None:  # an argument is one value
                    return env[name]
                raise self.dangling(reader, fname, ref, "no node or argument of that name"
                                    if name not in env else f"argument {name!r} is one value")
            layout = layouts[name]
            if arg is not None and arg not in layout and layout:
                raise self.dangling(reader, fname, ref, f"{name!r} has no output {arg!r}")
            i = (layout.get(arg, 0) if arg is not None else 0) + k
            outs = outputs[name]
            if i >= len(outs):
                raise self.dangling(reader, fname, ref, f"{name!r} has {len(outs)} outputs")
            return outs[i]

        local: dict[str, str] | None = None
        for nd in self.order(body, rets):
            ins = [resolve(r, f"node {nd.name!r}") for r in self.data_inputs(nd)]
            layout, dtypes = self.layout(nd)
            layouts[nd.name] = layout
            outputs[nd.name] = self.emit(nd, prefix, ins, dtypes)
            if nd.op == "IdentityN" and "_gradient_op_type" in nd.attr:
                if local is None:  # the body's names as a gradient's arguments spell them, made once
                    local = {re.sub(r"\W", "_", n.lower()): n
                             for n in [*body, *(a.name for a in sig.input_arg)]}
                self.custom_gradient(nd, ins, resolve, local)
        self.stack.pop()
        return [resolve(r, "its return value") for r in rets]

    def dangling(self, reader: str, fname: str, ref: str, why: str) -> FuseError:
        return self.fail(f"{reader} of function {fname!r} reads {ref!r}, which does not exist ({why})")

    def custom_gradient(self, nd, ins: list, resolve, names: dict[str, str]) -> None:
        """Record a ``tf.custom_gradient``: ``IdentityN(results..., inputs...)`` whose
        ``_gradient_op_type`` names a registered gradient function. That function takes one gradient per
        IdentityN output, then the forward tensors it captured, each an argument named after its
        reader in the gradient and the captured node (``mul_<node name, '/' as '_'>``); it returns one
        gradient per input. What it captured is what TensorFlow's backward reads."""
        fdef = self.functions.get(self.registered.get(nd.attr["_gradient_op_type"].s.decode(), ""))
        n_inputs = len(fdef.signature.output_arg) if fdef is not None else 0
        if not 0 < n_inputs < len(ins) or not all(isinstance(v, Tensor) for v in ins):
            return
        reads = []
        for arg in fdef.signature.input_arg[len(ins):]:
            # the longest name that is the argument's name or its end after a '_'
            best = next((k for k in _name_ends(arg.name) if k in names), None)
            try:
                value = None if best is None else resolve(names[best], f"the custom gradient of {nd.name!r}")
            except FuseError:  # not a value of this function: leave the ops to their own rules
                value = None
            if not isinstance(value, Tensor):
                return  # a capture fusecli cannot name: leave the ops to their own rules
            reads.append(value.name)
        self.custom_gradients.append({"results": [t.name for t in ins[:-n_inputs]],
                                      "inputs": [t.name for t in ins[-n_inputs:]], "reads": reads,
                                      "gradient": fdef.signature.name})

    @staticmethod
    def order(body: dict, rets: list[str]) -> list:
        """The body nodes the returns depend on (data edges only), in dependency order."""
        order, state = [], {}
        for ref in rets:
            root = _split_ref(ref)[0] if ref else ""
            if root not in body or root in state:
                continue
            stack = [(root, False)]
            while stack:
                name, done = stack.pop()
                if done:
                    state[name] = 2
                    order.append(body[name])
                    continue
                if state.get(name):
                    continue
                state[name] = 1
                stack.append((name, True))
                for r in body[name].input:
                    if r.startswith("^"):
                        continue
                    dep = _split_ref(r)[0]
                    if dep in body and not state.get(dep):
                        stack.append((dep, False))
        return order

    def attr(self, nd, name: str):
        """A node attr, or its OpDef default (SavedModels strip attrs equal to the default)."""
        if name in nd.attr:
            return nd.attr[name]
        return self.defaults.get(nd.op, {}).get(name)

    def layout(self, nd) -> tuple[dict[str, int], list[str]]:
        """Output arg name -> flat offset, and the dtype of each flat output."""
        if self.is_call(nd):
            if nd.op in _CALL_OPS:
                tout = nd.attr["Tout"].list.type if "Tout" in nd.attr else []
                return {"output": 0}, [dtype_name(t) for t in tout]
            opdef = self.functions[nd.op].signature
        else:
            opdef = self.opdefs.get(nd.op)
        if opdef is None:  # not in the stripped op list: count outputs by their shapes
            n = len(nd.attr["_output_shapes"].list.shape) if "_output_shapes" in nd.attr else 1
            budgets.check("OUTPUTS", n, f"{self.path}: node {nd.name!r} ({nd.op}) claims {n:,} outputs")
            t = self.attr(nd, "T") or self.attr(nd, "dtype")
            return {}, [dtype_name(t.type) if t is not None else "float32"] * n
        layout, dtypes = {}, []
        for arg in opdef.output_arg:
            layout[arg.name] = len(dtypes)
            if arg.type_list_attr:
                a = self.attr(nd, arg.type_list_attr)
                dtypes += [dtype_name(x) for x in a.list.type] if a is not None else []
                budgets.check("OUTPUTS", len(dtypes), f"{self.path}: node {nd.name!r} ({nd.op}) claims "
                              f"{len(dtypes):,} outputs ({arg.type_list_attr})")
                continue
            if arg.type:
                dt = dtype_name(arg.type)
            else:
                a = self.attr(nd, arg.type_attr)
                dt = dtype_name(a.type) if a is not None else "float32"
            n = 1
            if arg.number_attr:
                a = self.attr(nd, arg.number_attr)
                n = a.i if a is not None else 1
                budgets.check("OUTPUTS", len(dtypes) + n, f"{self.path}: node {nd.name!r} ({nd.op}) "
                              f"claims {n:,} outputs ({arg.number_attr})")
            dtypes += [dt] * n
        shapes = nd.attr["_output_shapes"].list.shape if "_output_shapes" in nd.attr else None
        if shapes is not None and len(shapes) != len(dtypes):  # what TensorFlow traced says it made
            raise self.fail(f"node {nd.name!r} ({nd.op}) claims {len(dtypes):,} outputs but its "
                            f"_output_shapes lists {len(shapes):,}")
        return layout, dtypes

    # -- nodes ------------------------------------------------------------------------------------
    def emit(self, nd, prefix: str, ins: list, dtypes: list[str]) -> list:
        """The values a body node makes: inlined calls, variable reads, or one IR node."""
        op = nd.op
        if self.is_call(nd):
            return self.inline(self.callee(nd), f"{prefix}{nd.name}/", ins)
        if op == "ReadVariableOp" and ins and isinstance(ins[0], _Resource):
            return [self.read(ins[0], f"{prefix}{nd.name}:0", self.shapes(nd))]
        if op == "IdentityN" or (op == "Identity" and ins and isinstance(ins[0], _Resource)):
            return list(ins)  # variable handles, or several values, passed on unchanged
        if op in ("VarHandleOp", "VariableV2"):
            a = nd.attr
            dtype = dtype_name(a["dtype"].type) if "dtype" in a else "float32"
            shape = shape_of(a["shape"].shape) if "shape" in a else None
            return [_Resource(f"{prefix}{nd.name}", dtype, shape)]
        if op == "NoOp" or (not dtypes and op != "Const"):
            return []
        name = self.unique(f"{prefix}{nd.name}")
        self.structure[name] = (nd, [self.reference(v) for v in ins])
        if op == "ResourceGather" and ins and isinstance(ins[0], _Resource):
            ins = [self.read(ins[0], f"{name}/ReadVariableOp:0", None), *ins[1:]]
        tensor_ins = [self.as_tensor(v, f"{name}/resource:0") for v in ins]
        if op == "Split" and len(tensor_ins) == 2:
            tensor_ins = [tensor_ins[1], tensor_ins[0]]  # (axis, value) -> (value, axis), as 'split' reads
        shapes = self.shapes(nd)
        outs = [self.new_tensor(f"{name}:{i}", dt, shapes[i] if i < len(shapes) else None, "activation")
                for i, dt in enumerate(dtypes)]
        attrs = {k: attr_value(v) for k, v in nd.attr.items() if not k.startswith("_")}
        for k, v in self.defaults.get(op, {}).items():
            attrs.setdefault(k, attr_value(v))
        node = Node(name, op, TF_KINDS.get(op, "unknown"), tensor_ins, outs, attrs)
        if op == "Const":
            node.meta["constant"] = True
            outs[0].kind = "constant"
            proto = nd.attr["value"].tensor if "value" in nd.attr else None
            if proto is not None:
                value = tensor_value(proto)
                if value is not None:
                    outs[0].meta["value"] = value
                if outs[0].shape is None:
                    outs[0].shape = shape_of(proto.tensor_shape)
        elif node.kind == "batch_norm":
            node.meta["stats"] = ("y3", "y4", "y5") if attrs.get("is_training", True) else ("x3", "x4", "y5")
        elif any(k in attrs for k in ("f", "then_branch", "body", "branches")):
            node.kind = "unknown"  # control flow and other function-valued ops: not inlined
        self.nodes.append(node)
        return outs

    @staticmethod
    def reference(v):
        """An input as the flat GraphDef takes it (``load.tf_flat``): a tensor's name, a variable handle's
        (name, dtype, shape), or None."""
        if isinstance(v, _Resource):
            return (v.name, v.dtype, v.shape)
        return v.name if isinstance(v, Tensor) else None

    def shapes(self, nd) -> list:
        if "_output_shapes" not in nd.attr:
            return []
        return [shape_of(s) for s in nd.attr["_output_shapes"].list.shape]

    def read(self, res: _Resource, name: str, shapes) -> Tensor:
        """The value of a variable: one tensor per variable, named after its first read."""
        if res.tensor is None:
            shape = res.shape if res.shape is not None else (shapes[0] if shapes else None)
            t = self.new_tensor(name, res.dtype, shape, "parameter" if res.trainable else "constant")
            t.meta["variable"] = res.name
            t.meta["trainable"] = res.trainable
            res.tensor = t
        return res.tensor

    def as_tensor(self, v, name: str) -> Tensor | None:
        if isinstance(v, _Resource):  # a handle read by another op: stands for the variable's value
            return self.read(v, name, None)
        return v

    def unique(self, base: str) -> str:
        name = unique_name(base, self.node_names)
        self.node_names.add(name)
        return name

    def new_tensor(self, name: str, dtype: str, shape, kind: str) -> Tensor:
        name = unique_name(name, self.tensors)
        t = self.tensors[name] = Tensor(name, dtype, shape, kind)
        return t

    # -- the graph --------------------------------------------------------------------------------
    def finish(self, out_names: dict[str, str]) -> Graph:
        graph = self.graph
        needed = self.prune()
        used: set[str] = {t.name for t in graph.inputs} | {t.name for t in graph.outputs}
        for n in needed:
            used.update(t.name for t in (*n.inputs, *n.outputs) if t is not None)
        graph.tensors = {name: t for name, t in self.tensors.items() if name in used}
        for n in needed:
            graph.add_node(n)
        graph.meta["custom_gradients"] = self.custom_gradients
        graph.meta["tf_structure"] = (self.structure, self.meta.graph_def.library)
        graph.meta.update(signature=self.signature, signatures=signature_names(self.meta),
                          output_names=out_names,
                          tensorflow_version=self.meta.meta_info_def.tensorflow_version)
        mark_constant_subgraphs(graph)
        # AddV2 adding a bias keeps AddV2's gradient: TensorFlow takes both shapes unless they are static
        refine_bias_adds(graph, lambda x: None, grad_kind="add")
        return graph

    def prune(self) -> list[Node]:
        """Nodes the graph outputs depend on, in emission (topological) order."""
        live: set[int] = set()
        producer = {id(t): n for n in self.nodes for t in n.outputs if t is not None}
        stack = [producer.get(id(t)) for t in self.graph.outputs]
        while stack:
            n = stack.pop()
            if n is None or id(n) in live:
                continue
            live.add(id(n))
            stack.extend(producer.get(id(t)) for t in n.inputs if t is not None)
        return [n for n in self.nodes if id(n) in live]


"""A SavedModel's forward graph as one flat GraphDef, its inputs bound to numbers, for TensorFlow's tools.

The SavedModel loader inlines every function call; it keeps, per IR node, the NodeDef it came from and
its inputs (``graph.meta["tf_structure"]``). Here each IR node becomes that NodeDef again (renamed
``n<k>``: IR names need not be TensorFlow names), reading the IR tensors it reads; a tensor without a
producer (a graph input, a variable's value, a captured constant) becomes a ``Placeholder`` of its
dtype and its shape at the given dim values (a ``Const`` where its value is known), and a variable handle
a ``VarHandleOp``. Internal attrs (``_`` first) are dropped: ``_output_shapes``, what TensorFlow recorded
at trace time (-1 for every dynamic dim), so that TensorFlow infers every shape afresh, and ``_class``,
colocation with nodes by their old names. No TensorFlow import: the GraphDef is built with ``tf_proto``'s
messages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..core.dims import dim_value
from ..core.ir import Graph, Node
from . import tf_proto
from .savedmodel import dtype_enum


def flat_graphdef(graph: Graph, values: Mapping[str, int],
                  nodes: Sequence[Node] | None = None) -> tuple[bytes, dict[str, tuple[str, int]]]:
    """The serialized GraphDef of ``graph`` (of its ``nodes`` only, when given: what they read from
    other nodes becomes placeholders too) with every producer-less tensor's dims evaluated at ``values``
    (-1 where a dim has no value), and IR tensor name -> (GraphDef node name, output index) for every
    output of an IR node."""
    nodes = graph.nodes if nodes is None else nodes
    structure, library = graph.meta["tf_structure"]
    gd = tf_proto.message_class("GraphDef")()
    refs: dict[str, str] = {}
    where: dict[str, tuple[str, int]] = {}
    handles: dict[str, str] = {}
    needs_library = False

    def ref(x) -> str:
        if x is None:
            raise ValueError("a node reads a value the loader could not follow")
        if isinstance(x, tuple):  # a variable handle: (name, dtype, shape)
            name, dtype, shape = x
            if name not in handles:
                handles[name] = f"v{len(handles)}"
                node = gd.node.add(name=handles[name], op="VarHandleOp")
                node.attr["dtype"].type = dtype_enum(dtype)
                _set_shape(node.attr["shape"].shape, shape, values)
                node.attr["shared_name"].s = handles[name].encode()
            return handles[name]
        if x not in refs:
            t = graph.tensors[x]
            refs[x] = f"p{len(refs)}"
            value = t.meta.get("value")
            if isinstance(value, np.ndarray) and value.dtype != object:  # a captured constant's value
                node = gd.node.add(name=refs[x], op="Const")
                node.attr["dtype"].type = dtype_enum(t.dtype)
                proto = node.attr["value"].tensor
                proto.dtype = dtype_enum(t.dtype)
                _set_shape(proto.tensor_shape, value.shape, {})
                proto.tensor_content = value.astype(value.dtype.newbyteorder("<")).tobytes()  # little-endian
                return refs[x]
            node = gd.node.add(name=refs[x], op="Placeholder")
            node.attr["dtype"].type = dtype_enum(t.dtype)
            _set_shape(node.attr["shape"].shape, t.shape, values)
        return refs[x]

    for k, n in enumerate(nodes):
        for i, t in enumerate(n.outputs):
            if t is not None:
                refs[t.name] = f"n{k}:{i}"
                where[t.name] = (f"n{k}", i)
    for k, n in enumerate(nodes):
        nd, inputs = structure[n.name]
        node = gd.node.add(name=f"n{k}", op=nd.op)
        for key, value in nd.attr.items():
            if not key.startswith("_"):  # internal attrs: trace-time shapes, colocation with renamed nodes
                node.attr[key].CopyFrom(value)
                needs_library |= value.HasField("func") or bool(value.list.func)
        node.input.extend(ref(x) for x in inputs)
    if needs_library:  # control flow left as ops (If, While): the functions they name must resolve
        gd.library.CopyFrom(library)
    return gd.SerializeToString(), where


def _set_shape(proto, shape, values: Mapping[str, int]) -> None:
    """A TensorShapeProto of ``shape`` at ``values`` (unknown rank when ``shape`` is None)."""
    if shape is None:
        proto.unknown_rank = True
        return
    for d in shape:
        v = dim_value(d, values)
        proto.dim.add(size=-1 if v is None else v)

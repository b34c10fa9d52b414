"""ModelProto copies that leave the weights out (for analysis passes and for writing past 2 GB)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from ...load.bound_fit import set_field
from ...load.onnx import SMALL_VALUE_ELEMENTS


def copy_with_initializers(model: onnx.ModelProto,
                           initializer: Callable[[onnx.TensorProto], onnx.TensorProto],
                           node: Callable[[onnx.NodeProto], onnx.NodeProto] | None = None) -> onnx.ModelProto:
    """A copy of ``model`` whose initializers are ``initializer(t)`` (no copy of the weights themselves)
    and, with ``node``, whose main-graph nodes are ``node(n)``."""
    out = onnx.ModelProto()
    for fd, value in model.ListFields():
        if fd.name == "graph":
            continue
        set_field(out, fd, value)
    for fd, value in model.graph.ListFields():
        if fd.name == "node" and node is not None:
            out.graph.node.extend(node(n) for n in value)
        elif fd.name != "initializer":
            set_field(out.graph, fd, value)
    out.graph.initializer.extend(initializer(t) for t in model.graph.initializer)
    return out


_DATA = ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")
_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
           onnx.TensorProto.BFLOAT16)


def stub(t: onnx.TensorProto) -> onnx.TensorProto:
    """Name, type and dims only (marked external, so nothing tries to read it) for big float tensors."""
    n = int(np.prod(t.dims, dtype=np.int64))
    is_float = t.data_type in _FLOATS
    if n <= SMALL_VALUE_ELEMENTS or not is_float:
        return t
    s = onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims,
                         data_location=onnx.TensorProto.EXTERNAL)
    s.external_data.add(key="location", value="__weights_left_out__")
    return s


def _numel(t: onnx.TensorProto) -> int:
    return int(np.prod(t.dims, dtype=np.int64))


def is_big_constant(node: onnx.NodeProto) -> bool:
    """A Constant node whose ``value`` is a weight: a float tensor past SMALL_VALUE_ELEMENTS, or any
    tensor whose payload is left in the file (external data) or out (light_constant)."""
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attribute) != 1:
        return False
    a = node.attribute[0]
    if a.name != "value" or not a.HasField("t"):
        return False
    t = a.t
    n = _numel(t)
    if t.data_location == onnx.TensorProto.EXTERNAL or (t.data_type in _FLOATS and n > SMALL_VALUE_ELEMENTS):
        return True
    return n > 0 and not any(t.HasField(f) if f == "raw_data" else len(getattr(t, f)) for f in _DATA)


def light_constant(node: onnx.NodeProto) -> onnx.NodeProto:
    """A weight-holding Constant node as name, type and dims only (as fusecli's reader leaves it)."""
    if not is_big_constant(node):
        return node
    t = node.attribute[0].t
    value = onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims)
    out = onnx.NodeProto(op_type=node.op_type, domain=node.domain, name=node.name, output=node.output)
    out.attribute.add(name="value", type=onnx.AttributeProto.TENSOR).t.CopyFrom(value)
    return out


def light_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with big float weights stubbed (initializers and Constant nodes): what shape
    inference and the IR loader need."""
    return copy_with_initializers(model, stub, light_constant)

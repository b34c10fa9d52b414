"""ModelProto copies that leave the weights out (for analysis passes and for writing past 2 GB)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from ..load.onnx import SMALL_VALUE_ELEMENTS


def copy_with_initializers(model: onnx.ModelProto,
                           initializer: Callable[[onnx.TensorProto], onnx.TensorProto]) -> onnx.ModelProto:
    """A copy of ``model`` whose initializers are ``initializer(t)`` (no copy of the weights themselves)."""
    out = onnx.ModelProto()
    for fd, value in model.ListFields():
        if fd.name == "graph":
            continue
        _set(out, fd, value)
    for fd, value in model.graph.ListFields():
        if fd.name != "initializer":
            _set(out.graph, fd, value)
    out.graph.initializer.extend(initializer(t) for t in model.graph.initializer)
    return out


def _set(msg, fd, value) -> None:
    if fd.is_repeated:
        getattr(msg, fd.name).extend(value)
    elif fd.message_type is not None:
        getattr(msg, fd.name).CopyFrom(value)
    else:
        setattr(msg, fd.name, value)


def stub(t: onnx.TensorProto) -> onnx.TensorProto:
    """Name, type and dims only (marked external, so nothing tries to read it) for big float tensors."""
    n = int(np.prod(t.dims, dtype=np.int64))
    is_float = t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                               onnx.TensorProto.BFLOAT16)
    if n <= SMALL_VALUE_ELEMENTS or not is_float:
        return t
    s = onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims,
                         data_location=onnx.TensorProto.EXTERNAL)
    s.external_data.add(key="location", value="__weights_left_out__")
    return s


def light_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with big float weights stubbed: what shape inference and the IR loader need."""
    return copy_with_initializers(model, stub)

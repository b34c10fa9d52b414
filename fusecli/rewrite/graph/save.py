"""Writing the rewritten model atomically; weights over 2 GB go to ``<OUT>.data`` beside it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import onnx

from ...core.output import PART_PREFIX, atomic_write, os_error, refuse_overwriting_input
from ...load.onnx import tensors_of
from .proto import copy_with_initializers
from .values import tensor_array

PROTOBUF_LIMIT = 2 * 1024**3  # a ModelProto cannot be serialized past 2 GB
EXTERNAL_THRESHOLD = 1024  # tensors of at least this many bytes go to the data file
Check = Callable[[str, str], None]  # (written part, its final path): raises to refuse it


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of all initializer data (raw or typed fields; external data counts its length)."""
    return sum(tensor_bytes(t) for t in model.graph.initializer)


def payload_bytes(model: onnx.ModelProto) -> int:
    """Bytes of every tensor the model holds: initializers, Constant nodes, subgraphs, functions."""
    return sum(tensor_bytes(t) for _, t in tensors_of(model))


def tensor_bytes(t: onnx.TensorProto) -> int:
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return int(next((e.value for e in t.external_data if e.key == "length"), 0) or 0)
    if t.raw_data:
        return len(t.raw_data)
    # the typed fields hold what is there (a tensor's dims may claim more)
    return 8 * max(len(t.float_data), len(t.int32_data), len(t.int64_data), len(t.double_data),
                   len(t.uint64_data)) + sum(len(s) for s in t.string_data)


def needs_external_data(model: onnx.ModelProto) -> bool:
    return weight_bytes(model) + (64 << 20) >= PROTOBUF_LIMIT  # headroom for the graph itself


def data_path(out: str) -> str:
    return out + ".data"


def write_model(model: onnx.ModelProto, out: str, protected: list[str] = (),
                check: Check | None = None) -> str | None:
    """Write ``model`` to ``out`` (never onto a protected file); the data file's path when one is written.

    Past 2 GB the tensors of at least 1 KiB are streamed to ``<OUT>.data`` (``location`` relative to the
    output's folder) and the written proto refers to them; ``model`` itself is left as it is. ``check``
    (``atomic_write``'s) reads the written model before it replaces ``out``; when it refuses, ``out`` and
    a data file that was there are as they were.
    """
    refuse_overwriting_input(out, list(protected))
    if not needs_external_data(model):
        data = model.SerializeToString()
        with atomic_write(out, check=check) as f:
            f.write(data)
        return None
    data_file = data_path(out)
    refuse_overwriting_input(data_file, list(protected))
    earlier = _set_aside(data_file)
    try:
        light = _write_data(model, data_file)
        with atomic_write(out, check=check) as f:
            f.write(light.SerializeToString())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(data_file)
        if earlier is not None:
            with contextlib.suppress(OSError):
                os.replace(earlier, data_file)
        raise
    if earlier is not None:
        with contextlib.suppress(OSError):
            os.unlink(earlier)
    return data_file


def _set_aside(path: str) -> str | None:
    """Move an existing ``path`` to a part name beside it (put back if the write fails); its new name."""
    if not os.path.exists(path):
        return None
    folder = os.path.dirname(os.path.abspath(path))
    aside = os.path.join(folder, f"{PART_PREFIX}{os.getpid()}-{os.path.basename(path)}.earlier.part")
    try:
        os.replace(path, aside)
    except OSError as e:
        raise os_error(path, e) from None
    return aside


def _write_data(model: onnx.ModelProto, data_file: str) -> onnx.ModelProto:
    """Stream the tensors of at least 1 KiB to ``data_file``; the model referring to them there."""
    location = os.path.basename(data_file)
    with atomic_write(data_file) as f:

        def external(t: onnx.TensorProto) -> onnx.TensorProto:
            if t.data_location == onnx.TensorProto.EXTERNAL or t.data_type == onnx.TensorProto.STRING:
                return t
            raw = t.raw_data if t.HasField("raw_data") else tensor_array(t).tobytes()
            if len(raw) < EXTERNAL_THRESHOLD:
                return t
            offset = f.tell()
            f.write(raw)
            ref = onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims,
                                   data_location=onnx.TensorProto.EXTERNAL)
            for key, value in (("location", location), ("offset", offset), ("length", len(raw))):
                ref.external_data.add(key=key, value=str(value))
            return ref

        return copy_with_initializers(model, external)

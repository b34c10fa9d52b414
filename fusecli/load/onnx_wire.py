"""Read an ONNX file's structure without its weights: large initializer payloads skipped at the wire level.

The file is memory-mapped; ModelProto.graph (field 7) is re-encoded with each large initializer's
data fields (float_data, int32_data, string_data, int64_data, raw_data, double_data, uint64_data) left
out, and the slim bytes are parsed with onnx's own messages. Names, dtypes, dims and small constants
(Reshape shapes, Clip bounds: what shape inference and the patterns need) are kept.
"""

from __future__ import annotations

import mmap

import onnx

KEEP_BYTES = 4096  # payloads up to this size are kept (shape constants, scalars)
_MODEL_GRAPH, _GRAPH_INITIALIZER = 7, 5
_TENSOR_DATA_FIELDS = frozenset({4, 5, 6, 7, 9, 10, 11})


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def _varint(buf, pos: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _fields(buf, start: int, end: int):
    """(field number, wire type, field start, value start, value end) for each field in buf[start:end]."""
    pos = start
    while pos < end:
        key, vpos = _varint(buf, pos)
        number, wtype = key >> 3, key & 7
        if wtype == 0:
            _, vend = _varint(buf, vpos)
        elif wtype == 1:
            vend = vpos + 8
        elif wtype == 2:
            length, vpos = _varint(buf, vpos)
            vend = vpos + length
        elif wtype == 5:
            vend = vpos + 4
        else:
            raise WireError(f"unsupported wire type {wtype}")
        if vend > end:
            raise WireError("field runs past the end of its message")
        yield number, wtype, pos, vpos, vend
        pos = vend


def _slim_tensor(buf, start: int, end: int) -> bytes:
    """A TensorProto without its data fields when they are larger than KEEP_BYTES."""
    fields = list(_fields(buf, start, end))
    data = sum(vend - vpos for n, _, _, vpos, vend in fields if n in _TENSOR_DATA_FIELDS)
    if data <= KEEP_BYTES:
        return bytes(buf[start:end])
    return b"".join(bytes(buf[f:vend]) for n, _, f, _, vend in fields if n not in _TENSOR_DATA_FIELDS)


def _slim_graph(buf, start: int, end: int) -> tuple[bytes, set[int]]:
    parts, slimmed = [], set()
    for i, (number, wtype, fstart, vpos, vend) in enumerate(_fields(buf, start, end)):
        if number == _GRAPH_INITIALIZER and wtype == 2:
            tensor = _slim_tensor(buf, vpos, vend)
            if len(tensor) != vend - vpos:
                slimmed.add(i)
            parts.append(bytes(buf[fstart:vpos - len(_encode_varint(vend - vpos))]))
            parts.append(_encode_varint(len(tensor)))
            parts.append(tensor)
        else:
            parts.append(bytes(buf[fstart:vend]))
    return b"".join(parts), slimmed


def read_structure(path: str) -> tuple[onnx.ModelProto, set[str]]:
    """The model without large weight payloads, and the names of the initializers left without data."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        parts = []
        for number, wtype, fstart, vpos, vend in _fields(buf, 0, len(buf)):
            if number == _MODEL_GRAPH and wtype == 2:
                graph, _ = _slim_graph(buf, vpos, vend)
                parts += [_encode_varint((_MODEL_GRAPH << 3) | 2), _encode_varint(len(graph)), graph]
            else:
                parts.append(bytes(buf[fstart:vend]))
    model = onnx.ModelProto()
    model.ParseFromString(b"".join(parts))
    omitted = {t.name for t in model.graph.initializer
               if t.data_location != onnx.TensorProto.EXTERNAL and not _has_data(t)
               and _numel(t) > 0}
    return model, omitted


def _numel(t: onnx.TensorProto) -> int:
    n = 1
    for d in t.dims:
        n *= d
    return n


def _has_data(t: onnx.TensorProto) -> bool:
    return bool(t.raw_data or t.float_data or t.int32_data or t.int64_data or t.double_data
                or t.uint64_data or t.string_data)

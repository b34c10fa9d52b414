"""Read an ONNX file's structure without its weights: large tensor payloads skipped at the wire level.

The file is read through a small window with os.pread, so skipped payloads are never read (nor mapped
into the process). Every TensorProto that holds weights (initializers, sparse initializers, and the
``value`` / ``sparse_value`` / tensor attributes of nodes such as ``Constant``, in the main graph, in
subgraphs, in local functions and training graphs) is re-encoded with its large data fields (float_data,
int32_data, string_data, int64_data, raw_data, double_data, uint64_data) left out; messages no larger
than KEEP_BYTES cannot hold such a payload and are copied as they are, unparsed. The slim bytes are
parsed with onnx's own messages. Names, dtypes, dims and small constants (Reshape shapes, Clip bounds,
a norm's eps: what shape inference and the patterns need) are kept.
"""

from __future__ import annotations

import math
import os

import onnx

KEEP_BYTES = 4096  # payloads up to this size are kept (shape constants, scalars)
_MODEL_GRAPH = 7
_TENSOR_DATA_FIELDS = frozenset({4, 5, 6, 7, 9, 10, 11})
_RAW_DATA = 9


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""


WINDOW = 1 << 14  # bytes read at a time (a tensor's header, a run of nodes); skipped payloads are never read


class _Source:
    """A file read on demand through a small window (os.pread): bytes that are skipped are never read.

    Unlike a memory map, nothing of the skipped payloads is mapped into the process (a kernel that maps
    whole large folios on each fault would otherwise count hundreds of MiB of weights in its RSS).
    """

    def __init__(self, f) -> None:
        self.fd = f.fileno()
        self.size = os.fstat(self.fd).st_size
        self.base = 0
        self.buf = b""

    def __len__(self) -> int:
        return self.size

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end) (fewer at the end of the file)."""
        base = self.base
        if base <= start and end <= base + len(self.buf):
            return self.buf[start - base:end - base]
        if end - start >= WINDOW:
            return os.pread(self.fd, end - start, start)
        self.buf, self.base = os.pread(self.fd, WINDOW, start), start
        return self.buf[:end - start]


def _varint_at(data: bytes, i: int) -> tuple[int, int]:
    """The varint at ``data[i:]`` (10 bytes at most) and the index after it."""
    result, shift = 0, 0
    for j in range(i, min(i + 10, len(data))):
        b = data[j]
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, j + 1
        shift += 7
    raise WireError("varint too long" if len(data) - i >= 10 else "truncated varint")


def encode_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


CHUNK = WINDOW // 2  # bytes of field headers decoded from one read (runs of small messages)


def wire_fields(src: _Source, start: int, end: int):
    """(field number, wire type, field start, value start, value end) for each field in [start, end)."""
    pos = start
    base, buf = start, b""  # bytes [base, base + len(buf)) of the file, read a chunk at a time
    while pos < end:
        i = pos - base
        if i + 20 > len(buf):  # the key and a varint value or length (10 bytes each at most) may not fit
            base, buf, i = pos, src.read(pos, pos + CHUNK), 0
        if i < len(buf) and buf[i] < 0x80:  # one-byte varints (small field numbers, short lengths) inline
            key, i = buf[i], i + 1
        else:
            key, i = _varint_at(buf, i)
        number, wtype = key >> 3, key & 7
        if wtype == 2:
            if i < len(buf) and buf[i] < 0x80:
                length, i = buf[i], i + 1
            else:
                length, i = _varint_at(buf, i)
            vpos = base + i
            vend = vpos + length
        else:
            vpos = base + i
            if wtype == 0:
                vend = base + _varint_at(buf, i)[1]
            elif wtype == 1:
                vend = vpos + 8
            elif wtype == 5:
                vend = vpos + 4
            else:
                raise WireError(f"unsupported wire type {wtype}")
        if vend > end:
            raise WireError("field runs past the end of its message")
        yield number, wtype, pos, vpos, vend
        pos = vend


def _slim_tensor(src: _Source, start: int, end: int, external: str | None = None) -> list[bytes] | None:
    """A TensorProto without its data fields when they are larger than KEEP_BYTES, else None (keep it).

    With ``external`` (the file's name), a payload held in raw_data becomes a reference to its own
    bytes in the file (ONNX external data: location, offset, length), to be read when needed; other
    payloads are kept."""
    if end - start <= KEEP_BYTES:
        return None  # its data fields cannot be larger than the whole message
    fields = list(wire_fields(src, start, end))
    data = [(n, vpos, vend) for n, _, _, vpos, vend in fields if n in _TENSOR_DATA_FIELDS]
    if sum(vend - vpos for _, vpos, vend in data) <= KEEP_BYTES:
        return None
    kept = [src.read(f, vend) for n, _, f, _, vend in fields if n not in _TENSOR_DATA_FIELDS]
    if external is None:
        return kept
    if len(data) != 1 or data[0][0] != _RAW_DATA or any(n in (13, 14) for n, *_ in fields):
        return None
    _, vpos, vend = data[0]
    for key, value in (("location", external), ("offset", str(vpos)), ("length", str(vend - vpos))):
        entry = _string_field(1, key) + _string_field(2, value)
        kept.append(encode_varint((13 << 3) | 2) + encode_varint(len(entry)) + entry)  # external_data
    kept.append(encode_varint(14 << 3) + encode_varint(1))  # data_location = EXTERNAL
    return kept


def _string_field(number: int, text: str) -> bytes:
    data = text.encode()
    return encode_varint((number << 3) | 2) + encode_varint(len(data)) + data


# Where weights live: message -> {field number: the message that field holds}
TENSOR, SPARSE, GRAPH, FUNCTION, NODE, ATTRIBUTE, TRAINING = range(7)
CHILDREN = {
    SPARSE: {1: TENSOR, 2: TENSOR},  # values, indices
    GRAPH: {1: NODE, 5: TENSOR, 15: SPARSE},  # node, initializer, sparse_initializer
    FUNCTION: {7: NODE, 11: ATTRIBUTE},  # node, attribute_proto (default values)
    NODE: {5: ATTRIBUTE},
    # t, g, tensors, graphs, sparse_tensor, sparse_tensors
    ATTRIBUTE: {5: TENSOR, 6: GRAPH, 10: TENSOR, 11: GRAPH, 22: SPARSE, 23: SPARSE},
    TRAINING: {1: GRAPH, 2: GRAPH},  # initialization, algorithm
}
MODEL_CHILDREN = {_MODEL_GRAPH: GRAPH, 20: TRAINING, 25: FUNCTION}  # graph, training_info, functions
MAX_DEPTH = 64  # nested messages (subgraphs in subgraphs); protobuf itself refuses past 100


def _slim(src: _Source, start: int, end: int, kind: int, depth: int = 0,
          external: str | None = None) -> list[bytes] | None:
    """A message's bytes with large tensor payloads cut out (unchanged runs copied as one), or None
    when nothing in it changes. Messages no larger than KEEP_BYTES are not even parsed."""
    if kind == TENSOR:
        return _slim_tensor(src, start, end, external)
    if end - start <= KEEP_BYTES or (kind == SPARSE and external is not None):
        return None  # (sparse tensors cannot refer to external data: kept whole when asked for that)
    if depth > MAX_DEPTH:
        raise WireError(f"messages nested more than {MAX_DEPTH} deep")
    return _rewrite_fields(src, start, end, CHILDREN[kind], depth, external)


def _rewrite_fields(src: _Source, start: int, end: int, children: dict[int, int],
                    depth: int, external: str | None = None) -> list[bytes] | None:
    parts: list[bytes] = []
    run = start  # start of the run of fields kept as they are
    for number, wtype, fstart, vpos, vend in wire_fields(src, start, end):
        child = children.get(number)
        if child is None or wtype != 2 or vend - vpos <= KEEP_BYTES:
            continue  # (_slim keeps messages no larger than KEEP_BYTES: not even a call for each)
        inner = _slim(src, vpos, vend, child, depth + 1, external)
        if inner is None:
            continue
        if fstart > run:
            parts.append(src.read(run, fstart))
        parts += [encode_varint((number << 3) | 2), encode_varint(sum(len(p) for p in inner)), *inner]
        run = vend
    if not parts:
        return None
    if end > run:
        parts.append(src.read(run, end))
    return parts


def read_structure(path: str, external: bool = False) -> tuple[onnx.ModelProto, set[str]]:
    """The model without large weight payloads, and the names of the main graph's initializers and
    Constant node outputs left without data. ``external``: payloads in raw_data become ONNX external
    data references to the file itself (read later, only where needed, e.g. by
    ``onnx.numpy_helper.to_array(t, base_dir)``); the set is then empty."""
    location = os.path.basename(path) if external else None
    with open(path, "rb") as f:
        src = _Source(f)
        parts = _rewrite_fields(src, 0, len(src), MODEL_CHILDREN, 0, location) or [src.read(0, len(src))]
    model = onnx.ModelProto()
    model.ParseFromString(b"".join(parts))
    omitted = {t.name for t in model.graph.initializer if payload_left_out(t)}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.output:
            for a in node.attribute:
                if (a.name == "value" and payload_left_out(a.t)) or \
                        (a.name == "sparse_value" and payload_left_out(a.sparse_tensor.values)):
                    omitted.add(node.output[0])
    return model, omitted


def payload_left_out(t: onnx.TensorProto) -> bool:
    """Whether ``t`` has elements but no data, and no external data either: its payload was skipped when
    the structure was read (one function: it is asked once per initializer)."""
    if t.raw_data or t.float_data or t.int32_data or t.int64_data or t.double_data or t.uint64_data \
            or t.string_data:
        return False
    return t.data_location != onnx.TensorProto.EXTERNAL and math.prod(t.dims) > 0

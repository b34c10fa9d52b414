"""Writing a model whose payloads are still in files, copying them file to file (never through Python).

``load_weights`` leaves large payloads where they are: each such TensorProto is an external-data
reference (location, offset, length) to the model file itself, or to the model's own external data
files. ``write_spliced`` serializes the (small) model, then re-encodes, at the protobuf wire level,
every referring TensorProto as the same tensor with its ``raw_data`` inline, the bytes copied from
their file by ``os.copy_file_range`` (kernel to kernel) straight into the output. The written file is
self-contained, as ``onnx.save`` of the fully loaded model would write it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import onnx

from ...core.errors import FuseError
from ...core.output import atomic_write, refuse_overwriting_input
from ...load.onnx_wire import CHILDREN, MODEL_CHILDREN, SPARSE, TENSOR, encode_varint, wire_fields

Part = bytes | tuple[str, int, int]  # bytes to write, or (file, offset, length) to copy
_MARK = b"\x0a\x08location"  # StringStringEntryProto key "location": in every external reference
_RAW_DATA, _EXTERNAL_DATA, _DATA_LOCATION = 9, 13, 14


class _Bytes:
    """In-memory bytes with the ``read(start, end)`` the wire walker uses."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def read(self, start: int, end: int) -> bytes:
        return self.data[start:end]


def _size(parts: list[Part]) -> int:
    return sum(len(p) if isinstance(p, bytes) else p[2] for p in parts)


def _tensor(buf: _Bytes, start: int, end: int, base_dir: str) -> list[Part] | None:
    """An external TensorProto as the same tensor with inline raw_data (a file range); else None."""
    fields = list(wire_fields(buf, start, end))
    if not any(n == _DATA_LOCATION and buf.data[v] == 1 for n, w, _, v, _ in fields if w == 0):
        return None
    entry: dict[str, str] = {}
    for n, _, _, vpos, vend in fields:
        if n == _EXTERNAL_DATA:
            kv = {k: buf.read(a, b).decode() for k, _, _, a, b in wire_fields(buf, vpos, vend)}
            entry[kv.get(1, "")] = kv.get(2, "")
    location = entry.get("location", "")
    path = os.path.join(base_dir, location)
    if not location or os.path.isabs(location) or not os.path.isfile(path):
        raise FuseError(f"external data {location!r} of a weight cannot be read")
    offset = int(entry.get("offset", 0) or 0)
    length = int(entry["length"]) if entry.get("length") else os.path.getsize(path) - offset
    kept = [buf.read(f, vend) for n, _, f, _, vend in fields if n not in (_EXTERNAL_DATA, _DATA_LOCATION)]
    return [*kept, encode_varint((_RAW_DATA << 3) | 2) + encode_varint(length), (path, offset, length)]


def _message(buf: _Bytes, start: int, end: int, children: dict[int, int], base_dir: str) -> list[Part] | None:
    """The message with its external tensors inlined (unchanged runs as one part), or None."""
    if buf.data.find(_MARK, start, end) < 0:
        return None  # no external reference inside: nothing to walk
    parts: list[Part] = []
    run = start
    for number, wtype, fstart, vpos, vend in wire_fields(buf, start, end):
        child = children.get(number)
        if child is None or wtype != 2 or child == SPARSE:
            continue
        inner = _tensor(buf, vpos, vend, base_dir) if child == TENSOR else \
            _message(buf, vpos, vend, CHILDREN[child], base_dir)
        if inner is None:
            continue
        if fstart > run:
            parts.append(buf.read(run, fstart))
        parts += [encode_varint((number << 3) | 2) + encode_varint(_size(inner)), *inner]
        run = vend
    if not parts:
        return None
    if end > run:
        parts.append(buf.read(run, end))
    return parts


def spliced_parts(model: onnx.ModelProto, base_dir: str) -> list[Part]:
    """The serialized model as parts: bytes, and file ranges for the payloads left in files."""
    buf = _Bytes(model.SerializeToString())
    return _message(buf, 0, len(buf), MODEL_CHILDREN, base_dir) or [buf.data]


def spliced_size(model: onnx.ModelProto, base_dir: str) -> int:
    return _size(spliced_parts(model, base_dir))


def _copy(src: int, dst: int, offset: int, length: int) -> None:
    """``length`` bytes of ``src`` from ``offset`` appended to ``dst``: in the kernel where it can."""
    end = offset + length
    while offset < end:
        try:
            n = os.copy_file_range(src, dst, min(end - offset, 1 << 30), offset)
        except OSError:  # another file system, an old kernel: read and write
            n = 0
        if n <= 0:
            data = os.pread(src, min(end - offset, 1 << 24), offset)
            if not data:
                raise FuseError("a weight's data ends early in its file")
            _write(dst, data)
            n = len(data)
        offset += n


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_spliced(model: onnx.ModelProto, out: str, base_dir: str, protected: list[str] = (),
                  check: Callable[[str, str], None] | None = None) -> None:
    """Write ``model`` to ``out`` (atomically, never onto a protected file), payloads copied from their
    files under ``base_dir``; ``model`` itself is left as it is. ``check`` (``atomic_write``'s) reads
    the written file before it replaces ``out``."""
    refuse_overwriting_input(out, list(protected))
    parts = spliced_parts(model, base_dir)
    fds: dict[str, int] = {}
    try:
        with atomic_write(out, check=check) as f:
            dst = f.fileno()
            for p in parts:
                if isinstance(p, bytes):
                    _write(dst, p)
                else:
                    path, offset, length = p
                    if path not in fds:
                        fds[path] = os.open(path, os.O_RDONLY)
                    _copy(fds[path], dst, offset, length)
    finally:
        for fd in fds.values():
            os.close(fd)

"""Sinusoidal position tables: weights whose values say they are fixed, not learned.

A (positions, d) table of ``sin`` and ``cos`` of ``pos / 10000^(2i/d)`` (the Transformer's sinusoidal
positions) is written by a model, not trained: RoFormer's and Marian's ``nn.Embedding(..., _freeze=True)``
is a parameter with ``requires_grad=False``, which neither torch exporter records (dynamo's signature says
PARAMETER). Only its values tell, so the loader reads the values of the float tables gathered by
positions (indices from shapes and constants, not from the inputs' values) and marks those that equal
one of the layouts ``meta["sinusoidal"]``. A learned table, randomly initialised, never equals them.
"""

from __future__ import annotations

import os

import numpy as np
from onnx import numpy_helper

from ..core.ir import Graph, Tensor
from ..core.kinds import reads_values
from .onnx_wire import read_structure

MAX_TABLE_ELEMENTS = 1 << 24  # a larger table is no position table (64 MiB of float32): not read
_ATOL = 1e-5  # float32 rounding of sin/cos computed in float64 (|value| <= 1)


def position_candidates(graph: Graph) -> list[Tensor]:
    """Float 2-D initializers read only by Gathers of rows whose indices come from shapes and constants
    (positions), without their values loaded."""
    out = []
    for t in graph.tensors.values():
        shape = t.shape
        if t.producer is not None or t.kind != "parameter" or not t.is_float or shape is None \
                or len(shape) != 2 or not all(isinstance(d, int) and d >= 2 for d in shape) \
                or shape[0] * shape[1] > MAX_TABLE_ELEMENTS or not t.consumers:
            continue
        if all(c.kind == "gather" and c.input(0) is t and c.attrs.get("axis", 0) == 0
               and c.input(1) is not None and not reads_values(c.input(1)) for c in t.consumers):
            out.append(t)
    return out


def sinusoidal_layouts(positions: int, d: int) -> list[np.ndarray]:
    """The tables the exporters' models write: [sin | cos] halves (RoFormer, Marian, XLM's halves) and
    sin, cos interleaved (XLM's ``create_sinusoidal_embeddings``), angle pos / 10000^(2 (j // 2) / d)."""
    angle = np.arange(positions)[:, None] / np.power(10000.0, 2 * (np.arange(d) // 2) / d)[None, :]
    halves = np.empty((positions, d))
    split = (d + 1) // 2
    halves[:, :split], halves[:, split:] = np.sin(angle[:, 0::2]), np.cos(angle[:, 1::2])
    interleaved = np.empty((positions, d))
    interleaved[:, 0::2], interleaved[:, 1::2] = np.sin(angle[:, 0::2]), np.cos(angle[:, 1::2])
    return [halves, interleaved]


def is_sinusoidal(value: np.ndarray) -> bool:
    """Whether a (positions, d) table equals one of ``sinusoidal_layouts`` to float32 rounding."""
    if value.ndim != 2 or not np.issubdtype(value.dtype, np.floating):
        return False
    v = value.astype(np.float64)
    if not np.all((np.abs(v[0]) <= _ATOL) | (np.abs(v[0] - 1) <= _ATOL)):
        return False  # position 0 is sin(0) = 0 and cos(0) = 1 in every layout: a learned row 0 is neither
    return any(np.allclose(v, table, rtol=0, atol=_ATOL) for table in sinusoidal_layouts(*v.shape))


def mark_sinusoidal_tables(graph: Graph, path: str) -> list[str]:
    """Mark the position candidates whose values are sinusoidal (``meta["sinusoidal"]``), reading only
    their payloads from ``path``; returns their names."""
    candidates = {t.name: t for t in position_candidates(graph)}
    if not candidates:
        return []
    values = {name: t.meta["value"] for name, t in candidates.items() if t.meta.get("value") is not None}
    if len(values) < len(candidates):
        try:
            model, _ = read_structure(path, external=True)  # payloads as references into the file
        except (OSError, ValueError):
            model = None  # unreadable now (the load read it): every table taken for what the export says
        base = os.path.dirname(os.path.abspath(path))
        for init in model.graph.initializer if model is not None else ():
            if init.name in candidates and init.name not in values:
                try:
                    values[init.name] = numpy_helper.to_array(init, base)
                except Exception:  # noqa: BLE001 - a payload that does not read is no sinusoidal table
                    continue
    found = [name for name, v in values.items() if is_sinusoidal(np.asarray(v))]
    for name in found:
        candidates[name].meta["sinusoidal"] = True
    return found

"""ONNX shape inference, run within a budget, and the shapes it leaves in a model.

Data propagation turns 1-D tensors into "shape values" element by element: a graph input, an
initializer or a Constant claiming millions of elements makes it allocate gigabytes (a 76-byte file
took 10 GB). Such a model is inferred without data propagation, and the warning says so.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from math import prod

import onnx

from ..core import budgets
from ..core.errors import error_text

DATA_PROP_ELEMENTS = int(os.environ.get("FUSECLI_MAX_SHAPE_VALUE_ELEMENTS", 1 << 16))
# inputs read as the shape (or repeats) of an output: one element per dim of what the op makes
SHAPE_INPUTS = {"ConstantOfShape": 0, "Reshape": 1, "Expand": 1, "Tile": 1}


def infer_shapes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    """ONNX shape inference, with data propagation unless the model claims a huge 1-D integer tensor;
    on failure the model as it was. Returns the model and a warning (or None)."""
    big = huge_shape_value(model)
    note = None
    if big is not None:
        note = (f"{big} claims more than {DATA_PROP_ELEMENTS} elements in one dim; shape inference ran "
                "without data propagation (raise FUSECLI_MAX_SHAPE_VALUE_ELEMENTS to allow it)")
    elif model.graph.sparse_initializer:  # onnx 1.23's data propagation hangs on some (fuzz seed 20265754)
        note = "the model has sparse initializers; shape inference ran without data propagation"
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=note is None)
        return inferred, note
    except Exception as e:  # onnx raises several C++-mapped types here
        first = error_text(e)
        return model, f"shape inference failed, shapes may be missing: {first}"


def _declared(g: onnx.GraphProto) -> Iterator[tuple[str, str, Sequence, str]]:
    """(label, name, dims, op) of each shape one graph declares: its inputs, values and outputs, its
    initializers and its nodes' tensor attributes (op: the node's op type, '' otherwise; name: the
    tensor a node reads, '' for an attribute but Constant's value). Dims as the proto holds them (ints,
    or Dimension messages: ``_dim_value``), so that a rank costs no list."""
    for what, infos in (("graph input", g.input), ("value", g.value_info), ("graph output", g.output)):
        for vi in infos:
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
                yield f"{what} {vi.name!r}", vi.name, vi.type.tensor_type.shape.dim, ""
    for t in g.initializer:
        yield f"initializer {t.name!r}", t.name, t.dims, ""
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                made = n.output[0] if n.output else ""
                read = made if n.op_type == "Constant" else ""
                yield f"{n.op_type} {n.name or made or n.op_type!r}", read, a.t.dims, n.op_type


def _dim_value(d) -> int | None:
    """A dim of ``_declared``: its int, None where symbolic."""
    return d if isinstance(d, int) else d.dim_value if d.HasField("dim_value") else None


def check_shape_costs(model: onnx.ModelProto, fields: bool = True) -> None:
    """OverBudget (one line, naming the tensor and the figure) when a declared or inferred shape costs
    more than the RANK budget: a value, initializer or tensor attribute of more dims, or a tensor an op
    reads as a shape (ConstantOfShape, Reshape, Expand, Tile) of more elements (a rank-N output, one dim
    each), in the graph and its subgraphs; or when a name, dim name or string attribute is longer than
    the STRING budget, or a node's inputs, outputs or an attribute's list longer than FIELD_ENTRIES.
    Linear in the model's values and nodes; run before the shape tools build anything from a shape.
    ``fields``: the node checks too (not again on an inferred copy, whose nodes are the model's)."""
    cap, chars, entries = budgets.limit("RANK"), budgets.limit("STRING"), budgets.limit("FIELD_ENTRIES")
    graphs = [model.graph]
    while graphs:
        g = graphs.pop()
        as_shape = {}  # tensor read as a shape -> the node that reads it
        for n in g.node:
            if fields:
                _node_fields(n, chars, entries)
            for a in n.attribute:
                graphs += [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            k = SHAPE_INPUTS.get(n.op_type)
            if k is not None and len(n.input) > k and n.input[k]:
                as_shape.setdefault(n.input[k], []).append(n)
        for t in g.initializer:
            if len(t.name) > chars:
                _text(t.name, "an initializer's name")
        for label, name, dims, _ in _declared(g):
            if len(name) > chars:
                _text(name, "a value's name")
            budgets.check("RANK", len(dims), f"{label} declares {len(dims):,} dims")
            for d in dims:
                if not isinstance(d, int) and len(d.dim_param) > chars:
                    _text(d.dim_param, f"a dim name of {label}")
            if name not in as_shape:
                continue
            known = [v for v in map(_dim_value, dims) if v is not None]
            elements = prod(known)
            if known and elements > cap:
                n = as_shape[name][0]
                budgets.check("RANK", elements, f"{n.op_type} {n.name or n.output[0]!r} reads "
                              f"{name!r} as a shape of {elements:,} elements")


def _text(value: str | bytes, what: str) -> None:
    """The STRING budget on one name or string (its first characters, escaped, name it)."""
    if len(value) > budgets.limit("STRING"):
        budgets.check("STRING", len(value), f"{what} {ascii(value[:32])[:48]}... of {len(value):,} "
                      "characters")


def _node_fields(n: onnx.NodeProto, chars: int, entries: int) -> None:
    """The STRING and FIELD_ENTRIES budgets on one node: its names, its lists, its string attributes
    (a length test per field; the message is made only for a field over its budget)."""
    label = f"{n.op_type[:32]} {ascii(n.name[:32])}"
    for value, what in ((n.name, "a node's name"), (n.op_type, "an op type"), (n.domain, "a domain")):
        if len(value) > chars:
            _text(value, what)
    for what, values in (("inputs", n.input), ("outputs", n.output)):
        if len(values) > entries:
            budgets.check("FIELD_ENTRIES", len(values), f"{label} lists {len(values):,} {what}")
        for v in values:
            if len(v) > chars:
                _text(v, f"a tensor name of {label}")
    for a in n.attribute:
        if len(a.name) > chars or len(a.s) > chars:
            _text(a.name, f"an attribute name of {label}")
            _text(a.s, f"attribute {ascii(a.name[:32])} of {label}")
        if a.type in _LISTS:
            for what, values in (("ints", a.ints), ("floats", a.floats), ("strings", a.strings)):
                if len(values) > entries:
                    budgets.check("FIELD_ENTRIES", len(values), f"attribute {ascii(a.name[:32])} of "
                                  f"{label} lists {len(values):,} {what}")
            for v in a.strings:
                if len(v) > chars:
                    _text(v, f"attribute {ascii(a.name[:32])} of {label}")


_LISTS = frozenset({onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS, onnx.AttributeProto.STRINGS})


def huge_shape_value(model: onnx.ModelProto) -> str | None:
    """The name of a 1-D input, value (value_info, output), initializer or Constant longer than the
    data-propagation budget."""
    for label, _, dims, op in _declared(model.graph):
        if op in ("", "Constant") and len(dims) == 1:
            v = _dim_value(dims[0])
            if v is not None and v > DATA_PROP_ELEMENTS:
                return label
    return None


def dims_of(value_info: onnx.ValueInfoProto) -> tuple | None:
    """A value's dims: ints, names (or expressions), None where unknown; None when the rank is unknown."""
    if not value_info.type.HasField("tensor_type"):
        return None
    tt = value_info.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)


def value_shapes(model: onnx.ModelProto,
                 extra: Iterable[onnx.ValueInfoProto] = ()) -> dict[str, tuple | None]:
    """Dims of every value the model's graph describes (inputs, value_info, outputs, ``extra``)."""
    g = model.graph
    out: dict[str, tuple | None] = {}
    for vi in (*g.input, *g.value_info, *g.output, *extra):
        s = dims_of(vi)
        if s is not None or vi.name not in out:
            out[vi.name] = s
    for t in g.initializer:
        out[t.name] = tuple(t.dims)
    return out

"""Open dims sized by ONNX's own (C++) shape inference with the graph inputs bound to numbers.

At the user's point and at the fit's probe points (``dim_fit``), ONNX's inference with data propagation
sizes most dims the symbolic run left open (``unk__7`` out of Shape -> Gather -> Concat -> Reshape); the
numbers are fitted to integer polynomials in the input dims and checked at every point. What it leaves
open (a Slice whose bounds come out of a Div of a shape, a Range) goes on to onnxruntime's symbolic tool
(``onnx_sizes``).

Each run sees only the part of the model the open tensors depend on, cut at float activations whose
shapes are already polynomials in the input dims: those become graph inputs of that shape at the point
(a float activation's values never size anything), so a run costs the shape computations, not the model.
Where that part is large (a TorchScript decoder's batch dim comes out of ``view(-1, seq)``: every
activation is open), two more runs size the float activations first, each dim one integer times one
monomial that fits all three points (``guess_shapes``); the fit then runs on the part cut there, and the
symbolic tool on what stays open only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx
from onnx import helper

from ..core.dims import dim_value
from ..core.ir import Graph, Tensor
from ..memory.sizes import input_dim_name
from .dim_fit import MAX_FIT_VARIABLES, fit_polynomials, monomial_poly, monomials, over_variables
from .shape_tools import dims_of, infer_shapes

_UNREAD = object()  # a memo's "not asked yet"
_FLOAT_TYPES = {"float32": onnx.TensorProto.FLOAT, "float64": onnx.TensorProto.DOUBLE,
                "float16": onnx.TensorProto.FLOAT16, "bfloat16": onnx.TensorProto.BFLOAT16}


def fit_by_onnx(graph: Graph, model: onnx.ModelProto, pending: set[str], values: Mapping[str, int],
                variables: tuple[str, ...]) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """The shapes of the ``pending`` tensors whose every open dim ONNX's bound inference sizes at each
    point and fits to a polynomial, and the dims it found at the user's point (ints, None where open).
    What it leaves open at the user's point goes on to onnxruntime's tool (``onnx_sizes``).

    Where the part of the model the open tensors depend on is large (a decoder whose batch or sequence
    dim comes out of a Reshape: every activation open) and the user's point closes at least half of
    them, the float activations are sized first from two more runs (``guess_shapes``); cut there, the
    fit's runs cost the shape computations only. (Where most stay open, onnxruntime's tool sizes them
    anyway, on about as much of the model: the two runs would cost more than they save.)"""
    if not pending or not variables or len(variables) > MAX_FIT_VARIABLES:
        return {}, {}
    template = cut_model(graph, model, pending, variables)

    def numbers_on(m: onnx.ModelProto):
        def numbers(point: Mapping[str, int], need: set[str]) -> dict[str, tuple]:
            inferred, _ = infer_shapes(bind_inputs(m, point))
            return needed_dims(inferred, need)
        return numbers

    at_user = numbers_on(template)(values, pending)
    guessed: dict[str, tuple] = {}
    still_open = sum(at_user.get(n) is None or None in at_user[n] for n in pending)
    if len(template.graph.node) >= GUESS_MIN_NODES and 2 * still_open <= len(pending):
        points = [{**values, **p} for p in guess_points(values, variables)]
        columns = [at_user, *(numbers_on(template)(p, pending) for p in points)]
        guessed = guess_shapes(graph, pending, columns, [values, *points], variables)
    closed: dict[str, tuple] = {}
    positions: list[tuple[str, int]] = []
    for name in sorted(pending - guessed.keys()):
        got, shape = at_user.get(name), graph.tensors[name].shape
        if got is None or None in got or (shape is not None and len(got) != len(shape)):
            continue
        closed[name] = shape if shape is not None else (None,) * len(got)
        positions += [(name, axis) for axis, d in enumerate(closed[name]) if not over_variables(d, variables)]
    if not guessed and len(closed) < len(pending):
        return {}, at_user  # no fit: onnxruntime's tool runs on as much of the model anyway
    if guessed:  # the fit's runs: what the closed tensors depend on, cut at the guessed activations
        template = cut_model(graph, model, set(closed), variables, guessed)
    fitted = fit_polynomials(numbers_on(template), positions, values, at_user, variables)
    out = dict(guessed)
    for name, shape in closed.items():
        dims = [fitted.get((name, axis), d if over_variables(d, variables) else None)
                for axis, d in enumerate(shape)]
        if None not in dims:
            out[name] = tuple(dims)
    return out, at_user


GUESS_MIN_NODES = 2000  # a smaller part is cheap to run whole at every point (ONNX's C++: ~7 us a node)


def guess_points(values: Mapping[str, int], variables: tuple[str, ...]) -> list[dict[str, int]]:
    """Two points where every input dim differs from the user's and from the other point's (3..40)."""
    out = []
    for base in (17, 29):
        p = {}
        for i, v in enumerate(variables):
            x = base + 2 * i
            while x == values.get(v) or any(q[v] == x for q in out):
                x += 1
            p[v] = x
        out.append(p)
    return out


def guess_shapes(graph: Graph, pending: set[str], columns: Sequence[Mapping[str, tuple]],
                 points: Sequence[Mapping[str, int]], variables: tuple[str, ...]) -> dict[str, tuple]:
    """The float activations of ``pending`` whose every dim at all ``points`` (the dims found there,
    ``columns``) is one integer times one monomial of degree <= 2 in the input dims, or a constant, and
    only one such: those shapes (a dim already known must agree at every point)."""
    mons = monomials(variables)[1:]  # the constant is _one_monomial's first test
    out: dict[str, tuple] = {}
    made: dict[tuple, tuple | None] = {}  # (dims at the points, dims known) -> the shape: asked once each
    for name in pending:
        t = graph.tensors[name]
        if t.dtype not in _FLOAT_TYPES or t.producer is None:
            continue
        key = (tuple(c.get(name) for c in columns), t.shape)
        shape = made.get(key, _UNREAD)
        if shape is _UNREAD:
            shape = made[key] = _guess_shape(key[0], t.shape, points, variables, mons)
        if shape is not None:
            out[name] = shape
    return out


def _guess_shape(rows: tuple, shape: tuple | None, points: Sequence[Mapping[str, int]],
                 variables: tuple[str, ...], mons: list[tuple[str, ...]]) -> tuple | None:
    """``guess_shapes`` for one tensor: its dims at the points ``rows``, its dims known ``shape``."""
    if any(r is None or None in r for r in rows) or len({len(r) for r in rows}) != 1 \
            or (shape is not None and len(shape) != len(rows[0])):
        return None
    dims = []
    for axis in range(len(rows[0])):
        got = [r[axis] for r in rows]
        d = None if shape is None else shape[axis]
        if d is not None and over_variables(d, variables):
            d = d if all(dim_value(d, p) == g for p, g in zip(points, got, strict=True)) else None
        else:
            d = _one_monomial(got, points, mons)
        if d is None:
            return None
        dims.append(d)
    return tuple(dims)


def _one_monomial(got: Sequence[int], points: Sequence[Mapping[str, int]], mons) -> int | str | None:
    """The constant, or the only ``c * monomial``, that gives ``got`` at every point; None otherwise."""
    if len(set(got)) == 1:
        return got[0]
    found = None
    for m in mons:
        c = None
        for p, g in zip(points, got, strict=True):
            v = 1
            for x in m:
                v *= p[x]
            if v == 0 or g % v or (c is not None and g // v != c):
                break
            c = g // v
        else:  # c > 0: a dim of 0 at every point is the constant above
            if found is not None:
                return None
            found = str(monomial_poly(c, m))  # as fit_polynomials writes it
    return found


def cut_model(graph: Graph, model: onnx.ModelProto, need: set[str], variables: tuple[str, ...],
              known: Mapping[str, tuple] | None = None, plain: bool = False) -> onnx.ModelProto:
    """The nodes ``need`` depends on, back to the graph inputs, initializers and float activations whose
    shape ``graph`` knows over ``variables`` (graph inputs here, their dims as expressions to bind).
    ``plain``: cut only where every dim is a number or a variable itself, for a symbolic tool (it reads a
    dim's text as one symbol: ``2*seq`` squared would print as ``2*seq**2``). ``known``: shapes sized
    since ``graph``'s, by name."""
    g = model.graph
    producer = {o: i for i, n in enumerate(g.node) for o in n.output if o}
    keep: set[int] = set()
    frontier: dict[str, Tensor] = {}
    seen = set(need)
    todo = [producer[n] for n in need if n in producer]
    while todo:
        i = todo.pop()
        if i in keep:
            continue
        keep.add(i)
        for x in g.node[i].input:
            if not x or x in seen:
                continue
            seen.add(x)
            if x not in producer:
                continue
            t = graph.tensors.get(x)
            shape = None if t is None else (known or {}).get(x, t.shape)
            if _cuttable(t, shape, variables, plain):
                frontier[x] = (t.dtype, shape)
            else:
                todo.append(producer[x])
    return sub_model(model, keep, seen, need, producer,
                     [helper.make_tensor_value_info(x, _FLOAT_TYPES[dtype], list(shape))
                      for x, (dtype, shape) in frontier.items()])


def sub_model(model: onnx.ModelProto, keep: set[int], seen: set[str], need: set[str],
              producer: Mapping[str, int],
              more_inputs: Sequence[onnx.ValueInfoProto] = ()) -> onnx.ModelProto:
    """The nodes at positions ``keep`` as a model: the graph inputs and initializers among ``seen``, then
    ``more_inputs``, and the made ones of ``need`` as outputs (shape tools then do only that work)."""
    g = model.graph
    out = onnx.ModelProto()
    for fd, value in model.ListFields():
        if fd.name != "graph":
            set_field(out, fd, value)
    og = out.graph
    og.name = g.name
    og.node.extend(g.node[i] for i in sorted(keep))
    og.input.extend(i for i in g.input if i.name in seen)
    og.input.extend(more_inputs)
    og.initializer.extend(t for t in g.initializer if t.name in seen)
    og.output.extend(onnx.ValueInfoProto(name=n) for n in sorted(need) if n in producer)
    return out


_INT64 = 1 << 63


def _cuttable(t: Tensor | None, shape: tuple | None, variables: tuple[str, ...], plain: bool = False) -> bool:
    """A float activation sized by the input dims: a shape is known, its values size nothing."""
    if t is None or t.producer is None or t.dtype not in _FLOAT_TYPES or shape is None:
        return False

    def known(d) -> bool:  # plain: a number or an input dim itself, not an expression of them
        if isinstance(d, int):
            return 0 <= d < _INT64  # a dim ONNX can write (a mutated file claims 2^64 - 1)
        return d in variables if plain else over_variables(d, variables)

    return any(not isinstance(d, int) for d in shape) and all(known(d) for d in shape)


def bind_inputs(model: onnx.ModelProto, values: Mapping[str, int]) -> onnx.ModelProto:
    """A copy of ``model`` with its graph inputs' named dims (and expressions of them) bound to ``values``."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    bind_in_place(m, values)
    return m


def bind_in_place(m: onnx.ModelProto, values: Mapping[str, int]) -> None:
    """``m``'s graph inputs' dims bound to ``values`` where they evaluate there (unnamed ones by the name
    fusecli gives them, ``sizes.input_dim_name``)."""
    for vi in m.graph.input:
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            continue
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.HasField("dim_value"):
                continue
            v = dim_value(d.dim_param or input_dim_name(vi.name, axis), values)
            if v is not None:
                d.Clear()
                d.dim_value = v


def needed_dims(model: onnx.ModelProto, need: set[str]) -> dict[str, tuple]:
    """The dims (ints, None where open) of the ``need`` values the (inferred) model describes; each
    distinct type is read once (a decoder's thousands of values have a few hundred)."""
    g = model.graph
    out: dict[str, tuple] = {}
    read: dict[bytes, tuple | None] = {}
    for infos in (g.input, g.value_info, g.output):
        for vi in infos:
            name = vi.name
            if name not in need:
                continue
            key = vi.type.SerializeToString()
            s = read.get(key, _UNREAD)
            if s is _UNREAD:
                s = dims_of(vi)
                s = read[key] = None if s is None else tuple(d if isinstance(d, int) else None for d in s)
            if s is not None or name not in out:
                out[name] = s
    return out


def set_field(msg, fd, value) -> None:
    """Copy one field (``ListFields()``'s descriptor and value) into ``msg``: repeated, message or scalar."""
    if fd.is_repeated:
        getattr(msg, fd.name).extend(value)
    elif fd.message_type is not None:
        getattr(msg, fd.name).CopyFrom(value)
    else:
        setattr(msg, fd.name, value)

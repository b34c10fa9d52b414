"""The dims of a SavedModel that fusecli's own shape rules leave open, sized by TensorFlow's inference.

A SavedModel records each op's shapes as TensorFlow traced them: a dynamic batch or sequence is -1 in
every tensor after it, and a Dense layer's Tensordot ``Reshape`` to ``[prod(free dims), d]`` has no known
dim at all. The rules of ``load.tf_shapes`` size first, without TensorFlow (a convolutional network's
every dim). What they leave open goes to TensorFlow: the part of the forward graph those tensors depend
on, cut at float activations already sized (placeholders of their shape stand for them, as
``load.bound_fit`` cuts an ONNX model), flattened (``load.tf_flat``) with its inputs bound to numbers, is
imported into a ``tf.Graph``: TensorFlow's C++ shape inference runs on every node and evaluates the small
shape computations on the way (Tensordot's Shape/GatherV2/Prod/ConcatV2, Einsum, BatchMatMul...). It runs
at the user's point and at more integer points, and the numbers are fitted to integer polynomials
(``load.dim_fit``), as the ONNX loader does with ONNX's tools. A dim no fit explains keeps an opaque name
(``unk1``) with its value at the user's sizes. TensorFlow is imported here only, when a dim stays open
after the rules (its import takes seconds; ``FUSECLI_TENSORFLOW_SHAPES=0`` turns this off); without it the
dims stay unknown and a warning says why. ``graph.meta["tensorflow_sizes"]`` records the import and the
tensors TensorFlow sized.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping

from ..core.dims import dim_poly
from ..core.ir import Graph, Node
from .dim_fit import MAX_FIT_VARIABLES, fit_polynomials, over_variables, pending_tensors
from .tf_flat import flat_graphdef
from .tf_shapes import open_to_tensorflow, size_natively

_FLOAT_TYPES = frozenset({"float16", "bfloat16", "float32", "float64"})  # values that never size a shape
SWITCH = "FUSECLI_TENSORFLOW_SHAPES"  # 0: no TensorFlow import (its seconds), open dims stay unknown


def resolve_sizes(graph: Graph, values: Mapping[str, int], variables: tuple[str, ...],
                  rules: bool = True) -> dict[str, int]:
    """Fill the graph's open dims in place (the shape TensorFlow recorded stays in
    ``meta["graph_shape"]``: its autodiff habits depend on it); returns the values of the opaque dims it
    had to name. The rules of ``load.tf_shapes`` first; TensorFlow only for what they leave open, on the
    part of the graph that depends on (``graph.meta["tensorflow_sizes"]``: whether it was imported and
    the tensors it sized). A warning in ``graph.meta["warnings"]`` when TensorFlow is missing or fails.
    ``rules=False``: TensorFlow sizes every open dim, on the whole graph (the rules' judge, in tests)."""
    pending = pending_tensors(graph, variables)
    if not pending or "tf_structure" not in graph.meta:
        return {}
    if rules and len(variables) <= MAX_FIT_VARIABLES:  # more: no fit would make the rules' polynomials either
        size_natively(graph, pending, variables)
        pending = pending_tensors(graph, variables)
        if not pending - open_to_tensorflow(graph, pending):
            return {}
    if os.environ.get(SWITCH, "").strip() == "0":
        _warn(graph, f"TensorFlow's shape inference is off ({SWITCH}=0): {len(pending)} tensors whose dims "
                     "the SavedModel records as unknown (-1) keep them unknown")
        return {}
    try:
        tf = _tensorflow()
    except ImportError:
        _warn(graph, f"TensorFlow is not installed: {len(pending)} tensors whose dims the SavedModel "
                     "records as unknown (-1) keep them unknown (pip install tensorflow to size them)")
        return {}
    except Exception as e:  # an installed TensorFlow that fails to import (a protobuf mismatch...)
        _warn(graph, f"TensorFlow failed to import ({_first_line(e)}): {len(pending)} tensors whose dims "
                     "the SavedModel records as unknown (-1) keep them unknown")
        return {}
    record = graph.meta["tensorflow_sizes"] = {"imported": True, "tensors": []}
    part = depends_on(graph, pending, variables) if rules else None
    cache: dict[tuple, dict[str, tuple | None]] = {}

    def numbers(at: Mapping[str, int], need=None) -> dict[str, tuple | None]:
        key = tuple(sorted(at.items()))
        if key not in cache:
            cache[key] = tensorflow_shapes(tf, graph, at, part)
        return cache[key]

    try:
        at_user = numbers(values)
    except Exception as e:  # TensorFlow's importer raises several types for a graph it refuses
        _warn(graph, f"TensorFlow's shape inference failed on the SavedModel's graph ({_first_line(e)}): "
                     f"{len(pending)} tensors keep unknown dims")
        return {}
    positions: list[tuple[str, int]] = []
    for name in sorted(pending):
        t = graph.tensors[name]
        got = at_user.get(name)
        if got is None or (t.shape is not None and len(got) != len(t.shape)):
            continue
        for axis, g in enumerate(got):
            d = None if t.shape is None else t.shape[axis]
            if g is not None and (d is None or dim_poly(d) is None or not over_variables(d, variables)):
                positions.append((name, axis))
    fitted = fit_polynomials(numbers, positions, values, at_user, variables)
    opaque: dict[str, int] = {}
    for name, axis in positions:
        t = graph.tensors[name]
        expr = fitted.get((name, axis))
        if expr is None and not variables:  # fixed sizes: the number is the dim
            expr = at_user[name][axis]
        elif expr is None:  # a dim no polynomial explains: named, with its value at the user's sizes
            expr = f"unk{len(opaque) + 1}"
            opaque[expr] = at_user[name][axis]
        t.meta.setdefault("graph_shape", t.shape)
        dims = list(t.shape) if t.shape is not None else [None] * len(at_user[name])
        dims[axis] = expr
        t.shape = tuple(dims)
    record["tensors"] = sorted({name for name, _ in positions})
    return opaque


def depends_on(graph: Graph, need: set[str], variables: tuple[str, ...]) -> list[Node]:
    """The nodes the ``need`` tensors depend on, in graph order, back to float activations whose every
    dim is sized over ``variables`` (their values size nothing: placeholders of that shape stand for
    them), as ``load.bound_fit`` cuts an ONNX model."""
    keep: set[int] = set()
    todo = [graph.tensors[n].producer for n in need]
    while todo:
        n = todo.pop()
        if n is None or id(n) in keep:
            continue
        keep.add(id(n))
        for t in n.inputs:
            if t is None or t.producer is None or id(t.producer) in keep:
                continue
            sized = t.shape is not None and all(over_variables(d, variables) for d in t.shape)
            if not (sized and t.dtype in _FLOAT_TYPES):
                todo.append(t.producer)
    return [n for n in graph.nodes if id(n) in keep]


def tensorflow_shapes(tf, graph: Graph, values: Mapping[str, int],
                      nodes: list[Node] | None = None) -> dict[str, tuple | None]:
    """IR tensor name -> its dims as TensorFlow infers them with the graph's inputs at ``values`` (None
    for an unknown rank or dim), on the graph's ``nodes`` (default all)."""
    data, where = flat_graphdef(graph, values, nodes)
    gd = tf.compat.v1.GraphDef.FromString(data)
    with tf.Graph().as_default() as g:
        tf.graph_util.import_graph_def(gd, name="")
    out = {}
    for name, (node, i) in where.items():
        s = g.get_operation_by_name(node).outputs[i].shape
        out[name] = None if s.rank is None else tuple(s.as_list())
    return out


def _tensorflow():
    """``import tensorflow``, its C++ start-up lines kept off the user's stderr."""
    import sys

    if sys.modules.get("tensorflow") is not None:
        return sys.modules["tensorflow"]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with _stderr_silenced():
        import tensorflow as tf
    return tf


@contextlib.contextmanager
def _stderr_silenced():
    """File descriptor 2 to /dev/null for the duration (C++ logging writes there, not to sys.stderr)."""
    import sys

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real descriptor 2 (an embedding host): nothing to silence
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:160] if text else type(e).__name__


def _warn(graph: Graph, text: str) -> None:
    graph.meta.setdefault("warnings", []).append(text)

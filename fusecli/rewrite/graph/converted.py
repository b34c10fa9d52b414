"""tf2onnx's output made runnable by ONNX Runtime and named as ``analyze`` names the SavedModel.

- Dims: tf2onnx names every unknown dim ``unk__<n>``, a fresh number per run; an input's dims are
  renamed to the names fusecli's SavedModel loader gives them (``batch``, ``<input>_dim<k>``), so the
  same ``--batch`` / ``--dim`` work for ``analyze`` and ``rewrite``. Other ``unk__`` dims (outputs,
  value_info) are cleared for shape inference to derive from the inputs.
- Ops ONNX Runtime cannot load: tf2onnx passes TensorFlow ops it does not convert through by name.
  ``Erfc`` (TensorFlow's exact GELU, ``0.5 x erfc(-x / sqrt 2)``) is written with ``Erf``; any other
  such op is refused in one line.
- ``GlobalAveragePool`` of a rank-3 tensor (tf2onnx's spelling of a mean over the last axis, as in
  LayerNorm's moments) is written as that ``ReduceMean``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...core.errors import FuseError

_GENERATED = "unk__"  # tf2onnx's dim names: unk__<n>, renumbered on every conversion


def fix_conversion(model: onnx.ModelProto, input_dims: dict[str, Sequence[int | str | None]],
                   label: str) -> dict[str, str]:
    """Apply every fix above in place; returns tf2onnx's dim name -> the loader's, for what was renamed.
    ``input_dims``: the SavedModel signature's inputs with the dims fusecli's loader named."""
    renamed = rename_input_dims(model, input_dims)
    replace_erfc(model)
    global_pools_as_means(model)
    refuse_unknown_ops(model, label)
    return renamed


def rename_input_dims(model: onnx.ModelProto,
                      input_dims: dict[str, Sequence[int | str | None]]) -> dict[str, str]:
    """The converted inputs' generated dim names -> the SavedModel's (by input name, else by position)."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    inputs = [i for i in g.input if i.name not in inits]
    names = list(input_dims)
    mapping: dict[str, str] = {}
    for pos, vi in enumerate(inputs):
        key = vi.name if vi.name in input_dims else vi.name.split(":")[0]
        if key not in input_dims:
            key = names[pos] if pos < len(names) and len(names) == len(inputs) else None
        if key is None:
            continue
        theirs = list(input_dims[key])
        dims = vi.type.tensor_type.shape.dim
        if len(dims) != len(theirs):
            continue
        for d, name in zip(dims, theirs, strict=True):
            if d.HasField("dim_param") and isinstance(name, str) and d.dim_param not in mapping:
                mapping[d.dim_param] = name
    for vi in (*g.input, *g.output, *g.value_info):
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            continue
        for d in vi.type.tensor_type.shape.dim:
            if not d.HasField("dim_param"):
                continue
            if d.dim_param in mapping:
                d.dim_param = mapping[d.dim_param]
            elif d.dim_param.startswith(_GENERATED):
                d.ClearField("dim_param")  # unknown: shape inference derives it from the inputs
    return mapping


def _producers(g: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in g.node for o in n.output if o}


def _scalar(g: onnx.GraphProto, name: str, producers: dict) -> np.ndarray | None:
    """A one-element constant (an initializer or a Constant node's value), else None."""
    t = next((t for t in g.initializer if t.name == name), None)
    if t is None:
        p = producers.get(name)
        if p is None or p.op_type != "Constant" or p.domain not in ("", "ai.onnx"):
            return None
        t = next((helper.get_attribute_value(a) for a in p.attribute if a.name == "value"), None)
        if t is None:
            return None
    v = numpy_helper.to_array(t)
    return v if v.size == 1 else None


def _unique(taken: set[str], base: str) -> str:
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def replace_erfc(model: onnx.ModelProto) -> int:
    """Erfc(y) -> 1 - Erf(y); where y = -x * c (TensorFlow's GELU) -> 1 + Erf(x * c), as
    erfc(-z) = 1 + erf(z), the form the GELU patterns read. Returns how many were replaced."""
    g = model.graph
    erfcs = [n for n in g.node if n.op_type == "Erfc" and n.domain in ("", "ai.onnx")]
    if not erfcs:
        return 0
    producers = _producers(g)
    taken = {o for n in g.node for o in n.output} | {n.name for n in g.node} \
        | {t.name for t in g.initializer} | {i.name for i in g.input}
    new_nodes: dict[int, list[onnx.NodeProto]] = {}
    for n in erfcs:
        y, out = n.input[0], n.output[0]
        odd = _negated(g, y, producers)  # (x, c) with y = -(x * c)
        base = n.name or out
        made: list[onnx.NodeProto] = []
        if odd is not None:
            x, c = odd
            dtype = c.dtype
            scale = _unique(taken, f"{base}_scale")
            g.initializer.append(numpy_helper.from_array(np.array(c.reshape(()), dtype), scale))
            arg = _unique(taken, f"{base}_arg")
            made.append(helper.make_node("Mul", [x, scale], [arg], name=_unique(taken, f"{base}_Mul")))
        else:
            arg, dtype = y, _elem_dtype(g, y)
        erf = _unique(taken, f"{base}_erf")
        made.append(helper.make_node("Erf", [arg], [erf], name=_unique(taken, f"{base}_Erf")))
        one = _unique(taken, f"{base}_one")
        g.initializer.append(numpy_helper.from_array(np.array(1, dtype), one))
        made.append(helper.make_node("Add", [one, erf], [out], name=_unique(taken, f"{base}_Add"))
                    if odd is not None else
                    helper.make_node("Sub", [one, erf], [out], name=_unique(taken, f"{base}_Sub")))
        new_nodes[id(n)] = made
    nodes = [m for n in g.node for m in new_nodes.get(id(n), [n])]
    del g.node[:]
    g.node.extend(nodes)
    _drop_dead(g, {n.input[0] for n in erfcs})
    return len(erfcs)


def _negated(g: onnx.GraphProto, y: str, producers: dict) -> tuple[str, np.ndarray] | None:
    """(x, c) when ``y`` is Mul(Neg(x), c), Neg(Mul(x, c)) or Mul(x, -c) with c a scalar constant."""
    p = producers.get(y)
    if p is None or p.domain not in ("", "ai.onnx"):
        return None
    if p.op_type == "Neg":
        q = producers.get(p.input[0])
        if q is not None and q.op_type == "Mul":
            for a, b in (q.input, q.input[::-1]):
                c = _scalar(g, b, producers)
                if c is not None:
                    return a, c
        return None
    if p.op_type != "Mul":
        return None
    for a, b in (p.input, p.input[::-1]):
        c = _scalar(g, b, producers)
        if c is None or not np.issubdtype(c.dtype, np.floating):
            continue
        neg = producers.get(a)
        if neg is not None and neg.op_type == "Neg" and neg.domain in ("", "ai.onnx"):
            return neg.input[0], c
        return a, -c  # -(x * -c) = x * c: erfc(x * -c) = 1 + erf(x * c)
    return None


def _elem_dtype(g: onnx.GraphProto, name: str) -> np.dtype:
    for vi in (*g.value_info, *g.input, *g.output):
        if vi.name == name and vi.type.tensor_type.elem_type:
            return helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
    return np.dtype(np.float32)  # tf2onnx's Erfc: float32 (TensorFlow's GELU of a float32 model)


def _drop_dead(g: onnx.GraphProto, candidates: set[str]) -> None:
    """The producers of ``candidates`` (and theirs) that nothing reads any more (the GELU's old Neg and
    Mul), their value_info and the constants only they read."""
    outputs = {o.name for o in g.output}
    dropped: set[str] = set()
    inputs_of_dead: set[str] = set()
    while candidates:
        read = {i for n in g.node for i in n.input} | outputs
        read |= {i for n in g.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH
                 for m in a.g.node for i in m.input}
        dead = [n for n in g.node if any(o in candidates for o in n.output)
                and not any(o in read for o in n.output if o)]
        if not dead:
            break
        candidates = {i for n in dead for i in n.input}
        inputs_of_dead |= candidates
        dropped |= {o for n in dead for o in n.output}
        keep = [n for n in g.node if not any(n is d for d in dead)]
        del g.node[:]
        g.node.extend(keep)
    read = {i for n in g.node for i in n.input} | outputs
    graph_inputs = {i.name for i in g.input}
    keep_inits = [t for t in g.initializer if t.name not in inputs_of_dead or t.name in read
                  or t.name in graph_inputs]
    if len(keep_inits) != len(g.initializer):
        del g.initializer[:]
        g.initializer.extend(keep_inits)
    keep_vi = [v for v in g.value_info if v.name not in dropped]
    if len(keep_vi) != len(g.value_info):
        del g.value_info[:]
        g.value_info.extend(keep_vi)


def _ranks(model: onnx.ModelProto, names: set[str]) -> dict[str, int]:
    """The ranks ONNX shape inference gives ``names`` (weights stubbed; nothing when it fails)."""
    from .proto import light_copy

    try:
        inferred = onnx.shape_inference.infer_shapes(light_copy(model))
    except Exception:  # a graph the checker rejects: no ranks, nothing rewritten
        return {}
    g = inferred.graph
    return {vi.name: len(vi.type.tensor_type.shape.dim) for vi in (*g.value_info, *g.input, *g.output)
            if vi.name in names and vi.type.tensor_type.HasField("shape")}


def global_pools_as_means(model: onnx.ModelProto) -> int:
    """GlobalAveragePool of a (B, S, C) tensor is the mean over its last axis, kept: ReduceMean."""
    g = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    pools = {n.input[0] for n in g.node if n.op_type == "GlobalAveragePool" and n.domain in ("", "ai.onnx")}
    if not pools:
        return 0
    ranks = _ranks(model, pools)
    count, taken = 0, {t.name for t in g.initializer} | {o for n in g.node for o in n.output}
    for i, n in enumerate(list(g.node)):
        if n.op_type != "GlobalAveragePool" or n.domain not in ("", "ai.onnx") or ranks.get(n.input[0]) != 3:
            continue
        name = n.name or n.output[0]
        if opset >= 18:
            axes = _unique(taken, f"{name}_axes")
            g.initializer.append(numpy_helper.from_array(np.array([2], np.int64), axes))
            mean = helper.make_node("ReduceMean", [n.input[0], axes], list(n.output), name=name, keepdims=1)
        else:
            mean = helper.make_node("ReduceMean", [n.input[0]], list(n.output), name=name, axes=[2],
                                    keepdims=1)
        g.node[i].CopyFrom(mean)
        count += 1
    return count


def refuse_unknown_ops(model: onnx.ModelProto, label: str) -> None:
    """One line naming the TensorFlow ops tf2onnx left unconverted (no ONNX schema: ORT cannot load them)."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    left: dict[str, int] = {}
    for n in model.graph.node:
        if n.domain not in ("", "ai.onnx"):
            continue
        try:
            onnx.defs.get_schema(n.op_type, opset, "")
        except onnx.defs.SchemaError:
            left[n.op_type] = left.get(n.op_type, 0) + 1
    if left:
        ops = ", ".join(f"{op} x{c}" for op, c in sorted(left.items()))
        raise FuseError(f"{label}: tf2onnx left TensorFlow ops with no ONNX equivalent ({ops}); ONNX Runtime "
                        "cannot run the converted model, nothing written")

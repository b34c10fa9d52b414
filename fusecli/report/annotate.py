"""``analyze --annotate``: a copy of the ONNX model with fusecli's results as metadata Netron shows.

Each analysed node gets ``metadata_props`` ``fusecli.saved_bytes`` (bytes backward keeps of its
outputs) and, when in a fusion match, ``fusecli.pattern`` and ``fusecli.verdict`` (comma-separated,
one per match, in the same order); the model gets totals (``fusecli.saved_bytes``,
``fusecli.peak_bytes``, ``fusecli.core.dims``, ``fusecli.matches``). Graph and weights are copied as they
are, the nodes in topological order where the file lists them otherwise; a model with external data is
refused (its weights live in other files). The copy is checked (onnx's checker, onnxruntime) before it is
written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.errors import FuseError
from .node_facts import facts_per_proto_node

if TYPE_CHECKING:
    import onnx

    from ..pipeline import Analysis

PREFIX = "fusecli."


def check_annotatable(model_path: str) -> None:
    """Refuse, before any analysis, a SavedModel or an ONNX model whose weights are in external data."""
    import onnx

    from ..load import is_savedmodel
    from ..load.onnx_wire import read_structure

    if is_savedmodel(model_path):
        raise FuseError(f"--annotate: {model_path} is a SavedModel; --annotate writes ONNX models only")
    try:
        model, _ = read_structure(model_path)
    except Exception:
        return  # unreadable: the loader says why
    tensors = [*model.graph.initializer,
               *(a.t for n in model.graph.node for a in n.attribute if a.HasField("t"))]
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in tensors):
        raise FuseError(f"--annotate: {model_path} keeps its weights in external data files; annotating "
                        "such a model is not supported")


def _set_props(props, values: dict[str, str]) -> None:
    """Replace earlier fusecli entries of a metadata_props list by ``values``."""
    keep = [(p.key, p.value) for p in props if not p.key.startswith(PREFIX)]
    del props[:]
    for key, value in [*keep, *values.items()]:
        entry = props.add()
        entry.key, entry.value = key, value


def annotate_model(a: Analysis, model: onnx.ModelProto) -> int:
    """Add fusecli's metadata to ``model`` in place; the number of nodes annotated."""
    count = 0
    for node, facts in zip(model.graph.node, facts_per_proto_node(a, model.graph), strict=True):
        if facts is None:
            continue
        values = {"fusecli.saved_bytes": f"{facts.saved_bytes}" + (" + unknown" if facts.saved_unknown
                                                                     else "")}
        if facts.fusions:
            values["fusecli.pattern"] = ", ".join(p for p, _ in facts.fusions)
            values["fusecli.verdict"] = ", ".join(v for _, v in facts.fusions)
        _set_props(node.metadata_props, values)
        count += 1
    live = a.liveness
    per_pattern: dict[str, dict[str, int]] = {}
    for m in a.matches:
        states = per_pattern.setdefault(m.pattern.name, {})
        states[m.verdict.state] = states.get(m.verdict.state, 0) + 1
    _set_props(model.metadata_props, {
        "fusecli.saved_bytes": str(live.saved_bytes),
        "fusecli.peak_bytes": str(live.peak_bytes),
        "fusecli.core.dims": ", ".join(f"{n}={a.sizes[n]}" for n in a.sizes.variables) or "fixed",
        "fusecli.matches": "; ".join(f"{p}: " + ", ".join(f"{c} {s}" for s, c in states.items())
                                     for p, states in per_pattern.items()) or "none",
    })
    return count


def write_annotated(a: Analysis, model_path: str, out_path: str) -> str:
    """Write the annotated copy of ``model_path`` to ``out_path`` (whole or not at all), its nodes in an
    order ONNX accepts, checked by onnx and onnxruntime before it replaces ``out_path``; a note."""
    import functools

    import onnx

    from ..core.output import atomic_write, check_model_file
    from ..load.onnx_order import sort_graph

    model = onnx.load(model_path, load_external_data=False)
    sort_graph(model.graph)  # a file listing a node before its inputs' makers is written in order
    count = annotate_model(a, model)
    check = functools.partial(check_model_file, original=model_path)
    with atomic_write(out_path, check=check) as f:
        f.write(model.SerializeToString())
    return f"wrote {out_path} (fusecli metadata on {count} nodes, for Netron)"

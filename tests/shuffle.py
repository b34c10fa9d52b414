"""A model's nodes listed in another order, and the analysis document two listings are compared by."""

from __future__ import annotations

import json
import random

import onnx


def shuffled(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """A copy of ``model`` whose graph lists its nodes in a random order (``seed``); nothing else moves."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    nodes = list(copy.graph.node)
    random.Random(seed).shuffle(nodes)
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy


def shuffle_file(path: str, out: str, seed: int) -> str:
    """``shuffled`` of the model file ``path`` (its external data left where it is), written to ``out``."""
    onnx.save(shuffled(onnx.load(path, load_external_data=False), seed), out)
    return out


def document(analysis) -> dict:
    """``analyze --json``'s document of an Analysis, as JSON reads it back, without the model's path."""
    from fusecli.report.document import to_json

    doc = json.loads(json.dumps(to_json(analysis), default=str))
    doc.pop("model", None)
    return doc


def first_difference(a, b, where: str = "") -> str | None:
    """Where two JSON values first differ, and how, as one line; None when they are equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            found = first_difference(a.get(k), b.get(k), f"{where}.{k}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{where or '.'}: {str(a)[:150]} != {str(b)[:150]}"

"""Loaders: one module per format, each ``path -> Graph``."""

from __future__ import annotations

import os

from ..core.errors import FuseError
from ..core.ir import Graph


def is_savedmodel(path: str) -> bool:
    """Whether ``path`` names a SavedModel (its folder, or the folder's saved_model.pb) rather than an ONNX
    file; the loader checks that it really is one."""
    return os.path.isdir(path) or os.path.basename(path) == "saved_model.pb"


def load_model(path: str, signature: str | None = None, constant_weights: bool = True) -> Graph:
    """Load an ONNX file or a SavedModel folder (its ``signature``, default serving_default) into a
    forward Graph (ONNX ``constant_weights``: Constant nodes in a weight's role are parameters);
    FuseError on bad input."""
    if os.path.basename(path) == "saved_model.pb" and os.path.isfile(path):
        path = os.path.dirname(path) or "."  # the SavedModel's own file names its folder
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "saved_model.pb")):
            raise FuseError(f"{path}: a folder without saved_model.pb is not a SavedModel")
        from .savedmodel import load_savedmodel

        graph = load_savedmodel(path, signature or "serving_default")
        graph.lint()
        return graph
    if signature is not None:
        raise FuseError(f"{path}: --signature applies to SavedModel folders only")
    from .onnx import load_onnx

    graph = load_onnx(path, constant_weights)
    graph.lint()
    return graph


def resolve_sizes(graph: Graph, sizes, routing: str | None = None) -> dict[str, int]:
    """Fill the dims the loader left open at the bound ``sizes`` with the format's shape tools; returns
    the values of dims that could be sized only as numbers (opaque names in the formulas). ``routing``:
    the user's assumption for mixture-of-experts routers (``load.routing``)."""
    if graph.format == "savedmodel":
        from .tf_sizes import resolve_sizes as resolve_savedmodel

        return resolve_savedmodel(graph, sizes, sizes.variables)
    structure = graph.meta.get("onnx_structure")
    if structure is None:
        return {}
    from .onnx_sizes import resolve_sizes as resolve_onnx

    model, omitted = structure
    return resolve_onnx(graph, sizes, sizes.variables, model, omitted, routing)

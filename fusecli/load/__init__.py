"""Loaders: one module per format, each ``path -> Graph``."""

from __future__ import annotations

import os

from ..errors import FuseError
from ..ir import Graph


def load_model(path: str) -> Graph:
    """Load an ONNX file or a SavedModel folder into a forward Graph; FuseError on bad input."""
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "saved_model.pb")):
            raise FuseError(f"{path}: SavedModel loading is not available yet in this version")
        raise FuseError(f"{path}: a folder without saved_model.pb is not a SavedModel")
    from .onnx import load_onnx

    graph = load_onnx(path)
    graph.lint()
    return graph

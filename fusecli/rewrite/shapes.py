"""Shapes ONNX's inference leaves open (``unk__3``), filled in by onnxruntime's symbolic shape inference.

Only an emitter's checks read them (is the skip of a SkipLayerNormalization the input's shape or its
(1, S, H) broadcast?); verdicts are computed before. Symbolic inference merges dims it cannot tell apart
(``auto_merge``), so a wrong guess fails at verification time in onnxruntime's shape checks.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import sys

import onnx
from onnx import helper

from ..ir import Graph
from .proto import is_big_constant, light_copy

MAX_ROUNDS = 8  # rounds of symbolic inference (each merges dims found equal; real models need 1-3)


def _open(shape) -> bool:
    return shape is None or any(d is None or (isinstance(d, str) and d.startswith("unk__")) for d in shape)


def _weights_as_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with big float weights (initializers and Constant nodes) turned into graph inputs:
    shapes known, values never read."""
    light = light_copy(model)
    stubs = [t for t in light.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    constants = [n for n in light.graph.node if is_big_constant(n) and n.output and n.output[0]]
    if constants:
        made = {id(n) for n in constants}
        nodes = [n for n in light.graph.node if id(n) not in made]
        del light.graph.node[:]
        light.graph.node.extend(nodes)
        stubs += [onnx.TensorProto(name=n.output[0], data_type=n.attribute[0].t.data_type,
                                   dims=n.attribute[0].t.dims) for n in constants]
    names = {t.name for t in stubs}
    listed = {i.name for i in light.graph.input}
    kept = [t for t in light.graph.initializer if t.name not in names]
    del light.graph.initializer[:]
    light.graph.initializer.extend(kept)
    light.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in stubs if t.name not in listed)
    return light


def _symbolic_shape_inference():
    """onnxruntime's SymbolicShapeInference, loaded from its file: importing it as
    ``onnxruntime.tools.symbolic_shape_infer`` runs ``onnxruntime.tools``' ``__init__``, which imports
    torch when it is installed (seconds) for a helper this module does not use."""
    name = "fusecli_ort_symbolic_shape_infer"
    module = sys.modules.get(name)
    if module is None:
        origin = importlib.util.find_spec("onnxruntime").origin
        path = os.path.join(os.path.dirname(origin), "tools", "symbolic_shape_infer.py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return module.SymbolicShapeInference


def refine_shapes(model: onnx.ModelProto, graph: Graph) -> int:
    """Give activations with open dims the symbolic shapes onnxruntime infers; how many were refined."""
    open_tensors = [t for t in graph.tensors.values() if t.kind == "activation" and _open(t.shape)]
    if not open_tensors:
        return 0
    try:
        SymbolicShapeInference = _symbolic_shape_inference()  # noqa: N806 (a class)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            # SymbolicShapeInference.infer_shapes, less its dump of sym_shape_infer_temp.onnx into the
            # current folder when some shape stays unknown (the partial result is still of use here)
            sym = SymbolicShapeInference(2**31 - 1, True, False, 0)
            sym._preprocess(_weights_as_inputs(model))
            for _ in range(MAX_ROUNDS):  # its own loop (run_ set again each round) can go on forever
                if not sym.run_:
                    break
                sym._infer_impl()
            inferred = sym.out_mp_
    except Exception:  # an optional refinement: any failure leaves the shapes as they were
        return 0
    shapes = {}
    for v in inferred.graph.value_info:
        tt = v.type.tensor_type
        if v.type.HasField("tensor_type") and tt.HasField("shape"):
            shapes[v.name] = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                   for d in tt.shape.dim)
    refined = 0
    for t in open_tensors:
        s = shapes.get(t.name)
        if s is not None and not _open(s) and (t.shape is None or len(s) == len(t.shape)):
            t.shape = s
            refined += 1
    return refined

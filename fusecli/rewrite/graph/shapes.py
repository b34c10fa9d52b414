"""Shapes ONNX's inference leaves open (``unk__3``), filled in by onnxruntime's symbolic shape inference.

Only an emitter's checks read them (is the skip of a SkipLayerNormalization the input's shape or its
(1, S, H) broadcast?); verdicts are computed before. Symbolic inference merges dims it cannot tell apart
(``auto_merge``), so a wrong guess fails at verification time in onnxruntime's shape checks.
"""

from __future__ import annotations

import onnx
from onnx import helper

from ...core.ir import Graph
from ...load.onnx_sizes import ort_symbolic_shapes
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


def refine_shapes(model: onnx.ModelProto, graph: Graph) -> int:
    """Give activations with open dims the symbolic shapes onnxruntime infers; how many were refined."""
    open_tensors = [t for t in graph.tensors.values() if t.kind == "activation" and _open(t.shape)]
    if not open_tensors:
        return 0
    shapes = ort_symbolic_shapes(_weights_as_inputs(model), passes=MAX_ROUNDS)
    if shapes is None:  # an optional refinement: any failure leaves the shapes as they were
        return 0
    refined = 0
    for t in open_tensors:
        s = shapes.get(t.name)
        if s is not None and not _open(s) and (t.shape is None or len(s) == len(t.shape)):
            t.shape = s
            refined += 1
    return refined

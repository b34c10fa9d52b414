"""What a tf2onnx (or keras2onnx) conversion says about the TensorFlow graph it was converted from.

tf2onnx converts a SavedModel's serving function, TensorFlow's inference graph: BatchNormalization runs
with its moving statistics, the variables are frozen into initializers, and its optimizer may fold a
BatchNorm into the convolution before it. fusecli differentiates the converted graph with TensorFlow's
habits (``grad.profiles.TENSORFLOW``), which depend on the TensorFlow graph the file keeps:

- a dim TensorFlow's graph leaves unknown (the batch) is a symbolic dim in the file (``unk__38``):
  ``meta["graph_shape"]`` has it as None, as the SavedModel loader does, so that an ``AddV2``'s gradient
  keeps both operands to read their shapes (``tensorflow_keeps_for_shape``);
- a per-channel ``Add`` is a ``bias_add`` for fusion, but TensorFlow ran it as ``AddV2`` (Keras 3's
  BatchNorm ``x * scale + shift``, EinsumDense's bias) unless TensorFlow named it ``BiasAdd``: it keeps
  ``AddV2``'s gradient, which reads both operands' shapes;
- the layout ops tf2onnx adds (NHWC <-> NCHW Transposes, a Squeeze after a keepdims Mean, the Reshapes
  and Transposes it writes Einsum with) are none TensorFlow runs (``meta["converter_made"]``): a
  backward read of their output is TensorFlow's read of the tensor they copy (the NHWC input, Einsum's
  operands), and their own gradients' shape reads keep nothing;
- TensorFlow's ``Rsqrt`` is written ``Reciprocal(Sqrt(x))``: its gradient reads the Reciprocal's output
  alone, as ``RsqrtGrad`` reads Rsqrt's;
- TensorFlow's ``Erfc`` (Keras's exact gelu), which tf2onnx leaves as it is though ONNX has no such op,
  is shaped as Erf is, so that what follows it is sized (``tf_ops_as_onnx``, ``for_sizing``);
- TensorFlow's ``SquaredDifference`` (LayerNormalization's variance) is written ``Mul(d, d)`` of
  ``d = Sub(x, y)``: its gradient reads x and y, as TensorFlow's does, not d;
- a BatchNorm folded into the convolution before it leaves no trace of its input, which TensorFlow keeps
  for the gradient of gamma: a warning says so (``folded_batch_norms``).
"""

from __future__ import annotations

import re

import onnx

from ..core.ir import Graph

TENSORFLOW_CONVERTERS = ("tf2onnx", "keras2onnx")
# a Keras BatchNormalization's ops are named "<layer>/batchnorm/..." (Keras 3, tf-keras's unfused BN),
# tf-keras's fused one "<layer>/FusedBatchNormV3"; tf2onnx keeps TensorFlow's names on what it converts
_BN_NAME = re.compile(r"^(.*?)/(batchnorm/|FusedBatchNorm(V2|V3)?(:|/|$))")
_MADE_BY_CONVERTER = re.compile(r"__\d+(:\d+)?$")  # tf2onnx's own nodes: make_name's "<name>__<n>"
_LAYOUT_KINDS = frozenset({"transpose", "squeeze", "unsqueeze", "reshape", "flatten", "identity"})
# TensorFlow's elementwise ops tf2onnx leaves in the default domain -> an ONNX op of the same shapes
_TF_ELEMENTWISE = {"Erfc": "Erf"}
_BN_OPS = frozenset({"Mul", "BatchNormalization"})  # the BN's scaling, where it was not folded


def refine_tf2onnx(graph: Graph) -> None:
    """Annotate a tf2onnx conversion in place: TensorFlow's graph shapes, and a warning for each folded
    BatchNorm. Any other producer: nothing."""
    if graph.meta.get("producer") not in TENSORFLOW_CONVERTERS:
        return
    for n in graph.nodes:  # tf2onnx's own layout ops: NHWC <-> NCHW, keepdims, Einsum as Transpose + MatMul
        if n.kind in _LAYOUT_KINDS and _MADE_BY_CONVERTER.search(n.name) and n.input(0) is not None:
            n.meta["converter_made"] = True
    for t in graph.tensors.values():  # TensorFlow's unknown dims are the file's symbolic ones, on the
        # tensors TensorFlow computes (a conv tf2onnx renamed "Conv__349" after folding a BatchNorm too)
        if t.shape is not None and (t.producer is None or not t.producer.meta.get("converter_made")):
            t.meta.setdefault("graph_shape", tuple(d if isinstance(d, int) else None for d in t.shape))
    for n in graph.nodes:  # a per-channel Add TensorFlow ran as AddV2, not BiasAdd: AddV2's gradient
        if n.kind == "bias_add" and n.op_type == "Add" and not _MADE_BY_CONVERTER.search(n.name) \
                and not n.name.rsplit("/", 1)[-1].startswith("BiasAdd"):  # reads both shapes
            n.meta["grad_kind"] = "add"
    for n in graph.nodes:  # TensorFlow's Rsqrt, which tf2onnx writes Reciprocal(Sqrt(x)): one RsqrtGrad
        x = n.input(0) if n.op_type == "Reciprocal" else None  # that reads y (-y^3 / 2), nothing on Sqrt's
        if x is not None and x.producer is not None and x.producer.op_type == "Sqrt" \
                and x.producer.name.rsplit("/", 1)[-1].startswith("Rsqrt") and len(x.consumers) == 1:
            n.meta["grad_kind"], x.producer.meta["grad_kind"] = "rsqrt", "identity"
    for n in graph.nodes:  # TensorFlow's SquaredDifference, which tf2onnx writes d = Sub(x, y); Mul(d, d):
        d = n.input(0) if n.op_type == "Mul" and len(n.inputs) == 2 and n.inputs[0] is n.inputs[1] else None
        if d is not None and d.producer is not None and d.producer.op_type == "Sub" \
                and d.producer.name.rsplit("/", 1)[-1].startswith("SquaredDifference") \
                and all(c is n for c in d.consumers):
            n.meta["grad_kind"], d.producer.meta["grad_kind"] = "identity", "squared_difference"  # reads x, y
    folded = folded_batch_norms(graph)
    if folded:
        graph.meta["folded_batch_norms"] = folded
        graph.meta.setdefault("warnings", []).append(
            f"an inference graph (tf2onnx converts the serving function): {len(folded)} BatchNorm "
            f"layer{'s were' if len(folded) > 1 else ' was'} folded into the convolution before "
            f"{'them' if len(folded) > 1 else 'it'} ({folded[0]}{', ...' if len(folded) > 1 else ''}); "
            "the convolution's own output, which TensorFlow keeps for the BatchNorm's backward, is not "
            "in the file, so the saved bytes leave it out")


def folded_batch_norms(graph: Graph) -> list[str]:
    """The BatchNorm layers (name scopes) whose parameters feed a convolution or matmul in place of a BN
    op of their own: tf2onnx folded them (their scaling is in the weights, their shift in the bias)."""
    kept, folded = set(), []
    for n in graph.nodes:
        m = _BN_NAME.match(n.name)
        if m and n.op_type in _BN_OPS:
            kept.add(m.group(1))
    for n in graph.nodes:
        if n.kind not in ("conv", "conv_transpose", "matmul", "gemm"):
            continue
        # the BN's name on a weight, or on the conv itself: tf2onnx names the fused conv after the BN op
        # it absorbed (``<bn>/batchnorm/mul_1``) when it merges the scale into the weights (merged_input)
        names = [t.name for t in n.inputs[1:] if t is not None and t.producer is None] + [n.name]
        for m in filter(None, map(_BN_NAME.match, names)):
            if m.group(1) not in kept and m.group(1) not in folded:
                folded.append(m.group(1))
    return folded



def tf_ops_as_onnx(model: onnx.ModelProto) -> list[int]:
    """Rename, in place, the elementwise TensorFlow ops a tf2onnx model keeps though ONNX lacks them
    (``Erfc``) to an ONNX op of the same shapes (``Erf``), so that the shape tools go on past them;
    returns their node indices, for ``restore_tf_ops``. Any other model: nothing."""
    if model.producer_name not in TENSORFLOW_CONVERTERS:
        return []
    renamed = [k for k, n in enumerate(model.graph.node) if n.op_type in _TF_ELEMENTWISE
               and n.domain in ("", "ai.onnx")]
    for k in renamed:
        model.graph.node[k].op_type = _TF_ELEMENTWISE[model.graph.node[k].op_type]
    return renamed


def restore_tf_ops(model: onnx.ModelProto, renamed: list[int]) -> None:
    """Undo ``tf_ops_as_onnx`` on ``model`` (or on a shape-inferred copy: the same nodes in order)."""
    back = {v: k for k, v in _TF_ELEMENTWISE.items()}
    for k in renamed:
        model.graph.node[k].op_type = back[model.graph.node[k].op_type]


def for_sizing(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model the shape tools size at the user's dims: a copy with ``tf_ops_as_onnx`` applied when it
    has such ops, else the model itself."""
    if model.producer_name not in TENSORFLOW_CONVERTERS \
            or not any(n.op_type in _TF_ELEMENTWISE for n in model.graph.node):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    tf_ops_as_onnx(copy)
    return copy

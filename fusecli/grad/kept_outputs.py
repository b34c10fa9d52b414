"""Outputs a forward kernel keeps for its own backward where the export leaves them unnamed.

ONNX's LayerNormalization computes Mean and InvStdDev (its optional outputs 1 and 2), and training keeps
both for the gradient: PyTorch's native_layer_norm saves them as mean and rstd (derivatives.yaml:
``native_layer_norm_backward(grad, input, shape, result1, result2, weight, bias)``), onnxruntime's
LayerNormalizationGrad reads them as saved_mean and saved_inv_std_dev. An export made for inference names
only Y; the backward builder makes the others here, shaped as the spec shapes them (x's dims before
``axis``, then 1s), so that liveness counts them as the framework does.
"""

from __future__ import annotations

from collections.abc import Callable

from ..core.ir import Graph, Node

# ONNX TensorProto element types a LayerNormalization's stash_type may name
_STASH_DTYPES = {1: "float32", 10: "float16", 11: "float64", 16: "bfloat16"}


def layer_norm_stats(node: Node, framework: str, device: str) -> list[tuple[int, str, str, tuple | None]]:
    """(output index, name suffix, dtype, shape) of Mean and InvStdDev: one value per normalized row.
    PyTorch keeps x's dtype on CPU and float32 for float16/bfloat16 on CUDA (acc_type); the ONNX spec
    computes them in ``stash_type`` (float32 unless the node says otherwise)."""
    x = node.inputs[0] if node.inputs else None
    if x is None:
        return []
    if framework == "pytorch":
        dtype = "float32" if device == "cuda" and x.dtype in ("float16", "bfloat16") else x.dtype
    else:
        stash = node.attrs.get("stash_type", 1)
        dtype = _STASH_DTYPES.get(stash, x.dtype) if isinstance(stash, int) else x.dtype
    shape = None
    axis = node.attrs.get("axis", -1)
    if x.shape is not None and isinstance(axis, int):  # (the linter reports an axis of another type)
        rank = len(x.shape)
        axis = axis + rank if axis < 0 else axis
        if 0 <= axis <= rank:
            shape = (*x.shape[:axis], *(1,) * (rank - axis))
    return [(1, "mean", dtype, shape), (2, "inv_std_dev", dtype, shape)]


# kind -> the outputs its kernel keeps for backward, named or not
KEPT_OUTPUTS: dict[str, Callable[[Node, str, str], list[tuple[int, str, str, tuple | None]]]] = {
    "layer_norm": layer_norm_stats,  # mean and 1/sqrt(var + eps) per row
}


def make_kept_outputs(joint: Graph, node: Node, kind: str, framework: str, device: str) -> None:
    """Give ``node`` (of the joint graph) the outputs its kernel keeps and the export does not name:
    activations it produces, named '<node>.mean' and so on."""
    for index, suffix, dtype, shape in KEPT_OUTPUTS[kind](node, framework, device):
        outputs = node.outputs
        if index < len(outputs) and outputs[index] is not None:
            continue  # the export names it: the rule reads it as it is
        name = f"{node.name}.{suffix}"
        while name in joint.tensors:
            name += "_"
        t = joint.tensor(name, dtype=dtype, shape=shape, kind="activation")
        t.producer = node
        outputs.extend([None] * (index + 1 - len(outputs)))
        outputs[index] = t


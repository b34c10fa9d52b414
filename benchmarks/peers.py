"""The optimizers users already run, on one ONNX file each, and one way to count what they fused.

- ``ort_extended``: ONNX Runtime's offline model at ORT_ENABLE_EXTENDED (CPU provider).
- ``ort_transformers``: ``onnxruntime.transformers.optimizer.optimize_model`` (ONNX Runtime's own
  transformer fusions, given the model type, heads and hidden size; ``opt_level=0`` so that only its
  Python fusions run, not a session's).
- ``onnxscript_ort``: ``onnxscript.rewriter.ort_fusions.optimize_for_ort``.

A *fused kernel* is a node of the ``com.microsoft`` domain, or an ONNX-domain op that only a fusion
makes (``ONNX_FUSED``: LayerNormalization, SimplifiedLayerNormalization, ...) beyond those the
original model already had.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections import Counter

import onnx

ONNX_FUSED = ("LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization", "Gelu", "Attention",
              "RotaryEmbedding", "HardSwish")


def op_counts(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
                   for n in model.graph.node)


def fused(model: onnx.ModelProto, original: onnx.ModelProto) -> Counter:
    """The fused kernels of ``model`` by op type (see the module docstring)."""
    after, before = op_counts(model), op_counts(original)
    out = Counter()
    for op, n in after.items():
        if op.startswith("com.microsoft."):
            out[op.removeprefix("com.microsoft.")] += n
        elif op in ONNX_FUSED and n > before.get(op, 0):
            out[op] += n - before.get(op, 0)
    return out


def ort_extended(path: str, out_path: str) -> onnx.ModelProto:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = out_path
    so.log_severity_level = 3
    ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return onnx.load(out_path)


def ort_transformers(path: str, model_type: str, heads: int, hidden: int) -> onnx.ModelProto:
    from onnxruntime.transformers.optimizer import optimize_model

    with _quiet():
        opt = optimize_model(path, model_type=model_type, num_heads=heads, hidden_size=hidden, opt_level=0,
                             use_gpu=False)
    return opt.model


def onnxscript_ort(path: str) -> onnx.ModelProto:
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    with _quiet():
        model = ir.load(path)
        model, _ = optimize_for_ort(model)
        return ir.to_proto(model)


@contextlib.contextmanager
def _quiet():
    """The peers log every fusion at INFO/WARNING; the benchmark prints its own lines."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    for name in ("onnxruntime", "onnxscript", "fusion"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.setLevel(level)


def save(model: onnx.ModelProto, path: str) -> str:
    big = model.ByteSize() > 1_500_000_000
    onnx.save_model(model, path, save_as_external_data=big, all_tensors_to_one_file=True,
                    location=os.path.basename(path) + ".data" if big else None)
    return path

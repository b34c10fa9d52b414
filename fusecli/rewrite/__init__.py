"""fusecli rewrite: turn fusion matches into ONNX Runtime kernels, fold what folds, verify, write.

Modules, one job each: ``source`` (ONNX file or SavedModel -> ONNX), ``values`` (weights and constant
subgraphs), ``fold`` (BatchNorm / scale-shift / bias folding math), ``emit`` (a match -> com.microsoft
nodes), ``plan`` (non-overlapping matches for a target and mode), ``edit`` (graph surgery), ``verify``
(onnxruntime comparison and --bench), ``save`` (atomic write, external data past 2 GB), ``run`` (the flow).
"""

from .run import RewriteOptions, RewriteResult, rewrite

__all__ = ["RewriteOptions", "RewriteResult", "rewrite"]

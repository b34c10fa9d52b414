"""fusecli rewrite: turn fusion matches into ONNX Runtime kernels, fold what folds, verify, write.

Modules, one job each: ``source`` (ONNX file or SavedModel -> ONNX), ``values`` (weights and constant
subgraphs), ``fold`` (BatchNorm / scale-shift / bias folding math), ``kit`` (what an emitter reads and
writes), ``emit_*`` (each family's kernels; the registry is the fusion families'), ``plan``
(non-overlapping matches for a target and mode), ``edit`` (graph surgery), ``verify`` (onnxruntime
comparison and --bench), ``save`` (atomic write, external data past 2 GB), ``run`` (the flow).

The flow is imported on first use: the fusion families import this package's kernel modules, and the
flow imports the analysis.
"""

__all__ = ["RewriteOptions", "RewriteResult", "rewrite"]


def __getattr__(name: str):
    if name in __all__:
        from . import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

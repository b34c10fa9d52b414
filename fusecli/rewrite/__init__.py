"""fusecli rewrite: turn fusion matches into ONNX Runtime kernels, fold what folds, verify, write.

On top, the command: ``run`` (the flow), ``plan`` (non-overlapping matches for a target and mode),
``source`` (ONNX file or SavedModel -> ONNX), ``report`` (the summary and --json). Below it, three packages,
arrows pointing down (tests/test_imports.py checks them):

- ``verify/``: the numerical checks: ``outputs`` (onnxruntime comparison and --bench), ``regions`` (each
  fused region cut out on its own), ``benchverdict`` (--bench in words). Imports graph/ and kernels/'s
  ``cuda``.
- ``kernels/``: one emitter module per kernel family (match -> the nodes that replace it), ``registry``
  (kernel key -> emitter), what only emitters share (``mask_band``, ``merged_heads``), and ``cuda`` (the
  kernels the CUDA provider has, and the CPU stand-ins verification runs). Imports graph/.
- ``graph/``: editing and saving the ModelProto: ``kit`` (what an emitter reads and writes, the Emission the
  edits apply), ``edit`` and ``sound`` (graph surgery and its checks), ``values`` (weights and constant
  subgraphs), ``fold`` (BatchNorm / scale-shift / bias folding math), ``save`` and ``splice`` (atomic
  write, external data past 2 GB). Imports neither.

The flow is imported on first use: this package, or a kernel, edit or check module, loads no pipeline.
"""

__all__ = ["RewriteOptions", "RewriteResult", "rewrite"]


def __getattr__(name: str):
    if name in __all__:
        from . import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

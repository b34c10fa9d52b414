"""onnxscript's transformer graphs saved two ways: weights as Constant nodes, and weights as initializers.

``onnxscript.rewriter.models`` ships SmolLM, Phi-2, BART-encoder and Whisper encoder/decoder graphs as
code, each with ``make_model_with_random_weights()``; they hold every weight in a ``Constant`` node.
``save(name, folder)`` writes ``<name>.constants.onnx`` (as built, 0 initializers) and
``<name>.initializers.onnx`` (onnx_ir's LiftConstantsToInitializersPass: every Constant of at least 16
elements becomes an initializer), both through ``onnx_ir.save``. The tests use the small ones (BART,
Whisper encoder); benchmarks/bench_constant_weights.py all of them.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

# name -> onnxscript module (under onnxscript.rewriter.models)
MODELS = {"bart_encoder": "_bart_encoder", "whisper_encoder": "_whisper_encoder",
          "whisper_decoder": "_whisper_decoder", "smollm_1": "_smollm_1", "smollm_2": "_smollm_2",
          "phi2": "_phi2lm"}
SMALL = ("bart_encoder", "whisper_encoder")


def paths(name: str, folder: Path) -> tuple[Path, Path]:
    """(weights as Constant nodes, weights as initializers)."""
    return folder / f"{name}.constants.onnx", folder / f"{name}.initializers.onnx"


def save(name: str, folder: Path, lifted: bool = True) -> tuple[Path, Path]:
    """Build the model (seeded) and write both files (``lifted=False``: the Constant-node one only),
    unless they are there already."""
    import numpy as np
    import onnx_ir as ir
    from onnx_ir.passes.common import LiftConstantsToInitializersPass

    constants, initializers = paths(name, folder)
    if constants.exists() and (initializers.exists() or not lifted):
        return constants, initializers
    folder.mkdir(parents=True, exist_ok=True)
    np.random.seed(0)  # the builders draw their weights from numpy's global generator
    module = importlib.import_module(f"onnxscript.rewriter.models.{MODELS[name]}")
    proto = module.make_model_with_random_weights()
    model = ir.serde.deserialize_model(proto)
    del proto
    for target, lift in ((constants, False), (initializers, True))[:2 if lifted else 1]:
        if lift:
            LiftConstantsToInitializersPass(size_limit=16)(model)
        tmp = target.with_suffix(".tmp")
        ir.save(model, str(tmp))
        os.replace(tmp, target)
    return constants, initializers


if __name__ == "__main__":  # python tests/load/onnxscript_models.py FOLDER NAME...
    for n in sys.argv[2:]:
        print(*save(n, Path(sys.argv[1])))

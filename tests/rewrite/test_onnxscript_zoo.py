"""onnxscript's Whisper encoder and decoder and SmolLM-1 (``onnxscript.rewriter.models``, weights in Constant
nodes) are rewritten and verified: Whisper's LayerNorm weights are ``CastLike(w, residual sum)``, which once
made the SkipLayerNormalization read its own output ('the graph has a cycle'); SmolLM-1 rotates q and k
with cos / sin computed from its position ids, and scales q and K^T (a 3D Reshape-Transpose-Reshape)
each. At least as many fused kernels as onnxscript's ``optimize_for_ort`` makes on the same files, run here
(with onnxscript 0.7.2: encoder 6 - Gelu 2, SkipLayerNormalization 2, Attention 1, BiasGelu 1; decoder 7 -
SkipLayerNormalization 4, MultiHeadAttention 2, BiasGelu 1; SmolLM-1 6 - RotaryEmbedding 2,
SkipSimplifiedLayerNormalization 2, MultiHeadAttention 1, FusedMatMul 1, besides its ONNX-domain
SimplifiedLayerNormalization, which fusecli writes too)."""

from __future__ import annotations

from collections import Counter

import onnx
import pytest

from fusecli.rewrite import RewriteOptions, rewrite
from fusecli.rewrite.graph.edit import undefined_read
from tests.load.onnxscript_models import save
from tests.rewrite.helpers import left_unfused

ZOO = ("whisper_encoder", "whisper_decoder", "smollm_1")
MUST = {"whisper_encoder": {"SkipLayerNormalization": 2, "MultiHeadAttention": 1},
        "whisper_decoder": {"SkipLayerNormalization": 2, "MultiHeadAttention": 1},
        "smollm_1": {"RotaryEmbedding": 2, "SkipSimplifiedLayerNormalization": 2, "MultiHeadAttention": 1}}


@pytest.fixture(scope="session")
def zoo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("zoo")
    return lambda name: str(save(name, folder, lifted=False)[0])


def onnxscript_kernels(path: str) -> Counter:
    """The com.microsoft nodes onnxscript's own ``optimize_for_ort`` writes for the model at ``path``."""
    import logging

    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    logging.getLogger("onnxscript").setLevel(logging.ERROR)
    model, _ = optimize_for_ort(ir.load(path))
    return Counter(n.op_type for n in ir.to_proto(model).graph.node if n.domain == "com.microsoft")


@pytest.mark.parametrize("name", ZOO)
def test_zoo_rewrites_and_verifies(zoo, name, tmp_path):
    out = str(tmp_path / "out.onnx")
    r = rewrite(zoo(name), RewriteOptions(), out)
    assert not left_unfused(r.warnings), r.warnings
    assert r.verification.ok and r.verification.regions == len(r.applied) and r.verification.region_checks
    written = onnx.load(out)
    onnx.checker.check_model(_ort_domain_ops_aside(written))
    assert undefined_read(written) is None
    kernels = Counter(n.op_type for n in written.graph.node if n.domain == "com.microsoft")
    peer = onnxscript_kernels(zoo(name))
    assert peer and sum(kernels.values()) >= sum(peer.values()), (kernels, peer)
    assert all(kernels[k] >= n for k, n in MUST[name].items()), kernels
    fused = {o for f in written.graph.node if f.domain == "com.microsoft" for o in f.output}
    assert not any(n.op_type == "CastLike" and n.input[1] in fused for n in written.graph.node)


def _ort_domain_ops_aside(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy the ONNX checker takes: onnxruntime's own ONNX-domain SimplifiedLayerNormalization (no ONNX
    schema) moved to the contrib domain, which the checker does not look into."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for n in copy.graph.node:
        if n.op_type == "SimplifiedLayerNormalization" and n.domain in ("", "ai.onnx"):
            n.domain = "com.microsoft"
    return copy

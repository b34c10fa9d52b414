"""Mixtral with transformers' eager experts (TorchScript, default attention) rewritten under
``--routing balanced``: the routed tokens are sized, so every region is cut out and verified on its own; the
experts' x @ w[e]^T become FusedMatMul(transB). At least as many fused kernels as ONNX Runtime's own
ORT_ENABLE_EXTENDED offline model of the same file (its MatMulTransposeFusion, QuickGelu and
SimplifiedLayerNormalization)."""

from __future__ import annotations

from collections import Counter

import onnx
import pytest

from fusecli.core.errors import FuseError
from fusecli.rewrite import RewriteOptions, rewrite
from tests.rewrite.helpers import left_unfused

FUSED_ONNX_DOMAIN = ("SimplifiedLayerNormalization", "LayerNormalization")  # only fusions make them


def _fused(model: onnx.ModelProto, original: onnx.ModelProto) -> Counter:
    before = Counter(n.op_type for n in original.graph.node if n.domain in ("", "ai.onnx"))
    out = Counter(n.op_type for n in model.graph.node if n.domain == "com.microsoft")
    after = Counter(n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx"))
    out.update({op: after[op] - before[op] for op in FUSED_ONNX_DOMAIN if after[op] > before[op]})
    return out


def _ort_extended(path: str, out: str) -> onnx.ModelProto:
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = out
    ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return onnx.load(out)


def test_mixtral_rewrites_every_region_verified(hf_onnx, tmp_path):
    path = hf_onnx("mixtral", "torchscript", attn="default")
    out = str(tmp_path / "fused.onnx")
    options = RewriteOptions(batch=2, dims={"seq": 32}, routing="balanced", verify_scope="regions")
    r = rewrite(path, options, out)
    assert r.verification.ok and r.verification.regions == len(r.applied)
    assert not left_unfused(r.warnings), r.warnings
    original = onnx.load(path)
    ours = _fused(onnx.load(out), original)
    peer = _fused(_ort_extended(path, str(tmp_path / "ort.onnx")), original)
    assert ours["FusedMatMul"] == 16  # 2 layers x 4 experts x (gate_up, down)
    assert ours["MultiHeadAttention"] == 2 and ours["RotaryEmbedding"] == 4
    assert sum(ours.values()) >= sum(peer.values()), (ours, peer)


def test_auto_verify_falls_back_to_regions_when_the_original_cannot_run(hf_onnx, tmp_path):
    """The TorchScript export runs only when every expert gets a token (its loop indexes each expert's
    tokens): on fusecli's random input the original model itself fails, so ``--verify auto`` (the default)
    says so and stands on the regions' checks, which cover every region here."""
    path = hf_onnx("mixtral", "torchscript", attn="default")
    options = RewriteOptions(batch=2, dims={"seq": 32}, routing="balanced")
    r = rewrite(path, options, str(tmp_path / "fused.onnx"))
    v = r.verification
    assert v.ok and not v.uncut and v.regions == len(r.applied) and not v.checks
    assert v.model_skipped.startswith("the original model does not run on random inputs"), v.model_skipped
    assert any("only the fused regions were verified" in w for w in r.warnings), r.warnings
    with pytest.raises(FuseError, match="failed to run the original model"):
        rewrite(path, RewriteOptions(batch=2, dims={"seq": 32}, routing="balanced", verify_scope="model"),
                str(tmp_path / "whole.onnx"))

"""Spellings the exporters write for real `transformers` models (default attention, both torch exporters),
found by the catalogue: OPT's residual sum reshaped before its LayerNorm, Phi-3's fused gate_up
projection split in two before SwiGLU, BLOOM's and the Gemmas' tanh-GELU spellings."""

from __future__ import annotations

from collections import Counter

import pytest

from fusecli.pipeline import Options, analyze

EXPORTERS = ("torchscript", "dynamo")


def _matches(hf_onnx, name: str, exporter: str):
    a = analyze(hf_onnx(name, exporter, attn="default"), Options(batch=2, dims={"seq": 32}))
    return a, Counter(m.pattern.name for m in a.matches)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_opt_skip_layer_norm_through_the_reshape(hf_onnx, exporter):
    """Add -> Reshape (batch seq, hidden) -> LayerNorm: every LayerNorm after a residual sum is a skip norm
    (2 layers x 2 + the final norm), training-safe: the kernel writes the sum (and its view) out."""
    a, counts = _matches(hf_onnx, "opt", exporter)
    norms = sum(1 for n in a.graph.nodes if n.kind == "layer_norm")
    skips = [m for m in a.matches if m.pattern.name == "skip_layer_norm"]
    assert counts["skip_layer_norm"] == norms == 5
    assert {m.verdict.state for m in skips} == {"training-safe"}
    assert sum("skip_layout" in m.roles for m in skips) >= 3


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_phi3_swiglu_over_the_split_gate_up_projection(hf_onnx, exporter):
    _, counts = _matches(hf_onnx, "phi3", exporter)
    assert counts["swiglu"] == 2


@pytest.mark.parametrize(("name", "exporter"), [("bloom", "torchscript"), ("bloom", "dynamo"),
                                                ("gemma", "torchscript"), ("gemma2", "torchscript"),
                                                ("gemma3_text", "torchscript")])
def test_tanh_gelu_spellings(hf_onnx, name, exporter):
    """BLOOM: x * 0.5 * (1 + tanh(0.79788456 x (1 + 0.044715 x x))); Gemma, Gemma2 and Gemma3 under
    TorchScript: the cube as x * (x * x). (Their dynamo exports write ONNX's Gelu op itself: nothing to
    fuse.)"""
    a, counts = _matches(hf_onnx, name, exporter)
    # after a MatMul and its bias: GemmFastGelu's match, with bias_gelu's inside
    assert counts["gelu"] + counts["bias_gelu"] + counts["matmul_fast_gelu"] == 2, counts

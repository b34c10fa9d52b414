"""A small BERT from a transformers config (random weights, nothing downloaded), exported by PyTorch:
the rewrite finds its GELU, LayerNorm, SkipLayerNorm and attention-scale matches, verifies, and holds at
least as many fused kernels as ONNX Runtime's ORT_ENABLE_EXTENDED optimizer makes of the same file."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

from fusecli.pipeline import Options, analyze
from fusecli.rewrite import RewriteOptions, rewrite
from fusecli.rewrite.verify.outputs import ort_optimized
from tests.rewrite.helpers import assert_cuda_kernels_only, assert_same_outputs, fused_kernel_count, ops

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

DIMS = {"seq": 16}


def _bert(seed: int = 0):
    """BertModel(hidden 64, 2 layers, 2 heads, intermediate 128), eager attention, every weight random."""
    torch.manual_seed(seed)
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=128, vocab_size=100, max_position_embeddings=64)
    config._attn_implementation = "eager"  # the matmul/softmax attention the catalogue is written against
    bert = transformers.BertModel(config).eval()
    with torch.no_grad():
        for p in bert.parameters():  # zeros and ones (fresh biases, LayerNorm) would hide swapped operands
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.dim() == 1 and "LayerNorm.weight" in _name(bert, p)
                                                 else 0.0))

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
            return out.last_hidden_state, out.pooler_output

    return Wrapped().eval()


def _name(module, param) -> str:
    return next(n for n, p in module.named_parameters() if p is param)


def _export(path, opset: int, dynamo: bool = False) -> str:
    ids, mask = torch.randint(0, 100, (2, 16)), torch.ones(2, 16, dtype=torch.int64)
    names = dict(input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state", "pooler"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            dim = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq", max=64)}
            torch.onnx.export(_bert(), (ids, mask), str(path), dynamo=True, dynamic_shapes=(dim, dim),
                              verbose=False, **names)
        else:
            axes = {0: "batch", 1: "seq"}
            torch.onnx.export(_bert(), (ids, mask), str(path), dynamo=False, opset_version=opset,
                              dynamic_axes={"input_ids": axes, "attention_mask": axes}, **names)
    return str(path)


@pytest.fixture(scope="module", params=[14, 17], ids=["opset14-decomposed-layernorm", "opset17"])
def bert(request, tmp_path_factory):
    return _export(tmp_path_factory.mktemp("bert") / f"bert{request.param}.onnx", request.param)


def test_analysis_finds_the_transformer_patterns(bert):
    found = {m.pattern.name for m in analyze(bert, Options(batch=2, dims=DIMS)).matches}
    assert {"bias_gelu", "skip_layer_norm", "matmul_scale", "matmul_bias"} <= found


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_bert_rewrite_verifies_and_fuses_at_least_what_onnxruntime_does(bert, target, tmp_path):
    r = rewrite(bert, RewriteOptions(target=target, batch=2, dims=DIMS))
    assert r.verification.ok
    assert_same_outputs(bert, r.model, dims=DIMS, rtol=1e-4, atol=1e-5)
    counts = ops(r.model)
    assert counts["com.microsoft.SkipLayerNormalization"] == 4  # 2 per layer
    assert counts["com.microsoft.EmbedLayerNormalization"] == 1  # the embeddings and their LayerNorm
    assert counts["com.microsoft.BiasGelu"] == 2
    assert counts["com.microsoft.MultiHeadAttention"] == 2 and "Softmax" not in counts  # QK^T scale inside
    assert "LayerNormalization" not in counts and "Erf" not in counts and "ReduceMean" not in counts
    ort_model = onnx.load(ort_optimized(bert, str(tmp_path / "ort.onnx"), "extended"))
    ort_kernels = fused_kernel_count(ort_model)
    if target == "cpu":
        assert counts["com.microsoft.FusedGemm"] == 1  # the pooler's dense + tanh
    else:  # onnxruntime optimized for its CPU provider; the CUDA one has no FusedGemm
        assert_cuda_kernels_only(r.model)
        ort_kernels -= ops(ort_model)["com.microsoft.FusedGemm"]
    assert fused_kernel_count(r.model) >= ort_kernels
    assert r.nodes_after < r.nodes_before


def test_layer_norm_alone(bert):
    """--patterns layer_norm: each of the five LayerNorms (decomposed or not) as one LayerNormalization."""
    r = rewrite(bert, RewriteOptions(patterns=("layer_norm",), batch=2, dims=DIMS))
    # opset 17 exports LayerNormalization already: nothing to rewrite, then no sessions are made
    assert (r.verification.ok if not r.unchanged else r.verification is None)
    assert ops(r.model)["LayerNormalization"] == 5
    assert "ReduceMean" not in ops(r.model)


def test_training_mode_keeps_to_training_safe_matches(bert):
    r = rewrite(bert, RewriteOptions(mode="training", batch=2, dims=DIMS))
    assert r.verification.ok
    assert all(a.pattern in ("bias_gelu", "skip_layer_norm", "matmul_scale", "matmul_bias_act", "layer_norm",
                             "embed_layer_norm") for a in r.applied)
    assert ops(r.model)["com.microsoft.SkipLayerNormalization"] == 4


# -- the dynamo exporter (opset 20): what the matcher and the rewrite miss there -----------------------------
@pytest.fixture(scope="module")
def bert_dynamo(tmp_path_factory):
    pytest.importorskip("onnxscript")
    return _export(tmp_path_factory.mktemp("bert") / "bert_dynamo.onnx", 20, dynamo=True)


def test_dynamo_export_rewrites_and_verifies(bert_dynamo, tmp_path):
    r = rewrite(bert_dynamo, RewriteOptions(batch=2, dims=DIMS))
    assert r.verification.ok
    assert_same_outputs(bert_dynamo, r.model, dims=DIMS)
    counts = ops(r.model)
    assert counts["com.microsoft.BiasGelu"] == 2
    assert counts["com.microsoft.MultiHeadAttention"] == 2 and "Softmax" not in counts  # QK^T scale inside
    assert counts["com.microsoft.SkipLayerNormalization"] == 4
    assert counts["com.microsoft.EmbedLayerNormalization"] == 1
    ort_model = onnx.load(ort_optimized(bert_dynamo, str(tmp_path / "ort.onnx"), "extended"))
    assert fused_kernel_count(r.model) >= fused_kernel_count(ort_model)


def test_dynamo_bias_add_gelu_op_is_a_bias_gelu_match(bert_dynamo):
    """opset 20's Gelu op after a bias Add is a bias_gelu match (once only matmul_bias_act covered it)."""
    found = {m.pattern.name for m in analyze(bert_dynamo, Options(batch=2, dims=DIMS)).matches}
    assert "bias_gelu" in found


def test_dynamo_training_mode_fuses_attention_scale_and_gelu(bert_dynamo):
    """The attention scale is a one-element float initializer: a constant, so MatMul -> Mul(scale) is
    training-safe (it was once judged a trainable parameter whose gradient reads the MatMul output)."""
    r = rewrite(bert_dynamo, RewriteOptions(mode="training", batch=2, dims=DIMS))
    counts = ops(r.model)
    assert counts["com.microsoft.FusedMatMul"] == 2 and counts["com.microsoft.BiasGelu"] == 2


def test_verifier_feeds_token_ids_and_sized_dims(bert):
    """fusecli's verifier feeds ids 0/1 (valid for any vocabulary) shaped (batch, --dim seq)."""
    import onnxruntime as ort

    from fusecli.rewrite.verify.outputs import make_feeds

    feeds = make_feeds(ort.InferenceSession(bert, providers=["CPUExecutionProvider"]), batch=2, dims=DIMS)
    assert set(feeds) == {"input_ids", "attention_mask"}
    for v in feeds.values():
        assert v.dtype == np.int64 and v.shape == (2, 16) and set(np.unique(v)) == {0, 1}

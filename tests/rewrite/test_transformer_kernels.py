"""Transformer-era kernels (MultiHeadAttention, SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization
with the residual sum, QuickGelu) on real `transformers` exports (2 layers, hidden 64, both exporters):
rewritten, verified by rewrite itself, and compared with PyTorch's own output; counted against ONNX
Runtime's offline EXTENDED model; ``--target cuda`` keeps to kernels the CUDA provider has."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from fusecli.rewrite import RewriteOptions, rewrite
from fusecli.rewrite.kernels.cuda import CUDA_KERNELS
from tests.rewrite.helpers import left_unfused, ops

DIMS = {"batch": 2, "seq": 16}
MS = "com.microsoft."


def _rewrite(path: str, target: str = "cpu"):
    return rewrite(path, RewriteOptions(target=target, batch=2, dims=dict(DIMS)))


def _torch_matches(name: str, model: onnx.ModelProto, attn: str = "eager") -> None:
    """The rewritten model run by onnxruntime (default level) against PyTorch's eager forward."""
    import torch

    from tests import hf_models

    args = hf_models.example_inputs(name, 2, 16)
    feeds = {k: a.numpy() for k, a in zip(hf_models.spec(name).inputs, args, strict=True)}
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})[0]
    with torch.no_grad():
        want = hf_models.build(name, attn=attn)(*args).numpy()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-4


def _ort_extended_fused(path: str, tmp_path) -> int:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "ort.onnx")
    ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    after, before = ops(onnx.load(tmp_path / "ort.onnx")), ops(onnx.load(path))
    return sum(n for k, n in after.items() if k.startswith(MS)) + sum(
        max(0, after[k] - before.get(k, 0)) for k in ("LayerNormalization", "SimplifiedLayerNormalization"))


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_llama_family_kernels(hf_onnx, exporter, tmp_path):
    """Grouped-query attention, RMSNorm pre-norm blocks and SwiGLU's SiLU: 2 layers give 2
    GroupQueryAttention (the eager export's causal mask from shapes), 4 SkipSimplifiedLayerNormalization
    (residual sum as the 4th output), 1 final
    SimplifiedLayerNormalization and 2 QuickGelu; verified and equal to PyTorch's output."""
    path = hf_onnx("llama", exporter)
    r = _rewrite(path)
    got = r.ops_after
    assert got.get(MS + "GroupQueryAttention") == 2 and MS + "MultiHeadAttention" not in got
    assert got.get(MS + "SkipSimplifiedLayerNormalization") == 4
    assert got.get("SimplifiedLayerNormalization") == 1 and got.get(MS + "QuickGelu") == 2
    assert r.verification.ok and "Softmax" not in got
    sums = [n for n in r.model.graph.node if n.op_type == "SkipSimplifiedLayerNormalization"]
    assert sum(len(n.output) == 4 and n.output[3] != "" for n in sums) >= 3  # the residual read again
    _torch_matches("llama", r.model)
    fused = sum(n for k, n in got.items() if k.startswith(MS) or k == "SimplifiedLayerNormalization")
    assert fused >= _ort_extended_fused(path, tmp_path)


@pytest.mark.parametrize("name", ["gpt2", "bert", "t5_encoder"])
def test_attention_becomes_multi_head_attention(hf_onnx, name, tmp_path):
    """Causal (GPT-2), padded additive mask (BERT, a padded row), position bias without scale (T5)."""
    path = hf_onnx(name)
    r = _rewrite(path)
    assert r.ops_after.get(MS + "MultiHeadAttention") == 2 and "Softmax" not in r.ops_after
    assert r.verification.ok
    _torch_matches(name, r.model)
    fused = sum(n for k, n in r.ops_after.items() if k.startswith(MS) or k.endswith("LayerNormalization"))
    assert fused >= _ort_extended_fused(path, tmp_path)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_cuda_target_emits_only_cuda_kernels(hf_onnx, name):
    """No GPU here: the structural check that every fused op of --target cuda has a CUDA kernel."""
    r = _rewrite(hf_onnx(name), target="cuda")
    fused = {k for k in r.ops_after if k.startswith(MS) or k.endswith("LayerNormalization")}
    assert MS + "MultiHeadAttention" in fused and fused <= CUDA_KERNELS


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize(("name", "blocks"),
                         [("bert", 2), ("gpt2", 2), ("opt", 2), ("bart", 6), ("llama", 2)])
def test_default_sdpa_attention_becomes_multi_head_attention(hf_onnx, name, blocks, exporter):
    """The default (sdpa) exports: the NaN guard (kept on the kernel's output: a row whose every key is
    masked gives zeros), q and k^T each scaled by sqrt(s), bool masks made additive, dynamo's
    Reshape-Transpose-Reshape of K, cross-attention (BART): one MultiHeadAttention per attention block
    (GroupQueryAttention for Llama's grouped-query causal attention; TorchScript cannot export enable_gqa,
    so its export repeats K/V: hf_models.export), every region cut out and verified on its own, equal to
    PyTorch's output."""
    r = _rewrite(hf_onnx(name, exporter, attn="default"))
    kernel = "GroupQueryAttention" if name == "llama" else "MultiHeadAttention"
    assert r.ops_after.get(MS + kernel) == blocks
    assert "Softmax" not in r.ops_after  # the NaN guard stays, on the kernel's output
    assert r.verification.ok and r.verification.uncut == []
    _torch_matches(name, r.model, attn="default")


def test_soft_capped_attention_becomes_group_query_attention(hf_onnx):
    """Gemma2 scores c tanh(q k^T s / c) under a causal mask, a sliding window of 8 keys on its first layer:
    GroupQueryAttention with softcap = c and local_window_size = 8 there (both read from the export and
    its probed mask), verified and equal to PyTorch's output."""
    r = _rewrite(hf_onnx("gemma2", "torchscript", attn="default"))
    gqa = [n for n in r.model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == 2 and MS + "MultiHeadAttention" not in r.ops_after and "Softmax" not in r.ops_after
    attrs = [{a.name: a.f or a.i for a in n.attribute} for n in gqa]
    assert all(a["softcap"] == 50.0 for a in attrs)
    assert sorted(a.get("local_window_size", -1) for a in attrs) == [-1, 8]
    assert r.verification.ok and not [w for w in left_unfused(r.warnings) if "attention" in w]
    _torch_matches("gemma2", r.model, attn="default")


def test_soft_capped_attention_on_cuda_is_left_unfused_and_said(hf_onnx):
    """--target cuda: MultiHeadAttention has no soft-cap and GroupQueryAttention's CUDA kernel takes no
    float32, so no attention kernel, and the run says why; the rest is still rewritten and verified."""
    r = _rewrite(hf_onnx("gemma2", "torchscript", attn="default"), target="cuda")
    said = [w for w in r.warnings if w.startswith("not rewritten: attention at") and "soft-cap" in w]
    assert len(said) == 2 and MS + "MultiHeadAttention" not in r.ops_after
    assert all("GroupQueryAttention: its CUDA kernel" in w for w in said)
    assert r.verification.ok and any(k.startswith(MS) for k in r.ops_after)


def test_olmo_layer_norm_reading_a_shared_cast_is_left_out_and_the_rest_written(hf_onnx):
    """OLMo's LayerNorms read a Cast that the next block's residual reads too: the SkipLayerNormalization
    that would drop it is left unfused with a 'not rewritten' line naming the Cast; the rest is
    rewritten, verified by onnxruntime, and equal to PyTorch's output."""
    r = _rewrite(hf_onnx("olmo", "torchscript", attn="default"))
    said = [w for w in r.warnings if w.startswith("not rewritten: skip_layer_norm at") and "Cast" in w]
    assert said and r.ops_after.get(MS + "RotaryEmbedding") == 4
    assert r.verification.ok and r.verification.uncut == []
    _torch_matches("olmo", r.model, attn="default")


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_fixed_size_export_rewrites(hf_onnx, exporter):
    """A BERT exported with every dim fixed: its token-type ids are a constant subgraph
    (GatherElements of a broadcast index, which onnx's reference implementation cannot run), folded by
    onnxruntime instead; attention and the skip-norms rewritten, verified, equal to PyTorch."""
    path = hf_onnx("bert", exporter, dynamic=False, batch=2, seq=16, attn="default")
    r = rewrite(path, RewriteOptions(batch=2))
    assert r.verification.ok and r.verification.checks, r.verification
    counts = r.kernel_counts()
    assert counts.get("MultiHeadAttention") == 2, counts
    _torch_matches("bert", r.model, attn="default")


def _verified_everywhere(name: str, path: str, r, tmp_path) -> None:
    """Every region of ``r`` checked and passed, the rewritten model equal to PyTorch's, at least ONNX
    Runtime's own EXTENDED count, and the same 2 MultiHeadAttention verified at another batch and length."""
    assert r.verification.ok and r.verification.uncut == []
    _torch_matches(name, r.model, attn="default")
    assert sum(n for k, n in r.ops_after.items() if k.startswith(MS)) >= _ort_extended_fused(path, tmp_path)
    other = rewrite(path, RewriteOptions(batch=3, dims={"seq": 24}))
    assert other.ops_after.get(MS + "MultiHeadAttention") == 2
    assert other.verification.ok and other.verification.uncut == []


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_deberta_position_matmuls_read_their_keys_in_place(hf_onnx, exporter, tmp_path):
    """DeBERTa-v2's disentangled attention (transformers runs it eager): the c2p and p2c products
    q @ pos_k^T become FusedMatMul(transB), 2 per layer; its heads-merged scores (B N, S, L) + c2p + p2c,
    split to (B, N, S, L) under XSoftmax's bool mask (filled with float32's lowest, which absorbs the
    terms), become one MultiHeadAttention per layer (TorchScript reads the scores' sizes too: written from
    the kernel's inputs); verified at two sizes, equal to PyTorch, and at least ONNX Runtime's own
    EXTENDED model's count."""
    path = hf_onnx("deberta_v2", exporter, attn="default")
    r = _rewrite(path)
    got = r.ops_after
    assert got.get(MS + "FusedMatMul", 0) >= 4, got
    assert got.get(MS + "MultiHeadAttention") == 2 and "Softmax" not in got, r.warnings
    _verified_everywhere("deberta_v2", path, r, tmp_path)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_heads_merged_attention_becomes_multi_head_attention(hf_onnx, exporter, tmp_path):
    """BLOOM's ALiBi attention computes its scores heads-merged: q, K^T and v reshaped to (B N, ., .),
    alibi (B N, 1, L) + q k^T / sqrt(d) split to (B, N, S, L) for the causal mask, P merged back for
    P @ V, whose output is split into heads again (TorchScript also reads its Shape). One
    MultiHeadAttention per layer: alibi split into (B, N, 1, L) at run time and summed with the mask into
    the attention bias, the output written where the export's split wrote; verified, equal to PyTorch,
    at least ONNX Runtime's own EXTENDED count, and verified again at another batch and length."""
    path = hf_onnx("bloom", exporter, attn="default")
    r = _rewrite(path)
    got = r.ops_after
    assert got.get(MS + "MultiHeadAttention") == 2 and "Softmax" not in got, r.warnings
    assert not [w for w in left_unfused(r.warnings) if "attention" in w], r.warnings
    _verified_everywhere("bloom", path, r, tmp_path)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_kv_cache_attention_becomes_multi_head_attention(exporter, tmp_path):
    """Past keys and values joined to the new ones by Concat before sdpa (a decode step with a cache, a
    data mask): MultiHeadAttention over the joined K/V, verified, at the past and sequence lengths given."""
    import torch

    F = torch.nn.functional

    class Cached(torch.nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(0)
            self.w = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(32, 64, generator=g) / 6)
                                            for _ in range(3))

        def forward(self, x, past_k, past_v):
            b, s, _ = x.shape
            q, k, v = ((x @ w).view(b, s, 4, 16).transpose(1, 2) for w in self.w)
            k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
            mask = (torch.rand(b, 1, s, k.shape[2]) > -1.0) & (x.sum() > -1e9)  # from a value
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, s, 64)

    model, path = Cached().eval(), str(tmp_path / "cached.onnx")
    args = (torch.randn(2, 8, 32), torch.randn(2, 4, 4, 16), torch.randn(2, 4, 4, 16))
    names = ["x", "past_k", "past_v"]
    if exporter == "torchscript":
        cache = {0: "batch", 2: "past"}
        torch.onnx.export(model, args, path, dynamo=False, input_names=names,
                          dynamic_axes={"x": {0: "batch", 1: "seq"}, "past_k": cache, "past_v": cache})
    else:
        b, s, p = (torch.export.Dim(n, min=2, max=64) for n in ("batch", "seq", "past"))
        torch.onnx.export(model, args, dynamo=True, input_names=names, verbose=False,
                          dynamic_shapes=({0: b, 1: s}, {0: b, 2: p}, {0: b, 2: p})).save(path)
    r = rewrite(path, RewriteOptions(batch=2, dims={"seq": 8, "past": 4}))
    assert r.kernel_counts() == {"MultiHeadAttention": 1} and r.verification.ok
    assert not left_unfused(r.warnings), r.warnings


def test_hubert_unnamed_copies_of_one_dim_are_one_dim(hf_onnx):
    """HuBERT's sdpa attention exported by dynamo: the frame count after the feature convolutions has no
    name, and shape inference gives each copy its own (K (B, N, unk46, H), its merge (unk54, unk55, H), K^T
    split back to (B, N, H, unk58)); they are one dim, equal at the analysis's sizes, so K^T is read as
    K's transpose and each layer's attention becomes MultiHeadAttention; verified by rewrite, equal to
    PyTorch, and verified again at another batch and length."""
    path = hf_onnx("hubert", "dynamo", attn="default")
    r = rewrite(path, RewriteOptions(batch=2, dims={"samples": 400}))
    assert r.ops_after.get(MS + "MultiHeadAttention") == 2 and "Softmax" not in r.ops_after, r.warnings
    assert not [w for w in left_unfused(r.warnings) if "attention" in w], r.warnings
    # every attention region checked on its own (some skip-LayerNorms' inputs are unsized: the whole model)
    assert r.verification.ok and r.verification.checks
    assert not [u for u in r.verification.uncut if "attention" in u], r.verification.uncut
    _torch_matches("hubert", r.model, attn="default")
    other = rewrite(path, RewriteOptions(batch=3, dims={"samples": 730}))
    assert other.ops_after.get(MS + "MultiHeadAttention") == 2
    assert other.verification.ok and other.verification.checks

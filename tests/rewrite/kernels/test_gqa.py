"""GroupQueryAttention (rewrite/kernels/gqa.py) on grouped-query decoders (4 query heads, 2 K/V heads, 2
layers, hidden 64): one kernel per layer reading the unrepeated K/V, the rotation inside where both rotary
matches feed it, every region verified by rewrite itself, and the rewritten model's output equal to PyTorch's
on onnxruntime CPU, at the exported length and at others (the causal contract holds for any length). Where the
contract does not fit (a padding mask from the inputs' values), MultiHeadAttention with the reason."""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest

from fusecli.rewrite import RewriteOptions, rewrite
from fusecli.rewrite.kernels.mask_band import allowed_keys, band
from tests.rewrite.helpers import init

MS = "com.microsoft."
GQA = MS + "GroupQueryAttention"


def _rewrite(path: str):
    return rewrite(path, RewriteOptions(batch=2, dims={"batch": 2, "seq": 16}))


def _max_diff_vs_torch(name: str, model, attn: str, seqs=(16, 23, 5)) -> float:
    """Largest |onnxruntime(rewritten) - PyTorch| over the lengths ``seqs`` (batch 2)."""
    import torch

    from tests import hf_models

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    torch_model = hf_models.build(name, attn=attn)
    worst = 0.0
    for seq in seqs:
        args = hf_models.example_inputs(name, 2, seq)
        feeds = {k: a.numpy() for k, a in zip(hf_models.spec(name).inputs, args, strict=True)}
        got = sess.run(None, feeds)[0]
        with torch.no_grad():
            want = torch_model(*args).numpy()
        worst = max(worst, float(np.abs(got - want).max()))
    return worst


@pytest.mark.parametrize("name", ["llama_gqa", "qwen2_gqa"])
def test_default_dynamo_export_gets_group_query_attention_with_rotary(hf_onnx, name):
    """sdpa (enable_gqa) exported by dynamo: the causal mask is computed from shapes; GroupQueryAttention
    with do_rotary replaces attention and both RotaryEmbeddings of each layer."""
    r = _rewrite(hf_onnx(name, "dynamo", attn="default"))
    got = r.ops_after
    assert got.get(GQA) == 2 and MS + "MultiHeadAttention" not in got and "Softmax" not in got
    assert MS + "RotaryEmbedding" not in got and r.kernel_counts().get("GroupQueryAttention (rotary)") == 2
    gqa = [n for n in r.model.graph.node if n.op_type == "GroupQueryAttention"]
    made = {o: n for n in r.model.graph.node for o in n.output}
    key_shape = made[gqa[0].input[1]].input[1]  # K packed (B, L, Nkv H) from its unrepeated heads
    assert list(init(r.model, key_shape)) == [0, 0, 2 * 16]
    attrs = {a.name: a for a in gqa[0].attribute}
    assert attrs["num_heads"].i == 4 and attrs["kv_num_heads"].i == 2 and attrs["do_rotary"].i == 1
    assert math.isclose(attrs["scale"].f, 1 / math.sqrt(16), rel_tol=1e-6)
    assert r.verification.ok and r.verification.uncut == [] and r.left_out == 0
    assert not [w for w in r.warnings if "attention" in w.lower()]
    assert _max_diff_vs_torch(name, r.model, "default") < 1e-4


def test_eager_torchscript_export_gets_group_query_attention(hf_onnx):
    """TorchScript cannot export sdpa with enable_gqa: the eager attention is its case (an additive causal
    mask from shapes, repeat_kv's Expand, the rotation inside)."""
    r = _rewrite(hf_onnx("llama_gqa", "torchscript"))
    assert r.ops_after.get(GQA) == 2 and "Softmax" not in r.ops_after
    # k reaches the repeat through a one-input Concat (the empty cache's update); its shape reads go too
    assert r.kernel_counts().get("GroupQueryAttention (rotary)") == 2
    assert MS + "RotaryEmbedding" not in r.ops_after
    assert r.verification.ok and r.verification.uncut == []
    assert _max_diff_vs_torch("llama_gqa", r.model, "eager") < 1e-4


@pytest.mark.parametrize("name", ["llama_gqa", "qwen3_gqa", "starcoder2_gqa"])
def test_default_torchscript_export_with_repeated_kv_gets_group_query_attention(hf_onnx, name):
    """sdpa exported by TorchScript, K/V repeated by transformers (repeat_kv: TorchScript cannot export
    enable_gqa), in three families (Llama; Qwen3's q/k RMSNorms; Starcoder2's LayerNorm and biases): one
    GroupQueryAttention per layer over the unrepeated K/V (the regression: every region written, found to
    differ, left unfused), verified by rewrite and against PyTorch at three lengths."""
    r = _rewrite(hf_onnx(name, "torchscript", attn="default"))
    assert r.ops_after.get(GQA) == 2 and MS + "MultiHeadAttention" not in r.ops_after, r.warnings
    assert "Softmax" not in r.ops_after
    assert not [w for w in r.warnings if "attention" in w.lower()], r.warnings
    assert r.verification.ok and r.verification.uncut == [] and r.left_out == 0
    assert _max_diff_vs_torch(name, r.model, "default") < 1e-4


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_kv_broadcast_after_a_fused_projection_gets_an_attention_kernel(hf_onnx, exporter):
    """Falcon's new decoder with 2 K/V heads for 4: q, k, v sliced from one query_key_value projection and
    each K/V head broadcast to its query heads (broadcast_to, then the groups flattened): an attention kernel
    per layer, where 'the head count or head size of q, k or v is unknown' was said; verified."""
    r = _rewrite(hf_onnx("falcon_gqa", exporter, attn="default"))
    kernels = r.ops_after.get(MS + "MultiHeadAttention", 0) + r.ops_after.get(GQA, 0)
    assert kernels == 2 and "Softmax" not in r.ops_after, r.warnings
    assert not [w for w in r.warnings if "attention at" in w], r.warnings
    assert r.verification.ok and r.left_out == 0
    assert _max_diff_vs_torch("falcon_gqa", r.model, "default") < 1e-4


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_padding_mask_falls_back_to_multi_head_attention_with_the_reason(hf_onnx, exporter):
    """An attention_mask input makes the mask depend on the inputs' values: GroupQueryAttention's
    right-padded seqlens_k is not provably the same, so MultiHeadAttention runs it, and the run says why."""
    attn = "default" if exporter == "dynamo" else "eager"
    r = _rewrite(hf_onnx("llama_gqa_padded", exporter, attn=attn))
    assert GQA not in r.ops_after and r.ops_after.get(MS + "MultiHeadAttention") == 2
    said = [w for w in r.warnings if "GroupQueryAttention at" in w and "padding mask" in w]
    assert len(said) == 2
    assert r.verification.ok
    assert _max_diff_vs_torch("llama_gqa_padded", r.model, attn, seqs=(16,)) < 1e-4


def test_mask_band_reads_causal_windowed_and_other_masks():
    """The probe's classification: causal (0 / -inf and a bool Where), a sliding window of 3 keys, and
    masks GroupQueryAttention cannot apply (bidirectional, a mid value, rows that differ, not square)."""
    s = 6
    i, j = np.arange(s)[:, None], np.arange(s)[None, :]
    causal = np.where(j <= i, 0.0, -np.inf).astype(np.float32)[None, None]
    assert band(allowed_keys(causal, "add", True, None)) == math.inf
    assert band(allowed_keys(np.broadcast_to(j <= i, (2, 1, s, s)), "where", True, -1e9)) == math.inf
    assert band(allowed_keys(j > i, "where", False, float(np.finfo(np.float32).min))) == math.inf
    window = np.where((i - j >= 0) & (i - j < 3), 0.0, np.finfo(np.float32).min)
    assert band(allowed_keys(window, "add", True, None)) == 3
    assert isinstance(band(allowed_keys(np.zeros((s, s)), "add", True, None)), str)  # bidirectional
    assert isinstance(allowed_keys(np.where(j <= i, 0.0, -5.0), "add", True, None), str)
    assert isinstance(allowed_keys(j <= i, "where", True, -5.0), str)  # the fill does not hide
    rows = np.stack([causal[0, 0], np.zeros((s, s), np.float32)])
    assert isinstance(allowed_keys(rows, "add", True, None), str)
    assert isinstance(band(np.ones((s, s + 2), bool)), str)


def test_sliding_window_becomes_local_window_size(hf_onnx):
    """Mistral's sdpa mask (dynamo) keeps the last 8 keys of each query: the probe reads the window, and
    GroupQueryAttention's local_window_size = 8 applies it at every length (5, 16 and 23 tokens)."""
    r = _rewrite(hf_onnx("mistral_gqa", "dynamo", attn="default"))
    gqa = [n for n in r.model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == 2 and all({a.name: a.i for a in n.attribute}["local_window_size"] == 8 for n in gqa)
    assert r.verification.ok and r.verification.uncut == []
    assert _max_diff_vs_torch("mistral_gqa", r.model, "default") < 1e-4


def test_shape_read_of_the_repeated_value_moves_to_the_query(hf_onnx):
    """Mistral's sdpa with its sliding-window mask, TorchScript: a mask is given, so transformers repeats
    K/V itself (repeat_kv, not enable_gqa) and reads value.shape[-1] of the repeated V for the output's
    Reshape. That Shape reads q instead (both (B, N, S, H)), and GroupQueryAttention replaces the repeat,
    as on the dynamo export; verified by rewrite and against PyTorch at three lengths."""
    r = _rewrite(hf_onnx("mistral_gqa", "torchscript", attn="default"))
    assert r.ops_after.get(GQA) == 2 and MS + "MultiHeadAttention" not in r.ops_after
    assert not [w for w in r.warnings if "GroupQueryAttention" in w]
    assert r.verification.ok and r.verification.uncut == [] and r.left_out == 0
    assert _max_diff_vs_torch("mistral_gqa", r.model, "default") < 1e-4


def _grouped_attention(mask: np.ndarray | None):
    """softmax(q repeat_kv(k)^T / 4 + mask) repeat_kv(v): 4 query heads, 2 K/V heads of 16, 8 tokens; the
    mask a constant (8, 8) table, or none."""
    from onnx import TensorProto, helper, numpy_helper

    b, s, h = 2, 8, 16
    inits = [numpy_helper.from_array(np.array([2], np.int64), "axis2"),
             numpy_helper.from_array(np.array([b, 2, 2, s, h], np.int64), "grouped"),
             numpy_helper.from_array(np.array([b, 4, s, h], np.int64), "heads"),
             numpy_helper.from_array(np.array(0.25, np.float32), "scale")]
    nodes = []
    for x in ("k", "v"):
        nodes += [helper.make_node("Unsqueeze", [x, "axis2"], [f"{x}5"]),
                  helper.make_node("Expand", [f"{x}5", "grouped"], [f"{x}x"]),
                  helper.make_node("Reshape", [f"{x}x", "heads"], [f"{x}r"])]
    nodes += [helper.make_node("Transpose", ["kr"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q", "kt"], ["qk"]),
              helper.make_node("Mul", ["qk", "scale"], ["scores"])]
    if mask is not None:
        inits.append(numpy_helper.from_array(mask.astype(np.float32), "mask"))
        nodes.append(helper.make_node("Add", ["scores", "mask"], ["masked"]))
    nodes += [helper.make_node("Softmax", ["masked" if mask is not None else "scores"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vr"], ["y"])]
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [b, heads, s, h])
           for n, heads in (("q", 4), ("k", 2), ("v", 2))]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "gqa", ins, [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("mask", "reason"), [("causal", None), ("none", "not causal"),
                                              ("every_other", "not causal"), ("half", "other than 0")])
def test_constant_masks_are_probed(save_model, mask, reason):
    """A constant causal table goes in as GroupQueryAttention; no mask (bidirectional), a mask hiding every
    other key, or one with a finite penalty of -2 do not fit: MultiHeadAttention, and the run says why.
    Both rewrites agree with the original on onnxruntime (rewrite's own region check)."""
    i, j = np.arange(8)[:, None], np.arange(8)[None, :]
    table = {"causal": np.where(j <= i, 0.0, -np.inf), "none": None,
             "every_other": np.where((j <= i) & (j % 2 == 0) | (j == i), 0.0, -np.inf),
             "half": np.where(j <= i, 0.0, -2.0)}[mask]
    r = rewrite(save_model(_grouped_attention(table)), RewriteOptions())
    assert r.verification.ok
    if reason is None:
        assert r.ops_after.get(GQA) == 1 and not r.warnings
    else:
        assert r.ops_after.get(MS + "MultiHeadAttention") == 1 and GQA not in r.ops_after
        assert [w for w in r.warnings if "GroupQueryAttention at" in w and reason in w], r.warnings

"""Rotary embeddings become ONNX Runtime's RotaryEmbedding where its contract fits (rotate_half halves, the
tables equal in both halves and varying along S alone, (B, N, S, D) heads), and stay as written
elsewhere; checked by rewrite's own region verification and on fresh inputs by onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from fusecli.rewrite import RewriteOptions, rewrite
from fusecli.rewrite.kernels.cuda import CUDA_KERNELS
from tests.rewrite.helpers import assert_same_outputs, attr, init, nodes, ops
from tests.transformer_graphs import HEAD, SEQ, llama_block, rotary_model


def _rewrite(save_model, model, target="cpu"):
    path = save_model(model)
    r = rewrite(path, RewriteOptions(target=target, batch=2))
    assert_same_outputs(path, r.model, dims={"batch": 2})
    return r


@pytest.mark.parametrize("kw", [{}, {"bound": "shape"}, {"scale": 0.5}, {"table": "constant"}],
                         ids=["computed", "torchscript_bound", "scaled", "folded"])
def test_rotary_becomes_rotary_embedding(save_model, kw):
    r = _rewrite(save_model, rotary_model(**kw))
    assert r.verification.ok and r.verification.regions == 1
    assert ops(r.model)["com.microsoft.RotaryEmbedding"] == 1
    assert not {"Slice", "Neg", "Concat", "Add"} & set(ops(r.model))
    node = nodes(r.model, "RotaryEmbedding")[0]
    assert attr(node, "interleaved") == 0
    assert init(r.model, node.input[1]).tolist() == [0]  # position offset 0: cache row s for position s
    if kw.get("table") == "constant":
        cache = init(r.model, node.input[2])
        f = np.arange(SEQ)[:, None] / 10000 ** (np.arange(0, HEAD, 2) / HEAD)
        np.testing.assert_allclose(cache, np.cos(f), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kw", [{"swap": True}, {"layout": "bsnd"}, {"pos_batch": 2}],
                         ids=["not_rotate_half", "heads_after_seq", "table_per_batch"])
def test_rotary_outside_the_contract_stays(save_model, kw):
    r = _rewrite(save_model, rotary_model(**kw))
    assert "com.microsoft.RotaryEmbedding" not in ops(r.model) and "Neg" in ops(r.model)


@pytest.mark.parametrize("kw", [{}, {"table": "constant"}, {"scale": 0.5}],
                         ids=["computed", "folded", "scaled"])
def test_interleaved_rotary_becomes_rotary_embedding_interleaved(save_model, kw):
    """GPT-J's rotate_every_two with tables whose angles repeat in pairs: RotaryEmbedding(interleaved=1)
    with the (S, D/2) caches of the angles, verified by rewrite and against the original."""
    r = _rewrite(save_model, rotary_model(interleaved=True, **kw))
    assert r.verification.ok and r.verification.regions == 1
    assert ops(r.model)["com.microsoft.RotaryEmbedding"] == 1
    assert not {"Slice", "Neg", "Concat", "Add"} & set(ops(r.model))
    node = nodes(r.model, "RotaryEmbedding")[0]
    assert attr(node, "interleaved") == 1
    if kw.get("table") == "constant":
        f = np.arange(SEQ)[:, None] / 10000 ** (np.arange(0, HEAD, 2) / HEAD)
        np.testing.assert_allclose(init(r.model, node.input[2]), np.cos(f), rtol=1e-6, atol=1e-6)


def test_interleaved_rotation_the_other_way_stays(save_model):
    """stack(x_even, -x_odd): the inverse rotation, which the kernel does not compute: left as it is."""
    r = _rewrite(save_model, rotary_model(interleaved=True, swap=True))
    assert "com.microsoft.RotaryEmbedding" not in ops(r.model) and "Neg" in ops(r.model)


def test_cuda_target_keeps_to_cuda_kernels(save_model):
    r = _rewrite(save_model, rotary_model(), target="cuda")
    assert "com.microsoft.RotaryEmbedding" in CUDA_KERNELS
    assert ops(r.model)["com.microsoft.RotaryEmbedding"] == 1


@pytest.mark.parametrize("spelling", ["sdpa", "eager"])
def test_llama_block_rotary_and_attention(save_model, spelling):
    """q and k rotated, then attention through sdpa's two sqrt scales and 3D K^T, or eager's spelling."""
    r = _rewrite(save_model, llama_block(spelling))
    got = ops(r.model)
    assert r.verification.ok
    assert got["com.microsoft.RotaryEmbedding"] == 2 and got["com.microsoft.MultiHeadAttention"] == 1
    assert "Softmax" not in got and "Neg" not in got


def test_cohere_interleaved_rotary_is_matched_and_written(hf_onnx):
    """Cohere's rotary (rotate_every_two on (B, N, S, D) heads, tables repeat_interleave'd) exported by
    dynamo: analyze reports the 4 rotary matches (q and k, 2 layers), rewrite writes them as
    RotaryEmbedding(interleaved=1), verified by rewrite and equal to PyTorch's output."""
    import onnxruntime as ort
    import torch

    from fusecli.pipeline import Options, analyze
    from tests import hf_models

    path = hf_onnx("cohere", "dynamo")
    assert sum(m.pattern.name == "rotary" for m in analyze(path, Options(batch=2)).matches) == 4
    r = rewrite(path, RewriteOptions(batch=2, dims={"seq": 16}))
    rot = nodes(r.model, "RotaryEmbedding")
    assert len(rot) == 4 and all(attr(n, "interleaved") == 1 for n in rot), r.warnings
    assert r.verification.ok and r.verification.checks and "Neg" not in ops(r.model)
    sess = ort.InferenceSession(r.model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seq in (16, 7):
        args = hf_models.example_inputs("cohere", 2, seq)
        with torch.no_grad():
            want = hf_models.build("cohere")(*args).numpy()
        got = sess.run(None, {"input_ids": args[0].numpy()})[0]
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5

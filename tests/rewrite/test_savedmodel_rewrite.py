"""Keras 3 SavedModels rewritten with the dims ``analyze`` names: a MultiHeadAttention encoder with a dynamic
sequence and a GELU FFN, and EfficientNetB0; outputs against TensorFlow's own (the serving signature)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from fusecli.cli import main
from tests.rewrite.helpers import ops

pytest.importorskip("tf2onnx")
pytest.importorskip("tensorflow")
pytest.importorskip("keras")

HIDDEN, HEADS = 64, 4


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@functools.cache
def _encoder() -> str:
    """2 blocks of MultiHeadAttention + LayerNorm + Dense(gelu) FFN, input (batch, None, 64), exported with
    ``model.export``; biases, gamma and beta random so that every bias and affine term is in the graph."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras

    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    rn = "random_normal"
    inp = keras.Input(shape=(None, HIDDEN))
    x = inp
    for _ in range(2):
        mha = keras.layers.MultiHeadAttention(num_heads=HEADS, key_dim=HIDDEN // HEADS, bias_initializer=rn)
        a = mha(x, x)
        x = keras.layers.LayerNormalization(beta_initializer=rn, gamma_initializer=rn)(x + a)
        f = keras.layers.Dense(2 * HIDDEN, activation="gelu", bias_initializer=rn)(x)
        f = keras.layers.Dense(HIDDEN, bias_initializer=rn)(f)
        x = keras.layers.LayerNormalization(beta_initializer=rn, gamma_initializer=rn)(x + f)
    root = tempfile.mkdtemp(prefix="fusecli-keras-encoder-")
    import atexit

    atexit.register(shutil.rmtree, root, True)
    path = os.path.join(root, "encoder")
    keras.Model(inp, x).export(path, verbose=False)
    return path


def _tf_output(folder: str, x: np.ndarray) -> np.ndarray:
    """TensorFlow's own output of the serving signature (the reference, not onnxruntime's)."""
    import tensorflow as tf

    fn = tf.saved_model.load(folder).signatures["serving_default"]
    key = next(iter(fn.structured_input_signature[1]))
    return next(iter(fn(**{key: tf.constant(x)}).values())).numpy()


def _ort_output(path: str, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def _analyze_dims(folder: str) -> tuple[list[str], list[str]]:
    """(batch dims, other dims) as analyze's JSON names them: --batch 3 sets the batch dims only."""
    r = run("analyze", folder, "--json", "--batch", 3)
    assert r.exit_code == 0, r.output
    dims = json.loads(r.stdout)["dims"]
    return [n for n, v in dims.items() if v == 3], [n for n, v in dims.items() if v != 3]


def _rel_l2(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def test_keras_encoder_rewrites_with_analyzes_dim_names(tmp_path):
    folder = _encoder()
    batch_dims, others = _analyze_dims(folder)
    assert len(batch_dims) == 1 and len(others) == 1, (batch_dims, others)
    seq = others[0]
    out = tmp_path / "encoder.onnx"
    r = run("rewrite", folder, "-o", out, "--batch", 2, "--dim", f"{seq}=32", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["dims"] == {batch_dims[0]: 2, seq: 32}
    kernels = doc["kernels"]
    assert kernels.get("MultiHeadAttention") == 2, kernels  # one per block
    assert sum(n for k, n in kernels.items() if k.startswith("SkipLayerNormalization")) == 4, kernels
    assert kernels.get("BiasGelu") == 2, kernels  # the exact GELU (TensorFlow's erfc) with its Dense bias
    assert doc["verification"]["ok"] and doc["verification"]["levels"], doc["verification"]
    assert doc["left_out"] == 0
    model = onnx.load(out)
    assert "Erfc" not in ops(model) and "Softmax" not in ops(model)  # TensorFlow's erfc; attention's softmax
    dims = [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims[:2] == [batch_dims[0], seq]  # the rewritten model's input is named as analyze names it
    rng = np.random.default_rng(0)
    for length in (32, 7):  # the verified length and another: the sequence stays dynamic
        x = rng.standard_normal((2, length, HIDDEN)).astype(np.float32)
        ref, got = _tf_output(folder, x), _ort_output(str(out), x)
        assert got.shape == ref.shape and _rel_l2(got, ref) < 1e-5, _rel_l2(got, ref)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_keras_encoder_human_output_names_its_dims(tmp_path):
    folder = _encoder()
    batch_dims, (seq,) = _analyze_dims(folder)
    r = run("rewrite", folder, "-o", tmp_path / "e.onnx", "--batch", 2, "--dim", f"{seq}=32")
    assert r.exit_code == 0, r.output
    assert f"verified with onnxruntime (CPU, {batch_dims[0]}=2, {seq}=32):" in r.stdout, r.stdout
    assert "unk__" not in r.output
    no_seq = run("rewrite", folder, "-o", tmp_path / "f.onnx", "--batch", 2, "--no-verify")
    assert no_seq.exit_code == 0, no_seq.output
    assert f"--dim {seq}=VALUE" in no_seq.stderr and "unk__" not in no_seq.output


def test_tf2onnx_dim_names_are_a_usage_error(tmp_path):
    """The converter's own names are not the model's: --dim takes analyze's names only."""
    folder = _encoder()
    r = run("rewrite", folder, "-o", tmp_path / "o.onnx", "--dim", "unk__1=32")
    assert r.exit_code == 2 and "no dim of that name" in r.output, r.output
    assert "unk__" not in r.output.split("its dims:")[1]


def test_keras_efficientnet_rewrites_verified_with_its_batch(tmp_path):
    from tests.grad.keras_apps import SIZE, saved_app

    folder = saved_app("keras3_efficientnetb0")
    batch_dims, others = _analyze_dims(folder)
    assert len(batch_dims) == 1 and others == []  # 32x32x3: batch is its only dim
    out = tmp_path / "effnet.onnx"
    r = run("rewrite", folder, "-o", out, "--batch", 2)
    assert r.exit_code == 0, r.output
    assert f"verified with onnxruntime (CPU, {batch_dims[0]}=2):" in r.stdout, r.stdout
    assert "unk__" not in r.output and "--dim" not in r.stderr, r.output
    assert not any(line.rstrip().endswith(" is") for line in r.stdout.splitlines()), r.stdout  # no cut line
    model = onnx.load(out)
    kernels = ops(model)
    assert kernels["com.microsoft.FusedConv"] > 0 and kernels["com.microsoft.QuickGelu"] > 0, kernels
    x = np.random.default_rng(0).standard_normal((2, SIZE, SIZE, 3)).astype(np.float32)
    ref, got = _tf_output(folder, x), _ort_output(str(out), x)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)

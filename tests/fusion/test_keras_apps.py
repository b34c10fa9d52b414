"""Keras applications (weights=None, small inputs): the seed's Conv-BN-ReLU in ResNet-50 SavedModels,
BN + swish in EfficientNet, and tf2onnx conversions against ONNX Runtime's own fused-kernel count.

Each model is built once per test session (they are the slowest fixtures of this folder).
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

from fusecli.pipeline import Options, analyze

tf = pytest.importorskip("tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

CONV_FUSIONS = ("conv_bias_act", "conv_bias_add_act", "conv_bn_act", "conv_bias_bn_act", "conv_mul")


@pytest.fixture(scope="session")
def keras_saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keras_apps")
    made: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in made:
            path = str(folder / name)
            if name.startswith("keras3_"):
                import keras

                keras.utils.set_random_seed(0)
                app = {"keras3_resnet50": keras.applications.ResNet50,
                       "keras3_efficientnetb0": keras.applications.EfficientNetB0}[name]
                app(weights=None, input_shape=(32, 32, 3), classes=10).export(path, verbose=False)
            else:
                tf_keras = pytest.importorskip("tf_keras")
                tf_keras.utils.set_random_seed(0)
                app = {"tf_keras_resnet50": tf_keras.applications.ResNet50}[name]
                tf.saved_model.save(app(weights=None, input_shape=(32, 32, 3), classes=10), path)
            made[name] = path
        return made[name]

    return get


@pytest.fixture(scope="session")
def tf2onnx_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tf2onnx")
    made: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in made and name.startswith("keras3_"):  # Keras 3 SavedModel -> tf2onnx's CLI
            import subprocess
            import sys

            import keras

            pytest.importorskip("tf2onnx")
            keras.utils.set_random_seed(0)
            saved, path = str(folder / name), str(folder / f"{name}.onnx")
            keras.applications.MobileNetV2(weights=None, input_shape=(64, 64, 3), classes=10).export(
                saved, verbose=False)
            done = subprocess.run([sys.executable, "-m", "tf2onnx.convert", "--saved-model", saved, "--opset",
                                   "17", "--output", path], capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stderr[-2000:]
            made[name] = path
        if name not in made:
            tf2onnx = pytest.importorskip("tf2onnx")
            tf_keras = pytest.importorskip("tf_keras")
            tf_keras.utils.set_random_seed(0)
            app = {"mobilenetv2": tf_keras.applications.MobileNetV2,
                   "mobilenetv3small": tf_keras.applications.MobileNetV3Small,
                   "efficientnetv2b0": tf_keras.applications.EfficientNetV2B0}[name]
            model = app(weights=None, input_shape=(64, 64, 3), classes=10)
            path = str(folder / f"{name}.onnx")
            tf2onnx.convert.from_keras(model, input_signature=(tf.TensorSpec((1, 64, 64, 3), tf.float32,
                                                                             name="input"),),
                                       opset=17, output_path=path)
            made[name] = path
        return made[name]

    return get


def _counts(a) -> Counter:
    return Counter((m.pattern.name, m.verdict.state) for m in a.matches if m.pattern.phase == "forward")


@pytest.mark.parametrize("name", ["keras3_resnet50", "tf_keras_resnet50"])
def test_resnet50_conv_bias_bn_relu_is_inference_only(keras_saved, name):
    a = analyze(keras_saved(name), Options(batch=2))
    ms = [m for m in a.matches if m.pattern.name == "conv_bias_bn_act"]
    assert len(ms) == 33  # stem + 16 blocks x 2 convs whose BN feeds a ReLU
    for m in ms:
        assert [n.op_type for n in m.nodes][:2] == ["Conv2D", "BiasAdd"] and m.roles["act"].kind == "relu"
        v = m.verdict
        assert v.state == "inference only" and v.recompute is None
        # BN's backward reads the (biased) conv output, made inside the kernel: the seed's reason
        assert [b.tensor for b in v.blocking] == [m.roles["bias"].outputs[0]]
        assert "re-run Conv2D" in v.reason


def test_efficientnet_bn_swish_is_training_safe_if_recomputed(keras_saved):
    a = analyze(keras_saved("keras3_efficientnetb0"), Options(batch=2))
    bn_swish = [m for m in a.matches if m.pattern.name == "bn_act"
                and m.verdict.state == "training-safe if recomputed"]
    assert len(bn_swish) == 33
    for m in bn_swish:
        rc = m.verdict.recompute
        bn_out = m.roles["bn"].outputs[0]
        assert bn_out.name in rc.tensors and rc.bytes_kept == 0 and rc.flops > 0


# ONNX Runtime's FusedConv count at ORT_ENABLE_EXTENDED on the same files (measured by the test itself)
@pytest.mark.parametrize("name", ["mobilenetv2", "mobilenetv3small", "efficientnetv2b0",
                                  "keras3_mobilenetv2"])
def test_tf2onnx_conv_fusions_at_least_onnx_runtime(tf2onnx_model, tmp_path, name):
    import onnx
    import onnxruntime as ort

    path = tf2onnx_model(name)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "ort.onnx")
    ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    ort_fused = sum(n.op_type == "FusedConv" for n in onnx.load(so.optimized_model_filepath).graph.node)
    a = analyze(path, Options(batch=1))
    ours = [m for m in a.matches if m.pattern.name in CONV_FUSIONS and m.verdict.inference_safe]
    assert ort_fused > 0 and len(ours) >= ort_fused, _counts(a)
    if name == "mobilenetv3small":  # its convs sit between tf2onnx's NHWC <-> NCHW Transposes
        assert any("layout" in m.roles for m in ours)
    if name == "keras3_mobilenetv2":  # BatchNorm's scale left as a per-channel Mul after the conv
        assert any(m.pattern.name == "conv_mul" for m in ours)

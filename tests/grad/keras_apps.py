"""Keras applications (weights=None, 32x32 inputs, 10 classes) and a Keras 3 transformer encoder saved as
SavedModels, once per process.

Keras 3's are exported with ``model.export``; tf-keras's with ``tf.saved_model.save``. Their swish
activations are ``tf.custom_gradient``s (registered gradients in the SavedModel); ConvNeXtTiny's
blocks are Keras 3 XLA-compiled nested calls.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile

APPS = {  # name -> (package, application)
    "keras3_efficientnetb0": ("keras", "EfficientNetB0"),
    "keras3_efficientnetv2b0": ("keras", "EfficientNetV2B0"),
    "keras3_convnexttiny": ("keras", "ConvNeXtTiny"),
    "tf_keras_efficientnetb0": ("tf_keras", "EfficientNetB0"),
    "tf_keras_efficientnetv2b0": ("tf_keras", "EfficientNetV2B0"),
}
MORE_APPS = {  # networks whose dims fusecli's own shape rules size (tests/load/test_tf_shapes.py)
    "keras3_resnet50": ("keras", "ResNet50"),
    "keras3_mobilenetv2": ("keras", "MobileNetV2"),
    "keras3_densenet121": ("keras", "DenseNet121"),
    "tf_keras_resnet50": ("tf_keras", "ResNet50"),
    "tf_keras_mobilenetv2": ("tf_keras", "MobileNetV2"),
    "tf_keras_densenet121": ("tf_keras", "DenseNet121"),
}
SIZE = 32


@functools.cache
def _root() -> str:
    root = tempfile.mkdtemp(prefix="fusecli-keras-apps-")
    atexit.register(shutil.rmtree, root, True)
    return root


@functools.cache
def saved_app(name: str) -> str:
    """The SavedModel folder of application ``name`` (built on first use)."""
    import importlib

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    package, app = {**APPS, **MORE_APPS}[name]
    keras = importlib.import_module(package)
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    model = getattr(keras.applications, app)(weights=None, input_shape=(SIZE, SIZE, 3), classes=10)
    path = os.path.join(_root(), name)
    if package == "keras":
        model.export(path, verbose=False)
    else:
        tf.saved_model.save(model, path)
    return path


ENCODER_DIM = 64  # the model width; 4 heads of 16, an FFN of 4 * 64


@functools.cache
def saved_encoder(activation: str = "relu", seq: int | None = None, blocks: int = 2,
                  positions: bool = False) -> str:
    """A Keras 3 transformer encoder built the usual way, exported with ``model.export``: input
    ``keras.Input((seq, 64), name="x")`` (``seq`` None: a dynamic sequence), then per block
    MultiHeadAttention + residual + LayerNormalization and a Dense FFN (``activation``) + residual +
    LayerNormalization. ``positions``: a learned position embedding added first, read at
    ``arange(shape(x)[1])`` (a Range whose size only TensorFlow's shape inference evaluates)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras

    layers = keras.layers
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)

    class Positions(layers.Layer):
        def build(self, shape):
            self.table = self.add_weight(shape=(512, shape[-1]), name="table")

        def call(self, x):
            return x + keras.ops.take(self.table, keras.ops.arange(keras.ops.shape(x)[1]), axis=0)

    x = inp = keras.Input((seq, ENCODER_DIM), name="x")
    if positions:
        x = Positions()(x)
    for _ in range(blocks):
        h = layers.MultiHeadAttention(num_heads=4, key_dim=ENCODER_DIM // 4)(x, x)
        x = layers.LayerNormalization()(layers.Add()([x, h]))
        f = layers.Dense(ENCODER_DIM)(layers.Dense(4 * ENCODER_DIM, activation=activation)(x))
        x = layers.LayerNormalization()(layers.Add()([x, f]))
    path = os.path.join(_root(), f"encoder_{activation}_{seq or 'dynamic'}_{blocks}{'_pos' * positions}")
    keras.Model(inp, x).export(path, verbose=False)
    return path


POLICIES = ("mixed_float16", "mixed_bfloat16")


def _mixed_cnn(keras):
    """Conv2D + BatchNormalization + ReLU twice, global pooling, Dense: 32x32x3 in, 10 out."""
    layers = keras.layers
    x = inp = keras.Input((SIZE, SIZE, 3), name="x")
    for _ in range(2):
        x = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(8, 3, padding="same")(x)))
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, layers.Dense(10)(x))


def _mixed_encoder(keras):
    """One encoder block, sequence 16, width 32: MultiHeadAttention (4 heads of 8) + residual +
    LayerNormalization, a GELU Dense FFN (64) + residual + LayerNormalization."""
    layers = keras.layers
    x = inp = keras.Input((16, 32), name="x")
    h = layers.MultiHeadAttention(num_heads=4, key_dim=8)(x, x)
    x = layers.LayerNormalization()(layers.Add()([x, h]))
    f = layers.Dense(32)(layers.Dense(64, activation="gelu")(x))
    return keras.Model(inp, layers.LayerNormalization()(layers.Add()([x, f])))


MIXED = {"cnn": _mixed_cnn, "encoder": _mixed_encoder}


@functools.cache
def saved_mixed(model: str, policy: str) -> str:
    """Keras 3 model ``model`` (``MIXED``) built under the global dtype policy ``policy`` and exported
    with ``model.export``; the policy in force before is restored. Keras 3's ``clear_session`` resets the
    policy, so it is set after."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras

    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    before = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        built = MIXED[model](keras)
    finally:
        keras.mixed_precision.set_global_policy(before)
    path = os.path.join(_root(), f"{model}_{policy}")
    built.export(path, verbose=False)
    return path

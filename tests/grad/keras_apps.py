"""Keras applications (weights=None, 32x32 inputs, 10 classes) saved as SavedModels, once per process.

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

    package, app = APPS[name]
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

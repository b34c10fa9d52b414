"""The SavedModel loader against SavedModels that TensorFlow, Keras 3 and tf-keras write at test time.

``saved_models()`` builds them once per test process (tests/grad/test_tf_savedmodel_oracle.py reuses
them): one ``tf.Module`` per seed pattern, a small Keras 3 CNN and ResNet-style block and a transformer
block (``model.export``), and a tf-keras CNN (``tf.saved_model.save``) when tf_keras is installed.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from fusecli.core.errors import FuseError
from fusecli.load import load_model
from fusecli.load.savedmodel import load_savedmodel

SEEDS = ("conv_bias_relu", "conv_bn_relu", "bn_add_relu", "matmul_bias_relu")
KERAS3 = ("keras3_cnn", "keras3_resnet", "keras3_transformer")
PREFIX = "StatefulPartitionedCall/"  # the signature function's call to the traced function


def _quiet_tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    return tf


def _seed_modules(tf) -> dict:
    """One tf.Module per seed pattern, with variables and a tf.function signature."""
    rng = np.random.default_rng(0)

    def var(*shape, name, trainable=True):
        return tf.Variable(rng.standard_normal(shape).astype("float32"), name=name, trainable=trainable)

    image = tf.TensorSpec([None, 8, 8, 3], tf.float32)

    class ConvBiasRelu(tf.Module):
        def __init__(self):
            self.w, self.b = var(3, 3, 3, 4, name="w"), var(4, name="b")

        @tf.function(input_signature=[image])
        def __call__(self, x):
            return {"y": tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, self.w, 1, "SAME"), self.b))}

    class ConvBnRelu(tf.Module):  # training-mode FusedBatchNormV3 (batch statistics)
        def __init__(self):
            self.w = var(3, 3, 3, 4, name="w")
            self.gamma, self.beta = var(4, name="gamma"), var(4, name="beta")

        @tf.function(input_signature=[image])
        def __call__(self, x):
            y = tf.nn.conv2d(x, self.w, 1, "SAME")
            y, _, _ = tf.compat.v1.nn.fused_batch_norm(y, self.gamma, self.beta, is_training=True)
            return {"y": tf.nn.relu(y)}

    class BnAddRelu(tf.Module):  # inference-mode FusedBatchNormV3 plus a residual side input
        def __init__(self):
            self.w, self.w2 = var(3, 3, 3, 4, name="w"), var(1, 1, 3, 4, name="w2")
            self.gamma, self.beta = var(4, name="gamma"), var(4, name="beta")
            self.mean = var(4, name="moving_mean", trainable=False)
            self.var = tf.Variable(np.ones(4, "float32"), name="moving_variance", trainable=False)

        @tf.function(input_signature=[image])
        def __call__(self, x):
            y = tf.nn.conv2d(x, self.w, 1, "SAME")
            y, _, _ = tf.compat.v1.nn.fused_batch_norm(y, self.gamma, self.beta, self.mean, self.var,
                                                       is_training=False)
            return {"y": tf.nn.relu(y + tf.nn.conv2d(x, self.w2, 1, "SAME"))}

    class MatMulBiasRelu(tf.Module):
        def __init__(self):
            self.w, self.b = var(16, 8, name="w"), var(8, name="b")

        @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32)])
        def __call__(self, x):
            return {"y": tf.nn.relu(tf.nn.bias_add(tf.matmul(x, self.w), self.b))}

    class Misc(tf.Module):  # several inputs and outputs, Split, a gather from a variable, control flow
        def __init__(self):
            self.w, self.table = var(4, 4, name="w"), var(10, 2, name="table")

        @tf.function(input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([None], tf.int32),
                                      tf.TensorSpec(None, tf.float32)])
        def __call__(self, x, ids, anything):
            a, b = tf.split(tf.matmul(x, self.w), 2, axis=1)
            c = tf.cond(tf.reduce_sum(x) > 0, lambda: a * 2.0, lambda: a)
            return {"y": c + tf.nn.embedding_lookup(self.table, ids), "z": b, "u": anything * 2.0}

    return {"conv_bias_relu": ConvBiasRelu(), "conv_bn_relu": ConvBnRelu(), "bn_add_relu": BnAddRelu(),
            "matmul_bias_relu": MatMulBiasRelu(), "misc": Misc()}


def _keras3_models() -> dict:
    import keras

    keras.backend.clear_session()  # layer names (functional_1/conv2d_1/...) start afresh
    keras.utils.set_random_seed(0)
    layers = keras.layers

    def cnn():
        x = inp = keras.Input((8, 8, 3))
        x = layers.Conv2D(4, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.ReLU()(x)
        x = layers.GlobalAveragePooling2D()(x)
        return keras.Model(inp, layers.Dense(5)(x))

    def resnet():  # ResNet's stem and one basic block
        x = inp = keras.Input((16, 16, 3))
        x = layers.ZeroPadding2D(1)(x)
        x = layers.Conv2D(8, 3, use_bias=False)(x)
        x = layers.ReLU()(layers.BatchNormalization()(x))
        x = layers.MaxPooling2D(2)(x)
        y = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(8, 3, padding="same")(x)))
        y = layers.BatchNormalization()(layers.Conv2D(8, 3, padding="same")(y))
        x = layers.ReLU()(layers.Add()([x, y]))
        x = layers.GlobalAveragePooling2D()(x)
        return keras.Model(inp, layers.Dense(4, activation="softmax")(x))

    def transformer():  # attention + residual + LayerNorm, then a GELU MLP + residual + LayerNorm
        inp = keras.Input((8, 16))
        h = layers.MultiHeadAttention(num_heads=2, key_dim=8)(inp, inp)
        x = layers.LayerNormalization()(layers.Add()([inp, h]))
        f = layers.Dense(16)(layers.Dense(32, activation="gelu")(x))
        return keras.Model(inp, layers.LayerNormalization()(layers.Add()([x, f])))

    return {"keras3_cnn": cnn(), "keras3_resnet": resnet(), "keras3_transformer": transformer()}


def _tf_keras_model():
    import tf_keras

    tf_keras.backend.clear_session()
    tf_keras.utils.set_random_seed(0)
    layers = tf_keras.layers
    x = inp = tf_keras.Input((8, 8, 3))
    x = layers.Conv2D(4, 3, padding="same")(x)
    x = layers.ReLU()(layers.BatchNormalization()(x))
    x = layers.GlobalAveragePooling2D()(x)
    return tf_keras.Model(inp, layers.Dense(5)(x))


def _tf1_bundle(tf, path: str) -> None:
    """A TF1 session bundle: graph nodes and a signature naming them, no function library."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        w = tf.compat.v1.get_variable("w", [4, 2])
        y = tf.nn.relu(tf.matmul(x, w), name="y")
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(path)
            sig = tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": y})
            builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": sig})
            builder.save()


def saved_models() -> dict[str, str]:
    """Name -> SavedModel folder, built once per process (the folder is removed at exit)."""
    root = os.path.join(tempfile.gettempdir(), f"fusecli-savedmodels-{os.getpid()}")
    done = os.path.join(root, "done")
    names = [*SEEDS, "misc", *KERAS3, "tf1_bundle"]
    if not os.path.exists(done):
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        atexit.register(shutil.rmtree, root, True)
        tf = _quiet_tf()
        for name, module in _seed_modules(tf).items():
            tf.saved_model.save(module, os.path.join(root, name), signatures=module.__call__)
        for name, model in _keras3_models().items():
            model.export(os.path.join(root, name), verbose=False)
        _tf1_bundle(tf, os.path.join(root, "tf1_bundle"))
        try:
            tf.saved_model.save(_tf_keras_model(), os.path.join(root, "tf_keras_cnn"))
        except ImportError:
            pass
        with open(done, "w") as f:
            f.write("ok")
    paths = {n: os.path.join(root, n) for n in names}
    if os.path.isdir(os.path.join(root, "tf_keras_cnn")):
        paths["tf_keras_cnn"] = os.path.join(root, "tf_keras_cnn")
    return paths


@pytest.fixture(scope="module")
def models() -> dict[str, str]:
    pytest.importorskip("tensorflow")
    return saved_models()


def kinds(graph, skip=("constant",)) -> list[str]:
    """The kinds of the graph's computing nodes in order (no Const nodes, no weight subgraphs)."""
    return [n.kind for n in graph.nodes if n.kind not in skip and not n.meta.get("constant")]


def params(graph) -> dict[str, str]:
    """Variable name -> the kind of the tensor that reads it."""
    return {t.meta["variable"]: t.kind for t in graph.tensors.values() if "variable" in t.meta}


# -- the seed patterns ------------------------------------------------------------------------------
def test_conv_bias_relu_structure(models):
    g = load_model(models["conv_bias_relu"])
    g.lint()
    assert g.format == "savedmodel" and g.meta["signature"] == "serving_default"
    assert [n.name for n in g.nodes] == [f"{PREFIX}Conv2D", f"{PREFIX}BiasAdd", f"{PREFIX}Relu",
                                         f"{PREFIX}Identity", "Identity"]
    assert [n.kind for n in g.nodes] == ["conv", "bias_add", "relu", "identity", "identity"]
    conv = g.node(f"{PREFIX}Conv2D")
    x, w = conv.inputs
    assert (x.name, x.kind, x.shape, x.dtype) == ("x", "input", (None, 8, 8, 3), "float32")
    assert g.inputs == [x]
    assert (w.name, w.kind, w.shape, w.producer) == (f"{PREFIX}Conv2D/ReadVariableOp:0", "parameter",
                                                      (3, 3, 3, 4), None)
    assert conv.outputs[0].name == f"{PREFIX}Conv2D:0" and conv.outputs[0].shape == (None, 8, 8, 4)
    assert conv.attrs["padding"] == "SAME" and conv.attrs["strides"] == [1, 1, 1, 1]
    assert conv.attrs["data_format"] == "NHWC"  # an OpDef default the SavedModel strips
    assert params(g) == {"w": "parameter", "b": "parameter"}
    assert [t.name for t in g.outputs] == ["Identity:0"] and g.meta["output_names"] == {"y": "Identity:0"}


def test_conv_bn_relu_training_batch_norm_reads_its_reserve_space(models):
    g = load_model(models["conv_bn_relu"])
    assert kinds(g) == ["conv", "batch_norm", "relu", "identity", "identity"]
    bn = next(n for n in g.nodes if n.kind == "batch_norm")
    assert bn.op_type == "FusedBatchNormV3" and bn.attrs["is_training"] is True
    assert bn.meta["stats"] == ("y3", "y4", "y5")
    assert len(bn.outputs) == 6 and bn.outputs[0].shape == (None, 8, 8, 4)
    assert bn.outputs[0].consumers[0].kind == "relu"  # 'FusedBatchNormV3:y:0' is output 0
    assert [t.name for t in bn.outputs] == [f"{PREFIX}FusedBatchNormV3:{i}" for i in range(6)]
    assert [t.dtype for t in bn.outputs] == ["float32"] * 6
    assert bn.inputs[1].kind == bn.inputs[2].kind == "parameter"


def test_bn_add_relu_inference_batch_norm_and_frozen_statistics(models):
    g = load_model(models["bn_add_relu"])
    bn = next(n for n in g.nodes if n.kind == "batch_norm")
    assert bn.attrs["is_training"] is False and bn.meta["stats"] == ("x3", "x4", "y5")
    assert params(g) == {"w": "parameter", "w2": "parameter", "gamma": "parameter", "beta": "parameter",
                         "moving_mean": "constant", "moving_variance": "constant"}
    add = next(n for n in g.nodes if n.op_type == "AddV2")
    assert add.kind == "add" and {t.producer.kind for t in add.inputs} == {"batch_norm", "conv"}
    assert add.outputs[0].consumers[0].kind == "relu"


def test_matmul_bias_relu(models):
    g = load_model(models["matmul_bias_relu"])
    assert kinds(g) == ["matmul", "bias_add", "relu", "identity", "identity"]
    mm = g.nodes[0]
    assert mm.op_type == "MatMul" and mm.outputs[0].shape == (None, 8)
    assert mm.attrs["transpose_a"] is False


def test_several_inputs_and_outputs_split_gather_and_control_flow(models):
    g = load_model(models["misc"])
    g.lint()
    assert [(t.name, t.dtype, t.shape) for t in g.inputs] == [
        ("anything", "float32", None), ("ids", "int32", (None,)), ("x", "float32", (None, 4))]
    assert list(g.meta["output_names"]) == ["u", "y", "z"]
    split = g.node(f"{PREFIX}split")
    assert split.kind == "split" and split.inputs[0].producer.kind == "matmul"  # (axis, value) -> value first
    assert [t.name for t in split.outputs] == [f"{PREFIX}split:0", f"{PREFIX}split:1"]
    z = g.tensors[g.meta["output_names"]["z"]]
    assert z.producer.inputs[0].producer.inputs[0] is split.outputs[1]  # 'split:output:1' is output 1
    gather = next(n for n in g.nodes if n.op_type == "ResourceGather")
    table = gather.inputs[0]
    assert gather.kind == "gather" and (table.kind, table.shape, table.meta["variable"]) == \
        ("parameter", (10, 2), "table")
    cond = next(n for n in g.nodes if n.op_type == "StatelessIf")
    assert cond.kind == "unknown" and cond.outputs[0].shape == (None, 2)


# -- Keras 3 and tf-keras ------------------------------------------------------------------------------
def test_keras3_cnn(models):
    g = load_model(models["keras3_cnn"])
    g.lint()
    assert [t.name for t in g.inputs] == ["keras_tensor"] and g.inputs[0].shape == (None, 8, 8, 3)
    assert g.meta["signatures"] == ["serve", "serving_default"]
    # Keras 3 exports BatchNorm in inference form: x * (gamma rsqrt(var + eps)) + (beta - mean ...)
    assert kinds(g) == ["conv", "bias_add", "mul", "bias_add", "relu", "reduce_mean", "matmul", "bias_add",
                        "identity", "identity"]
    conv = g.node(f"{PREFIX}functional_1/conv2d_1/convolution")
    assert conv.op_type == "Conv2D" and conv.outputs[0].shape == (None, 8, 8, 4)
    # the conv bias is Squeeze(Reshape(bias)): a weight subgraph, so its output is a parameter
    bias = g.node(f"{PREFIX}functional_1/conv2d_1/BiasAdd").inputs[1]
    assert bias.kind == "parameter" and bias.producer.op_type == "Squeeze" and bias.producer.meta["constant"]
    scale = g.node(f"{PREFIX}functional_1/batch_normalization_1/batchnorm/mul")
    assert scale.meta["constant"] and scale.outputs[0].kind == "parameter" and scale.outputs[0].shape == (4,)
    assert params(g) == {"conv2d/kernel": "parameter", "conv2d/bias": "parameter",
                         "batch_normalization/gamma": "parameter", "batch_normalization/beta": "parameter",
                         "batch_normalization/moving_mean": "constant",
                         "batch_normalization/moving_variance": "constant",
                         "dense/kernel": "parameter", "dense/bias": "parameter"}
    eps = g.node(f"{PREFIX}functional_1/batch_normalization_1/batchnorm/add/y").outputs[0]
    assert eps.kind == "constant" and eps.meta["value"].dtype == np.float32
    assert np.isclose(float(eps.meta["value"]), 1e-3)
    serve = load_savedmodel(models["keras3_cnn"], "serve")  # the same function under its other name
    assert kinds(serve) == kinds(g)


def test_keras3_resnet_and_transformer_load_fully(models):
    for name in ("keras3_resnet", "keras3_transformer"):
        g = load_model(models[name])
        g.lint()
        assert all(n.kind != "unknown" for n in g.nodes), [n.op_type for n in g.nodes if n.kind == "unknown"]
        assert all(n.name.startswith(PREFIX) or n.name == "Identity" for n in g.nodes)
        floats = [t for t in g.tensors.values() if t.kind == "activation" and t.is_float]
        assert floats and all(t.shape is not None and t.shape[0] is None for t in floats)
    res = load_model(models["keras3_resnet"])
    assert {"pad", "max_pool", "add", "softmax"} <= set(kinds(res))
    tr = load_model(models["keras3_transformer"])
    assert {"einsum", "softmax", "squared_difference", "stop_gradient", "rsqrt", "erfc"} <= set(kinds(tr))
    sq = next(n for n in tr.nodes if n.kind == "squared_difference")
    assert sq.inputs[1].producer.kind == "stop_gradient"  # moments' mean gets no gradient


def test_tf_keras_cnn(models):
    if "tf_keras_cnn" not in models:
        pytest.skip("tf_keras is not installed")
    g = load_model(models["tf_keras_cnn"])
    g.lint()
    assert kinds(g) == ["conv", "bias_add", "batch_norm", "relu", "reduce_mean", "matmul", "bias_add",
                        "identity", "identity"]
    assert f"{PREFIX}model/conv2d/Conv2D" in {n.name for n in g.nodes}
    bn = next(n for n in g.nodes if n.kind == "batch_norm")
    assert bn.meta["stats"] == ("x3", "x4", "y5")
    assert [t.kind for t in bn.inputs[1:]] == ["parameter", "parameter", "constant", "constant"]


# -- errors ---------------------------------------------------------------------------------------------
def test_folder_without_saved_model_pb(tmp_path):
    with pytest.raises(FuseError, match="without saved_model.pb"):
        load_model(str(tmp_path))


def test_corrupt_saved_model_pb(tmp_path):
    (tmp_path / "saved_model.pb").write_bytes(np.random.default_rng(1).bytes(4096))
    with pytest.raises(FuseError, match="not a SavedModel") as e:
        load_model(str(tmp_path))
    assert "\n" not in str(e.value)
    (tmp_path / "saved_model.pb").write_bytes(b"")
    with pytest.raises(FuseError, match="empty"):
        load_model(str(tmp_path))


def test_tf1_session_bundle_is_refused(models):
    with pytest.raises(FuseError, match="TF1 SavedModel/session bundle not supported"):
        load_model(models["tf1_bundle"])


def test_unknown_signature_lists_the_available_ones(models):
    with pytest.raises(FuseError, match=r"no signature 'predict' \(available: serve, serving_default\)"):
        load_savedmodel(models["keras3_cnn"], "predict")
    with pytest.raises(FuseError, match="no signature '__saved_model_init_op'"):
        load_savedmodel(models["keras3_cnn"], "__saved_model_init_op")


def test_saved_model_pb_path_loads_its_folder(models):
    g = load_model(os.path.join(models["conv_bias_relu"], "saved_model.pb"))
    assert g.format == "savedmodel" and len(g.nodes) == 5


# -- the schema and the import -----------------------------------------------------------------------
def _repeated(field) -> bool:
    if hasattr(field, "is_repeated"):  # protobuf >= 6
        return field.is_repeated
    return field.label == field.LABEL_REPEATED


def test_schema_matches_tensorflow_protos():
    """Every field fusecli declares has TensorFlow's number, type and cardinality."""
    pytest.importorskip("tensorflow")
    from google.protobuf import descriptor_pool
    from tensorflow.core.protobuf import saved_model_pb2  # noqa: F401  (registers the protos)

    from fusecli.load import tf_proto

    pool = descriptor_pool.Default()
    packages = ("tensorflow", "tensorflow.core.protobuf")  # the SavedModel proto lives in the latter
    for message, fields in tf_proto.SCHEMA.items():
        full = tf_proto.TF_NAMES.get(message, message)
        desc = None
        for package in packages:
            try:
                desc = pool.FindMessageTypeByName(f"{package}.{full}")
                break
            except KeyError:
                continue
        assert desc is not None, message
        ours = tf_proto.message_class(message).DESCRIPTOR
        for field, number, type_, repeated in fields:
            theirs, mine = desc.fields_by_name[field], ours.fields_by_name[field]
            assert theirs.number == number, (message, field)
            assert _repeated(theirs) == _repeated(mine) == (repeated or type_.startswith("map<")), field
            if theirs.message_type is None:
                wire = {theirs.TYPE_ENUM: theirs.TYPE_INT32}.get(theirs.type, theirs.type)
                assert mine.type == wire, (message, field)
            else:
                assert mine.message_type is not None, (message, field)


def test_loader_never_imports_tensorflow(models):
    code = ("import sys, fusecli.load.savedmodel as s; g = s.load_savedmodel(sys.argv[1]); "
            "assert g.nodes; assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules")
    subprocess.run([sys.executable, "-c", code, models["keras3_cnn"]], check=True)

"""User ``tf.custom_gradient``s saved with a SavedModel: fusecli reads what the registered gradient
function captured, and its saved set equals TensorFlow's (the oracle of test_tf_savedmodel_oracle)."""

from __future__ import annotations

import pytest

from fusecli.grad.backward import build_backward
from fusecli.grad.profiles import TENSORFLOW
from fusecli.load import load_model

tf = pytest.importorskip("tensorflow")
from .test_tf_savedmodel_oracle import compare  # noqa: E402


def _module():
    @tf.custom_gradient
    def swish(x):  # reads x and its own sigmoid, not the product
        s = tf.sigmoid(x)

        def grad(dy):
            return dy * (s + x * s * (1 - s))

        return x * s, grad

    @tf.custom_gradient
    def exp(x):  # reads its result only
        y = tf.exp(x)

        def grad(dy):
            return dy * y

        return y, grad

    class Module(tf.Module):
        def __init__(self):
            super().__init__()
            self.w1 = tf.Variable(tf.random.stateless_normal((4, 8), (0, 1)) * 0.3, name="w1")
            self.w2 = tf.Variable(tf.random.stateless_normal((8, 3), (0, 2)) * 0.3, name="w2")

        @tf.function(input_signature=[tf.TensorSpec((None, 4), tf.float32)])
        def __call__(self, x):
            h = swish(tf.matmul(x, self.w1))
            return exp(tf.matmul(h, self.w2))

    return Module()


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("custom") / "model")
    module = _module()
    tf.saved_model.save(module, folder, signatures=module.__call__)
    return folder


def test_loader_records_what_each_gradient_captured(path):
    graph = load_model(path)
    found = sorted(sorted(graph.tensors[n].producer.op_type for n in cg["reads"])
                   for cg in graph.meta["custom_gradients"])
    assert found == [["Exp"], ["MatMul", "Sigmoid"]], graph.meta["custom_gradients"]
    joint = build_backward(graph, profile=TENSORFLOW)
    joint.lint()
    assert sorted(joint.meta["composites"].values()) == ["custom_gradient", "custom_gradient"]


def test_saved_set_matches_tensorflow(path):
    r = compare(path)
    assert r["theirs"] and not r["tf_only"] and not r["ours_only"], (r["tf_only"], r["ours_only"])
    assert r["raw"] == (1.0, 1.0)
    product = r["ours"]["StatefulPartitionedCall/mul:0"]  # swish's output: read by the next MatMul's
    assert {n.op_type for n in product.needed_by} == {"MatMulGradB"}  # gradient, not by swish's
    assert r["tf_reads"]["StatefulPartitionedCall/MatMul_1:0"] == {"ZerosLike"}  # exp's x: IdentityN's
    assert r["ours"]["StatefulPartitionedCall/MatMul_1:0"].needed_by[0].op_type == "ZerosLike"  # copy

"""The long tail's TensorFlow spellings (issue 24) in a SavedModel, against TensorFlow's own saved set.

One tf.Module uses the TF ops that map to the new kinds (TopKV2, Cumsum, MatrixBandPart, GatherNd,
TensorScatterUpdate, TensorScatterAdd, FloorMod, Softsign, Tan, Atan, Asinh, Acosh, Sinh, Cosh, Asin,
Acos, Atanh, Log1p, Expm1, ClipByValue, BroadcastArgs, Sign, Floor, Ceil, Round, OneHot, IsNan);
``test_tf_savedmodel_oracle.assert_matches`` compares fusecli's saved activations with the tensors
TensorFlow's ``__backward_*`` function reads, by tensor name.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
from fusecli.load import load_model  # noqa: E402

from .test_rule_coverage import without_rule  # noqa: E402
from .test_tf_savedmodel_oracle import assert_matches  # noqa: E402

B, H = 2, 8


def _module():
    rng = np.random.default_rng(0)

    def var(*shape, name):
        return tf.Variable(rng.standard_normal(shape).astype("float32"), name=name)

    class LongTail(tf.Module):
        def __init__(self):
            self.w, self.v, self.u = var(H, H, name="w"), var(H, H, name="v"), var(4, H, name="u")
            self.p = var(B, H, name="p")

        @tf.function(input_signature=[tf.TensorSpec([B, H], tf.float32), tf.TensorSpec([B, 4], tf.int32)])
        def __call__(self, x, ids):
            with tf.name_scope("long_tail"):  # unscoped, add_14 comes back as add_14_0 in the forward fn
                return self.body(x, ids)

        def body(self, x, ids):
            h = tf.matmul(x, self.w)
            c = tf.cumsum(h, axis=1)
            values, index = tf.math.top_k(c, 4)
            t = tf.linalg.band_part(tf.matmul(tf.reshape(c, [B, 1, H]) * tf.ones([B, H, 1]), self.v), 0, -1)
            g = tf.gather_nd(t, tf.stack([ids[:, 0] % B, ids[:, 1] % H], axis=1))  # (B, H)
            s = tf.tensor_scatter_nd_update(g, [[0]], tf.tanh(h[:1]))
            s = tf.tensor_scatter_nd_add(s, [[1]], tf.sinh(h[1:2]))
            m = tf.math.floormod(tf.abs(s) + 2.0, tf.abs(tf.matmul(tf.cast(index, tf.float32), self.u)) + 1.0)
            k = tf.nn.softsign(m) + tf.math.atan(values[:, :1] * self.p)
            k = k + tf.math.tan(tf.tanh(k)) + tf.math.asinh(k) + tf.math.cosh(tf.tanh(k))
            k = k + tf.math.acosh(tf.abs(k) + 1.5) + tf.math.asin(tf.tanh(k)) * tf.math.acos(tf.tanh(k) * 0.5)
            k = k + tf.math.atanh(tf.tanh(k) * 0.5) + tf.math.log1p(tf.abs(k)) + tf.math.expm1(tf.tanh(k))
            k = tf.raw_ops.ClipByValue(t=k, clip_value_min=-3.0, clip_value_max=3.0)
            k = tf.broadcast_to(k, tf.raw_ops.BroadcastArgs(s0=tf.shape(k), s1=tf.shape(h)))
            no_grad = tf.sign(k) + tf.floor(k) + tf.math.ceil(k) + tf.round(k)
            no_grad += tf.cast(tf.math.is_nan(k), tf.float32)
            no_grad += tf.reduce_sum(tf.one_hot(ids, 3), axis=1)[:, :1]
            return {"y": k * no_grad}

    return LongTail()


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> str:
    path = os.path.join(tmp_path_factory.mktemp("tf_long_tail"), "long_tail")
    module = _module()
    tf.saved_model.save(module, path, signatures=module.__call__)
    return path


def test_every_op_has_a_rule(saved):
    graph = load_model(saved)
    ops = {n.op_type for n in graph.nodes}
    assert {"TopKV2", "Cumsum", "MatrixBandPart", "GatherNd", "TensorScatterUpdate", "TensorScatterAdd",
            "FloorMod", "Softsign", "Tan", "Atan", "Asinh", "Acosh", "OneHot", "IsNan", "Sign", "Log1p",
            "Expm1", "ClipByValue", "BroadcastArgs"} <= ops, ops
    assert not without_rule(graph)


def test_saved_set_matches_tensorflow(saved):
    assert_matches(saved)



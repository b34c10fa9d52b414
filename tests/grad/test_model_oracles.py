"""Whole models against the frameworks: a small CNN and a transformer block, end to end.

The framework's saved set must be fusecli's, changed node by node exactly as the per-op table of
documented differences says (a tensor fusecli reads for one node may be read by another anyway).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from fusecli.grad.profiles import OPS, TENSORFLOW
from tests.conftest import make_model, vi

from .oracles import (
    ORACLES,
    fusecli_joint,
    fusecli_reads_by_node,
    fusecli_saved,
    make_feeds,
    model_names,
    onnxruntime_outputs,
)
from .test_rules_oracles import expected_difference


class _Weights:
    """Seeded initializers: small random floats, or given values."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(1)
        self.inits: list[TensorProto] = []

    def __call__(self, name: str, *shape: int, value=None) -> str:
        if value is None:
            value = (self.rng.standard_normal(shape) * 0.3).astype(np.float32)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name


def node(op, ins, out, **attrs):
    return helper.make_node(op, ins, [out], out, **attrs)


def small_cnn():
    """conv+bias -> BN -> relu -> maxpool -> conv -> bias add -> relu -> residual add -> GAP -> gemm."""
    w = _Weights()
    c = 4
    bn = [w("bn_scale", c), w("bn_bias", c), w("bn_mean", c),
          w("bn_var", value=np.linspace(0.5, 1.5, c, dtype=np.float32))]
    nodes = [
        node("Conv", ["x", w("w1", c, 3, 3, 3), w("b1", c)], "conv1", pads=[1, 1, 1, 1]),
        node("BatchNormalization", ["conv1", *bn], "bn"),
        node("Relu", ["bn"], "relu1"),
        node("MaxPool", ["relu1"], "pool", kernel_shape=[2, 2], strides=[2, 2]),
        node("Conv", ["pool", w("w2", c, c, 3, 3)], "conv2", pads=[1, 1, 1, 1]),
        node("Add", ["conv2", w("b2", c, 1, 1)], "bias2"),
        node("Relu", ["bias2"], "relu2"),
        node("Add", ["relu2", "pool"], "residual"),
        node("GlobalAveragePool", ["residual"], "gap"),
        node("Flatten", ["gap"], "flat"),
        node("Gemm", ["flat", w("w3", 5, c), w("b3", 5)], "logits", transB=1),
        node("LogSoftmax", ["logits"], "y", axis=-1),
    ]
    return make_model(nodes, [vi("x", 2, 3, 8, 8)], [vi("y", 2, 5)], w.inits)


def transformer_block():
    """Pre-norm block: two-head self-attention and a GELU MLP, each with its residual."""
    w = _Weights()
    b, s, d, h = 2, 4, 8, 2
    shape = w("heads_shape", value=np.array([b, s, h, d // h], np.int64))
    nodes = [
        node("LayerNormalization", ["x", w("ln1_scale", d), w("ln1_bias", d)], "ln1", axis=-1),
        *(node("MatMul", ["ln1", w(f"w{p}", d, d)], p) for p in "qkv"),
        *(node("Reshape", [p, shape], f"{p}_heads") for p in "qkv"),
        node("Transpose", ["q_heads"], "qh", perm=[0, 2, 1, 3]),
        node("Transpose", ["k_heads"], "kh", perm=[0, 2, 3, 1]),
        node("Transpose", ["v_heads"], "vh", perm=[0, 2, 1, 3]),
        node("MatMul", ["qh", "kh"], "scores"),
        node("Mul", ["scores", w("scale", value=np.float32(1 / np.sqrt(d // h)))], "scaled"),
        node("Softmax", ["scaled"], "probs", axis=-1),
        node("MatMul", ["probs", "vh"], "context"),
        node("Transpose", ["context"], "context_t", perm=[0, 2, 1, 3]),
        node("Reshape", ["context_t", w("merge_shape", value=np.array([b, s, d], np.int64))], "merged"),
        node("MatMul", ["merged", w("wo", d, d)], "proj"),
        node("Add", ["proj", w("bo", d)], "attn"),
        node("Add", ["x", "attn"], "h1"),
        node("LayerNormalization", ["h1", w("ln2_scale", d), w("ln2_bias", d)], "ln2", axis=-1),
        node("MatMul", ["ln2", w("w_up", d, 2 * d)], "up"),
        node("Add", ["up", w("b_up", 2 * d)], "up_b"),
        node("Gelu", ["up_b"], "act"),
        node("MatMul", ["act", w("w_down", 2 * d, d)], "down"),
        node("Add", ["down", w("b_down", d)], "mlp"),
        node("Add", ["h1", "mlp"], "y"),
    ]
    return make_model(nodes, [vi("x", b, s, d)], [vi("y", b, s, d)], w.inits, opset=20)


def predicted_saved(joint, fw: str) -> set[str]:
    """fusecli's reads, each node's changed by its documented difference with ``fw``."""
    nodes = {n.name: n for n in joint.forward_nodes()}
    out: set[str] = set()
    for name, reads in fusecli_reads_by_node(joint).items():
        fw_only, ours_only = expected_difference(nodes[name], fw)
        out |= (reads - ours_only) | fw_only
    return out


@pytest.mark.parametrize("fw", list(ORACLES))
@pytest.mark.parametrize("make", [small_cnn, transformer_block], ids=lambda f: f.__name__)
def test_model_saved_values_match_the_framework(make, fw):
    module, oracle = ORACLES[fw]
    pytest.importorskip(module)
    model = make()
    feeds = make_feeds(model)
    got = oracle(model, feeds)
    np.testing.assert_allclose(got.outputs[0], onnxruntime_outputs(model, feeds)[0], rtol=1e-4, atol=1e-5)
    joint = fusecli_joint(model)
    names = model_names(model)  # LayerNorm's kept Mean and InvStdDev are no tensor of the model
    assert set().union(*fusecli_reads_by_node(joint).values()) & names == fusecli_saved(model)
    # TensorFlow's graph-mode gradients also differentiate constant operands (the attention scale):
    # fusecli's TensorFlow mode, used for SavedModels, builds the backward the same way
    assert got.named == predicted_saved(fusecli_joint(model, TENSORFLOW if fw == "tf" else OPS), fw) & names

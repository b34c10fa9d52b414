"""A residual sum whose operands' sequence dims carry two names (shape inference names a conv stack's
frame count anew on each operand: HuBERT's TorchScript export) becomes SkipLayerNormalization where
those dims are equal at the analysis's sizes, and stays Add + LayerNormalization, with its reason said,
where they differ."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from fusecli.rewrite import RewriteOptions, rewrite
from tests.conftest import make_model
from tests.rewrite.helpers import assert_same_outputs

H = 16


def residual_layer_norm():
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((1 + 0.1 * rng.standard_normal(H)).astype(np.float32), "gamma"),
             numpy_helper.from_array((0.1 * rng.standard_normal(H)).astype(np.float32), "beta")]
    nodes = [helper.make_node("Add", ["x", "r"], ["s"], name="add"),
             helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5,
                              name="norm")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "frames_a", H]),
              helper.make_tensor_value_info("r", TensorProto.FLOAT, ["batch", "frames_b", H])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    return make_model(nodes, inputs, outputs, inits)


def test_equal_at_the_analysis_sizes_is_one_skip_layer_norm(save_model):
    dims = {"frames_a": 7, "frames_b": 7}
    path = save_model(residual_layer_norm())
    r = rewrite(path, RewriteOptions(batch=2, dims=dims))
    assert r.ops_after.get("com.microsoft.SkipLayerNormalization") == 1, r.warnings
    assert "Add" not in r.ops_after
    assert r.verification.ok
    assert_same_outputs(path, r.model, dims=dims)


def test_unequal_dims_keep_the_add_and_say_why(save_model):
    path = save_model(residual_layer_norm())
    r = rewrite(path, RewriteOptions(batch=2, dims={"frames_a": 7, "frames_b": 1}))
    assert "com.microsoft.SkipLayerNormalization" not in r.ops_after
    assert any("skip_layer_norm" in w and "residual sum's operands" in w for w in r.warnings), r.warnings

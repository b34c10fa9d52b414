"""Attributes of the wrong kind on the ops an emitter reads: one FuseError naming the node, never a crash.

Found by trying every attribute an emitter reads with a list, a string, bytes that are not UTF-8, a
tensor and a subgraph (each once ended in TypeError, ValueError or UnicodeDecodeError).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from fusecli.core.errors import FuseError
from fusecli.rewrite import RewriteOptions, rewrite
from tests.hostile import model, vi

RNG = np.random.default_rng(0)


def _p(name, *shape):
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), name)


def _conv_bn_act(act: str, act_attrs: dict, bn_attrs: dict, opset: int = 17):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], "conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "sh", "m", "v"], ["bn"], "bn", **bn_attrs),
             helper.make_node(act, ["bn"], ["y"], "act", **act_attrs)]
    inits = [_p("w", 4, 4, 3, 3), _p("s", 4), _p("sh", 4), _p("m", 4),
             numpy_helper.from_array(np.ones(4, np.float32), "v")]
    return model(nodes, [vi("x", 1, 4, 6, 6)], [vi("y", 1, 4, 6, 6)], inits, opset=opset)


def _layer_norm(attrs: dict):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], "mm"),
             helper.make_node("Add", ["m", "x"], ["a"], "res"),
             helper.make_node("LayerNormalization", ["a", "g", "b"], ["y"], "ln", **attrs)]
    return model(nodes, [vi("x", 2, 3, 8)], [vi("y", 2, 3, 8)], [_p("w", 8, 8), _p("g", 8), _p("b", 8)])


CASES = [
    (lambda: _conv_bn_act("LeakyRelu", {"alpha": [1, 2]}, {}),
     r"node 'act': attribute 'alpha' is a list of ints"),
    (lambda: _conv_bn_act("HardSigmoid", {"beta": "tanh"}, {}), r"node 'act': attribute 'beta' is a string"),
    (lambda: _conv_bn_act("Clip", {"min": b"\xff\xfe"}, {}, opset=6),
     r"node 'act': attribute 'min' is a string"),
    (lambda: _conv_bn_act("Relu", {}, {"epsilon": [0.5, 0.5]}), r"node 'bn': attribute 'epsilon' is a list"),
    (lambda: _layer_norm({"axis": [1, 2]}), r"node 'ln': attribute 'axis' is a list of ints"),
    (lambda: _layer_norm({"epsilon": "tanh"}), r"node 'ln': attribute 'epsilon' is a string"),
]


@pytest.mark.parametrize("build, message", CASES)
def test_attribute_of_the_wrong_kind_is_one_error(build, message, save_model):
    with pytest.raises(FuseError, match=message) as e:
        rewrite(save_model(build()), RewriteOptions(verify=False))
    assert "\n" not in str(e.value)

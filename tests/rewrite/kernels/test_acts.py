"""Gate activations written out become one op: QuickGelu (SiLU, QuickGELU's beta 1.702) and HardSwish
(x * relu6(x + 3) / 6, CPU only); checked on fresh inputs by onnxruntime against the original."""

from __future__ import annotations

import pytest

from fusecli.rewrite import RewriteOptions, rewrite
from tests.builders import Net
from tests.rewrite.helpers import assert_same_outputs, attr, nodes, ops


def _rewrite(save_model, model, target="cpu"):
    path = save_model(model)
    r = rewrite(path, RewriteOptions(target=target, batch=2))
    assert r.verification.ok if not r.unchanged else r.verification is None  # nothing rewritten: no check
    assert_same_outputs(path, r.model)
    return r


@pytest.mark.parametrize("beta", [None, 1.702])
def test_silu_and_quick_gelu_become_quick_gelu(save_model, beta):
    net = Net(x=("N", 16))
    x = "x" if beta is None else net.op("Mul", "beta", "x", net.param("b", value=beta))
    y = net.op("Mul", "act", "x", net.op("Sigmoid", "sig", x))
    r = _rewrite(save_model, net.model(y))
    assert ops(r.model) == {"com.microsoft.QuickGelu": 1}
    assert attr(nodes(r.model, "QuickGelu")[0], "alpha") == pytest.approx(beta or 1.0)


def _hard_swish() -> Net:
    net = Net(x=("N", 16))
    shifted = net.op("Add", "add3", "x", net.param("three", value=3.0))
    relu6 = net.op("Clip", "relu6", shifted, net.param("lo", value=0.0), net.param("hi", value=6.0))
    y = net.op("Div", "div6", net.op("Mul", "mul", "x", relu6), net.param("six", value=6.0))
    return net.model(y)


def test_hard_swish_written_out_becomes_the_op_on_cpu_only(save_model):
    assert ops(_rewrite(save_model, _hard_swish()).model) == {"HardSwish": 1}
    assert "HardSwish" not in ops(_rewrite(save_model, _hard_swish(), "cuda").model)


def test_clip_other_than_relu6_is_not_hard_swish(save_model):
    net = Net(x=("N", 16))
    shifted = net.op("Add", "add3", "x", net.param("three", value=3.0))
    clip = net.op("Clip", "clip", shifted, net.param("lo", value=0.0), net.param("hi", value=5.0))
    y = net.op("Div", "div6", net.op("Mul", "mul", "x", clip), net.param("six", value=6.0))
    assert "HardSwish" not in ops(_rewrite(save_model, net.model(y)).model)

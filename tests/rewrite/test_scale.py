"""A hang guard, not a speed test: rewrite of a 20k-node chain (its passes, verification and the check of the
written file) ends, complete and verified, within GUARD CPU seconds. How rewrite's time compares with
analyze's is measured side by side by ``benchmarks/bench_scale.py --skip-scaling`` (its history in
benchmarks/RESULTS-scale.md); this test once asserted that ratio, and its bound went 3x, 3.5x, 4x, 4.5x, 5x
as the work rewrite does grew. The chains take 3-5 CPU seconds here: GUARD is 40x that."""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fusecli.rewrite import RewriteOptions, rewrite

NODES = 20_000


def _plain_chain(n: int) -> onnx.ModelProto:
    """x -> Relu -> Sigmoid -> Tanh -> Neg -> ... (nothing to fuse)."""
    ops, nodes, prev = ["Relu", "Sigmoid", "Tanh", "Neg"], [], "x"
    for i in range(n):
        nodes.append(helper.make_node(ops[i % 4], [prev], [f"t{i}"], f"n{i}"))
        prev = f"t{i}"
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["N", 4])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _conv_chain(n: int) -> onnx.ModelProto:
    """(Conv 1x1 -> Relu) * n/2: every pair becomes a FusedConv."""
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32).reshape(4, 4, 1, 1), "w")
    nodes, prev = [], "x"
    for i in range(n // 2):
        nodes += [helper.make_node("Conv", [prev, "w"], [f"c{i}"], f"conv{i}"),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], f"relu{i}")]
        prev = f"r{i}"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 2, 2])
    g = helper.make_graph(nodes, "chain", [x],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 4, 2, 2])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


GUARD = 200.0  # CPU seconds: a hang or a pass gone quadratic, not a slow machine (see the docstring)


@pytest.mark.parametrize("build", [_plain_chain, _conv_chain])
def test_rewrite_of_a_long_chain_ends_within_the_hang_guard(build, tmp_path):
    """Verified as rewrite verifies by default: 10k identical FusedConv regions once, not the whole model."""
    path = str(tmp_path / "chain.onnx")
    onnx.save(build(NODES), path)
    t0 = time.process_time()
    r = rewrite(path, RewriteOptions(), output=str(tmp_path / "out.onnx"))
    seconds = time.process_time() - t0
    print(f"rewrite of {NODES} nodes: {seconds:.2f} CPU s")  # for the log; bench_scale.py compares
    assert r.nodes_before == NODES
    if build is _conv_chain:
        v = r.verification
        assert v.ok and (v.regions, v.distinct) == (NODES // 2, 1) and v.model_skipped and not v.checks
        assert r.nodes_after == NODES // 2
    assert seconds <= GUARD, f"rewrite took {seconds:.1f} CPU s (hang guard {GUARD:g} s)"

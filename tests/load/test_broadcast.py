"""An export whose elementwise inputs do not broadcast is said to be inconsistent, where it starts
(fusecli/load/broadcast.py), against onnxruntime, which refuses to run it."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from fusecli.load.broadcast import broadcast_conflicts
from fusecli.pipeline import Options, analyze


def _model(width: int) -> onnx.ModelProto:
    """x (batch, 16) doubled by a Concat, a MatMul, a Slice back to 16 columns, times a vector of
    ``width``: consistent at 16, not at 32."""
    nodes = [helper.make_node("Concat", ["x", "x"], ["xx"], axis=1, name="cat"),
             helper.make_node("MatMul", ["xx", "w"], ["h"], name="mm"),
             helper.make_node("Slice", ["h", "start", "end", "axis"], ["hs"], name="slice"),
             helper.make_node("Mul", ["hs", "b"], ["m"], name="scale"),
             helper.make_node("Relu", ["m"], ["y"], name="relu")]
    inits = [helper.make_tensor("w", TensorProto.FLOAT, [32, 32], [0.5] * 1024),
             helper.make_tensor("b", TensorProto.FLOAT, [width], [1.0] * width),
             helper.make_tensor("start", TensorProto.INT64, [1], [0]),
             helper.make_tensor("end", TensorProto.INT64, [1], [16]),
             helper.make_tensor("axis", TensorProto.INT64, [1], [1])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("width", [16, 32])
def test_an_inconsistent_broadcast_is_said_where_onnxruntime_refuses_the_model(tmp_path, width):
    ort = pytest.importorskip("onnxruntime")
    import numpy as np

    path = tmp_path / "m.onnx"
    onnx.save(_model(width), path)
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        session.run(None, {"x": np.ones((2, 16), np.float32)})
        runs = True
    except Exception:  # onnxruntime's refusal, at load or at run
        runs = False
    a = analyze(str(path), Options(batch=2))
    conflicts = broadcast_conflicts(a.graph, a.sizes)
    said = [w for w in a.warnings if w.startswith("an inconsistent model")]
    assert runs == (width == 16)
    if runs:
        assert not conflicts and not said
    else:
        assert [(n.name, x, y) for n, x, y in conflicts] == [("scale", 16, 32)]
        assert len(said) == 1 and "'scale'" in said[0] and "16 against 32" in said[0]
        assert any("the model is inconsistent (above)" in w for w in a.warnings)

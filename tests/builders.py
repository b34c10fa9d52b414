"""One small ONNX model builder for the tests (fusion patterns, rewrite kernels)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import make_model


class Net:
    """A model under construction: ``op(type, name, ...)`` adds node ``name`` making ``<name>_out``.

    Parameters are seeded normals times 0.5, or positive (|normal| * 0.5 + 0.5) where asked, by default
    with ``positive=True``, or filled with ``value``.
    """

    def __init__(self, seed: int = 0, positive: bool = False, **inputs: tuple) -> None:
        self.rng = np.random.default_rng(seed)
        self.positive = positive
        inputs = inputs or {"x": ("N", 3, 8, 8)}
        self.inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s))
                       for n, s in inputs.items()]
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def param(self, name: str, *shape: int, value=None, positive: bool | None = None) -> str:
        data = self.rng.standard_normal(shape) * 0.5 if value is None else np.full(shape, value)
        if value is None and (self.positive if positive is None else positive):
            data = np.abs(data) + 0.5
        self.inits.append(numpy_helper.from_array(np.asarray(data, np.float32), name))
        return name

    def ints(self, name: str, *values: int) -> str:
        self.inits.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    def op(self, op_type: str, name: str, *inputs: str, **attrs) -> str:
        out = f"{name}_out"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name, **attrs))
        return out

    def act(self, op_type: str, x: str, name: str = "act") -> str:
        """An activation; ``Clip`` is Clip(0, 6) with its bounds as inputs."""
        if op_type == "Clip":
            return self.op("Clip", name, x, self.param(f"{name}_lo", value=0.0),
                           self.param(f"{name}_hi", value=6.0))
        return self.op(op_type, name, x, **({"alpha": 0.1} if op_type == "LeakyRelu" else {}))

    def conv(self, x: str = "x", name: str = "conv", cout: int = 4, cin: int = 3, k: int = 3,
             own_bias: bool = False) -> str:
        w = self.param(f"{name}_w", cout, cin, k, k)
        b = (self.param(f"{name}_b", cout),) if own_bias else ()
        return self.op("Conv", name, x, w, *b, pads=[k // 2] * 4)

    def bias(self, x: str, shape: tuple = (4, 1, 1), name: str = "bias") -> str:
        """A bias Add (NCHW per-channel by default)."""
        return self.op("Add", name, x, self.param(f"{name}_b", *shape))

    def bn(self, x: str, c: int = 4, name: str = "bn") -> str:
        return self.op("BatchNormalization", name, x, self.param(f"{name}_scale", c),
                       self.param(f"{name}_shift", c), self.param(f"{name}_mean", c),
                       self.param(f"{name}_var", c, positive=True), epsilon=1e-3)

    def model(self, *outputs: str, opset: int = 17) -> onnx.ModelProto:
        """The checked model; output types come from shape inference."""
        outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
        model = onnx.shape_inference.infer_shapes(
            make_model(self.nodes, self.inputs, outs, self.inits, opset=opset), strict_mode=True)
        onnx.checker.check_model(model, full_check=True)
        return model

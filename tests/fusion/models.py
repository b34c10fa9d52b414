"""Small ONNX models for the fusion tests (opset 17, symbolic batch ``N``), each run in ONNX Runtime."""

from __future__ import annotations

import math
import os

import numpy as np
import onnx
import onnxruntime as ort

from fusecli.pipeline import Analysis, Options, analyze
from tests.builders import Net as _Net

_rng = np.random.default_rng(0)


def Net(**inputs: tuple) -> _Net:  # noqa: N802 -- the shared builder, all parameters positive
    return _Net(positive=True, **inputs)


def run_ort(model: onnx.ModelProto, batch: int = 2) -> list[np.ndarray]:
    """Run ``model`` in ONNX Runtime on random inputs, symbolic dims at ``batch``: proof it is valid."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {i.name: _rng.standard_normal([d if isinstance(d, int) else batch for d in i.shape])
             .astype(np.float32) for i in sess.get_inputs()}
    return sess.run(None, feeds)


def analyze_model(model: onnx.ModelProto, folder, batch: int = 2, **options) -> Analysis:
    """Check ``model`` runs in ONNX Runtime, save it under ``folder`` and analyze it."""
    run_ort(model, batch)
    path = os.path.join(folder, f"{model.graph.name}_{len(os.listdir(folder))}.onnx")
    onnx.save(model, path)
    return analyze(path, Options(batch=batch, **options))


def found(a: Analysis, pattern: str) -> list[list[str]]:
    """Node names of each match of ``pattern``."""
    return [[n.name for n in m.nodes] for m in a.matches if m.pattern.name == pattern]


def only(a: Analysis, pattern: str):
    """The one match of ``pattern``."""
    ms = [m for m in a.matches if m.pattern.name == pattern]
    assert len(ms) == 1, f"{pattern}: {len(ms)} matches in {[(m.pattern.name, m.nodes) for m in a.matches]}"
    return ms[0]


# -- models used by several test files --------------------------------------------------------------
def conv_act(act: str = "Relu", bias: str = "add", k: int = 3) -> onnx.ModelProto:
    """Conv + bias (``own``: Conv's B, ``add``: a per-channel Add, ``none``) + activation."""
    net = Net()
    y = net.conv(k=k, own_bias=bias == "own")
    if bias == "add":
        y = net.bias(y)
    return net.model(net.act(act, y))


def conv_bn_act(bn: str = "op", act: str | None = "Relu", x_shape=("N", 3, 8, 8)) -> onnx.ModelProto:
    """Conv + BatchNorm (``op``, or decomposed: ``add`` x*s+t, ``sub`` x*s-t) + optional activation."""
    net = Net(x=x_shape)
    y = net.conv()
    if bn == "op":
        y = net.bn(y)
    else:
        y = net.op("Mul", "scale", y, net.param("bn_s", 4, 1, 1))
        y = net.op("Add" if bn == "add" else "Sub", "shift", y, net.param("bn_t", 4, 1, 1))
    return net.model(net.act(act, y) if act else y)


def gelu_erf(order: int = 0, arg: str = "div", half: float = 0.5, sqrt2: float = math.sqrt(2),
             bias: bool = False, erf_of_other: bool = False) -> onnx.ModelProto:
    """x = x0 @ w (+ b); 0.5 x (1 + erf(x / sqrt 2)) in one of the catalogue's three operand orders.

    ``arg``: ``div`` (x / sqrt2) or ``mul`` (x * 1/sqrt2); ``half``/``sqrt2`` let a test break a constant;
    ``erf_of_other``: the erf reads a second MatMul's output instead of x.
    """
    net = Net(x0=("N", 8))
    x = net.op("MatMul", "matmul", "x0", net.param("w", 8, 16))
    if bias:
        x = net.op("Add", "bias", x, net.param("b", 16))
    x_erf = net.op("MatMul", "matmul2", "x0", net.param("w2", 8, 16)) if erf_of_other else x
    if arg == "div":
        e = net.op("Div", "erf_arg", x_erf, net.param("sqrt2", value=sqrt2))
    else:
        e = net.op("Mul", "erf_arg", x_erf, net.param("inv_sqrt2", value=1 / sqrt2))
    one_plus = net.op("Add", "one_plus", net.op("Erf", "erf", e), net.param("one", value=1.0))
    h = net.param("half", value=half)
    if order == 0:  # (x * 0.5) * (1 + erf)
        y = net.op("Mul", "gelu", net.op("Mul", "half_x", h, x), one_plus)
    elif order == 1:  # (x * (1 + erf)) * 0.5
        y = net.op("Mul", "gelu", h, net.op("Mul", "x_one_plus", one_plus, x))
    else:  # x * ((1 + erf) * 0.5)
        y = net.op("Mul", "gelu", net.op("Mul", "half_one_plus", one_plus, h), x)
    return net.model(y)


GELU_ERF_NODES = {0: ["erf_arg", "erf", "one_plus", "half_x", "gelu"],
                  1: ["erf_arg", "erf", "one_plus", "x_one_plus", "gelu"],
                  2: ["erf_arg", "erf", "one_plus", "half_one_plus", "gelu"]}


def layer_norm(square: str = "pow", exponent: float = 2.0, skip: str | None = None,
               mean_of: str | None = None) -> onnx.ModelProto:
    """(x - mean) / sqrt(mean(d^2) + eps) * gamma + beta over the last axis of x (N, 4, 16).

    ``square``: ``pow`` (Pow(d, exponent)) or ``mul`` (d * d); ``skip``: ``add`` adds a second input
    first, ``op`` uses the LayerNormalization op after that Add instead of the decomposition;
    ``mean_of``: the tensor the mean is taken of, when not x.
    """
    net = Net(x=("N", 4, 16), z=("N", 4, 16))
    x = net.op("Add", "skip", "x", "z") if skip else "x"
    gamma, beta = net.param("gamma", 16), net.param("beta", 16)
    if skip == "op":
        return net.model(net.op("LayerNormalization", "ln", x, gamma, beta, axis=-1))
    d = net.op("Sub", "sub", x, net.op("ReduceMean", "mean", mean_of or x, axes=[-1]))
    sq = net.op("Pow", "sq", d, net.param("two", value=exponent)) if square == "pow" else \
        net.op("Mul", "sq", d, d)
    var = net.op("Add", "var_eps", net.op("ReduceMean", "var", sq, axes=[-1]), net.param("eps", value=1e-5))
    normed = net.op("Div", "normalize", d, net.op("Sqrt", "std", var))
    return net.model(net.op("Add", "beta_add", net.op("Mul", "gamma_mul", normed, gamma), beta))


def gelu_tanh(cube: float = 3.0) -> onnx.ModelProto:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^cube))) for x = x0 @ w."""
    net = Net(x0=("N", 8))
    x = net.op("MatMul", "matmul", "x0", net.param("w", 8, 16))
    c = net.op("Mul", "cube_mul", net.op("Pow", "cube", x, net.param("three", value=cube)),
               net.param("k", value=0.044715))
    t = net.op("Tanh", "tanh", net.op("Mul", "tanh_arg", net.op("Add", "inner", x, c),
                                      net.param("s", value=math.sqrt(2 / math.pi))))
    one_plus = net.op("Add", "one_plus", t, net.param("one", value=1.0))
    half_x = net.op("Mul", "half_x", x, net.param("half", value=0.5))
    return net.model(net.op("Mul", "gelu", half_x, one_plus))


def conv_squeeze(then: str = "bias") -> onnx.ModelProto:
    """A 1-D conv written as 2-D: Conv (N, 4, 1, 16) -> Squeeze(axis 2) -> per-channel Add or Relu."""
    net = Net(x=("N", 4, 1, 16))
    c = net.op("Conv", "conv", "x", net.param("w", 8, 4, 1, 3), pads=[0, 1, 0, 1])
    s = net.op("Squeeze", "squeeze", c, net.ints("axes", 2))
    return net.model(net.bias(s, shape=(8, 1)) if then == "bias" else net.act(then, s))


LAYER_NORM_NODES = ["mean", "sub", "sq", "var", "var_eps", "std", "normalize", "gamma_mul", "beta_add"]

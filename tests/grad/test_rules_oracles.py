"""fusecli's gradient rules against TensorFlow's and PyTorch's autodiff, one single-op ONNX model per op.

The frameworks are the judge: each test computes what the framework's backward reads and compares
it with what fusecli's backward reads. Where fusecli deliberately differs, DIFFERENCES says how, in
the rules' notation (``x<i>``: the op's input i, ``y<i>``: its output i), and why.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from fusecli.core.ir import Graph, Node
from fusecli.grad.backward import build_backward
from fusecli.grad.profiles import get_profile
from fusecli.memory.liveness import analyze_liveness
from tests.conftest import make_model, vi

from .oracles import (
    ORACLES,
    fusecli_joint,
    fusecli_kept,
    fusecli_saved,
    make_feeds,
    onnxruntime_outputs,
    tf_saved,
)


@dataclass
class Case:
    """One ONNX node whose float operands are graph inputs; integer operands are initializers."""

    id: str
    op: str
    args: tuple[str, ...]  # the node's input names ("" = absent)
    shapes: dict[str, tuple[int, ...]]
    inits: dict[str, np.ndarray] = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)
    outs: int = 1  # node outputs; the first ``graph_outs`` are graph outputs
    graph_outs: int | None = None
    opset: int = 17
    positive: tuple[str, ...] = ()
    bools: tuple[str, ...] = ()
    out_type: int = TensorProto.FLOAT
    random: bool = False  # no forward comparison with onnxruntime
    skip: dict[str, str] = field(default_factory=dict)  # framework -> why it has no such op

    def model(self):
        outs = ["y"] if self.outs == 1 else [f"y{i}" for i in range(self.outs)]
        inputs = [helper.make_tensor_value_info(
            n, TensorProto.BOOL if n in self.bools else TensorProto.FLOAT, list(s))
            for n, s in self.shapes.items()]
        outputs = [helper.make_tensor_value_info(n, self.out_type, None)
                   for n in outs[:self.graph_outs or self.outs]]
        node = helper.make_node(self.op, list(self.args), outs, "node", **self.attrs)
        inits = [numpy_helper.from_array(v, n) for n, v in self.inits.items()]
        return make_model([node], inputs, outputs, inits, opset=self.opset)


def ints(*v):
    return np.array(v, dtype=np.int64)


def f32(v):
    return np.array(v, dtype=np.float32)


def unary(op, shape=(2, 3, 4), **kw):
    return Case(op.lower(), op, ("x",), {"x": shape}, **kw)


def binary(op, a, b, **kw):
    return Case(f"{op.lower()}_broadcast", op, ("a", "b"), {"a": a, "b": b}, **kw)


X4 = {"x": (2, 3, 6, 6)}
NO_TF_OP = "TensorFlow has no such op: Keras composes it from ops whose rules are checked on their own"
CASES = [
    Case("conv1d", "Conv", ("x", "w", "b"), {"x": (2, 3, 8), "w": (4, 3, 3), "b": (4,)},
         attrs={"pads": [1, 1]}),
    Case("conv2d", "Conv", ("x", "w", "b"), {**X4, "w": (4, 3, 3, 3), "b": (4,)},
         attrs={"pads": [1, 1, 1, 1]}),
    Case("conv3d", "Conv", ("x", "w"), {"x": (1, 2, 4, 4, 4), "w": (3, 2, 3, 3, 3)}),
    Case("conv_grouped", "Conv", ("x", "w"), {"x": (2, 4, 6, 6), "w": (6, 2, 3, 3)}, attrs={"group": 2}),
    Case("conv_depthwise", "Conv", ("x", "w"), {"x": (2, 4, 6, 6), "w": (4, 1, 3, 3)},
         attrs={"group": 4, "pads": [1, 1, 1, 1]}),
    Case("conv_transpose", "ConvTranspose", ("x", "w", "b"), {"x": (2, 4, 5, 5), "w": (4, 3, 3, 3),
                                                              "b": (3,)}, attrs={"strides": [2, 2]}),
    Case("gemm", "Gemm", ("a", "b", "c"), {"a": (2, 5), "b": (3, 5), "c": (3,)}, attrs={"transB": 1}),
    Case("matmul", "MatMul", ("a", "b"), {"a": (4, 5), "b": (5, 3)}),
    Case("matmul_batched", "MatMul", ("a", "b"), {"a": (2, 4, 5), "b": (2, 5, 3)}),
    Case("bias_add", "Add", ("x", "bias"), {"x": (2, 4, 3, 3)},
         inits={"bias": np.linspace(-1, 1, 4, dtype=np.float32).reshape(4, 1, 1)}),
    binary("Add", (2, 3, 4), (3, 1)),
    binary("Sub", (2, 3, 4), (4,)),
    binary("Mul", (2, 3, 4), (1, 4)),
    binary("Div", (2, 3, 4), (3, 1), positive=("b",)),
    Case("batch_norm", "BatchNormalization", ("x", "scale", "bias", "mean", "var"),
         {**X4, "scale": (3,), "bias": (3,), "mean": (3,), "var": (3,)}, positive=("var",)),
    Case("batch_norm_training", "BatchNormalization", ("x", "scale", "bias", "mean", "var"),
         {**X4, "scale": (3,), "bias": (3,), "mean": (3,), "var": (3,)}, positive=("var",),
         attrs={"training_mode": 1}, outs=3, graph_outs=1, opset=15),
    Case("layer_norm", "LayerNormalization", ("x", "scale", "bias"),
         {"x": (2, 3, 8), "scale": (8,), "bias": (8,)}),
    unary("Relu"),
    Case("relu6", "Clip", ("x", "lo", "hi"), {"x": (2, 3, 4)}, inits={"lo": f32(0), "hi": f32(6)}),
    unary("LeakyRelu", attrs={"alpha": 0.1}),
    unary("Elu"), unary("Sigmoid"), unary("Tanh"), unary("Gelu", opset=20), unary("Erf"),
    unary("Softmax", attrs={"axis": -1}), unary("LogSoftmax", attrs={"axis": -1}),
    unary("MaxPool", X4["x"], attrs={"kernel_shape": [2, 2], "strides": [2, 2]}),
    unary("AveragePool", X4["x"], attrs={"kernel_shape": [2, 2], "strides": [2, 2]}),
    unary("GlobalAveragePool", X4["x"]),
    Case("reshape", "Reshape", ("x", "shape"), {"x": (2, 3, 4)}, inits={"shape": ints(6, 4)}),
    unary("Transpose", attrs={"perm": [2, 0, 1]}),
    Case("squeeze", "Squeeze", ("x", "axes"), {"x": (2, 1, 4)}, inits={"axes": ints(1)}),
    Case("unsqueeze", "Unsqueeze", ("x", "axes"), {"x": (2, 4)}, inits={"axes": ints(0, 2)}),
    unary("Flatten", (2, 3, 2, 2)),
    Case("concat", "Concat", ("a", "b"), {"a": (2, 3), "b": (2, 2)}, attrs={"axis": 1}),
    Case("split", "Split", ("x", "split"), {"x": (2, 6)}, inits={"split": ints(2, 4)},
         attrs={"axis": 1}, outs=2),
    Case("slice", "Slice", ("x", "starts", "ends", "axes", "steps"), {"x": (4, 6)},
         inits={"starts": ints(1, 0), "ends": ints(3, 6), "axes": ints(0, 1), "steps": ints(1, 2)}),
    Case("gather", "Gather", ("x", "indices"), {"x": (5, 3)}, inits={"indices": ints(0, 2, 4)}),
    Case("pad", "Pad", ("x", "pads"), {"x": (2, 3)}, inits={"pads": ints(0, 1, 0, 2)}),
    unary("ReduceMean", attrs={"axes": [1]}),
    Case("reducesum", "ReduceSum", ("x", "axes"), {"x": (2, 3, 4)}, inits={"axes": ints(2)},
         attrs={"keepdims": 0}),
    unary("ReduceMax", attrs={"axes": [1]}),
    unary("Sqrt", positive=("x",)),
    Case("pow", "Pow", ("x", "e"), {"x": (2, 3), "e": (2, 3)}, positive=("x",)),
    unary("Exp"), unary("Log", positive=("x",)), unary("Reciprocal", positive=("x",)),
    Case("dropout", "Dropout", ("x", "ratio", "training"), {"x": (4, 8)},
         inits={"ratio": f32(0.5), "training": np.array(True)}, outs=2, graph_outs=1, random=True),
    unary("Cast", attrs={"to": TensorProto.DOUBLE}, out_type=TensorProto.DOUBLE),
    unary("Identity"),
    Case("where", "Where", ("cond", "a", "b"), {"cond": (2, 3), "a": (2, 3), "b": (2, 3)}, bools=("cond",)),
    Case("expand", "Expand", ("x", "shape"), {"x": (3, 1)}, inits={"shape": ints(2, 3, 4)}),
    unary("Abs"), unary("Neg"), unary("Sin"), unary("Cos"), unary("Softplus"), unary("Selu"),
    Case("clip", "Clip", ("x", "lo", "hi"), {"x": (2, 3, 4)}, inits={"lo": f32(-1), "hi": f32(2)}),
    Case("max", "Max", ("a", "b"), {"a": (2, 3), "b": (2, 3)}),
    Case("min", "Min", ("a", "b"), {"a": (2, 3), "b": (2, 3)}),
    Case("mean", "Mean", ("a", "b"), {"a": (2, 3), "b": (2, 3)}),
    Case("sum", "Sum", ("a", "b", "c"), {"a": (2, 3), "b": (2, 3), "c": (2, 3)}),
    unary("HardSigmoid", attrs={"alpha": 1 / 6}, skip={"tf": NO_TF_OP}),  # PyTorch's slope
    unary("HardSwish", opset=14, skip={"tf": NO_TF_OP}),
    Case("prelu", "PRelu", ("x", "slope"), {"x": (2, 3, 4, 4), "slope": (3, 1, 1)}, skip={"tf": NO_TF_OP}),
    unary("ReduceMin", attrs={"axes": [1]}),
    unary("ReduceProd", attrs={"axes": [1]}),
    unary("ReduceL2", attrs={"axes": [1]}),
    unary("ReduceSumSquare", attrs={"axes": [1]}),
    unary("GlobalMaxPool", X4["x"]),
    Case("tile", "Tile", ("x", "repeats"), {"x": (2, 3)}, inits={"repeats": ints(2, 1)}),
    Case("resize_nearest", "Resize", ("x", "", "", "sizes"), {"x": (1, 2, 3, 3)},
         inits={"sizes": ints(1, 2, 6, 6)}, attrs={"mode": "nearest"}),
    unary("DepthToSpace", (1, 8, 2, 3), attrs={"blocksize": 2}),
    unary("SpaceToDepth", (1, 2, 4, 6), attrs={"blocksize": 2}),
    Case("instance_norm", "InstanceNormalization", ("x", "scale", "bias"),
         {**X4, "scale": (3,), "bias": (3,)}, skip={"tf": NO_TF_OP}),
    Case("group_norm", "GroupNormalization", ("x", "scale", "bias"),
         {"x": (2, 4, 3, 3), "scale": (2,), "bias": (2,)}, attrs={"num_groups": 2}, opset=18,
         skip={"tf": NO_TF_OP}),
    unary("LRN", (2, 5, 3, 3), attrs={"size": 3, "alpha": 1e-2}),
    # the exporters' long tail (issue 24): index ops read their indices, not their data
    Case("gather_elements", "GatherElements", ("x", "indices"), {"x": (3, 4)},
         inits={"indices": np.array([[0, 3], [1, 1], [2, 0]], dtype=np.int64)}, attrs={"axis": 1},
         skip={"tf": NO_TF_OP}),
    Case("gather_nd", "GatherND", ("x", "indices"), {"x": (4, 3)},
         inits={"indices": np.array([[0], [2], [3]], dtype=np.int64)}),
    Case("scatter_nd", "ScatterND", ("x", "indices", "u"), {"x": (4, 3), "u": (2, 3)},
         inits={"indices": np.array([[0], [2]], dtype=np.int64)}),
    Case("scatter_elements", "ScatterElements", ("x", "indices", "u"), {"x": (3, 4), "u": (3, 2)},
         inits={"indices": np.array([[0, 2], [1, 3], [3, 0]], dtype=np.int64)}, attrs={"axis": 1},
         skip={"tf": NO_TF_OP}),
    Case("scatter_elements_add", "ScatterElements", ("x", "indices", "u"), {"x": (3, 4), "u": (3, 2)},
         inits={"indices": np.array([[0, 2], [1, 3], [3, 0]], dtype=np.int64)},
         attrs={"axis": 1, "reduction": "add"}, opset=18, skip={"tf": NO_TF_OP}),
    Case("cumsum", "CumSum", ("x", "axis"), {"x": (2, 5)}, inits={"axis": np.array(1, dtype=np.int64)}),
    Case("top_k", "TopK", ("x", "k"), {"x": (3, 6)}, inits={"k": ints(2)}, outs=2, graph_outs=1),
    Case("trilu", "Trilu", ("x",), {"x": (2, 4, 4)}, opset=14),
    Case("tril", "Trilu", ("x",), {"x": (4, 4)}, attrs={"upper": 0}, opset=14),
    Case("mod", "Mod", ("a", "b"), {"a": (2, 3), "b": (2, 3)}, attrs={"fmod": 1}, positive=("a", "b")),
    Case("einsum", "Einsum", ("a", "b"), {"a": (2, 3, 4), "b": (2, 4, 5)}, attrs={"equation": "bij,bjk->bik"},
         opset=12),
    unary("Softsign"), unary("Tan"), unary("Atan"), unary("Sinh"), unary("Cosh"), unary("Asinh"),
    unary("Asin"),  # NaN where abs(x) > 1, in every framework alike
    unary("Acos"), unary("Atanh"), unary("Acosh", positive=("x",)),
    unary("Sign"), unary("Ceil"), unary("Floor"), unary("Round"),
    unary("Celu", attrs={"alpha": 1.0}, opset=12, skip={"tf": NO_TF_OP}),
    unary("Mish", opset=18, skip={"tf": NO_TF_OP}),
    unary("ThresholdedRelu", attrs={"alpha": 0.5}, skip={"tf": NO_TF_OP}),
    unary("Shrink", attrs={"lambd": 0.5}, skip={"tf": NO_TF_OP}),
    unary("ReduceLogSumExp", attrs={"axes": [1]}),
    Case("grid_sample", "GridSample", ("x", "grid"), {"x": (1, 2, 4, 4), "grid": (1, 3, 3, 2)},
         opset=16, skip={"tf": NO_TF_OP}),
]

# (rule key, framework) -> (read by the framework only, read by fusecli only, why)
DIFFERENCES: dict[tuple[str, str], tuple[set[str], set[str], str]] = {
    # PyTorch's hardtanh backward tests the input's range; TF's Relu6Grad (fusecli's rule) the output's
    ("relu6", "torch"): ({"x0"}, {"y0"}, "PyTorch's relu6 (hardtanh) saves x; TF and fusecli read y"),
    ("elu", "torch"): ({"x0"}, {"y0"}, "PyTorch's elu saves x; TF's EluGrad and fusecli read y"),
    # argmax indices (internal) stand in for y in PyTorch
    ("max_pool", "torch"): (set(), {"y0"}, "PyTorch saves x and the argmax indices; TF reads x and y"),
    ("avg_pool", "torch"): ({"x0"}, set(), "PyTorch's avg_pool2d_backward takes x but reads only its shape"),
    ("layer_norm", "torch"): ({"x2"}, set(), "PyTorch's native_layer_norm saves the bias, unread"),
    # batch statistics are internal; fusecli counts the running ones (same size) in their place
    ("batch_norm_training", "tf"): (set(), {"x3", "x4"}, "training mode reads the batch statistics"),
    # where(mask, x * scale, 0): TF keeps its own bool mask (internal) and x for the constant's gradient
    ("dropout", "tf"): ({"x0"}, {"y1"}, "TF's dropout is composite: it reads x and its own mask"),
    ("selu", "torch"): ({"x0"}, {"y0"}, "PyTorch's selu (an elu) saves x; TF's SeluGrad and fusecli read y"),
    ("global_max_pool", "torch"): (set(), {"y0"}, "PyTorch saves x and the argmax indices; TF reads x and y"),
    # TF's ProdGrad rebuilds the other factors from x by cumprod (exact with zeros); PyTorch reads y too
    ("reduce_prod", "tf"): (set(), {"y0"}, "TF's ProdGrad reads x only; fusecli, like PyTorch, also y"),
    # the scale is broadcast before the kernel: PyTorch saves the broadcast copy (internal)
    ("instance_norm", "torch"): (set(), {"x1"}, "PyTorch saves the scale repeated per sample"),
    ("group_norm", "torch"): (set(), {"x1"}, "opset 18's per-group scale reaches PyTorch per channel"),
    ("lrn", "torch"): (set(), {"y0"}, "PyTorch's LRN is composite: it saves its intermediates"),
    # the long tail (issue 24); the PyTorch profile's overrides remove the torch differences
    ("gather_elements", "torch"): ({"x0"}, set(), "PyTorch's gather saves self as well as the index"),
    ("tan", "torch"): ({"y0"}, {"x0"}, "PyTorch's tan saves its result; TF's TanGrad and fusecli read x"),
    ("asinh", "torch"): ({"x0"}, {"y0"}, "PyTorch's asinh saves self; TF's AsinhGrad and fusecli read y"),
    ("acosh", "torch"): ({"x0"}, {"y0"}, "PyTorch's acosh saves self; TF's AcoshGrad and fusecli read y"),
    ("reduce_log_sum_exp", "tf"): (set(), {"x0", "y0"}, "TF's reduce_logsumexp is composite: it keeps "
                                   "exp(x - max) and the sum; PyTorch's logsumexp, like fusecli, x and y"),
}
# (rule key, framework) pairs whose backward also saves values that are no ONNX tensor
INTERNAL = {
    ("max_pool", "torch"),  # argmax indices
    ("batch_norm", "torch"), ("batch_norm_training", "torch"),  # save_mean, save_invstd (empty in eval)
    ("batch_norm", "tf"), ("batch_norm_training", "tf"),  # FusedBatchNormV3's batch stats, reserve spaces
    ("layer_norm", "torch"),  # mean, rstd
    ("layer_norm", "tf"), ("gelu", "tf"), ("dropout", "tf"),  # composite ops: their intermediates
    ("mean", "tf"),  # add_n(xs) / n: the division keeps the sum, for the (constant) divisor's gradient
    ("global_max_pool", "torch"),  # argmax indices
    ("instance_norm", "torch"), ("group_norm", "torch"),  # the broadcast scale, mean, rstd
    ("lrn", "torch"),  # composite: pow, avg_pool3d and div intermediates
    ("softsign", "torch"),  # composite x / (1 + |x|): the divisor
    ("reduce_log_sum_exp", "tf"),  # composite: exp(x - max) and its sum
}


def rule_key(node) -> str:
    """The node's kind, with BatchNormalization's training mode apart (it reads other statistics)."""
    return node.kind + ("_training" if node.attrs.get("training_mode") else "")


@functools.cache
def _reference(case_id: str):
    case = next(c for c in CASES if c.id == case_id)
    model = case.model()
    feeds = make_feeds(model, case.positive)
    return model, feeds, None if case.random else onnxruntime_outputs(model, feeds)


def resolve(refs: set[str], node) -> set[str]:
    """Rule notation (``x0``, ``y1``) -> the tensor names of ``node``."""
    return {(node.inputs if r[0] == "x" else node.outputs)[int(r[1:])].name for r in refs}


def expected_difference(node, fw: str) -> tuple[set[str], set[str]]:
    fw_only, ours_only, _ = DIFFERENCES.get((rule_key(node), fw), (set(), set(), ""))
    return resolve(fw_only, node), resolve(ours_only, node)


@pytest.mark.parametrize("fw", list(ORACLES))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_saved_values_match_the_framework(case, fw):
    module, oracle = ORACLES[fw]
    pytest.importorskip(module)
    if fw in case.skip:
        pytest.skip(case.skip[fw])
    model, feeds, reference = _reference(case.id)
    got = oracle(model, feeds)
    if reference is not None:  # the executor computes the same op as the ONNX model
        for ours, ref in zip(got.outputs, reference, strict=True):
            np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-5)
    node = fusecli_joint(model).forward_nodes()[0]
    ours = fusecli_saved(model)
    assert (got.named - ours, ours - got.named) == expected_difference(node, fw)
    assert bool(got.internal) == ((rule_key(node), fw) in INTERNAL), got.internal
    kept = fusecli_kept(model)  # values fusecli counts that the model does not name: the framework keeps them
    assert not kept or got.internal, kept
    if fw == "torch":  # PyTorch's internal values are listed by shape and dtype: each kept one is among them
        internal = list(got.internal)
        for shape, dtype in kept:
            internal.remove(f"{shape} torch.{dtype}")


TF_ONLY = [  # (op, kind, inputs, numpy reference)
    ("Rsqrt", "rsqrt", ("x",), lambda x: 1 / np.sqrt(x)),
    ("Square", "square", ("x",), np.square),
    ("SquaredDifference", "squared_difference", ("a", "b"), lambda a, b: (a - b) ** 2),
    ("Erfc", "erfc", ("x",), lambda x: 1 - np.vectorize(math.erf)(x)),
    ("Log1p", "log1p", ("x",), np.log1p),
    ("Expm1", "expm1", ("x",), np.expm1),
]


@pytest.mark.parametrize(("op", "kind", "names", "ref"), TF_ONLY, ids=[t[1] for t in TF_ONLY])
def test_tf_only_rule_matches_tf(op, kind, names, ref):
    """TF ops with no ONNX op: fusecli's rule on a hand-built IR node against TF's gradient."""
    pytest.importorskip("tensorflow")
    node = helper.make_node(op, list(names), ["y"], "node", domain="tf")
    model = make_model([node], [vi(n, 2, 3) for n in names], [vi("y", 2, 3)])
    feeds = make_feeds(model, positive=names)
    got = tf_saved(model, feeds)
    np.testing.assert_allclose(got.outputs[0], ref(*feeds.values()), rtol=1e-5, atol=1e-6)
    g = Graph(kind)
    ins = [g.tensor(n, shape=(2, 3), kind="input") for n in names]
    y = g.tensor("y", shape=(2, 3))
    g.add_node(Node("node", op, kind, ins, [y]))
    g.inputs, g.outputs = ins, [y]
    joint = build_backward(g, wrt_inputs=True)
    joint.lint()
    live = analyze_liveness(joint)
    assert {s.tensor.name for s in live.saved if s.reads == "value"} == got.named
    assert not got.internal


@pytest.mark.parametrize("case_id", ["gather_elements", "tan", "asinh", "acosh"])
def test_pytorch_profile_reads_what_pytorch_saves(case_id):
    """The PyTorch profile's overrides for the long tail (issue 24) read what PyTorch saves."""
    pytest.importorskip("torch")
    model, feeds, _ = _reference(case_id)
    got = ORACLES["torch"][1](model, feeds)
    assert fusecli_saved(model, get_profile("pytorch")) == got.named
    assert fusecli_saved(model) != got.named  # the table (TensorFlow's reads) differs there


@pytest.mark.parametrize("case_id", ["relu6", "elu", "selu"])
def test_pytorch_profile_reads_what_pytorch_reads(case_id):
    """The PyTorch profile's overrides remove the table's documented differences with PyTorch."""
    pytest.importorskip("torch")
    model, feeds, _ = _reference(case_id)
    got = ORACLES["torch"][1](model, feeds)
    assert DIFFERENCES[(case_id, "torch")][0] == {"x0"}
    assert fusecli_saved(model, get_profile("pytorch")) == got.named == {"x"}

"""Framework oracles: run an ONNX graph with PyTorch's or TensorFlow's own ops and list what autodiff saves.

Each executor walks the ONNX nodes in order and computes each with the framework's op, remembering
which framework tensor is which ONNX tensor. PyTorch's saved set comes from ``saved_tensors_hooks``;
TensorFlow's from the extra outputs of the ``__forward_*`` function that ``tf.function`` splits off
for its ``__backward_*`` function. A view of an ONNX tensor (a reshape, or a transpose the executor
makes for TF's weight layout) counts as that tensor. Saved values that are no ONNX tensor (pooling
indices, batch statistics, composite ops' intermediates) are listed as ``internal``; TensorFlow's
captured constants and shapes are never activations and are left out.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from fusecli.core.ir import Graph
from fusecli.grad.backward import build_backward
from fusecli.grad.profiles import OPS, Profile
from fusecli.load.onnx import build_graph, infer_shapes
from fusecli.memory.liveness import analyze_liveness

_FLOAT = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)


@dataclass
class Oracle:
    """What one framework's backward reads: ONNX tensor names, other saved values, forward outputs."""

    named: set[str]
    internal: list[str]
    outputs: list[np.ndarray]


# -- fusecli side ----------------------------------------------------------------------------------
def fusecli_joint(model: onnx.ModelProto, profile: Profile = OPS) -> Graph:
    """The linted joint graph of ``model``, differentiated w.r.t. parameters and float inputs, as
    ``profile``'s framework builds it (grad.profiles)."""
    joint = build_backward(build_graph(infer_shapes(model)[0]), wrt_inputs=True, profile=profile)
    joint.lint()
    return joint


def fusecli_saved(model: onnx.ModelProto, profile: Profile = OPS) -> set[str]:
    """Names of the model's tensors whose values fusecli's backward reads."""
    return {name for name, _ in _fusecli_saved_values(model, profile) if name is not None}


def fusecli_kept(model: onnx.ModelProto, profile: Profile = OPS) -> list[tuple[tuple, str]]:
    """(shape, dtype) of the values fusecli's backward reads that are no tensor of the model: outputs a
    kernel keeps though the model does not name them (grad/kept_outputs.py)."""
    return sorted(kept for name, kept in _fusecli_saved_values(model, profile) if name is None)


def model_names(model: onnx.ModelProto) -> set[str]:
    """The names of the model's own tensors: inputs, initializers, node outputs."""
    g = model.graph
    return {*(i.name for i in g.input), *(i.name for i in g.initializer),
            *(o for n in g.node for o in n.output)}


def _fusecli_saved_values(model: onnx.ModelProto, profile: Profile) -> list[tuple[str | None, tuple]]:
    names = model_names(model)
    live = analyze_liveness(fusecli_joint(model, profile))
    return [(s.tensor.name, ()) if s.tensor.name in names else (None, (s.tensor.shape, s.tensor.dtype))
            for s in live.saved if s.reads == "value"]


def fusecli_reads_by_node(joint: Graph) -> dict[str, set[str]]:
    """Forward node name -> the forward tensors its backward ops read by value."""
    reads: dict[str, set[str]] = {}
    for node in joint.backward_nodes():
        if "forward" in node.meta:
            reads.setdefault(node.meta["forward"], set()).update(
                t.name for t in node.inputs if t.producer is None or t.producer.phase == "forward")
    return reads


# -- inputs and the reference -----------------------------------------------------------------------
def make_feeds(model: onnx.ModelProto, positive: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Seeded values for the graph inputs: normal floats (``positive`` ones in [0.5, 1.5)), random bools."""
    rng = np.random.default_rng(0)
    feeds = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        if dtype == np.bool_:
            feeds[vi.name] = rng.random(shape) < 0.5
        elif vi.name in positive:
            feeds[vi.name] = rng.uniform(0.5, 1.5, shape).astype(dtype)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _leaves(model: onnx.ModelProto, feeds: dict[str, np.ndarray]):
    """(graph inputs and float initializers: the differentiable leaves, other initializers).

    One-element float initializers (a 1/sqrt(d) scale, an epsilon) are constants here: an ONNX graph
    cannot say whether a scalar is trained, and the graphs this runs on hold none that is. Where a model
    has trained scalars (nn.PReLU's slope, a learned gate), its own framework is the judge
    (tests/grad/test_torch_parameter_math.py), not this executor."""
    leaves = dict(feeds)
    consts = {}
    for init in model.graph.initializer:
        value = numpy_helper.to_array(init)
        (leaves if init.data_type in _FLOAT and value.size > 1 else consts)[init.name] = value
    return leaves, consts


# -- the node walk ----------------------------------------------------------------------------------
@dataclass
class Call:
    """One ONNX node's operands: framework tensors, initializer values (else None) and attributes."""

    ins: list
    values: list
    attrs: dict

    def inp(self, i: int):
        return self.ins[i] if i < len(self.ins) else None

    def value(self, i: int):
        return self.values[i] if i < len(self.values) else None

    def ints(self, name: str, i: int, default=None):
        """An int-list operand given as attribute ``name`` (older opsets) or as input ``i``."""
        v = self.attrs.get(name, self.value(i))
        return default if v is None else [int(a) for a in np.atleast_1d(v)]


def _attrs(node: onnx.NodeProto) -> dict:
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def run_graph(model: onnx.ModelProto, ops: dict, env: dict, values: dict) -> dict:
    """ONNX name -> framework tensor, after computing every node with ``ops[op_type](Call)``."""
    for node in model.graph.node:
        call = Call([env[n] if n else None for n in node.input], [values.get(n) for n in node.input],
                    _attrs(node))
        outs = ops[node.op_type](call)
        outs = list(outs) if isinstance(outs, tuple | list) else [outs]
        env.update((n, t) for n, t in zip(node.output, outs, strict=False) if n)
    return env


# -- ops shared by both frameworks (Python operators, indexing) -------------------------------------
def _slice(c: Call):
    x = c.ins[0]
    starts, ends = c.ints("starts", 1), c.ints("ends", 2)
    axes = c.ints("axes", 3, list(range(len(starts))))
    steps = c.ints("steps", 4, [1] * len(starts))
    index = [slice(None)] * len(x.shape)
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        index[a] = slice(s, min(e, x.shape[a]), st)
    return x[tuple(index)]


_SHARED = {
    "Add": lambda c: c.ins[0] + c.ins[1], "Sub": lambda c: c.ins[0] - c.ins[1],
    "Mul": lambda c: c.ins[0] * c.ins[1], "Div": lambda c: c.ins[0] / c.ins[1],
    "Identity": lambda c: c.ins[0], "Slice": _slice,
}


def _sym_pads(c: Call, rank: int) -> list[int]:
    """Symmetric ONNX ``pads`` as one number per spatial axis."""
    pads = c.attrs.get("pads", [0] * 2 * rank)
    assert pads[:rank] == pads[rank:], "only symmetric pads are supported"
    return pads[:rank]


def _reduce_axes(c: Call, rank: int) -> list[int]:
    return c.ints("axes", 1, list(range(rank)))


def _clip_bounds(c: Call) -> tuple[float, float]:
    lo, hi = c.attrs.get("min", c.value(1)), c.attrs.get("max", c.value(2))
    return float(-np.inf if lo is None else lo), float(np.inf if hi is None else hi)


def _variadic(fn, c: Call):
    """A variadic ONNX op (Max, Min, Sum) as a chain of the framework's binary op."""
    return functools.reduce(fn, c.ins)


def _lrn_args(c: Call) -> tuple[int, float, float, float]:
    return c.attrs["size"], c.attrs.get("alpha", 1e-4), c.attrs.get("beta", 0.75), c.attrs.get("bias", 1.0)


def _k(c: Call, i: int, default: int = 0) -> int:
    """A one-element int operand (TopK's k, CumSum's axis, Trilu's k) as a Python int."""
    v = c.value(i)
    return default if v is None else int(np.asarray(v).reshape(-1)[0])


def _index_columns(c: Call, i: int) -> tuple:
    """GatherND/ScatterND indices (batch_dims 0) as one index tensor per indexed axis."""
    idx = c.ins[i]
    return tuple(idx[..., k] for k in range(idx.shape[-1]))


def _split_sizes(c: Call, dim: int) -> list[int]:
    sizes = c.ints("split", 1)
    n = c.attrs.get("num_outputs")
    return sizes or [dim // n] * n


# -- PyTorch ----------------------------------------------------------------------------------------
@functools.cache
def _torch_ops() -> dict:
    import torch
    import torch.nn.functional as F

    def conv(c):
        x, w, b = c.ins[0], c.ins[1], c.inp(2)
        r = x.dim() - 2
        return (F.conv1d, F.conv2d, F.conv3d)[r - 1](
            x, w, b, c.attrs.get("strides", 1), _sym_pads(c, r), c.attrs.get("dilations", 1),
            c.attrs.get("group", 1))

    def conv_transpose(c):
        x, w, b = c.ins[0], c.ins[1], c.inp(2)
        r = x.dim() - 2
        return (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[r - 1](
            x, w, b, c.attrs.get("strides", 1), _sym_pads(c, r), c.attrs.get("output_padding", 0),
            c.attrs.get("group", 1), c.attrs.get("dilations", 1))

    def gemm(c):
        a, b, bias = c.ins[0], c.ins[1], c.inp(2)
        a = a.t() if c.attrs.get("transA") else a
        b = b.t() if c.attrs.get("transB") else b
        return torch.matmul(a, b) if bias is None else torch.addmm(bias, a, b)

    def batch_norm(c):
        x, scale, bias, mean, var = c.ins
        return F.batch_norm(x, mean.detach(), var.detach(), scale, bias,
                            training=bool(c.attrs.get("training_mode", 0)),
                            eps=c.attrs.get("epsilon", 1e-5))

    def layer_norm(c):
        x = c.ins[0]
        axis = c.attrs.get("axis", -1) % x.dim()
        return F.layer_norm(x, x.shape[axis:], c.ins[1], c.inp(2), c.attrs.get("epsilon", 1e-5))

    def clip(c):
        lo, hi = _clip_bounds(c)
        return F.relu6(c.ins[0]) if (lo, hi) == (0, 6) else torch.clamp(c.ins[0], lo, hi)

    def pool(fns, c):
        x = c.ins[0]
        r = x.dim() - 2
        return fns[r - 1](x, c.attrs["kernel_shape"], c.attrs.get("strides"), _sym_pads(c, r))

    def pad(c):
        p = c.ints("pads", 1)
        r = len(p) // 2
        return F.pad(c.ins[0], [v for i in reversed(range(r)) for v in (p[i], p[r + i])],
                     value=float(c.value(2) or 0))

    def unsqueeze(c):
        x = c.ins[0]
        for a in sorted(v % (x.dim() + len(c.ints("axes", 1))) for v in c.ints("axes", 1)):
            x = x.unsqueeze(a)
        return x

    def reduce(fn, c):
        x = c.ins[0]
        return fn(x, _reduce_axes(c, x.dim()), keepdim=bool(c.attrs.get("keepdims", 1)))

    def reduce_prod(c):
        x = c.ins[0]
        for a in sorted((v % x.dim() for v in _reduce_axes(c, x.dim())), reverse=True):
            x = torch.prod(x, a, keepdim=bool(c.attrs.get("keepdims", 1)))
        return x

    def depth_to_space(c):  # DCR: reshape and permute only, as ONNX defines it
        x, r = c.ins[0], c.attrs["blocksize"]
        n, ch, h, w = x.shape
        assert c.attrs.get("mode", "DCR") == "DCR"
        return x.reshape(n, r, r, ch // r**2, h, w).permute(0, 3, 4, 1, 5, 2).reshape(
            n, ch // r**2, h * r, w * r)

    def space_to_depth(c):
        x, r = c.ins[0], c.attrs["blocksize"]
        n, ch, h, w = x.shape
        return x.reshape(n, ch, h // r, r, w // r, r).permute(0, 3, 5, 1, 2, 4).reshape(
            n, ch * r * r, h // r, w // r)

    def group_norm(c):
        x, scale, bias = c.ins
        per = x.shape[1] // c.attrs["num_groups"]  # opset 18: one scale and bias per group
        return F.group_norm(x, c.attrs["num_groups"], scale.repeat_interleave(per),
                            bias.repeat_interleave(per), c.attrs.get("epsilon", 1e-5))

    def lrn(c):
        size, alpha, beta, bias = _lrn_args(c)
        return F.local_response_norm(c.ins[0], size, alpha, beta, bias)

    def scatter_elements(c):
        x, index, updates = c.ins
        axis = c.attrs.get("axis", 0) % x.dim()
        reduction = c.attrs.get("reduction", "none")
        assert reduction in ("none", "add"), reduction
        return x.scatter(axis, index, updates) if reduction == "none" else x.scatter_add(axis, index, updates)

    def top_k(c):
        return torch.topk(c.ins[0], _k(c, 1), dim=c.attrs.get("axis", -1),
                          largest=bool(c.attrs.get("largest", 1)), sorted=bool(c.attrs.get("sorted", 1)))

    def shrink(c):
        assert c.attrs.get("bias", 0.0) == 0.0, "Shrink with bias 0 is hardshrink"
        return F.hardshrink(c.ins[0], c.attrs.get("lambd", 0.5))

    dtypes = {onnx.TensorProto.FLOAT: torch.float32, onnx.TensorProto.DOUBLE: torch.float64}
    return {
        **_SHARED,
        "GatherElements": lambda c: torch.gather(c.ins[0], c.attrs.get("axis", 0) % c.ins[0].dim(), c.ins[1]),
        "GatherND": lambda c: c.ins[0][_index_columns(c, 1)],  # aten::index, as dynamo's GatherND is
        "ScatterND": lambda c: c.ins[0].index_put(_index_columns(c, 1), c.ins[2]),
        "ScatterElements": scatter_elements, "TopK": top_k,
        "CumSum": lambda c: torch.cumsum(c.ins[0], _k(c, 1)),
        "Trilu": lambda c: (torch.triu if c.attrs.get("upper", 1) else torch.tril)(c.ins[0], _k(c, 1)),
        "Mod": lambda c: (torch.fmod if c.attrs.get("fmod", 0) else torch.remainder)(c.ins[0], c.ins[1]),
        "Einsum": lambda c: torch.einsum(c.attrs["equation"], *c.ins),
        "Softsign": lambda c: F.softsign(c.ins[0]), "Tan": lambda c: torch.tan(c.ins[0]),
        "Asin": lambda c: torch.asin(c.ins[0]), "Acos": lambda c: torch.acos(c.ins[0]),
        "Atan": lambda c: torch.atan(c.ins[0]), "Sinh": lambda c: torch.sinh(c.ins[0]),
        "Cosh": lambda c: torch.cosh(c.ins[0]), "Asinh": lambda c: torch.asinh(c.ins[0]),
        "Acosh": lambda c: torch.acosh(c.ins[0]), "Atanh": lambda c: torch.atanh(c.ins[0]),
        "Sign": lambda c: torch.sign(c.ins[0]), "Ceil": lambda c: torch.ceil(c.ins[0]),
        "Floor": lambda c: torch.floor(c.ins[0]), "Round": lambda c: torch.round(c.ins[0]),
        "Celu": lambda c: F.celu(c.ins[0], c.attrs.get("alpha", 1.0)), "Mish": lambda c: F.mish(c.ins[0]),
        "ThresholdedRelu": lambda c: F.threshold(c.ins[0], c.attrs.get("alpha", 1.0), 0.0),
        "Shrink": shrink,
        "ReduceLogSumExp": lambda c: torch.logsumexp(c.ins[0], _reduce_axes(c, c.ins[0].dim()),
                                                     keepdim=bool(c.attrs.get("keepdims", 1))),
        "GridSample": lambda c: F.grid_sample(c.ins[0], c.ins[1], mode="bilinear", padding_mode="zeros",
                                              align_corners=bool(c.attrs.get("align_corners", 0))),
        "Abs": lambda c: torch.abs(c.ins[0]), "Neg": lambda c: torch.neg(c.ins[0]),
        "Max": functools.partial(_variadic, torch.maximum),
        "Min": functools.partial(_variadic, torch.minimum),
        "Sum": functools.partial(_variadic, torch.add),
        "Mean": lambda c: _variadic(torch.add, c) / len(c.ins),
        "Sin": lambda c: torch.sin(c.ins[0]), "Cos": lambda c: torch.cos(c.ins[0]),
        "Softplus": lambda c: F.softplus(c.ins[0]), "Selu": lambda c: F.selu(c.ins[0]),
        # F.hardsigmoid's slope is 1/6: the case sets ONNX's alpha to match
        "HardSigmoid": lambda c: F.hardsigmoid(c.ins[0]), "HardSwish": lambda c: F.hardswish(c.ins[0]),
        "PRelu": lambda c: F.prelu(c.ins[0], c.ins[1].reshape(-1)),
        "ReduceMin": functools.partial(reduce, torch.amin), "ReduceProd": reduce_prod,
        "ReduceL2": lambda c: torch.linalg.vector_norm(
            c.ins[0], 2, _reduce_axes(c, c.ins[0].dim()), keepdim=bool(c.attrs.get("keepdims", 1))),
        "ReduceSumSquare": lambda c: torch.sum(torch.square(c.ins[0]), _reduce_axes(c, c.ins[0].dim()),
                                               keepdim=bool(c.attrs.get("keepdims", 1))),
        "GlobalMaxPool": lambda c: F.adaptive_max_pool2d(c.ins[0], 1),
        "Tile": lambda c: c.ins[0].repeat([int(v) for v in c.value(1)]),
        "Resize": lambda c: F.interpolate(c.ins[0], [int(v) for v in c.value(3)[2:]], mode="nearest"),
        "DepthToSpace": depth_to_space, "SpaceToDepth": space_to_depth,
        "InstanceNormalization": lambda c: F.instance_norm(c.ins[0], weight=c.ins[1], bias=c.ins[2],
                                                           eps=c.attrs.get("epsilon", 1e-5)),
        "GroupNormalization": group_norm, "LRN": lrn,
        "Conv": conv, "ConvTranspose": conv_transpose, "Gemm": gemm,
        "MatMul": lambda c: torch.matmul(c.ins[0], c.ins[1]),
        "BatchNormalization": batch_norm, "LayerNormalization": layer_norm,
        "Relu": lambda c: F.relu(c.ins[0]), "Clip": clip,
        "LeakyRelu": lambda c: F.leaky_relu(c.ins[0], c.attrs.get("alpha", 0.01)),
        "Elu": lambda c: F.elu(c.ins[0], c.attrs.get("alpha", 1.0)),
        "Sigmoid": lambda c: torch.sigmoid(c.ins[0]), "Tanh": lambda c: torch.tanh(c.ins[0]),
        "Gelu": lambda c: F.gelu(c.ins[0], approximate=c.attrs.get("approximate", "none")),
        "Erf": lambda c: torch.erf(c.ins[0]),
        "Softmax": lambda c: F.softmax(c.ins[0], c.attrs.get("axis", -1)),
        "LogSoftmax": lambda c: F.log_softmax(c.ins[0], c.attrs.get("axis", -1)),
        "MaxPool": functools.partial(pool, (F.max_pool1d, F.max_pool2d, F.max_pool3d)),
        "AveragePool": functools.partial(pool, (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)),
        "GlobalAveragePool": lambda c: (F.adaptive_avg_pool1d, F.adaptive_avg_pool2d,
                                        F.adaptive_avg_pool3d)[c.ins[0].dim() - 3](c.ins[0], 1),
        "Reshape": lambda c: c.ins[0].reshape([int(v) for v in c.value(1)]),
        # ONNX tensors are their own buffers: on a permuted view, torch.matmul would save a copy
        "Transpose": lambda c: c.ins[0].permute(c.attrs["perm"]).contiguous(),
        "Squeeze": lambda c: c.ins[0].squeeze(tuple(c.ints("axes", 1))),
        "Unsqueeze": unsqueeze,
        "Flatten": lambda c: c.ins[0].reshape(int(np.prod(c.ins[0].shape[:c.attrs.get("axis", 1)])), -1),
        "Concat": lambda c: torch.cat(c.ins, c.attrs["axis"]),
        "Split": lambda c: torch.split(c.ins[0], _split_sizes(c, c.ins[0].shape[c.attrs.get("axis", 0)]),
                                       c.attrs.get("axis", 0)),
        "Gather": lambda c: torch.index_select(c.ins[0], c.attrs.get("axis", 0), c.ins[1]),
        "Pad": pad,
        "ReduceMean": functools.partial(reduce, torch.mean),
        "ReduceSum": functools.partial(reduce, torch.sum),
        "ReduceMax": functools.partial(reduce, torch.amax),
        "Sqrt": lambda c: torch.sqrt(c.ins[0]), "Pow": lambda c: torch.pow(c.ins[0], c.ins[1]),
        "Exp": lambda c: torch.exp(c.ins[0]), "Log": lambda c: torch.log(c.ins[0]),
        "Reciprocal": lambda c: torch.reciprocal(c.ins[0]),
        # the kernel F.dropout runs on GPUs (on CPUs it multiplies by a float mask instead)
        "Dropout": lambda c: torch.native_dropout(c.ins[0], float(c.value(1)), True),
        "Cast": lambda c: c.ins[0].to(dtypes[c.attrs["to"]]),
        "Where": lambda c: torch.where(c.ins[0], c.ins[1], c.ins[2]),
        "Expand": lambda c: c.ins[0].expand(np.broadcast_shapes(tuple(c.ins[0].shape),
                                                                 tuple(int(v) for v in c.value(1)))),
    }


def _torch_match(t, env: dict, made: int) -> str | None:
    """The ONNX name of a saved tensor: the same object, else the same view, else the latest tensor
    made before the op (``made`` = how many there were) of which it views all elements."""
    for name, x in env.items():
        if t is x:
            return name
    if t.numel() == 0:
        return None
    exact = (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)
    for name, x in env.items():
        if (x.data_ptr(), tuple(x.shape), x.stride(), x.dtype) == exact:
            return name
    whole = (t.data_ptr(), t.numel(), t.dtype)
    before = list(env.items())[:made]
    return next((n for n, x in reversed(before) if (x.data_ptr(), x.numel(), x.dtype) == whole), None)


def torch_saved(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> Oracle:
    """PyTorch's saved tensors for ``loss = sum(outputs)``, by ONNX name."""
    import torch

    leaves, consts = _leaves(model, feeds)
    env = {n: torch.tensor(v, requires_grad=v.dtype.kind == "f") for n, v in leaves.items()}
    env.update((n, torch.tensor(v)) for n, v in consts.items())
    packed = []

    def pack(t):
        packed.append((t, len(env)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run_graph(model, _torch_ops(), env, {**consts, **leaves})
    outs = [env[o.name] for o in model.graph.output]
    sum(y.sum() for y in outs if y.requires_grad).backward()
    named, internal = set(), []
    for t, made in packed:
        name = _torch_match(t, env, made)
        if name is None:
            internal.append(f"{tuple(t.shape)} {t.dtype}")
        else:
            named.add(name)
    return Oracle(named, internal, [y.detach().numpy() for y in outs])


# -- TensorFlow -------------------------------------------------------------------------------------
_TF_FORMATS = {3: "NCW", 4: "NCHW", 5: "NCDHW"}


def _tf_padding(c: Call, kernel: list[int]) -> str:
    """ONNX pads as TF's VALID or SAME (explicit pads break TF's NCHW filter gradient on CPUs)."""
    r = len(kernel)
    pads = c.attrs.get("pads", [0] * 2 * r)
    if not any(pads):
        return "VALID"
    same = [(k - 1) // 2 for k in kernel] + [k - 1 - (k - 1) // 2 for k in kernel]
    assert pads == same and set(c.attrs.get("strides", [1])) == {1}, "pads must be VALID or SAME"
    return "SAME"


@functools.cache
def _tf_ops() -> dict:
    import tensorflow as tf

    def layout(t, perm):
        """A layout transpose for TF's weight order: the oracle maps its output to its input."""
        return tf.transpose(t, perm, name="layout")

    def spatial(c, rank, name):
        return list(c.attrs.get(name, [1] * rank))

    def conv(c):
        x, w, b = c.ins[0], c.ins[1], c.inp(2)
        r = len(x.shape) - 2
        kernel = list(w.shape[2:])
        fmt = _TF_FORMATS[r + 2]
        if c.attrs.get("group", 1) == x.shape[1] > 1 and w.shape[1] == 1 and w.shape[0] == x.shape[1]:
            y = tf.nn.depthwise_conv2d(x, layout(w, [2, 3, 0, 1]), [1, 1, *spatial(c, r, "strides")],
                                       _tf_padding(c, kernel), data_format=fmt,
                                       dilations=spatial(c, r, "dilations"))
        else:
            y = tf.nn.convolution(x, layout(w, [*range(2, r + 2), 1, 0]), spatial(c, r, "strides"),
                                  _tf_padding(c, kernel), data_format=fmt,
                                  dilations=spatial(c, r, "dilations"))
        return y if b is None else tf.nn.bias_add(y, b, data_format="NC...")

    def conv_transpose(c):
        x, w, b = c.ins[0], c.ins[1], c.inp(2)
        r = len(x.shape) - 2
        kernel, strides = list(w.shape[2:]), spatial(c, r, "strides")
        assert _tf_padding(c, kernel) == "VALID", "ConvTranspose: only zero pads"
        out = [x.shape[0], w.shape[1], *((n - 1) * s + k for n, s, k in
                                         zip(x.shape[2:], strides, kernel, strict=True))]
        y = tf.nn.conv_transpose(x, layout(w, [*range(2, r + 2), 1, 0]), out, strides, "VALID",
                                 data_format=_TF_FORMATS[r + 2])
        return y if b is None else tf.nn.bias_add(y, b, data_format="NC...")

    def gemm(c):
        y = tf.matmul(c.ins[0], c.ins[1], transpose_a=bool(c.attrs.get("transA")),
                      transpose_b=bool(c.attrs.get("transB")))
        return y if c.inp(2) is None else y + c.inp(2)

    def batch_norm(c):
        x, scale, bias, mean, var = c.ins
        return tf.raw_ops.FusedBatchNormV3(x=x, scale=scale, offset=bias, mean=mean, variance=var,
                                           epsilon=c.attrs.get("epsilon", 1e-5), data_format="NCHW",
                                           is_training=bool(c.attrs.get("training_mode", 0)))[0]

    def layer_norm(c):
        x = c.ins[0]
        axes = list(range(c.attrs.get("axis", -1) % len(x.shape), len(x.shape)))
        mean, var = tf.nn.moments(x, axes, keepdims=True)
        return tf.nn.batch_normalization(x, mean, var, c.inp(2), c.ins[1], c.attrs.get("epsilon", 1e-5))

    def clip(c):
        lo, hi = _clip_bounds(c)
        if (lo, hi) == (0, 6):
            return tf.nn.relu6(c.ins[0])
        # the ClipByValue op (tf.clip_by_value composes Minimum and Maximum, whose rules are their own)
        return tf.raw_ops.ClipByValue(t=c.ins[0], clip_value_min=lo, clip_value_max=hi)

    def pool(fn, c):
        x = c.ins[0]
        r = len(x.shape) - 2
        return fn(x, c.attrs["kernel_shape"], spatial(c, r, "strides"),
                  _tf_padding(c, c.attrs["kernel_shape"]), data_format=_TF_FORMATS[r + 2])

    def pad(c):
        p = c.ints("pads", 1)
        r = len(p) // 2
        return tf.pad(c.ins[0], [[p[i], p[r + i]] for i in range(r)],
                      constant_values=float(c.value(2) or 0))

    def unsqueeze(c):
        x = c.ins[0]
        for a in sorted(v % (len(x.shape) + len(c.ints("axes", 1))) for v in c.ints("axes", 1)):
            x = tf.expand_dims(x, a)
        return x

    def reduce(fn, c):
        x = c.ins[0]
        return fn(x, _reduce_axes(c, len(x.shape)), keepdims=bool(c.attrs.get("keepdims", 1)))

    def flatten(c):
        axis = c.attrs.get("axis", 1)
        return tf.reshape(c.ins[0], [int(np.prod(c.ins[0].shape[:axis])), -1])

    def nhwc(fn):
        """A TF op that runs NHWC only on CPUs, between layout transposes (views of the ONNX tensors)."""
        return lambda c: layout(fn(c, layout(c.ins[0], [0, 2, 3, 1])), [0, 3, 1, 2])

    def lrn(c, x):
        size, alpha, beta, bias = _lrn_args(c)
        assert size % 2 == 1, "TF's LRN window is symmetric"
        return tf.nn.local_response_normalization(x, (size - 1) // 2, bias, alpha / size, beta)

    def reduce_l2(c):
        x = c.ins[0]
        return tf.raw_ops.EuclideanNorm(input=x, axis=_reduce_axes(c, len(x.shape)),
                                        keep_dims=bool(c.attrs.get("keepdims", 1)))

    def top_k(c):
        assert c.attrs.get("axis", -1) in (-1, len(c.ins[0].shape) - 1), "TF's top_k is along the last axis"
        return tf.math.top_k(c.ins[0], _k(c, 1), sorted=bool(c.attrs.get("sorted", 1)))  # int32 indices

    def trilu(c):
        assert _k(c, 1) == 0, "band_part keeps whole diagonals only"
        return tf.linalg.band_part(c.ins[0], 0, -1) if c.attrs.get("upper", 1) else \
            tf.linalg.band_part(c.ins[0], -1, 0)

    dtypes = {onnx.TensorProto.FLOAT: tf.float32, onnx.TensorProto.DOUBLE: tf.float64}
    return {
        **_SHARED,
        "GatherND": lambda c: tf.gather_nd(c.ins[0], c.ins[1]),
        "ScatterND": lambda c: tf.tensor_scatter_nd_update(c.ins[0], c.ins[1], c.ins[2]),
        "TopK": top_k, "Trilu": trilu, "CumSum": lambda c: tf.cumsum(c.ins[0], _k(c, 1)),
        "Mod": lambda c: tf.math.floormod(c.ins[0], c.ins[1]),  # the cases' operands are positive
        "Einsum": lambda c: tf.einsum(c.attrs["equation"], *c.ins),
        "Softsign": lambda c: tf.nn.softsign(c.ins[0]), "Tan": lambda c: tf.math.tan(c.ins[0]),
        "Asin": lambda c: tf.math.asin(c.ins[0]), "Acos": lambda c: tf.math.acos(c.ins[0]),
        "Atan": lambda c: tf.math.atan(c.ins[0]), "Sinh": lambda c: tf.math.sinh(c.ins[0]),
        "Cosh": lambda c: tf.math.cosh(c.ins[0]), "Asinh": lambda c: tf.math.asinh(c.ins[0]),
        "Acosh": lambda c: tf.math.acosh(c.ins[0]), "Atanh": lambda c: tf.math.atanh(c.ins[0]),
        "Sign": lambda c: tf.sign(c.ins[0]), "Ceil": lambda c: tf.math.ceil(c.ins[0]),
        "Floor": lambda c: tf.floor(c.ins[0]), "Round": lambda c: tf.round(c.ins[0]),
        "ReduceLogSumExp": lambda c: tf.reduce_logsumexp(c.ins[0], _reduce_axes(c, len(c.ins[0].shape)),
                                                         keepdims=bool(c.attrs.get("keepdims", 1))),
        "Abs": lambda c: tf.abs(c.ins[0]), "Neg": lambda c: tf.negative(c.ins[0]),
        "Max": functools.partial(_variadic, tf.maximum), "Min": functools.partial(_variadic, tf.minimum),
        "Sum": lambda c: tf.add_n(c.ins), "Mean": lambda c: tf.add_n(c.ins) / len(c.ins),
        "Sin": lambda c: tf.sin(c.ins[0]), "Cos": lambda c: tf.cos(c.ins[0]),
        "Softplus": lambda c: tf.nn.softplus(c.ins[0]), "Selu": lambda c: tf.nn.selu(c.ins[0]),
        "ReduceMin": functools.partial(reduce, tf.reduce_min),
        "ReduceProd": functools.partial(reduce, tf.reduce_prod), "ReduceL2": reduce_l2,
        "ReduceSumSquare": lambda c: reduce(tf.reduce_sum, Call([tf.square(c.ins[0])], c.values, c.attrs)),
        "GlobalMaxPool": lambda c: tf.reduce_max(c.ins[0], list(range(2, len(c.ins[0].shape))),
                                                 keepdims=True),
        "Tile": lambda c: tf.tile(c.ins[0], [int(v) for v in c.value(1)]),
        "Resize": nhwc(lambda c, x: tf.raw_ops.ResizeNearestNeighbor(
            images=x, size=[int(v) for v in c.value(3)[2:]], half_pixel_centers=True)),
        "DepthToSpace": nhwc(lambda c, x: tf.nn.depth_to_space(x, c.attrs["blocksize"])),
        "SpaceToDepth": nhwc(lambda c, x: tf.nn.space_to_depth(x, c.attrs["blocksize"])),
        "LRN": nhwc(lrn),
        "Conv": conv, "ConvTranspose": conv_transpose, "Gemm": gemm,
        "MatMul": lambda c: tf.matmul(c.ins[0], c.ins[1]),
        "BatchNormalization": batch_norm, "LayerNormalization": layer_norm,
        "Relu": lambda c: tf.nn.relu(c.ins[0]), "Clip": clip,
        "LeakyRelu": lambda c: tf.nn.leaky_relu(c.ins[0], c.attrs.get("alpha", 0.01)),
        "Elu": lambda c: tf.nn.elu(c.ins[0]),
        "Sigmoid": lambda c: tf.sigmoid(c.ins[0]), "Tanh": lambda c: tf.tanh(c.ins[0]),
        "Gelu": lambda c: tf.nn.gelu(c.ins[0], approximate=c.attrs.get("approximate") == "tanh"),
        "Erf": lambda c: tf.math.erf(c.ins[0]),
        "Softmax": lambda c: tf.nn.softmax(c.ins[0], c.attrs.get("axis", -1)),
        "LogSoftmax": lambda c: tf.nn.log_softmax(c.ins[0], c.attrs.get("axis", -1)),
        "MaxPool": functools.partial(pool, tf.nn.max_pool),
        "AveragePool": functools.partial(pool, tf.nn.avg_pool),
        "GlobalAveragePool": lambda c: tf.reduce_mean(c.ins[0], list(range(2, len(c.ins[0].shape))),
                                                      keepdims=True),
        "Reshape": lambda c: tf.reshape(c.ins[0], [int(v) for v in c.value(1)]),
        "Transpose": lambda c: tf.transpose(c.ins[0], c.attrs["perm"]),
        "Squeeze": lambda c: tf.squeeze(c.ins[0], c.ints("axes", 1)),
        "Unsqueeze": unsqueeze, "Flatten": flatten,
        "Concat": lambda c: tf.concat(c.ins, c.attrs["axis"]),
        "Split": lambda c: tf.split(c.ins[0], _split_sizes(c, c.ins[0].shape[c.attrs.get("axis", 0)]),
                                    c.attrs.get("axis", 0)),
        "Gather": lambda c: tf.gather(c.ins[0], c.ins[1], axis=c.attrs.get("axis", 0)),
        "Pad": pad,
        "ReduceMean": functools.partial(reduce, tf.reduce_mean),
        "ReduceSum": functools.partial(reduce, tf.reduce_sum),
        "ReduceMax": functools.partial(reduce, tf.reduce_max),
        "Sqrt": lambda c: tf.sqrt(c.ins[0]), "Pow": lambda c: tf.pow(c.ins[0], c.ins[1]),
        "Exp": lambda c: tf.exp(c.ins[0]), "Log": lambda c: tf.math.log(c.ins[0]),
        "Reciprocal": lambda c: tf.math.reciprocal(c.ins[0]),
        "Identity": lambda c: tf.identity(c.ins[0]),
        # TF only (no ONNX op): for the rules of TF_KINDS
        "Rsqrt": lambda c: tf.math.rsqrt(c.ins[0]), "Square": lambda c: tf.square(c.ins[0]),
        "SquaredDifference": lambda c: tf.math.squared_difference(c.ins[0], c.ins[1]),
        "Erfc": lambda c: tf.math.erfc(c.ins[0]), "Log1p": lambda c: tf.math.log1p(c.ins[0]),
        "Expm1": lambda c: tf.math.expm1(c.ins[0]),
        "Dropout": lambda c: tf.nn.dropout(c.ins[0], float(c.value(1)), seed=0),
        "Cast": lambda c: tf.cast(c.ins[0], dtypes[c.attrs["to"]]),
        "Where": lambda c: tf.where(c.ins[0], c.ins[1], c.ins[2]),
        "Expand": lambda c: tf.broadcast_to(c.ins[0], np.broadcast_shapes(
            tuple(c.ins[0].shape), tuple(int(v) for v in c.value(1)))),
    }


_TF_VIEWS = ("Reshape", "ExpandDims", "Squeeze")  # TF ops that share their input's buffer


def _tf_aliases(graph, names: dict[str, str]) -> None:
    """Name a view (or layout transpose) of an ONNX tensor after it, and the tensor it views."""
    for op in graph.get_operations():
        if op.type in _TF_VIEWS or (op.type == "Transpose" and op.name.startswith("layout")):
            src, dst = op.inputs[0].name, op.outputs[0].name
            if src in names:
                names.setdefault(dst, names[src])
            elif dst in names:
                names[src] = names[dst]


def tf_saved(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> Oracle:
    """TensorFlow's saved tensors for ``loss = sum(outputs)``, by ONNX name.

    Tracing the tape gradient of a ``tf.function`` call splits the function into ``__forward_*`` and
    ``__backward_*`` functions and appends what the backward reads to the traced graph's outputs.
    """
    import tensorflow as tf

    leaves, consts = _leaves(model, feeds)
    specs = [tf.TensorSpec(v.shape, tf.as_dtype(v.dtype)) for v in leaves.values()]
    names: dict[str, str] = {}

    @tf.function(input_signature=specs, autograph=False)
    def onnx_graph(*args):
        env = dict(zip(leaves, args, strict=True))
        env.update((n, tf.constant(v)) for n, v in consts.items())
        run_graph(model, _tf_ops(), env, {**consts, **leaves})
        for n, t in env.items():
            names.setdefault(t.name, n)
        return [env[o.name] for o in model.graph.output]

    @tf.function(input_signature=specs, autograph=False)
    def train_step(*args):
        watched = [a for a in args if a.dtype.is_floating]
        with tf.GradientTape() as tape:
            tape.watch(watched)
            loss = tf.add_n([tf.reduce_sum(tf.cast(y, tf.float32)) for y in onnx_graph(*args)])
        return [g for g in tape.gradient(loss, watched) if g is not None]

    graph = onnx_graph.get_concrete_function().graph
    step = train_step.get_concrete_function()
    if not step.outputs:  # no gradient flows (Floor, Round): no forward/backward split, nothing saved
        return Oracle(set(), [], [np.asarray(y) for y in onnx_graph(*leaves.values())])
    library = step.graph.as_graph_def().library.function
    forward = [f for f in library if f.signature.name.startswith("__forward_onnx_graph")]
    assert [len(f.signature.output_arg) for f in forward] == [len(graph.outputs)]
    _tf_aliases(graph, names)
    named, internal = set(), []
    for t in graph.outputs[len(model.graph.output):]:
        if t.name in names:
            named.add(names[t.name])
        elif t.op.type not in ("Const", "Shape"):
            internal.append(f"{t.name} ({t.op.type})")
    outputs = [np.asarray(y) for y in onnx_graph(*leaves.values())]
    return Oracle(named, internal, outputs)


ORACLES = {"tf": ("tensorflow", tf_saved), "torch": ("torch", torch_saved)}  # name -> (module, oracle)

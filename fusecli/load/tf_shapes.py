"""A SavedModel's open dims sized without TensorFlow: TensorFlow's shape rules, written out, on symbols.

A SavedModel records each op's shapes as TensorFlow traced them: a dynamic batch is -1 in every tensor
after it, although each such dim is the batch times numbers the SavedModel records. Here the forward
graph is walked once in order, the graph inputs' dims as the names ``memory.sizes.bind`` gave them
(``batch``, ``x_dim1``), and each op's output shape is made by its shape rule (the table ``RULES``, one line
per op kind: convolutions and pooling, elementwise and broadcasting ops, MatMul, Einsum, Reshape with a
known shape...), dims as integer polynomials (``core.dims.Poly``). A dim the SavedModel records as a number
stays that number; a rule's dim fills only a dim it records as -1. Small integer tensors carry their
values too (a constant, ``Shape`` of a sized tensor, and what Tensordot's arithmetic does to them:
StridedSlice, GatherV2, Pack, ConcatV2, Prod), so a Reshape to a computed shape is sized as well.

What no rule sizes stays open (an op without a rule, a spatial dim divided by a stride, a data-dependent
shape) and goes on to TensorFlow's own shape inference (``load.tf_sizes``). A dim comes out as the
polynomial TensorFlow's numbers fit (``load.dim_fit``): an int when constant, else ``str(Poly)``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..core.dims import Poly, dim_poly
from ..core.ir import Graph, Node
from .dim_fit import over_variables

Dim = Poly | None  # None: unknown
Shape = tuple[Dim, ...] | None  # None: unknown rank
MAX_VALUES = 64  # integer tensors up to this many elements carry their values (the loader's small constants)
_UNREADABLE = (ArithmeticError, AttributeError, LookupError, TypeError, ValueError)  # a rule's failure
MAX_DEGREE = 2  # the fit's degree (``dim_fit``): a dim of higher degree stays open, as it would there


class _Pass:
    """The shapes (and small integer values) of the graph's tensors, as the walk reaches them."""

    def __init__(self, graph: Graph) -> None:
        self.shapes: dict[str, Shape] = {}
        self.values: dict[str, tuple[Dim, ...]] = {}
        for t in graph.tensors.values():
            if t.producer is None:
                self.shapes[t.name] = _poly_shape(t.shape)
                value = t.meta.get("value")
                if isinstance(value, np.ndarray) and value.dtype.kind in "iu":  # flattened
                    self.values[t.name] = tuple(Poly.const(int(v)) for v in value.reshape(-1))

    def shape(self, t) -> Shape:
        return None if t is None else self.shapes.get(t.name)

    def value(self, t) -> tuple[Dim, ...] | None:
        return None if t is None else self.values.get(t.name)

    def ints(self, t) -> list[int] | None:
        """A tensor's value as Python ints, when it is known and constant."""
        v = self.value(t)
        if v is None or any(d is None or d.constant is None for d in v):
            return None
        return [d.constant for d in v]

    def run(self, graph: Graph) -> None:
        for n in graph.nodes:
            rule = RULES.get(n.op_type)
            got: list = []
            if rule is not None:
                try:
                    got = list(rule(self, n))
                except _UNREADABLE:
                    got = []  # an op whose arguments the rule cannot read: left to TensorFlow
            for i, t in enumerate(n.outputs):
                if t is None:
                    continue
                self.shapes[t.name] = _merge(_poly_shape(t.shape), got[i] if i < len(got) else None)
                value = t.meta.get("value")
                if isinstance(value, np.ndarray) and value.dtype.kind in "iu":  # a constant, flattened
                    self.values[t.name] = tuple(Poly.const(int(v)) for v in value.reshape(-1))
                    continue
                if n.op_type in VALUE_RULES and t.dtype.startswith("int") and i == 0:
                    try:
                        v = VALUE_RULES[n.op_type](self, n)
                    except _UNREADABLE:
                        v = None
                    if v is not None and len(v) <= MAX_VALUES:
                        self.values[t.name] = tuple(v)


def size_natively(graph: Graph, pending: set[str], variables: tuple[str, ...]) -> set[str]:
    """Fill the ``pending`` tensors' open dims that the rules size, in place (the recorded shape kept in
    ``meta["graph_shape"]``, as ``tf_sizes`` does); the names of the tensors changed."""
    found = native_shapes(graph)
    changed = set()
    for name in sorted(pending):
        t, got = graph.tensors[name], found.get(name)
        if got is None or (t.shape is not None and len(got) != len(t.shape)):
            continue
        dims = list(t.shape) if t.shape is not None else [None] * len(got)
        for axis, g in enumerate(got):
            d = dims[axis]
            open_ = d is None or not over_variables(d, variables)
            if open_ and g is not None and over_variables(g, variables):
                dims[axis] = g
        if tuple(dims) != t.shape:
            t.meta.setdefault("graph_shape", t.shape)
            t.shape = tuple(dims)
            changed.add(name)
    return changed


TENSORFLOW_LEAVES_OPEN = {  # op -> outputs whose shape TensorFlow's own shape function leaves unknown
    "FusedBatchNormV3": (5,),  # reserve_space_3: c->UnknownShape() in FusedBatchNormV3Shape
    "_FusedBatchNormEx": (5,),  # the same shape function
}


def open_to_tensorflow(graph: Graph, names: set[str]) -> set[str]:
    """The tensors among ``names`` that TensorFlow's shape inference leaves unknown too (importing it for
    them would size nothing)."""
    out = set()
    for name in names:
        t = graph.tensors[name]
        n = t.producer
        if n is not None and any(n.outputs[i] is t for i in TENSORFLOW_LEAVES_OPEN.get(n.op_type, ())
                                 if i < len(n.outputs)):
            out.add(name)
    return out


def native_shapes(graph: Graph) -> dict[str, tuple]:
    """Tensor name -> its dims by the rules (int, a polynomial's text, None where open), for every tensor
    a node makes."""
    p = _Pass(graph)
    p.run(graph)
    out = {}
    for n in graph.nodes:
        for t in n.outputs:
            if t is not None:
                s = p.shapes.get(t.name)
                out[t.name] = None if s is None else tuple(_dim_text(d) for d in s)
    return out


# -- dims ---------------------------------------------------------------------------------------------------
def _poly_shape(shape) -> Shape:
    if shape is None:
        return None
    return tuple(_poly(d) for d in shape)


def _poly(d) -> Dim:
    if d is None or isinstance(d, bool):
        return None
    p = dim_poly(d)
    return p if p is not None and not (p.constant is not None and p.constant < 0) else None


def _dim_text(d: Dim):
    if d is None or _degree(d) > MAX_DEGREE or (d.constant is not None and d.constant < 0):
        return None
    return d.constant if d.constant is not None else str(d)


def _degree(p: Poly) -> int:
    return max((sum(e for _, e in m) for m in p.terms), default=0)


def _merge(recorded: Shape, inferred: Shape) -> Shape:
    """What TensorFlow recorded, its -1s filled by the rule (a recorded number wins; ranks must agree)."""
    if inferred is None:
        return recorded
    if recorded is None:
        return inferred
    if len(recorded) != len(inferred):
        return recorded
    return tuple(r if r is not None else i for r, i in zip(recorded, inferred, strict=True))


def _c(k: int) -> Poly:
    return Poly.const(k)


def _broadcast_dim(a: Dim, b: Dim) -> Dim:
    """NumPy broadcasting of two dims, as TensorFlow's BroadcastBinaryOpShapeFn reads unknowns."""
    if a is not None and a.constant == 1:
        return b
    if b is not None and b.constant == 1:
        return a
    if a is None or b is None:  # unknown against a dim > 1 (an input dim, >= 3 where the fit probes): it
        known = a if b is None else b
        return known if known is not None and (known.constant is None or known.constant > 1) else None
    return a if a == b else None


def _broadcast(*shapes: Shape) -> Shape:
    if any(s is None for s in shapes):
        return None
    rank = max(len(s) for s in shapes)
    out: list[Dim] = [_c(1)] * rank
    for s in shapes:
        padded = (_c(1),) * (rank - len(s)) + tuple(s)
        out = [_broadcast_dim(x, y) for x, y in zip(out, padded, strict=True)]
    return tuple(out)


def _product(dims) -> Dim:
    out = _c(1)
    for d in dims:
        if d is None:
            return None
        out = out * d
    return out


def _divide(a: Dim, b: Dim) -> Dim:
    """``a / b`` when it is exact: b a nonzero constant dividing every coefficient, or a monomial
    dividing every term."""
    if a is None or b is None or not b.terms:
        return None
    if b.constant is not None:
        if any(c % b.constant for c in a.terms.values()):
            return None
        return Poly({m: c // b.constant for m, c in a.terms.items()})
    if len(b.terms) != 1:
        return None
    (bm, bc), = b.terms.items()
    out = {}
    for m, c in a.terms.items():
        exps = dict(m)
        for s, e in bm:
            if exps.get(s, 0) < e:
                return None
            exps[s] -= e
        if c % bc:
            return None
        out[tuple(sorted((s, e) for s, e in exps.items() if e))] = c // bc
    return Poly(out)


def _axis(a: int, rank: int) -> int:
    if not -rank <= a < rank:
        raise ValueError(f"axis {a} of rank {rank}")
    return a % rank


# -- the rules: node -> its output shapes -----------------------------------------------------------------
def _same(p: _Pass, n: Node) -> list[Shape]:
    """Elementwise: every output the first input's shape."""
    return [p.shape(n.inputs[0])] * len(n.outputs)


def _binary(p: _Pass, n: Node) -> list[Shape]:
    """Broadcasting ops (AddV2, Mul, SelectV2...): the inputs broadcast."""
    return [_broadcast(*(p.shape(t) for t in n.inputs))]


def _spatial(n: Node, rank: int) -> tuple[int, list[int]]:
    """The channel axis and the spatial axes of the data format (NHWC unless 'NC' first)."""
    channels_first = str(n.attrs.get("data_format", "NHWC")).startswith("NC")
    return (1, list(range(2, rank))) if channels_first else (rank - 1, list(range(1, rank - 1)))


def _window(size: Dim, k: int, stride: int, dilation: int, padding: str, pads: tuple[int, int]) -> Dim:
    """One spatial dim after a window: SAME ceil(n / s), VALID (n - (k-1)d - 1) / s + 1, EXPLICIT padded."""
    if size is None:
        return None
    if stride == 1 and (padding == "SAME" or (padding == "VALID" and k == 1)):
        return size  # a symbol carried through: no division
    n = size.constant
    if n is None:
        return None
    if padding == "SAME":
        return _c(-(-n // stride))
    extra = sum(pads) if padding == "EXPLICIT" else 0
    return _c((n + extra - (k - 1) * dilation - 1) // stride + 1)


def _conv(p: _Pass, n: Node, depthwise: bool = False, pool: bool = False) -> list[Shape]:
    """Conv2D/Conv3D/DepthwiseConv2dNative/MaxPool/AvgPool: batch, windowed spatial dims, channels."""
    x = p.shape(n.inputs[0])
    if x is None:
        return []
    rank = len(x)
    ch, spatial = _spatial(n, rank)
    strides = list(n.attrs.get("strides") or [1] * rank)
    dilations = list(n.attrs.get("dilations") or [1] * rank)
    padding = str(n.attrs.get("padding", "VALID"))
    explicit = list(n.attrs.get("explicit_paddings") or [])
    if pool:
        ksize = list(n.attrs["ksize"])
        kernel = [ksize[a] for a in spatial]
        out_ch = x[ch]
    else:
        w = p.shape(n.inputs[1])
        kernel = [w[i].constant for i in range(rank - 2)]
        out_ch = (x[ch] * w[-1] if x[ch] is not None else None) if depthwise else w[-1]
    out = list(x)
    for i, a in enumerate(spatial):
        pads = (explicit[2 * a], explicit[2 * a + 1]) if len(explicit) == 2 * rank else (0, 0)
        d = 1 if pool else dilations[a]
        out[a] = _window(x[a], kernel[i], strides[a], d, padding, pads)
    out[ch] = out_ch
    return [tuple(out)]


def _matmul(p: _Pass, n: Node) -> list[Shape]:
    """MatMul/BatchMatMul: [..., m, k] @ [..., k, n] -> [..., m, n], batch dims broadcast (V2, V3)."""
    a, b = p.shape(n.inputs[0]), p.shape(n.inputs[1])
    if a is None or b is None:
        return []
    ta = n.attrs.get("transpose_a", n.attrs.get("adj_x", False))
    tb = n.attrs.get("transpose_b", n.attrs.get("adj_y", False))
    m = a[-1] if ta else a[-2]
    k = b[-2] if tb else b[-1]
    if n.op_type == "BatchMatMul" and len(a) != len(b):
        return []
    batch = _broadcast(a[:-2], b[:-2])
    return [(*batch, m, k)]


def _reshape(p: _Pass, n: Node) -> list[Shape]:
    """Reshape: the shape argument's values, a -1 being what the element count leaves."""
    target = p.value(n.inputs[1])
    if target is None:
        return []
    x = p.shape(n.inputs[0])
    out = list(target)
    holes = [i for i, d in enumerate(out) if d is not None and d.constant == -1]
    if len(holes) == 1:
        rest = _product(d for i, d in enumerate(out) if i != holes[0])
        out[holes[0]] = _divide(_product(x) if x is not None else None, rest)
    elif holes:
        return []
    return [tuple(out)]


def _transpose(p: _Pass, n: Node) -> list[Shape]:
    """Transpose: the input's dims in the order of the constant ``perm``."""
    x, perm = p.shape(n.inputs[0]), p.ints(n.inputs[1])
    if x is None or perm is None:
        return []
    return [tuple(x[i] for i in perm)]


def _squeeze(p: _Pass, n: Node) -> list[Shape]:
    """Squeeze: the ``squeeze_dims`` axes dropped (every dim of 1 when none is named)."""
    x = p.shape(n.inputs[0])
    if x is None:
        return []
    axes = {_axis(a, len(x)) for a in n.attrs.get("squeeze_dims") or []}
    if not axes:
        if any(d is None for d in x):
            return []
        axes = {i for i, d in enumerate(x) if d.constant == 1}
    return [tuple(d for i, d in enumerate(x) if i not in axes)]


def _expand_dims(p: _Pass, n: Node) -> list[Shape]:
    """ExpandDims: a 1 inserted at the constant axis (negative: counted from rank + 1)."""
    x, axis = p.shape(n.inputs[0]), p.ints(n.inputs[1])
    if x is None or axis is None or len(axis) != 1:
        return []
    a = _axis(axis[0], len(x) + 1)
    return [(*x[:a], _c(1), *x[a:])]


def _concat(p: _Pass, n: Node) -> list[Shape]:
    """ConcatV2: the inputs (axis last) summed along the constant axis, the other dims merged."""
    axis = p.ints(n.inputs[-1])
    shapes = [p.shape(t) for t in n.inputs[:-1]]
    if axis is None or any(s is None for s in shapes) or len({len(s) for s in shapes}) != 1:
        return []
    a = _axis(axis[0], len(shapes[0]))
    out = []
    for i in range(len(shapes[0])):
        dims = [s[i] for s in shapes]
        if i == a:
            out.append(_sum(dims) if None not in dims else None)
        else:
            out.append(next((d for d in dims if d is not None), None))
    return [tuple(out)]


def _sum(dims) -> Poly:
    total = Poly()
    for d in dims:
        total = total + d
    return total


def _slice(p: _Pass, n: Node) -> list[Shape]:
    """Slice: the constant ``size`` (-1: to the end, the dim less ``begin``)."""
    x, begin, size = p.shape(n.inputs[0]), p.ints(n.inputs[1]), p.ints(n.inputs[2])
    if x is None or begin is None or size is None:
        return []
    return [tuple((d - _c(b) if d is not None else None) if s == -1 else _c(s)
                  for d, b, s in zip(x, begin, size, strict=True))]


def _strided_slice(p: _Pass, n: Node) -> list[Shape]:
    """StridedSlice with constant begin / end / strides and no ellipsis or new axis: per axis, a masked
    bound is the whole dim; a shrunk axis goes."""
    x = p.shape(n.inputs[0])
    b, e, s = (p.ints(t) for t in n.inputs[1:4])
    if x is None or b is None or e is None or s is None:
        return []
    if n.attrs.get("ellipsis_mask", 0) or n.attrs.get("new_axis_mask", 0):
        return []
    out = []
    for i, d in enumerate(x):
        if i >= len(b):
            out.append(d)
            continue
        if n.attrs.get("shrink_axis_mask", 0) >> i & 1:
            continue
        out.append(_slice_len(d, b[i], e[i], s[i], n.attrs.get("begin_mask", 0) >> i & 1,
                              n.attrs.get("end_mask", 0) >> i & 1))
    return [tuple(out)]


def _slice_len(d: Dim, begin: int, end: int, stride: int, whole_begin: int, whole_end: int) -> Dim:
    """The length of ``d[begin:end:stride]`` (a masked bound: the dim's end)."""
    if whole_begin and whole_end and stride == 1:
        return d
    if d is None or d.constant is None:
        return None
    return _c(len(range(d.constant)[slice(None if whole_begin else begin, None if whole_end else end,
                                          stride)]))


def _reduce(p: _Pass, n: Node) -> list[Shape]:
    """Mean/Sum/Max/Min/Prod over constant axes: those dims go (or become 1 with keep_dims)."""
    x, axes = p.shape(n.inputs[0]), p.ints(n.inputs[1])
    if x is None or axes is None:
        return []
    drop = {_axis(a, len(x)) for a in axes}
    keep = n.attrs.get("keep_dims", False)
    return [tuple(_c(1) if i in drop else d for i, d in enumerate(x) if keep or i not in drop)]


def _pad(p: _Pass, n: Node) -> list[Shape]:
    """Pad/PadV2/MirrorPad: each dim plus its constant before and after."""
    x, pads = p.shape(n.inputs[0]), p.ints(n.inputs[1])
    if x is None or pads is None or len(pads) != 2 * len(x):
        return []
    return [tuple(None if d is None else d + _c(pads[2 * i] + pads[2 * i + 1]) for i, d in enumerate(x))]


def _batch_norm(p: _Pass, n: Node) -> list[Shape]:
    """FusedBatchNorm(V2, V3): y is x's shape; the statistics are as recorded. V3's reserve_space_3 in
    inference (is_training false, the serving signature's BatchNorm) is an empty dummy: shape [0] as
    TensorFlow's CPU kernel makes it (measured), a 0-d dummy in the GPU kernel; in training the GPU
    kernel hands cuDNN's reserve space there, whose size cuDNN chooses: left open."""
    y = p.shape(n.inputs[0])
    if len(n.outputs) == 6 and n.attrs.get("is_training") is False:
        return [y, None, None, None, None, (_c(0),)]
    return [y]


def _bias_add(p: _Pass, n: Node) -> list[Shape]:
    """BiasAdd: the value's shape."""
    return [p.shape(n.inputs[0])]


def _tile(p: _Pass, n: Node) -> list[Shape]:
    """Tile: each dim times its constant multiple."""
    x, m = p.shape(n.inputs[0]), p.value(n.inputs[1])
    if x is None or m is None:
        return []
    return [tuple(None if d is None or k is None else d * k for d, k in zip(x, m, strict=True))]


def _gather(p: _Pass, n: Node) -> list[Shape]:
    """GatherV2 (batch_dims 0): params' dims with the axis replaced by the indices' dims."""
    x, idx, axis = p.shape(n.inputs[0]), p.shape(n.inputs[1]), p.ints(n.inputs[2])
    if x is None or idx is None or axis is None or n.attrs.get("batch_dims", 0):
        return []
    a = _axis(axis[0], len(x))
    return [(*x[:a], *idx, *x[a + 1:])]


def _pack(p: _Pass, n: Node) -> list[Shape]:
    """Pack: N inputs of one shape stacked on a new axis."""
    x = p.shape(n.inputs[0])
    if x is None:
        return []
    a = _axis(n.attrs.get("axis", 0), len(x) + 1)
    return [(*x[:a], _c(len(n.inputs)), *x[a:])]


def _shape(p: _Pass, n: Node) -> list[Shape]:
    """Shape: a vector of the input's rank."""
    x = p.shape(n.inputs[0])
    return [] if x is None else [(_c(len(x)),)]


def _einsum(p: _Pass, n: Node) -> list[Shape]:
    """Einsum without ellipsis: each output letter's dim from the input that has it."""
    eq = str(n.attrs.get("equation", "")).replace(" ", "")
    if "." in eq or "->" not in eq:
        return []
    lhs, out = eq.split("->")
    terms = lhs.split(",")
    letters: dict[str, Dim] = {}
    for term, t in zip(terms, n.inputs, strict=True):
        s = p.shape(t)
        if s is None or len(s) != len(term):
            return []
        for ch, d in zip(term, s, strict=True):
            have = letters.get(ch)
            if have is None or (have.constant == 1 and d is not None):  # a known dim; broadcast's 1 last
                letters[ch] = d
    return [tuple(letters.get(ch) for ch in out)]


_UNARY = ("Relu", "Relu6", "Elu", "Selu", "Sigmoid", "Tanh", "Softplus", "Softsign", "Rsqrt", "Sqrt", "Exp",
          "Log", "Log1p", "Neg", "Square", "Abs", "Reciprocal", "Inv", "Erf", "Erfc", "Identity", "Cast",
          "StopGradient", "PreventGradient", "Softmax", "LogSoftmax", "LeakyRelu", "Gelu", "Sin", "Cos",
          "Floor", "Ceil", "Round", "Sign", "IsNan", "LogicalNot", "ZerosLike", "OnesLike", "Snapshot",
          "CheckNumerics", "EnsureShape", "Mish", "Swish", "Relu6Grad", "ClipByValue", "Dropout")
_BINARY = ("AddV2", "Add", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "FloorDiv", "FloorMod", "Maximum",
           "Minimum", "Pow", "SquaredDifference", "Greater", "GreaterEqual", "Less", "LessEqual", "Equal",
           "NotEqual", "LogicalAnd", "LogicalOr", "SelectV2", "MulNoNan", "TruncateDiv", "BiasAddV1")

RULES: dict[str, Callable[[_Pass, Node], list[Shape]]] = {
    **{op: _same for op in _UNARY},  # elementwise: the input's shape
    **{op: _binary for op in _BINARY},  # broadcasting: the inputs broadcast
    "AddN": _binary,  # inputs of one shape
    "BiasAdd": _bias_add,  # the value's shape
    "Conv2D": _conv,  # batch, windowed spatial dims, the filter's output channels
    "Conv3D": _conv,  # the same in three spatial dims
    "DepthwiseConv2dNative": lambda p, n: _conv(p, n, depthwise=True),  # channels times the multiplier
    "MaxPool": lambda p, n: _conv(p, n, pool=True),  # windowed spatial dims, channels kept
    "AvgPool": lambda p, n: _conv(p, n, pool=True),
    "MaxPool3D": lambda p, n: _conv(p, n, pool=True),
    "AvgPool3D": lambda p, n: _conv(p, n, pool=True),
    "MatMul": _matmul,  # [m, k] @ [k, n], transposes read
    "BatchMatMul": _matmul,  # batch dims equal
    "BatchMatMulV2": _matmul,  # batch dims broadcast
    "BatchMatMulV3": _matmul,
    "Einsum": _einsum,  # each output letter's dim from an input
    "FusedBatchNorm": _batch_norm,  # y as x
    "FusedBatchNormV2": _batch_norm,
    "FusedBatchNormV3": _batch_norm,
    "Reshape": _reshape,  # the shape argument, -1 what the count leaves
    "Transpose": _transpose,  # dims permuted
    "Squeeze": _squeeze,  # named dims (or every 1) dropped
    "ExpandDims": _expand_dims,  # a 1 inserted
    "ConcatV2": _concat,  # summed along the axis
    "Slice": _slice,  # the constant sizes
    "StridedSlice": _strided_slice,  # the constant bounds
    "Mean": _reduce, "Sum": _reduce, "Max": _reduce, "Min": _reduce, "Prod": _reduce,  # axes dropped
    "Pad": _pad, "PadV2": _pad, "MirrorPad": _pad,  # dims plus their paddings
    "Tile": _tile,  # dims times the multiples
    "GatherV2": _gather,  # the axis replaced by the indices' dims
    "Pack": _pack,  # a new axis of N
    "Shape": _shape,  # a vector of the rank
}


# -- small integer values: what shape arithmetic computes -------------------------------------------------
def _v_shape(p: _Pass, n: Node):
    """Shape: the input's dims."""
    return p.shape(n.inputs[0])


def _v_strided_slice(p: _Pass, n: Node):
    """StridedSlice of a vector with constant bounds (a shrunk axis: one element)."""
    v = p.value(n.inputs[0])
    b, e, s = (p.ints(t) for t in n.inputs[1:4])
    if v is None or b is None or e is None or s is None or len(b) != 1:
        return None
    if n.attrs.get("ellipsis_mask", 0) or n.attrs.get("new_axis_mask", 0):
        return None
    if n.attrs.get("shrink_axis_mask", 0) & 1:
        return (v[b[0]],)
    begin = None if n.attrs.get("begin_mask", 0) & 1 else b[0]
    end = None if n.attrs.get("end_mask", 0) & 1 else e[0]
    return tuple(v[begin:end:s[0]])


def _v_gather(p: _Pass, n: Node):
    """GatherV2 of a vector at constant indices."""
    v, idx = p.value(n.inputs[0]), p.ints(n.inputs[1])
    return None if v is None or idx is None else tuple(v[i] for i in idx)


def _v_pack(p: _Pass, n: Node):
    """Pack of scalars: their values in a vector."""
    vals = [p.value(t) for t in n.inputs]
    if any(v is None or len(v) != 1 for v in vals) or n.attrs.get("axis", 0) not in (0, -1):
        return None
    return tuple(v[0] for v in vals)


def _v_concat(p: _Pass, n: Node):
    """ConcatV2 of vectors: their values one after the other."""
    vals = [p.value(t) for t in n.inputs[:-1]]
    return None if any(v is None for v in vals) else tuple(d for v in vals for d in v)


def _v_prod(p: _Pass, n: Node):
    """Prod of a vector over its one axis: the product."""
    v = p.value(n.inputs[0])
    return None if v is None else (_product(v),)


def _v_same(p: _Pass, n: Node):
    """Identity, Cast: the same values."""
    return p.value(n.inputs[0])


def _v_arith(op: Callable[[Poly, Poly], Poly]):
    def rule(p: _Pass, n: Node):
        """Elementwise integer arithmetic, a scalar broadcast."""
        a, b = p.value(n.inputs[0]), p.value(n.inputs[1])
        if a is None or b is None or (len(a) != len(b) and 1 not in (len(a), len(b))):
            return None
        k = max(len(a), len(b))
        a, b = (a * k if len(a) == 1 else a), (b * k if len(b) == 1 else b)
        return tuple(None if x is None or y is None else op(x, y) for x, y in zip(a, b, strict=True))
    return rule


VALUE_RULES: dict[str, Callable[[_Pass, Node], tuple | None]] = {
    "Shape": _v_shape,  # the input's dims
    "StridedSlice": _v_strided_slice,  # a slice (or one element) of a vector
    "GatherV2": _v_gather,  # elements at constant indices
    "Pack": _v_pack,  # scalars in a vector
    "ConcatV2": _v_concat,  # vectors joined
    "Prod": _v_prod,  # the product
    "Identity": _v_same, "Cast": _v_same,  # the same values
    "Mul": _v_arith(lambda x, y: x * y),  # products
    "AddV2": _v_arith(lambda x, y: x + y), "Add": _v_arith(lambda x, y: x + y),  # sums
    "Sub": _v_arith(lambda x, y: x - y),  # differences
}

"""Memory layout (strides) of forward tensors as PyTorch eager lays them out: what decides whether a
``reshape`` is a view (shares its input's storage) or a copy (a storage of its own).

PyTorch's ``reshape`` returns a view when ``computeStride`` (aten/src/ATen/TensorUtils.cpp) finds strides
for the new shape, else a contiguous copy; ``.contiguous()``, which the TorchScript exporter drops, copies
a non-contiguous tensor. So ``attn_output.transpose(1, 2).contiguous().reshape(b, s, -1)`` shares the
storage of sdpa's output only when that output is laid out (batch, seq, heads, head_dim) in memory, and
PyTorch's CPU flash kernel lays its output out as its query is: q from ``view(b, s, h, d).transpose(1, 2)``
and elementwise ops on it (Llama's rotary) -> a view; q from ``torch.cat`` (StableLM's and GPT-J's partial
rotary) -> contiguous (b, h, s, d) -> a copy, which o_proj's MmBackward0 saves beside the output sdpa
saves.

The model is small on purpose: transpose permutes strides; reshape/flatten/squeeze/unsqueeze keep
``computeStride``'s strides or copy; expand gives its broadcast dims stride 0; identity, same-dtype
casts and split's outputs (narrow) keep strides; elementwise ops lay their output out as their first
full-shape input (TensorIterator's operand order); an sdpa output carries ``meta["sdpa_layout"]``; every
other op makes a contiguous tensor. Unknown sizes: contiguous.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..core.ir import Tensor

_KEEP = frozenset({"identity", "cast", "dropout"})
_RESHAPE = frozenset({"reshape", "flatten", "squeeze", "unsqueeze"})
ELEMENTWISE = frozenset({
    "add", "sub", "mul", "div", "neg", "reciprocal", "abs", "sqrt", "rsqrt", "square", "pow", "exp", "log",
    "erf", "sin", "cos", "tan", "tanh", "sigmoid", "relu", "relu6", "clip", "leaky_relu", "elu", "selu",
    "gelu", "softplus", "hard_sigmoid", "hard_swish", "where", "maximum", "minimum", "mod", "bias_add",
    "bias_gelu", "mish", "celu", "softsign", "erfc", "log1p", "expm1"})
_MAX_WALK = 256  # producers followed for one answer; past that the tensor is taken as contiguous


def contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, s = [], 1
    for d in reversed(shape):
        strides.append(s)
        s *= max(d, 1)
    return tuple(reversed(strides))


def dense_like(strides: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    """Dense strides for ``shape`` whose dims are ordered in memory as ``strides`` order them (the
    layout an elementwise op or empty_like gives its output)."""
    order = sorted(range(len(shape)), key=lambda i: (-strides[i], i))  # outermost first
    out, s = [0] * len(shape), 1
    for i in reversed(order):
        out[i] = s
        s *= max(shape[i], 1)
    return tuple(out)


def compute_stride(oldshape: tuple[int, ...], oldstride: tuple[int, ...],
                   newshape: tuple[int, ...]) -> tuple[int, ...] | None:
    """aten's computeStride: the strides of ``view(newshape)``, or None when only a copy can reshape."""
    if not oldshape:
        return contiguous(newshape)
    numel = 1
    for d in oldshape:
        numel *= d
    if numel == 0:
        return contiguous(newshape)
    newstride = [0] * len(newshape)
    view_d = len(newshape) - 1
    chunk_base_stride = oldstride[-1]
    tensor_numel = view_numel = 1
    for tensor_d in range(len(oldshape) - 1, -1, -1):
        tensor_numel *= oldshape[tensor_d]
        if tensor_d == 0 or (oldshape[tensor_d - 1] != 1
                             and oldstride[tensor_d - 1] != tensor_numel * chunk_base_stride):
            while view_d >= 0 and (view_numel < tensor_numel or newshape[view_d] == 1):
                newstride[view_d] = view_numel * chunk_base_stride
                view_numel *= newshape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base_stride = oldstride[tensor_d - 1]
                tensor_numel = view_numel = 1
    return tuple(newstride) if view_d == -1 else None


class Layouts:
    """Strides of tensors at the analysis sizes ``dims``, memoised per tensor (one per build). A named dim
    bound to 1 counts as 2 here: a size-1 dim takes any stride, so at 1 a reshape PyTorch copies at every
    larger size would pass for a view, and the saved set, which the byte formulas hold for every size,
    would be that of size 1 alone."""

    def __init__(self, dims: Mapping[str, int]) -> None:
        self.dims = {name: max(value, 2) for name, value in dims.items()}
        self.memo: dict[int, tuple[int, ...] | None] = {}

    def shape(self, t: Tensor) -> tuple[int, ...] | None:
        return t.resolve_shape(self.dims)

    def strides(self, t: Tensor, budget: list[int] | None = None) -> tuple[int, ...] | None:
        """t's strides, or None when its shape is unknown."""
        key = id(t)
        if key in self.memo:
            return self.memo[key]
        budget = [_MAX_WALK] if budget is None else budget
        shape = self.shape(t)
        got = None if shape is None else self._strides(t, shape, budget)
        self.memo[key] = got
        return got

    def _strides(self, t: Tensor, shape: tuple[int, ...], budget: list[int]) -> tuple[int, ...]:
        budget[0] -= 1
        p = t.producer
        if budget[0] <= 0 or p is None or p.meta.get("constant") or t.kind in ("parameter", "constant"):
            return contiguous(shape)
        x = p.inputs[0] if p.inputs else None
        like = t.meta.get("sdpa_layout")
        if like is not None:  # sdpa's output: as its query (CPU flash), (b, s, h, d) (CUDA) or contiguous
            if like == "bshd" and len(shape) == 4:
                return (shape[1] * shape[2] * shape[3], shape[3], shape[1] * shape[3], 1)
            if isinstance(like, Tensor):
                qs = self.strides(like, budget)
                if qs is not None and len(qs) == len(shape):
                    return dense_like(qs, shape)
            return contiguous(shape)
        if p.kind == "split" and x is not None:  # narrow()s of x: x's strides, any output
            xs = self.strides(x, budget)
            return xs if xs is not None and len(xs) == len(shape) else contiguous(shape)
        if x is None or p.outputs[0] is not t:
            return contiguous(shape)
        if p.kind in _KEEP or p.kind in _RESHAPE or p.kind == "transpose":
            xs = self.strides(x, budget)
            xshape = self.shape(x)
            if xs is None or xshape is None:
                return contiguous(shape)
            if p.kind in _KEEP:
                return xs if len(xs) == len(shape) else contiguous(shape)
            if p.kind == "transpose":
                perm = p.attrs.get("perm") or list(reversed(range(len(xs))))
                return tuple(xs[i] for i in perm) if len(perm) == len(shape) else contiguous(shape)
            view = compute_stride(xshape, xs, shape)
            return view if view is not None else contiguous(shape)
        if p.kind == "expand":  # broadcast dims get stride 0, as Tensor.expand gives them
            xs, xshape = self.strides(x, budget), self.shape(x)
            if xs is None or xshape is None or len(xshape) > len(shape):
                return contiguous(shape)
            lead = len(shape) - len(xshape)
            return tuple(0 if i < lead or (xshape[i - lead] == 1 and d != 1) else xs[i - lead]
                         for i, d in enumerate(shape))
        if p.kind in ELEMENTWISE:
            for i in p.inputs:
                if i is not None and i.kind not in ("constant",) and self.shape(i) == shape:
                    xs = self.strides(i, budget)
                    return contiguous(shape) if xs is None else dense_like(xs, shape)
        return contiguous(shape)

    def matmul_copies(self, node, t: Tensor) -> bool:
        """Whether PyTorch's matmul saves a copy of its operand ``t`` rather than a view: aten's matmul
        folds a batched operand to 3-D (both >= 3-D: bmm) or to 2-D (a >= 3-D left operand of a 2-D
        right one: mm) with ``reshape``, which copies where the batch dims cannot merge (a split/chunk
        view: GPT-NeoX's v, GPT-2's eager q and k); bmm/mm then save that copy, not the storage ``t``
        views."""
        ins = node.inputs
        if len(ins) != 2 or any(x is None for x in ins) or all(x is not t for x in ins):
            return False
        shapes = [self.shape(x) for x in ins]
        shape = self.shape(t)
        if shape is None or any(s is None for s in shapes) or len(shape) < 3:
            return False
        if all(len(s) >= 3 for s in shapes):
            if shapes[0][:-2] != shapes[1][:-2]:
                return False  # broadcast batch dims: expand first (not modelled)
            folded = (math.prod(shape[:-2]), shape[-2], shape[-1])
        elif t is ins[0] and len(shapes[1]) <= 2:
            folded = (math.prod(shape[:-1]), shape[-1])
        else:
            return False
        xs = self.strides(t)
        return xs is not None and compute_stride(shape, xs, folded) is None

    def reshape_copies(self, t: Tensor) -> bool:
        """Whether PyTorch's reshape making ``t`` (a reshape/flatten of its producer's input) copies."""
        p = t.producer
        x = p.inputs[0]
        xshape, shape = self.shape(x), self.shape(t)
        if xshape is None or shape is None:
            return False  # unknown sizes: a view, as before
        xs = self.strides(x)
        return xs is not None and compute_stride(xshape, xs, shape) is None

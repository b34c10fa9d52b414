"""The pattern kit: ``Pattern`` (one declarative catalogue entry: forms are alternative op trees) and the
tree builders and tensor checks the family modules (fusion/families/) write their entries with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..core.ir import Tensor
from ..core.trees import Op, Var, op, through_noops
from ..spellings import gelu, norms
from ..spellings.acts import gate_acts
from ..spellings.common import SUM, is_activation, is_param, optional, scalar, swaps_last_two


@dataclass(frozen=True)
class Pattern:
    name: str
    forms: tuple[Op, ...]  # alternatives, most complete first
    kernel: str  # what the match becomes
    doc: str  # one-line math or seed comment
    phase: str = "forward"
    fused_kind: str | None = None  # becomes an op with its own gradient rule (judge training by it)
    include_producers: tuple[str, ...] = ()  # bound tensors whose producers join the match
    require: Callable | None = None  # (roles, bound) -> bool
    side_outputs: tuple[str, ...] = ()  # bound tensors the kernel writes out as extra outputs
    anchor: Callable | None = None  # (root node) -> bool: a cheap test before any form is tried
    find: Callable | None = None  # (root node) -> (nodes, roles, bound) | None: read by form, not trees
    roots: frozenset[str] = frozenset()  # the root kinds of a ``find`` pattern
    recompute: str | None = None  # a recompute rule beyond the default (recompute.RULES: "flash")

    @property
    def root(self) -> Op:
        return Op(frozenset().union(self.roots, *(f.kinds for f in self.forms)))


# -- tensor checks ----------------------------------------------------------------------------------
def is_channel_param(t: Tensor) -> bool:
    """A per-channel weight: a parameter with exactly one dim larger than 1."""
    return is_param(t) and t.shape is not None and sum(1 for d in t.shape if d != 1) == 1


def made_by(*kinds: str) -> Callable[[Tensor], bool]:
    return lambda t: t.producer is not None and t.producer.kind in kinds


_PROJECTION = made_by("matmul", "gemm", "bias_add")


def transposed_weight(t: Tensor) -> bool:
    """A weight made at run time by a Transpose of a weight that swaps its last two axes only (what a
    GEMM's transB reads in place); the Transpose is a view of the parameter, not part of the match."""
    p = t.producer
    if not is_param(t) or p is None or p.kind != "transpose" or not p.inputs or not is_param(p.inputs[0]):
        return False
    return swaps_last_two(p)


def not_param(t: Tensor) -> bool:
    return not is_param(t)


def projected(t: Tensor) -> bool:
    """A projection's output, or a part of one (Phi-3's and Mixtral's fused gate_up_proj, split in two by
    Split, Slice or chunk's Gather)."""
    p = t.producer
    return _PROJECTION(t) or (p is not None and p.kind in ("split", "slice", "gather") and bool(p.inputs)
                              and p.inputs[0] is not None and _PROJECTION(p.inputs[0]))


ACTIVATIONS = frozenset({"relu", "relu6", "clip", "leaky_relu", "elu", "sigmoid", "tanh", "gelu",
                         "hard_sigmoid"})
X, W = Var(), Var()
BIAS = Var(check=is_param)
Z = Var(check=is_activation)  # a residual side input: an activation, not a constant


def act(arg: Op) -> Op:
    return op(ACTIVATIONS, arg, role="act", more=True)  # Clip's min and max are inputs from opset 11


def acts(arg: Op) -> tuple[Op, ...]:
    """One-op activations, then the gate family (silu / swish / quick_gelu / hard_swish) over ``arg``."""
    return (act(arg), *gate_acts(arg))


def conv(*, role: str = "conv") -> Op:
    """A conv (its own bias B, if any, is its third input), seen through the layout Transpose that tf2onnx
    writes after an NHWC conv (elementwise epilogues commute with it)."""
    return optional("transpose", op("conv", X, W, role=role, more=True), role="layout")


def bias(arg: Op) -> Op:
    return op("bias_add", arg, BIAS, role="bias", commutative=True)


def bn_forms(arg: Op) -> tuple[Op, ...]:
    """BatchNorm as one op, or decomposed as Keras 3 exports it: x * (gamma rsqrt(var + eps)) + shift."""
    scale = op("mul", arg, Var(check=is_channel_param), role="bn_scale", commutative=True)
    return (op("batch_norm", arg, role="bn", more=True),
            op("bias_add", scale, BIAS, role="bn", commutative=True),
            op("sub", scale, Var(check=is_channel_param), role="bn"))


def channel_scale(arg: Op) -> Op:
    """arg * s for a per-channel constant s (BatchNorm's scale that tf2onnx leaves after a conv)."""
    return op("mul", arg, Var(check=is_channel_param), role="scale", commutative=True)


def scaled(arg: Op | Var) -> tuple[Op, Op]:
    """arg * alpha (either order) or arg / alpha, for a scalar constant alpha (alpha / arg is no scale)."""
    alpha = Var(check=scalar())
    return (op("mul", arg, alpha, role="scale", commutative=True), op("div", arg, alpha, role="scale"))


def residual_add(arg: Op) -> Op:
    return op(SUM, arg, Z, role="add", commutative=True)


GELU = gelu.ALL_ERF + gelu.ALL_ERFC + gelu.ALL_TANH  # written out (the Gelu op: bias_gelu only)
LAYER_NORM, RMS_NORM = norms.ALL_LAYER_NORM, norms.ALL_RMS_NORM
SKIP_LAYOUT = frozenset({"reshape", "flatten", "squeeze", "unsqueeze"})  # between a residual sum and its norm
RESIDUAL_X = Var("x", check=lambda t: made_by("add", "sum")(through_noops(t))
                 and all(is_activation(i) for i in through_noops(t).producer.inputs if i is not None))

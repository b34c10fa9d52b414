"""GELU: 0.5 x (1 + erf(x / sqrt 2)) and its tanh approximation
0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

The three arrangements of the product: 0.5 x first (hand-written, GPT-2), (x (1 + f)) 0.5 (TorchScript's
F.gelu), x ((1 + f) 0.5) (dynamo's).
"""

from __future__ import annotations

import math

from ..core.trees import Op, Var, op
from .common import ADD, TENSORFLOW, Spelling, scalar, select, spell

HALF = Var(check=scalar(0.5))
ONE = Var(check=scalar(1.0))


def one_plus(inner: Op) -> Op:
    """1 + inner, either order."""
    return op(ADD, inner, ONE, commutative=True)


def _arrangements(f: Op) -> tuple[Op, Op, Op]:
    """x Phi's three products with 1 + f: 0.5 x first, TorchScript's, dynamo's."""
    xv, plus = Var("x"), one_plus(f)
    return (op("mul", op("mul", xv, HALF, commutative=True), plus, commutative=True, role="gelu"),
            op("mul", op("mul", xv, plus, commutative=True), HALF, commutative=True, role="gelu"),
            op("mul", xv, op("mul", plus, HALF, commutative=True), commutative=True, role="gelu"))


def _tagged(f: Op, first: str, torchscript: str, dynamo: str) -> tuple[Spelling, ...]:
    """The three arrangements of 1 + f, each tagged with who writes it."""
    writers = (first, torchscript, dynamo)
    return tuple(Spelling(t, frozenset(w.split())) for t, w in zip(_arrangements(f), writers, strict=True))


# erf(x / sqrt 2) (PyTorch), erf(x * (1 / sqrt 2)) (tf2onnx, hand-written)
_ERF_DIV = op("erf", op("div", Var("x"), Var(check=scalar(math.sqrt(2)))))
_ERF_MUL = op("erf", op("mul", Var("x"), Var(check=scalar(1 / math.sqrt(2))), commutative=True))
ERF = (_tagged(_ERF_DIV, "hand-written", "torchscript", "dynamo")
       + _tagged(_ERF_MUL, "tf2onnx hand-written", "tf2onnx hand-written", "tf2onnx hand-written"))

# TensorFlow writes the erf form as 0.5 x erfc(-x / sqrt 2)
_ERFC_ARG = (op("mul", op("neg", Var("x")), Var(check=scalar(1 / math.sqrt(2))), commutative=True),
             op("mul", Var("x"), Var(check=scalar(-1 / math.sqrt(2))), commutative=True))
ERFC = spell((op("mul", op("mul", Var("x"), HALF, commutative=True), op("erfc", a), commutative=True,
                 role="gelu") for a in _ERFC_ARG), *TENSORFLOW, "tf2onnx")

# x^3 as the exporters write it: Pow(x, 3) (dynamo), x * (x * x) (TorchScript's F.gelu), (x * x) * x
CUBE_POW = op("pow", Var("x"), Var(check=scalar(3.0)))
CUBE_MUL = op("mul", Var("x"), op("mul", Var("x"), Var("x")), commutative=True)
CUBE_MUL_FIRST = op("mul", op("mul", Var("x"), Var("x")), Var("x"), commutative=True)


def tanh_arg(cube: Op) -> Op:
    """sqrt(2/pi) (x + 0.044715 x^3): the tanh approximation's argument."""
    return op("mul", op(ADD, Var("x"), op("mul", cube, Var(check=scalar(0.044715)), commutative=True),
                        commutative=True), Var(check=scalar(math.sqrt(2 / math.pi))), commutative=True)


TANH = (_tagged(op("tanh", tanh_arg(CUBE_POW)), "hand-written", "hand-written", "dynamo")
        + _tagged(op("tanh", tanh_arg(CUBE_MUL)), "hand-written", "torchscript", "hand-written")
        + _tagged(op("tanh", tanh_arg(CUBE_MUL_FIRST)), "hand-written", "hand-written", "hand-written"))

# BLOOM (transformers' bloom_gelu_forward, a custom autograd.Function that both torch exporters trace):
# x * 0.5 * (1 + tanh(0.79788456 x (1 + 0.044715 x x)))
TANH_ARG_BLOOM = op("mul", op("mul", Var("x"), Var(check=scalar(math.sqrt(2 / math.pi))), commutative=True),
                    op(ADD, op("mul", op("mul", Var("x"), Var(check=scalar(0.044715)), commutative=True),
                               Var("x"), commutative=True), ONE, commutative=True), commutative=True)
BLOOM = _tagged(op("tanh", TANH_ARG_BLOOM), "torchscript dynamo", "hand-written", "hand-written")

# the Gelu op itself (ONNX opset 20, onnxruntime's contrib op)
OP = spell((op("gelu", Var("x"), role="gelu", more=True),), "dynamo", "onnxscript")

ALL_ERF, ALL_ERFC, ALL_TANH = select(ERF), select(ERFC), select(TANH + BLOOM)

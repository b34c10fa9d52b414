"""Normalizations: LayerNorm (x - mean) / sqrt(var + eps) * gamma + beta, written out, and RMSNorm
x rsqrt(mean(x^2) + eps) g (Llama, T5, Mistral, Qwen2); the embedding sum a LayerNorm reads in BERT."""

from __future__ import annotations

from dataclasses import replace

from ..core.ir import Node, Tensor
from ..core.trees import Op, Var, op
from .common import ADD, SUM, TENSORFLOW, is_param, scalar, select, spell


def _layer_norm_trees() -> tuple[Op, ...]:
    d = op("sub", Var("x"), op("reduce_mean", Var("x"), more=True), name="d")
    sq = (op("pow", Var("d"), Var(check=scalar(2.0))), op("mul", Var("d"), Var("d")))
    trees = []
    for s in sq:
        var = op("reduce_mean", s, more=True)
        std = op("sqrt", op(ADD, var, Var(check=scalar()), commutative=True))
        normed = op("div", d, std, role="normalize")
        affine = op(ADD, op("mul", normed, Var(check=is_param), commutative=True),
                    Var(check=is_param), commutative=True, role="layer_norm")
        trees += [affine, normed]
    return tuple(trees)


def _moments_layer_norm_trees() -> tuple[Op, ...]:
    """Keras 3 / TensorFlow: x * inv + (beta - mean * inv), inv = rsqrt(var(x) + eps) * gamma."""
    mean = op("reduce_mean", Var("x"), more=True, name="mean")
    var = op("reduce_mean", op("squared_difference", Var("x"), op("stop_gradient", mean)), more=True)
    rsqrt = op("rsqrt", op(ADD, var, Var(check=scalar()), commutative=True))
    trees = []
    for inv in (op("mul", rsqrt, Var(check=is_param), commutative=True, name="inv"),
                op("rsqrt", rsqrt.args[0], name="inv")):
        neg_mean_inv = op("mul", op("neg", Var("mean")), Var("inv"), commutative=True)
        for shift in (op(ADD, neg_mean_inv, Var(check=is_param), commutative=True),
                      neg_mean_inv):
            trees.append(op(SUM, op("mul", Var("x"), inv, commutative=True), shift, commutative=True,
                            role="layer_norm"))
    return tuple(trees)


def _tf2onnx_moments_trees() -> tuple[Op, ...]:
    """The moments form as tf2onnx writes it: (x - mean)^2 as d * d, rsqrt as Reciprocal(Sqrt)."""
    mean = op("reduce_mean", Var("x"), more=True, name="mean")
    var = op("reduce_mean", op("mul", op("sub", Var("x"), mean, name="d"), Var("d")), more=True)
    rs = op("reciprocal", op("sqrt", op(ADD, var, Var(check=scalar()), commutative=True,
                                        role="ln_eps")))
    trees = []
    for inv in (op("mul", rs, Var(check=is_param), commutative=True, name="inv", role="ln_inv"),
                replace(rs, name="inv", role="ln_inv")):
        neg_mean_inv = op("mul", op("neg", Var("mean")), Var("inv"), commutative=True)
        for shift in (op(ADD, neg_mean_inv, Var(check=is_param), commutative=True,
                         role="ln_shift"), neg_mean_inv):
            trees.append(op(SUM, op("mul", Var("x"), inv, commutative=True), shift, commutative=True,
                            role="layer_norm"))
    return tuple(trees)


# decomposed: F.layer_norm below opset 17 (both torch exporters), and by hand
LAYER_NORM = (spell(_layer_norm_trees(), "torchscript", "dynamo", "hand-written")
              + spell(_moments_layer_norm_trees(), *TENSORFLOW)
              + spell(_tf2onnx_moments_trees(), "tf2onnx"))


def _rms_norm_trees() -> tuple[Op, ...]:
    x = Var("x")
    squares = (op("pow", x, Var(check=scalar(2.0))), op("mul", x, x), op("square", x))
    trees: list[Op] = []
    for sq in squares:
        ms_eps = op(ADD, op("reduce_mean", sq, more=True, role="mean_square"), Var(check=scalar()),
                    commutative=True)
        root = op("sqrt", ms_eps)
        normed = (op("mul", x, op("div", Var(check=scalar(1.0)), root), commutative=True, role="normalize"),
                  op("mul", x, op("reciprocal", root), commutative=True, role="normalize"),
                  op("mul", x, op("rsqrt", ms_eps), commutative=True, role="normalize"),
                  op("div", x, root, role="normalize"))
        trees += [op("mul", n, Var(check=is_param), commutative=True, role="rms_norm") for n in normed]
        trees += list(normed)
    return tuple(trees)


RMS_NORM = spell(_rms_norm_trees(), "hand-written", "torchscript", "dynamo", "onnxscript")


def _rms_norm_op_trees() -> tuple[Op, ...]:
    """F.rms_norm (dynamo): x * reciprocal(sqrt(mean(pow(x, 2)) + eps)) * w, or x * rsqrt(...) * w."""
    ms = op(SUM, op("reduce_mean", op("pow", Var("x"), Var(check=scalar(2.0))), more=True),
            Var(check=scalar()), commutative=True)
    trees = []
    for rstd in (op("reciprocal", op("sqrt", ms), name="rstd"), op("rsqrt", ms, name="rstd"),
                 op("div", Var(check=scalar(1.0)), op("sqrt", ms), name="rstd")):
        normed = op("mul", Var("x"), rstd, commutative=True, name="normed")
        trees += [op("mul", normed, Var(), commutative=True), normed]
    return tuple(trees)


# F.rms_norm as dynamo decomposes it, binding rstd and normed (what its autograd saves)
RMS_NORM_OP = spell(_rms_norm_op_trees(), "dynamo")
ALL_LAYER_NORM, ALL_RMS_NORM = select(LAYER_NORM), select(RMS_NORM)


def _group_norm_trees() -> tuple[Op, ...]:
    """F.group_norm as both torch exporters write it: x reshaped to (N, G, -1), InstanceNormalization (unit
    scale, zero bias) over each group, reshaped back to x's shape, then * w + b (w and b viewed (C, 1))."""
    groups = op("instance_norm", op("reshape", Var("x"), Var()), Var(check=is_param), Var(check=is_param),
                role="groups")
    normed = op("reshape", groups, Var(), role="normalize")
    return (op(ADD, op("mul", normed, Var(check=is_param), commutative=True), Var(check=is_param),
               commutative=True, role="group_norm"), normed)


# nn.GroupNorm (wav2vec2's and HuBERT's first feature-encoder conv)
GROUP_NORM = spell(_group_norm_trees(), "torchscript", "dynamo")


def _weight_norm_trees() -> tuple[Op, ...]:
    """torch._weight_norm(v, g, dim): g * v / ||v||, the norm over every axis but dim, kept (dynamo writes
    v * (g / n), TorchScript v / n * g); v and g parameters, so a normalised activation is not one."""
    v, g = Var("v", check=is_param), Var("g", check=is_param)
    norm = op("reduce_l2", v, more=True, role="norm")
    return (op("mul", Var("v"), op("div", g, norm), commutative=True, role="weight_norm"),
            op("mul", op("div", v, norm), g, commutative=True, role="weight_norm"))


# nn.utils.parametrizations.weight_norm (wav2vec2's and HuBERT's positional conv) when no exporter folded it
WEIGHT_NORM = spell(_weight_norm_trees(), "torchscript", "dynamo")


def embedding_sum(x: Tensor) -> tuple[list[Node], list[Node]] | None:
    """(Gathers, Adds) when ``x`` = the sum of two or three rows of 2-D embedding tables (BERT's word +
    position (+ segment) embeddings): Gather(table, ids) each, summed by Adds whose sums nothing else
    reads; else None."""
    gathers: list[Node] = []
    adds: list[Node] = []
    stack = [x]
    while stack:
        t = stack.pop()
        p = t.producer
        if p is None or (t is not x and (len(t.consumers) != 1 or p.outputs[0] is not t)):
            return None
        ins = [i for i in p.inputs if i is not None]
        if p.kind in ADD and p.kind != "sum" and len(ins) == 2 and len(adds) < 2:
            adds.append(p)
            stack += ins
        elif p.kind == "gather" and len(ins) == 2 and is_param(ins[0]) and ins[0].shape is not None \
                and len(ins[0].shape) == 2 and p.attrs.get("axis", 0) == 0:
            gathers.append(p)
        else:
            return None
    return (gathers, adds) if 2 <= len(gathers) <= 3 else None

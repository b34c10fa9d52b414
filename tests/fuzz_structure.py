"""Structure-aware fuzzer: seeded mutations of ModelProto fields through analyze, the render views, plan,
diff and rewrite, each case in a forked child with a memory cap (2 GiB) and a time limit (20 s).

A case is ``(seed)``: the seed picks a base model and 1-4 mutations (op types, input and output counts,
attributes, dims, dtypes, names, opset and IR versions, initializer data). The transformer bases (hand-built
attention, RMSNorm, SwiGLU and rotary blocks in the exporters' spellings) mostly get structural edits that
keep the graph well formed: two nodes or inputs swapped, a node dropped or duplicated, a constant's value,
dtype or rank changed. The child runs
``pipeline.analyze``, ``render.build_dot`` for the before / after / backward views (DOT source, no
Graphviz layout), ``plan`` at half the unplanned peak, ``diff`` of the model against itself and ``rewrite``
with verification; it reports ``ok``, ``error`` (a FuseError: one line)
or ``internal`` (anything else, with the traceback). A child killed by its time limit is a ``hang``, one
that hits its memory cap (MemoryError or killed) a ``memory`` finding.

    python -m tests.fuzz_structure --seconds 1200 [--seed 0]   # a long local run; prints a summary

``--order`` checks properties of node order instead (``order_case``): a case is a base model as it is,
with one edit, with every tensor unsized, with nodes no output needs, or a model whose backward keeps
nothing; the child analyzes it listed in topological order and shuffled, and the two ``analyze --json``
documents must be identical (a FuseError must be the same on both), and rewrite's output of the shuffled
copy must load in onnxruntime wherever the shuffled input loads. A broken property is a ``property``
finding.

    python -m tests.fuzz_structure --order --seconds 1200 [--seed 0]

tests/test_fuzz_structure.py runs both for a bounded time in CI (FUSECLI_FUZZ_SECONDS, default 70, and
FUSECLI_FUZZ_ORDER_SECONDS, default 30).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import random
import resource
import signal
import sys
import tempfile
import time
import traceback

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.shuffle import document, first_difference, shuffled

TIME_LIMIT = 20  # seconds per case (issue 54: a case past it is a finding)
ORDER_TIME_LIMIT = 30  # seconds per --order case: two analyses, a rewrite and onnxruntime sessions
MEMORY_CAP = 2 << 30  # bytes of address space a case may add to what the runner holds at the fork (2 GiB)

OPS = ["Relu", "Conv", "Add", "Mul", "Sub", "Div", "MatMul", "Gemm", "BatchNormalization", "Clip", "Sigmoid",
       "Tanh", "LeakyRelu", "Gelu", "Softmax", "LayerNormalization", "Reshape", "Transpose", "Concat",
       "Split", "Squeeze", "Unsqueeze", "Dropout", "Identity", "Constant", "ConstantOfShape", "Shape",
       "Gather", "Slice", "Erf", "Sqrt", "Pow", "ReduceMean", "MaxPool", "AveragePool", "GlobalAveragePool",
       "Flatten", "Cast", "Where", "Expand", "Tile", "Pad", "Resize", "Einsum", "If", "Loop", "Scan", "Sum",
       "Max", "HardSigmoid", "HardSwish", "Selu", "Elu", "PRelu", "InstanceNormalization", "Attention",
       "FusedConv", "SkipLayerNormalization", "NoSuchOp", ""]
DOMAINS = ["", "ai.onnx", "com.microsoft", "custom", "ai.onnx.ml"]
ODD_INTS = [0, 1, -1, 2, 3, 7, 2**31 - 1, -2**31, 2**62, -2**63]
ODD_FLOATS = [0.0, -0.0, 1.0, -1.0, 6.0, 1e-12, 1e30, float("inf"), float("nan")]


# --- base models: small, valid, covering the patterns fusecli knows --------------------------------
def _p(rng, name, *shape):
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.5, name)


def _model(nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(nodes, "fuzz", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset),
                                               helper.make_opsetid("com.microsoft", 1)], ir_version=8)


def _vi(name, *shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, list(shape) if shape else None)


def base_models() -> list[onnx.ModelProto]:
    rng = np.random.default_rng(0)
    n = helper.make_node
    conv = _model([n("Conv", ["x", "w", "b"], ["c"], "conv", pads=[1, 1, 1, 1]),
                   n("BatchNormalization", ["c", "s", "sh", "m", "v"], ["bn"], "bn", epsilon=1e-3),
                   n("Add", ["bn", "x"], ["a"], "add"), n("Relu", ["a"], ["y"], "relu")],
                  [_vi("x", "N", 4, 6, 6)], [_vi("y")],
                  [_p(rng, "w", 4, 4, 3, 3), _p(rng, "b", 4), _p(rng, "s", 4), _p(rng, "sh", 4),
                   _p(rng, "m", 4), numpy_helper.from_array(np.ones(4, np.float32), "v")])
    mlp = _model([n("MatMul", ["x", "w1"], ["m"], "mm"), n("Add", ["m", "b1"], ["a"], "bias"),
                  n("Gelu" if rng.random() < 2 else "Relu", ["a"], ["g"], "gelu", domain="com.microsoft"),
                  n("MatMul", ["g", "w2"], ["m2"], "mm2"), n("Add", ["m2", "x"], ["r"], "res"),
                  n("LayerNormalization", ["r", "gamma", "beta"], ["y"], "ln", axis=-1, epsilon=1e-5)],
                 [_vi("x", "N", "S", 8)], [_vi("y")],
                 [_p(rng, "w1", 8, 16), _p(rng, "b1", 16), _p(rng, "w2", 16, 8), _p(rng, "gamma", 8),
                  _p(rng, "beta", 8)])
    shape = numpy_helper.from_array(np.array([0, -1], np.int64), "shape")
    lo, hi = (numpy_helper.from_array(np.array(v, np.float32), k) for k, v in (("lo", 0.0), ("hi", 6.0)))
    misc = _model([n("Gemm", ["x", "w", "b"], ["g"], "gemm", transB=1),
                   n("Clip", ["g", "lo", "hi"], ["c"], "clip"),
                   n("Reshape", ["c", "shape"], ["r"], "reshape"),
                   n("Softmax", ["r"], ["s"], "softmax", axis=-1),
                   n("Dropout", ["s"], ["d", "mask"], "drop"), n("Sigmoid", ["d"], ["y"], "sig")],
                  [_vi("x", "N", 8)], [_vi("y"), _vi("mask", dtype=TensorProto.BOOL)],
                  [_p(rng, "w", 6, 8), _p(rng, "b", 6), lo, hi, shape])
    then = helper.make_graph([n("Relu", ["x"], ["t"], "then_relu")], "then", [], [_vi("t")])
    other = helper.make_graph([n("Neg", ["x"], ["e"], "else_neg")], "else", [], [_vi("e")])
    cst = n("Constant", [], ["c"], "const", value=_p(rng, "cv", 1, 4, 1, 1))
    branchy = _model([cst, n("Conv", ["x", "w"], ["cv_out"], "conv", pads=[1, 1, 1, 1]),
                      n("Add", ["cv_out", "c"], ["a"], "bias"), n("Relu", ["a"], ["y"], "relu"),
                      n("ReduceMean", ["y"], ["red"], "mean", keepdims=0),
                      n("Greater", ["red", "zero"], ["cond"], "gt"),
                      n("If", ["cond"], ["z"], "if", then_branch=then, else_branch=other)],
                     [_vi("x", 1, 4, 6, 6)], [_vi("y"), _vi("z")],
                     [_p(rng, "w", 4, 4, 3, 3), numpy_helper.from_array(np.array(0, np.float32), "zero")])
    sparse = _model([n("Add", ["x", "sb"], ["a"], "add"), n("Tanh", ["a"], ["y"], "tanh")],
                    [_vi("x", 2, 4)], [_vi("y")], [])
    sparse.graph.sparse_initializer.append(helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "sb"),
        numpy_helper.from_array(np.array([1, 3], np.int64), "sb_idx"), [4]))
    bases = [conv, mlp, misc, branchy, sparse]  # the first five: the seeds of past findings pick from these
    acts = _model([n("Conv", ["x", "w"], ["c"], "conv", pads=[1, 1, 1, 1]),
                   n("BatchNormalization", ["c", "s", "sh", "m", "v"], ["bn"], "bn", epsilon=1e-3),
                   n("LeakyRelu", ["bn"], ["l"], "leaky", alpha=0.1),
                   n("Conv", ["l", "w"], ["c2"], "conv2", pads=[1, 1, 1, 1]),
                   n("HardSigmoid", ["c2"], ["h"], "hsig", alpha=0.2, beta=0.5),
                   n("Conv", ["h", "w"], ["c3"], "conv3", pads=[1, 1, 1, 1]),
                   n("Clip", ["c3", "lo", "hi"], ["y"], "clip")],
                  [_vi("x", 1, 4, 5, 5)], [_vi("y")],
                  [_p(rng, "w", 4, 4, 3, 3), _p(rng, "s", 4), _p(rng, "sh", 4), _p(rng, "m", 4),
                   numpy_helper.from_array(np.ones(4, np.float32), "v"), lo, hi])
    gelu = _model([n("MatMul", ["x", "w1"], ["m"], "mm"), n("Add", ["m", "b1"], ["a"], "bias"),
                   n("Gelu", ["a"], ["g"], "gelu", approximate="tanh"),
                   n("ReduceMean", ["g", "ax"], ["mean"], "mean", keepdims=1),
                   n("Sub", ["g", "mean"], ["d"], "sub"), n("Squeeze", ["d", "ax0"], ["y"], "squeeze")],
                  [_vi("x", 1, 3, 8)], [_vi("y")],
                  [_p(rng, "w1", 8, 8), _p(rng, "b1", 8),
                   numpy_helper.from_array(np.array([-1], np.int64), "ax"),
                   numpy_helper.from_array(np.array([0], np.int64), "ax0")], opset=20)
    return [*bases, acts, gelu, *transformer_bases()]


def transformer_bases() -> list[onnx.ModelProto]:
    """The exporters' transformer spellings (tests/transformer_graphs.py): rotary with computed tables and
    torchscript's Shape-derived bound, a Llama block as sdpa and as eager attention write it."""
    from tests import transformer_graphs as T

    return [T.rotary_model(), T.rotary_model(bound="shape", table="constant"), T.llama_block("sdpa"),
            T.llama_block("eager")]


# --- structural mutations of the transformer bases: each keeps the graph well formed more often ---------
def _consumers(g: onnx.GraphProto, name: str) -> list[tuple[onnx.NodeProto, int]]:
    return [(nd, i) for nd in g.node for i, x in enumerate(nd.input) if x == name]


def mutate_structure(m: onnx.ModelProto, r: random.Random) -> str:
    """One edit that keeps names defined: swap two nodes or two inputs, drop a node (its readers read its
    first input), duplicate one in place, change a constant's value, dtype or rank."""
    g = m.graph
    nodes = list(g.node)
    what = r.randrange(7)
    if what == 0 and len(nodes) > 1:
        i, j = r.sample(range(len(nodes)), 2)
        a, b = onnx.NodeProto(), onnx.NodeProto()
        a.CopyFrom(nodes[i])
        b.CopyFrom(nodes[j])
        g.node[i].CopyFrom(b)
        g.node[j].CopyFrom(a)
        return f"swap nodes {a.name} {b.name}"
    if what == 1:
        nd = r.choice([nd for nd in nodes if len(nd.input) > 1] or nodes)
        if len(nd.input) > 1:
            i, j = r.sample(range(len(nd.input)), 2)
            nd.input[i], nd.input[j] = nd.input[j], nd.input[i]
        return f"swap inputs of {nd.name}"
    if what == 2:
        nd = r.choice([nd for nd in nodes if nd.input and nd.input[0]] or nodes)
        if nd.input and nd.output:
            for c, i in _consumers(g, nd.output[0]):
                c.input[i] = nd.input[0]
            for o in g.output:
                if o.name == nd.output[0]:
                    o.name = nd.input[0]
            g.node.remove(nd)
        return f"drop {nd.name}"
    if what == 3 and nodes:
        k = r.randrange(len(nodes))
        nd = nodes[k]
        if nd.output and nd.input:
            twin = onnx.NodeProto()
            twin.CopyFrom(nd)
            twin.name, twin.output[0] = f"{nd.name}_twin", f"{nd.output[0]}_twin"
            for c, i in _consumers(g, nd.output[0]):
                c.input[i] = twin.output[0]
            twin.input[0] = nd.output[0]
            g.node.insert(k + 1, twin)
            for o in g.output:
                if o.name == nd.output[0]:
                    o.name = twin.output[0]
        return f"duplicate {nd.name}"
    inits = list(g.initializer)
    if not inits:
        return "none"
    t = r.choice(inits)
    try:
        v = numpy_helper.to_array(t)
    except ValueError:  # an earlier edit left its data and dims disagreeing: that is the case already
        return f"unreadable {t.name}"
    if what == 4:  # a value: scaled, negated, zero, non-finite, an int bound moved
        if v.dtype.kind == "f":
            with np.errstate(all="ignore"):
                v = v * np.asarray(r.choice([0.0, -1.0, 2.0, 1e-9, float("nan"), float("inf")]), v.dtype)
        else:
            v = v.astype(np.int64) + r.choice([-2, -1, 1, 2, 2**62])
    elif what == 5:  # a dtype, with data of that dtype
        with np.errstate(all="ignore"):
            v = v.astype(r.choice([np.float16, np.float64, np.int64, np.int32, np.float32, np.bool_]))
    else:  # a rank: a leading 1 added, or the size-1 dims squeezed away
        v = v[None] if r.random() < 0.6 or v.ndim == 0 else np.squeeze(v)
    t.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(v), t.name))
    return f"{['value', 'dtype', 'rank'][min(what, 6) - 4]} of {t.name}"


# --- mutations ----------------------------------------------------------------------------------------
def _names(m: onnx.ModelProto) -> list[str]:
    g = m.graph
    names = [t.name for t in g.initializer] + [v.name for v in g.input]
    names += [o for nd in g.node for o in nd.output]
    return names or ["x"]


def _odd_attr(r: random.Random, name: str) -> onnx.AttributeProto:
    kind = r.randrange(7)
    if kind == 0:
        return helper.make_attribute(name, r.choice(ODD_INTS))
    if kind == 1:
        return helper.make_attribute(name, r.choice(ODD_FLOATS))
    if kind == 2:
        return helper.make_attribute(name, [r.choice(ODD_INTS) for _ in range(r.randrange(0, 9))] or [0])
    if kind == 3:
        return helper.make_attribute(name, r.choice(["", "NOTSET", "SAME_UPPER", "relu", "\x00", "x" * 300]))
    if kind == 4:
        return helper.make_attribute(name, [r.choice(ODD_FLOATS) for _ in range(r.randrange(1, 5))])
    if kind == 5:
        dims = [r.choice([0, 1, 2, 3]) for _ in range(r.randrange(0, 4))]
        return helper.make_attribute(name, numpy_helper.from_array(
            np.full(dims, r.choice(ODD_FLOATS), np.float32), name))
    sub = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "sub", [], [_vi("o")])
    return helper.make_attribute(name, sub)


ATTR_NAMES = ["axis", "alpha", "beta", "epsilon", "pads", "strides", "kernel_shape", "dilations", "group",
              "transA", "transB", "perm", "axes", "keepdims", "to", "value", "mode", "auto_pad", "activation",
              "activation_params", "min", "max", "seed", "ratio", "then_branch", "body", "split",
              "approximate"]


def _dim(r: random.Random, d: onnx.TensorShapeProto.Dimension) -> None:
    choice = r.randrange(5)
    if choice == 0:
        d.dim_value = r.choice(ODD_INTS[:5] + [2**40, 2**62])
    elif choice == 1:
        d.dim_param = r.choice(["N", "S", "", "unk__0", "batch", "x" * 200])
    elif choice == 2:
        d.Clear()
    else:
        d.dim_value = r.choice([0, 1, 2, 3, 4, 5, 6, 8, 16])


def mutate(m: onnx.ModelProto, r: random.Random) -> str:
    """One random edit of ``m`` in place; a short description of it."""
    g = m.graph
    nodes = list(g.node)
    what = r.randrange(14)
    if what == 0 and nodes:
        nd = r.choice(nodes)
        nd.op_type = r.choice(OPS)
        if r.random() < 0.3:
            nd.domain = r.choice(DOMAINS)
        return f"op {nd.name}->{nd.domain}.{nd.op_type}"
    if what == 1 and nodes:
        nd = r.choice(nodes)
        k = r.randrange(3)
        if k == 0 and nd.input:
            del nd.input[r.randrange(len(nd.input))]
        elif k == 1:
            nd.input.append(r.choice([*_names(m), "", "nowhere"]))
        else:
            nd.input.insert(0, r.choice(_names(m)))
        return f"inputs of {nd.name}"
    if what == 2 and nodes:
        nd = r.choice(nodes)
        if nd.output and r.random() < 0.5:
            del nd.output[r.randrange(len(nd.output))]
        else:
            nd.output.append(r.choice(["", f"extra{r.randrange(9)}", *_names(m)]))
        return f"outputs of {nd.name}"
    if what == 3 and nodes:
        nd = r.choice(nodes)
        if nd.attribute and r.random() < 0.4:
            del nd.attribute[r.randrange(len(nd.attribute))]
        else:
            name = r.choice(ATTR_NAMES + [a.name for a in nd.attribute])
            keep = [a for a in nd.attribute if a.name != name]
            del nd.attribute[:]
            nd.attribute.extend([*keep, _odd_attr(r, name)])
        return f"attribute of {nd.name}"
    if what == 4:
        vis = [*g.input, *g.output, *g.value_info]
        if vis:
            v = r.choice(vis)
            shape = v.type.tensor_type.shape
            if shape.dim and r.random() < 0.8:
                _dim(r, r.choice(shape.dim))
            elif r.random() < 0.5:
                shape.dim.add().dim_value = r.choice([1, 2, 2**40])
            else:
                v.type.tensor_type.ClearField("shape")
            return f"dims of {v.name}"
    if what == 5:
        vis = [*g.input, *g.output]
        if vis:
            v = r.choice(vis)
            v.type.tensor_type.elem_type = r.randrange(0, 26)
            return f"dtype of {v.name}"
    if what == 6 and g.initializer:
        t = r.choice(g.initializer)
        k = r.randrange(4)
        if k == 0:
            t.data_type = r.randrange(0, 26)
        elif k == 1 and t.dims:
            t.dims[r.randrange(len(t.dims))] = r.choice([0, 1, 3, 2**40, -1])
        elif k == 2:
            t.dims.append(r.choice([1, 2, 0]))
        else:
            t.raw_data = t.raw_data[: r.randrange(len(t.raw_data) + 1)]
        return f"initializer {t.name}"
    if what == 7:
        pool = [*nodes, *g.initializer, *g.input, *g.output]
        if pool:
            x = r.choice(pool)
            new = r.choice(["", "y", "x", "a/b:0", "n" * r.choice([1, 500, 5000]), "é\x01"])
            if isinstance(x, onnx.NodeProto):
                if x.output and r.random() < 0.6:
                    x.output[r.randrange(len(x.output))] = new
                else:
                    x.name = new
            else:
                x.name = new
            return "rename"
    if what == 8:
        op = next((o for o in m.opset_import if o.domain in ("", "ai.onnx")), None)
        if op is not None:
            op.version = r.choice([1, 6, 7, 9, 10, 11, 12, 13, 14, 18, 21, 23, 30, 0, 10**6])
        return "opset"
    if what == 9:
        m.ir_version = r.choice([0, 1, 3, 4, 7, 8, 10, 11, 12, 100])
        return "ir version"
    if what == 10 and len(nodes) > 1:
        r.shuffle(nodes)
        del g.node[:]
        g.node.extend(nodes)
        return "node order"
    if what == 11 and nodes:  # a cycle or a self-loop
        nd = r.choice(nodes)
        if nd.output:
            nd.input.append(nd.output[0])
        return f"cycle at {nd.name}"
    if what == 12 and nodes:  # a node duplicated (outputs defined twice) or removed
        nd = r.choice(nodes)
        if r.random() < 0.5:
            g.node.append(nd)
        else:
            g.node.remove(nd)
        return "node count"
    if what == 13:
        init = r.choice(list(g.initializer)) if g.initializer else None
        if init is not None and r.random() < 0.5:
            g.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        elif g.output:
            del g.output[r.randrange(len(g.output))]
        return "graph inputs/outputs"
    return "none"


def make_case(seed: int, bases: list[onnx.ModelProto]) -> tuple[onnx.ModelProto, list[str]]:
    """The seed's base model and edits; transformer bases mostly get the structural ones."""
    r = random.Random(seed)
    m = onnx.ModelProto()
    m.CopyFrom(r.choice(bases))
    structural = m.graph.name == "block"
    edits = [mutate_structure(m, r) if structural and r.random() < 0.75 else mutate(m, r)
             for _ in range(r.randint(1, 2 if structural else 4))]
    return m, edits


# --- node order: a case listed in order and shuffled ------------------------------------------------
ORDER_KINDS = ("as built", "one edit", "unsized", "dead nodes", "nothing saved")


def nothing_saved_model(r: random.Random) -> onnx.ModelProto:
    """A random DAG of ops whose backward reads no tensor (Add, Sub, Neg, Identity and bias Adds of
    parameters), several outputs: its backward keeps nothing."""
    n = helper.make_node
    names, nodes, inits = ["x"], [], []
    for i in range(r.randint(1, 10)):
        op = r.choice(["Add", "Sub", "Neg", "Identity", "bias"])
        a = r.choice(names)
        if op == "bias":
            inits.append(numpy_helper.from_array(np.full(4, 0.5, np.float32), f"b{i}"))
            nodes.append(n("Add", [a, f"b{i}"], [f"t{i}"], "" if r.random() < 0.3 else f"n{i}"))
        elif op in ("Add", "Sub"):
            nodes.append(n(op, [a, r.choice(names)], [f"t{i}"], "" if r.random() < 0.3 else f"n{i}"))
        else:
            nodes.append(n(op, [a], [f"t{i}"], "" if r.random() < 0.3 else f"n{i}"))
        names.append(f"t{i}")
    read = {x for nd in nodes for x in nd.input}
    outs = [t for t in names[1:] if t not in read or r.random() < 0.2] or [names[-1]]
    return _model(nodes, [_vi("x", "N", 4)], [_vi(t) for t in outs], inits)


def order_case(seed: int, bases: list[onnx.ModelProto]) -> tuple[onnx.ModelProto, list[str]]:
    """The seed's model for the node-order properties, listed in topological order where it has one."""
    from fusecli.core.errors import FuseError
    from fusecli.load.onnx_order import sort_graph

    r = random.Random(seed)
    kind = r.choice(ORDER_KINDS)
    if kind == "nothing saved":
        m, edits = nothing_saved_model(r), [kind]
    else:
        m = onnx.ModelProto()
        m.CopyFrom(r.choice(bases))
        edits = [kind]
    if kind == "one edit":
        edits.append(mutate_structure(m, r) if m.graph.name == "block" else mutate(m, r))
    elif kind == "unsized":  # no graph input, output or value has a shape: every activation is unsized
        for v in (*m.graph.input, *m.graph.output, *m.graph.value_info):
            if v.type.HasField("tensor_type"):
                v.type.tensor_type.ClearField("shape")
    elif kind == "dead nodes":  # nodes no graph output needs, reading what the graph makes
        made = _names(m)
        for i in range(r.randint(1, 3)):
            op = r.choice(["Relu", "Neg", "Identity", "Add"])
            ins = [r.choice(made) for _ in range(2 if op == "Add" else 1)]
            m.graph.node.append(helper.make_node(op, ins, [f"dead{i}"], r.choice(["", f"dead{i}"])))
            made.append(f"dead{i}")
    try:
        sort_graph(m.graph)
    except FuseError:
        pass  # a cycle or an undefined input: listed as it is (both listings must be refused alike)
    return m, edits


def order_child(path: str, out_path: str, shuffled_path: str, nothing_saved: bool = False) -> dict:
    """The properties: the shuffled copy's analysis is the listed one's (or both are refused alike), and
    keeps nothing where ``nothing_saved``; rewrite's output of the shuffled copy loads where that copy
    loads."""
    from fusecli.core.errors import FuseError
    from fusecli.pipeline import Options, analyze
    from fusecli.rewrite import RewriteOptions, rewrite

    docs = []
    for p in (path, shuffled_path):
        try:
            docs.append(document(analyze(p, Options(batch=2))))
        except FuseError as e:
            docs.append({"error": " ".join(str(e).replace(p, "<model>").split())})
    difference = first_difference(*docs)
    if difference is not None:
        return {"result": "property", "stage": "analyze", "message": f"shuffled differs: {difference}"}
    if "error" in docs[0]:
        return {"result": "error", "stage": "analyze", "message": docs[0]["error"][:300]}
    saved = len(docs[0]["saved"])
    if nothing_saved and (saved or docs[0]["memory"]["saved_bytes"]):
        return {"result": "property", "stage": "analyze", "message": f"{saved} tensors saved, none expected"}
    try:
        rewrite(shuffled_path, RewriteOptions(batch=2), output=out_path)
    except FuseError as e:
        return {"result": "error", "stage": "rewrite", "message": " ".join(str(e).split())[:300]}
    if os.path.exists(out_path) and _ort_loads(shuffled_path) is None:
        failure = _ort_loads(out_path)
        if failure is not None:
            return {"result": "property", "stage": "rewrite", "message": f"output does not load: {failure}"}
    return {"result": "ok", "saved": saved}


def _ort_loads(path: str) -> str | None:
    """Why onnxruntime does not load the model, or None when it does."""
    import onnxruntime as ort

    try:
        ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    except Exception as e:
        return " ".join(str(e).split())[:200]
    return None


# --- one case in a forked child ---------------------------------------------------------------------
def _vm_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30


def _child(path: str, out_path: str) -> dict:
    from fusecli.core.errors import FuseError
    from fusecli.diff.compare import DiffOptions, analyze_pair, compare
    from fusecli.pipeline import Options, analyze
    from fusecli.plan.planner import PlanOptions, make_plan
    from fusecli.render.views import build_dot
    from fusecli.rewrite import RewriteOptions, rewrite

    stage = "analyze"
    try:
        a = analyze(path, Options(batch=2))
        for view in ("before", "after", "backward"):
            stage = f"render {view}"
            build_dot(a, view)
        stage = "plan"  # a budget of half the unplanned peak: a plan to search, at the case's own dims
        try:
            make_plan(a, PlanOptions(max(1, a.liveness.peak_bytes // 2)))
        except FuseError as e:  # a budget below the floor is refused in one line: diff and rewrite go on
            if "\n" in str(e).strip():
                raise  # a refusal of more lines: the finding the handler below reports
        stage = "diff"  # the model against itself: every pairing and memory comparison runs
        old, new, notes, rename = analyze_pair(path, path, 2, {})
        compare(old, new, DiffOptions(notes=notes, dim_rename=rename))
        stage = "rewrite"
        rewrite(path, RewriteOptions(), output=out_path)
        return {"result": "ok"}
    except FuseError as e:
        text = " ".join(str(e).split())
        return {"result": "error", "stage": stage, "message": text[:300],
                "lines": str(e).strip().count("\n") + 1}
    except MemoryError:
        return {"result": "memory", "stage": stage}
    except RecursionError:
        return {"result": "internal", "stage": stage, "message": "RecursionError"}
    except Exception as e:
        tb = traceback.format_exc().strip().splitlines()
        return {"result": "internal", "stage": stage, "message": f"{type(e).__name__}: {str(e)[:200]}",
                "where": [ln.strip() for ln in tb if ln.strip().startswith("File")][-3:]}


def run_case(path: str, out_path: str, time_limit: float = TIME_LIMIT, memory_cap: int = MEMORY_CAP,
             work=None) -> dict:
    """Run one model file through analyze, render and rewrite (``work(path, out_path)``, default
    ``_child``) in a forked child, under the limits."""
    read, write = os.pipe()
    cap = _vm_bytes() + memory_cap
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: limits, run, report through the pipe, exit without cleanup
        os.close(read)
        code = 0
        try:
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
            signal.alarm(int(time_limit) + 1)
            with open(os.devnull, "w") as null:  # onnxruntime and onnx may print from C++
                os.dup2(null.fileno(), 1)
                os.dup2(null.fileno(), 2)
            try:
                result = (work or _child)(path, out_path)
            except MemoryError:
                result = {"result": "memory"}
            result["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
            os.write(write, json.dumps(result).encode())
        except BaseException:
            code = 3
        finally:
            os._exit(code)
    os.close(write)
    deadline = t0 + time_limit + 5
    status = None
    while time.perf_counter() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    seconds = time.perf_counter() - t0
    if data:
        result = json.loads(data)
    elif os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGALRM, signal.SIGKILL):
        result = {"result": "hang" if seconds >= time_limit else "memory",
                  "message": f"killed by signal {os.WTERMSIG(status)}"}
    else:
        result = {"result": "crash", "message": f"exit status {status}"}
    result["seconds"] = round(seconds, 3)
    return result


def preload() -> None:
    """Import what every case needs once, before the forks (each child starts warm)."""
    import onnx.reference  # noqa: F401
    import onnxruntime  # noqa: F401
    from onnxruntime.tools import symbolic_shape_infer  # noqa: F401

    import fusecli.diff.compare  # noqa: F401
    import fusecli.pipeline  # noqa: F401
    import fusecli.plan.planner  # noqa: F401
    import fusecli.render.views  # noqa: F401
    import fusecli.rewrite  # noqa: F401


def fuzz(seconds: float, seed: int = 0, max_cases: int | None = None, log=None,
         seeds: list[int] | None = None, n_bases: int | None = None, order: bool = False) -> dict:
    """Cases ``seed, seed+1, ...`` (or exactly ``seeds``) until ``seconds`` pass, drawn from the first
    ``n_bases`` base models (default all); a summary with every finding. ``order``: the node-order
    properties' cases (``order_case``), the model shuffled by the case's seed."""
    preload()
    bases = base_models()[:n_bases]
    counts: dict[str, int] = {}
    stages: dict[str, int] = {}
    findings, slowest, peak = [], 0.0, 0
    start = time.perf_counter()
    todo = iter(seeds) if seeds is not None else itertools.count(seed)
    if max_cases is not None:
        todo = itertools.islice(todo, max_cases)
    done = 0
    kinds: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="fusecli-fuzz-") as work:
        path, out = os.path.join(work, "model.onnx"), os.path.join(work, "out.onnx")
        copy = os.path.join(work, "shuffled.onnx")
        for case in todo:
            if time.perf_counter() - start >= seconds:
                break
            done += 1
            m, edits = (order_case if order else make_case)(case, bases)
            with open(path, "wb") as f:
                f.write(m.SerializeToString())
            if os.path.exists(out):
                os.unlink(out)
            if order:
                kinds[edits[0]] = kinds.get(edits[0], 0) + 1
                with open(copy, "wb") as f:
                    f.write(shuffled(m, case).SerializeToString())
                work = functools.partial(order_child, shuffled_path=copy,
                                         nothing_saved=edits[0] == "nothing saved")
                result = run_case(path, out, ORDER_TIME_LIMIT, work=work)
                if result.get("saved") == 0:  # every model whose analysis kept no tensor
                    kinds["nothing saved (measured)"] = kinds.get("nothing saved (measured)", 0) + 1
            else:
                result = run_case(path, out)
            counts[result["result"]] = counts.get(result["result"], 0) + 1
            if result["result"] == "error":  # where each refusal came: how far the cases get
                stages[result.get("stage", "?")] = stages.get(result.get("stage", "?"), 0) + 1
            slowest = max(slowest, result["seconds"])
            peak = max(peak, result.get("peak_mib", 0))
            bad = result["result"] not in ("ok", "error") or (result["result"] == "error"
                                                               and result.get("lines", 1) != 1)
            if bad:
                findings.append({"seed": case, "bases": len(bases), "edits": edits, **result})
                if log:
                    print(json.dumps(findings[-1]), file=log, flush=True)
    summary = {"cases": done, "seconds": round(time.perf_counter() - start, 1), "counts": counts,
               "errors_by_stage": stages, "slowest_case_s": slowest, "peak_mib": peak, "findings": findings}
    return {**summary, "kinds": kinds} if order else summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=None)
    parser.add_argument("--seeds", default=None, help="comma-separated seeds to replay (one case each)")
    parser.add_argument("--bases", type=int, default=None, help="draw from the first N base models only "
                        "(a finding's 'bases': replays it as it was found)")
    parser.add_argument("--order", action="store_true", help="the node-order properties' cases instead")
    args = parser.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else None
    summary = fuzz(args.seconds, args.seed, args.cases, log=sys.stderr, seeds=seeds, n_bases=args.bases,
                   order=args.order)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

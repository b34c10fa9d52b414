"""Hostile and unusual input files, built from code: each is (command, path) for the CLI to refuse with one
``error:`` line or to handle correctly, within a time and memory budget (tests/test_hostile.py).

ONNX cases are ModelProtos from onnx.helper; SavedModel cases are hand-made saved_model.pb files written with
fusecli's own schema (load/tf_proto.py), so no TensorFlow is needed to make them.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def model(nodes, inputs, outputs, inits=(), opset=OPSET, **kw) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "hostile", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), *kw.pop("extra", [])],
                             ir_version=8, **kw)


def vi(name, *shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def external(name: str, location: str, dims=(4,), dtype=TensorProto.FLOAT) -> TensorProto:
    t = TensorProto(name=name, data_type=dtype, dims=list(dims), data_location=TensorProto.EXTERNAL)
    t.external_data.add(key="location", value=location)
    return t


def save(m: onnx.ModelProto, folder: str, name: str = "model.onnx") -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    return path


def _relu_model(extra_nodes=(), inits=(), **kw) -> onnx.ModelProto:
    return model([*extra_nodes, helper.make_node("Relu", ["x"], ["y"], "relu")], [vi("x", 1, 4)],
                 [vi("y", 1, 4)], inits, **kw)


# --- external data wherever a tensor can live (outside the folder: refused) ----------------------------
def constant_attr_outside(folder: str, location: str = "/etc/hostname") -> str:
    c = helper.make_node("Constant", [], ["c"], "const")
    c.attribute.append(helper.make_attribute("value", external("c", location)))
    add = helper.make_node("Add", ["x", "c"], ["y"], "add")
    return save(model([c, add], [vi("x", 4)], [vi("y", 4)]), folder)


def constant_attr_symlink(folder: str) -> str:
    os.makedirs(folder, exist_ok=True)
    link = os.path.join(folder, "weights.bin")
    if not os.path.lexists(link):
        os.symlink("/etc/hostname", link)
    return constant_attr_outside(folder, "weights.bin")


def if_branch_outside(folder: str) -> str:
    branch_init = external("w", "/etc/hostname")
    then = helper.make_graph([helper.make_node("Add", ["x", "w"], ["t"], "then_add")], "then", [],
                             [vi("t", 4)], [branch_init])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"], "else_id")], "else", [],
                              [vi("e", 4)])
    node = helper.make_node("If", ["cond"], ["y"], "if", then_branch=then, else_branch=other)
    return save(model([node], [vi("x", 4), vi("cond", dtype=TensorProto.BOOL)], [vi("y", 4)]), folder)


def function_constant_outside(folder: str) -> str:
    c = helper.make_node("Constant", [], ["c"], "fconst")
    c.attribute.append(helper.make_attribute("value", external("c", "../../outside.bin")))
    body = [c, helper.make_node("Add", ["a", "c"], ["b"], "fadd")]
    fn = helper.make_function("local", "AddC", ["a"], ["b"], body, [helper.make_opsetid("", OPSET)])
    call = helper.make_node("AddC", ["x"], ["y"], "call", domain="local")
    m = model([call], [vi("x", 4)], [vi("y", 4)], extra=[helper.make_opsetid("local", 1)])
    m.functions.append(fn)
    return save(m, folder)


def sparse_initializer_outside(folder: str) -> str:
    values = external("s", "/etc/hostname", dims=(1,))
    indices = numpy_helper.from_array(np.array([0], np.int64), "s_idx")
    m = model([helper.make_node("Add", ["x", "s"], ["y"], "add")], [vi("x", 4)], [vi("y", 4)])
    m.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [4]))
    return save(m, folder)


def nul_in_location(folder: str) -> str:
    return save(_relu_model(inits=[external("w", "w\x00.bin")]), folder)


# --- internal errors of the past ---------------------------------------------------------------------
def clip_vector_bounds(folder: str) -> str:
    lo = numpy_helper.from_array(np.zeros(4, np.float32), "lo")
    hi = numpy_helper.from_array(np.full(4, 6, np.float32), "hi")
    node = helper.make_node("Clip", ["x", "lo", "hi"], ["y"], "clip")
    return save(model([node], [vi("x", 1, 4)], [vi("y", 1, 4)], [lo, hi]), folder)


def dropout_odd_inputs(folder: str) -> str:
    ratio = numpy_helper.from_array(np.array([0.5, 0.1], np.float32), "ratio")
    mode = numpy_helper.from_array(np.array([True, False]), "mode")
    node = helper.make_node("Dropout", ["x", "ratio", "mode"], ["y", "mask"], "drop")
    return save(model([node], [vi("x", 1, 4)], [vi("y", 1, 4)], [ratio, mode]), folder)


def dropout_no_input(folder: str) -> str:
    node = helper.make_node("Dropout", [""], ["y", "mask"], "drop")
    relu = helper.make_node("Relu", ["x"], ["z"], "relu")
    return save(model([relu, node], [vi("x", 1, 4)], [vi("y", 1, 4), vi("z", 1, 4)]), folder)


def sparse_initializer(folder: str) -> str:
    """A valid model whose bias is a sparse initializer (a correct result expected)."""
    values = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "b")
    indices = numpy_helper.from_array(np.array([1, 3], np.int64), "b_idx")
    m = model([helper.make_node("Add", ["x", "b"], ["y"], "add")], [vi("x", 1, 4)], [vi("y", 1, 4)])
    m.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [4]))
    return save(m, folder)


def undefined_elem_type(folder: str) -> str:
    """A graph input of element type UNDEFINED (0) feeding a MatMul: rewrite once never ended."""
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], "mm"), helper.make_node("Relu", ["m"], ["y"], "r")]
    return save(model(nodes, [vi("x", "N", 4, dtype=TensorProto.UNDEFINED)], [vi("y", "N", 4)], [w]), folder)


def short_initializer(folder: str) -> str:
    """A Conv weight whose raw data is shorter than its dims say (rewrite reads it to fold a BatchNorm)."""
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4, 4, 3, 3], raw_data=b"\0" * 12)
    stats = [numpy_helper.from_array(np.full(4, v, np.float32), k) for k, v in
             (("s", 1.0), ("sh", 0.0), ("m", 0.0), ("v", 1.0))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], "conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "sh", "m", "v"], ["bn"], "bn"),
             helper.make_node("Relu", ["bn"], ["y"], "relu")]
    return save(model(nodes, [vi("x", 1, 4, 6, 6)], [vi("y", 1, 4, 6, 6)], [w, *stats]), folder)


def huge_dims(folder: str, n: int | str = 2**62) -> str:
    """A graph input with a 2^62 dim (or a named dim ``n``): verification must not try to allocate its
    feed, and memory totals past int64 must stay exact."""
    w = numpy_helper.from_array(np.ones((4, 4, 1, 1), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], "conv"), helper.make_node("Relu", ["c"], ["y"], "r")]
    return save(model(nodes, [vi("x", n, 4, 1, 1)], [vi("y", n, 4, 1, 1)], [w]), folder)


def _conv_relu(x: str = "x") -> tuple[list, list]:
    """Conv + Relu (a FusedConv for rewrite, so that verification runs) on [N, 4, 1, 1]."""
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32).reshape(4, 4, 1, 1), "w")
    nodes = [helper.make_node("Conv", [x, "w"], ["c"], "conv"),
             helper.make_node("Relu", ["c"], ["r"], "relu")]
    return nodes, [w]


def ort_refuses(folder: str) -> str:
    """A model onnxruntime cannot load (an unknown op): its own log lines must not reach the terminal."""
    nodes, inits = _conv_relu()
    nodes.append(helper.make_node("NoSuchOp", ["r"], ["y"], "odd", domain="com.microsoft"))
    return save(model(nodes, [vi("x", 1, 4, 1, 1)], [vi("y", 1, 4, 1, 1)], inits,
                      extra=[helper.make_opsetid("com.microsoft", 1)]), folder)


def reshape_fails_at_run(folder: str) -> str:
    """A Reshape of [N, 4, 1, 1] to [3, 5]: onnxruntime fails while running it (and logs its own line)."""
    nodes, inits = _conv_relu()
    inits.append(numpy_helper.from_array(np.array([3, 5], np.int64), "shape"))
    nodes.append(helper.make_node("Reshape", ["r", "shape"], ["y"], "reshape"))
    return save(model(nodes, [vi("x", "N", 4, 1, 1)], [vi("y", 3, 5)], inits), folder)


def constant_attr_in_folder(folder: str) -> str:
    """Legitimate external data of a Constant attribute, beside the model (rewrite carries it along)."""
    os.makedirs(folder, exist_ok=True)
    data = np.arange(4, dtype=np.float32).reshape(1, 4, 1, 1)
    with open(os.path.join(folder, "c.bin"), "wb") as f:
        f.write(data.tobytes())
    ext = external("c", "c.bin", dims=(1, 4, 1, 1))
    ext.external_data.add(key="length", value=str(data.nbytes))
    c = helper.make_node("Constant", [], ["c"], "const")
    c.attribute.append(helper.make_attribute("value", ext))
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4, 3, 3)).astype(np.float32),
                                "w")
    nodes = [c, helper.make_node("Conv", ["x", "w"], ["conv"], "conv", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["conv", "c"], ["a"], "bias"),
             helper.make_node("Relu", ["a"], ["y"], "relu")]
    return save(model(nodes, [vi("x", 1, 4, 6, 6)], [vi("y", 1, 4, 6, 6)], [w]), folder)


def mul_of_huge_inputs(folder: str) -> str:
    """76 bytes: a Mul of two [250000000] inputs (data propagation once took 10 GB)."""
    node = helper.make_node("Mul", ["a", "b"], ["y"])
    return save(model([node], [vi("a", 250000000), vi("b", 250000000)], [vi("y", 250000000)]), folder)


def billion_initializer(folder: str) -> str:
    """A billion-element initializer with no data."""
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[10**9])
    node = helper.make_node("Add", ["x", "w"], ["y"])
    return save(model([node], [vi("x", 10**9)], [vi("y", 10**9)], [w]), folder)


# --- SavedModels, hand-made ------------------------------------------------------------------------
def _tf():
    from fusecli.load import tf_proto

    return tf_proto


def saved_model(folder: str, body, ret: str, opdefs=(), functions=()) -> str:
    """A SavedModel whose serving signature calls function ``f(x) -> y`` with ``body`` (NodeDef kwargs)."""
    tf = _tf()
    sm = tf.SavedModel()
    meta = sm.meta_graphs.add()
    meta.meta_info_def.tags.append("serve")
    for spec in opdefs:
        op = meta.meta_info_def.stripped_op_list.op.add(name=spec["name"])
        for arg in spec.get("outputs", [{"name": "y", "type_attr": "T"}]):
            op.output_arg.add(**arg)
    sig = meta.signature_def["serving_default"]
    sig.inputs["x"].name = "serving_default_x:0"
    sig.inputs["x"].dtype = 1
    sig.outputs["y"].name = "StatefulPartitionedCall:0"
    g = meta.graph_def
    ph = g.node.add(name="serving_default_x", op="Placeholder")
    ph.attr["dtype"].type = 1
    call = g.node.add(name="StatefulPartitionedCall", op="StatefulPartitionedCall",
                      input=["serving_default_x"])
    call.attr["f"].func.name = "f"
    call.attr["Tout"].list.type.append(1)
    for name, fbody, fret, inputs in [("f", body, ret, ["x"]), *functions]:
        fn = g.library.function.add()
        fn.signature.name = name
        for a in inputs:
            fn.signature.input_arg.add(name=a, type=1)
        fn.signature.output_arg.add(name="y", type=1)
        for nd in fbody:
            n = fn.node_def.add(name=nd["name"], op=nd["op"], input=nd.get("input", []))
            for k, v in nd.get("attr", {}).items():
                if isinstance(v, str):
                    n.attr[k].func.name = v
                elif k in ("T", "dtype"):
                    n.attr[k].type = v
                else:
                    n.attr[k].i = v
        fn.ret["y"] = fret
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "saved_model.pb"), "wb") as f:
        f.write(sm.SerializeToString())
    return folder


_UNPACK = {"name": "Unpack", "outputs": [{"name": "output", "type_attr": "T", "number_attr": "num"}]}
_SHAPEN = {"name": "ShapeN", "outputs": [{"name": "output", "type_attr": "out_type", "number_attr": "N"}]}
_RELU = {"name": "Relu"}


def unpack_claims(folder: str, num: int = 3_000_000) -> str:
    body = [{"name": "u", "op": "Unpack", "input": ["x"], "attr": {"num": num, "T": 1}},
            {"name": "r", "op": "Relu", "input": ["u:output:0"], "attr": {"T": 1}}]
    return saved_model(folder, body, "r:y:0", [_UNPACK, _RELU])


def shapen_claims(folder: str, n: int = 10**9, used: bool = False) -> str:
    """ShapeN claiming ``n`` outputs; ``used``: the function reads one of them."""
    body = [{"name": "s", "op": "ShapeN", "input": ["x"], "attr": {"N": n, "T": 1, "out_type": 3}},
            {"name": "r", "op": "Relu", "input": ["s:output:0" if used else "x"], "attr": {"T": 1}}]
    return saved_model(folder, body, "r:y:0", [_SHAPEN, _RELU])


def dangling_reference(folder: str, ref: str = "missing:0") -> str:
    """Node ``r`` reads ``ref`` (``r2`` is a Relu of the argument ``x``, with one output)."""
    body = [{"name": "r2", "op": "Relu", "input": ["x"], "attr": {"T": 1}},
            {"name": "r", "op": "Relu", "input": [ref, "r2:y:0"], "attr": {"T": 1}}]
    return saved_model(folder, body, "r:y:0", [_RELU])


def negative_count(folder: str) -> str:
    body = [{"name": "u", "op": "Unpack", "input": ["x"], "attr": {"num": -5, "T": 1}},
            {"name": "r", "op": "Relu", "input": ["u:output:0"], "attr": {"T": 1}}]
    return saved_model(folder, body, "r:y:0", [_UNPACK, _RELU])


def deep_nesting(folder: str, depth: int = 3000) -> str:
    """Function f calls g1, g1 calls g2, ... ``depth`` levels deep (recursion once overflowed)."""
    def call(i, callee):
        return {"name": f"c{i}", "op": "PartitionedCall", "input": ["x"], "attr": {"f": callee}}

    functions = [(f"g{i}", [call(i, f"g{i + 1}")], f"c{i}:output:0", ["x"])
                 for i in range(1, depth)]
    functions.append((f"g{depth}", [{"name": "r", "op": "Relu", "input": ["x"], "attr": {"T": 1}}],
                      "r:y:0", ["x"]))
    return saved_model(folder, [call(0, "g1")], "c0:output:0", [_RELU], functions)


def huge_saved_model_pb(folder: str, size: int = 6 * 1024**3) -> str:
    """A sparse saved_model.pb of ``size`` bytes (no disk used): must be refused before it is read."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "saved_model.pb"), "wb") as f:
        f.truncate(size)
    return folder


# --- shapes that cost more than they weigh: a rank, or a tensor read as a shape (issue 54) ------------
def rank_from_declared_dim(folder: str, dim: int = 4611686018427387904) -> str:
    """The fuzz's 381-byte file: an input declared [dim, 16], a ConstantOfShape reading an Erf of it as
    its shape (a rank-(16 dim) output)."""
    nodes = [helper.make_node("Erf", ["x"], ["e"], "erf"),
             helper.make_node("ConstantOfShape", ["e"], ["y"], "cos")]
    return save(model(nodes, [vi("x", dim, 16)], [vi("y")]), folder)


def declared_rank(folder: str, rank: int = 1000) -> str:
    """A graph input declaring ``rank`` dims."""
    return save(model([helper.make_node("Relu", ["x"], ["y"], "relu")], [vi("x", *[1] * rank)], [vi("y")]),
                folder)


def shape_input_claims(folder: str, op: str = "Reshape", length: int = 10**6) -> str:
    """``op`` reading a graph input declared ``[length]`` (int64) as its shape or repeats."""
    s = helper.make_tensor_value_info("s", TensorProto.INT64, [length])
    return save(model([helper.make_node(op, ["x", "s"], ["y"], "r")], [vi("x", 2, 3), s], [vi("y")]), folder)


def shape_constant_claims(folder: str, op: str = "Expand", length: int = 200) -> str:
    """``op`` whose shape is a Constant of ``length`` ones: a rank-``length`` output."""
    c = helper.make_node("Constant", [], ["s"], "shape",
                         value=numpy_helper.from_array(np.ones(length, np.int64), "s"))
    reads = ["s"] if op == "ConstantOfShape" else ["x", "s"]
    return save(model([c, helper.make_node(op, reads, ["y"], "r")], [vi("x", 1)], [vi("y")]), folder)


def long_names(folder: str, where: str = "node", length: int = 100_000) -> str:
    """A Relu whose node name, output name or input dim name (``where``) is ``length`` characters."""
    long = "n" * length
    name, out, dim = (long, "y", "N") if where == "node" else ("r", long, "N") if where == "output" \
        else ("r", "y", long)
    return save(model([helper.make_node("Relu", ["x"], [out], name)], [vi("x", dim, 3)], [vi(out, dim, 3)]),
                folder)


def many_inputs(folder: str, count: int = 200) -> str:
    """A Sum of ``count`` inputs (one graph input read ``count`` times)."""
    return save(model([helper.make_node("Sum", ["x"] * count, ["y"], "sum")], [vi("x", 2, 3)], [vi("y")]),
                folder)


def complex_conv_bias(folder: str) -> str:
    """Conv + BatchNorm + ReLU whose Conv bias is complex64, which onnxruntime refuses (and a fold of the
    BatchNorm into it would discard the imaginary part, numpy warning on stderr)."""
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    b = numpy_helper.from_array(np.ones(4, np.complex64), "b")
    bn = [numpy_helper.from_array(np.full(4, i + 1.0, np.float32), n)
          for i, n in enumerate(["s", "bb", "m", "v"])]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], "conv"),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["d"], "bn"),
             helper.make_node("Relu", ["d"], ["y"], "relu")]
    return save(model(nodes, [vi("x", "N", 3, 8, 8)], [vi("y")], [w, b, *bn]), folder)

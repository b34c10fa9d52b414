"""fusecli's saved set of a SavedModel against TensorFlow's own, computed from the same SavedModel.

TensorFlow's side: ``tf.saved_model.load`` the model, call its signature function under a
``tf.GradientTape`` inside a ``tf.function`` and take the gradient of ``sum(outputs)`` w.r.t. the
trainable variables. Tracing that splits the signature function into ``__forward_*`` and
``__backward_*`` functions; the forward function's outputs past the signature's own are exactly the
tensors the backward reads. Each is followed through the forward FunctionDefs' ``ret`` maps (a
``StatefulPartitionedCall`` into a nested ``__forward_*`` function adds its node name and ``/``) to the
node that makes it. The forward functions are made from the loaded functions' graphs, which keep the
node names of the SavedModel's function bodies, so the path is fusecli's node name
(``StatefulPartitionedCall/functional_1/conv2d_1/BiasAdd``), though the functions themselves are renamed
(``__forward___call___412`` for ``__inference___call___284``).

fusecli's side: ``load_model`` -> ``build_backward(wrt_inputs=False)`` -> ``analyze_liveness`` with
``keeps_for_shape`` true for tensors with an unknown dim (as ``analyze_graph`` does for SavedModels).

Compared by tensor name (``node:index``, stricter than by producer node name), every kept tensor an op
makes: TensorFlow's function arguments (the graph input), ``ReadVariableOp`` and ``Const`` outputs, and
tensors computed from Const ops alone (Grappler folds them) are left out on both sides, as are fusecli's
graph outputs (TensorFlow returns them as the forward function's own outputs, never as extra ones).
Tensors computed from variables are compared too (Keras 3's BatchNorm ``rsqrt(var + eps) * gamma``, a
mixed policy's float16 copy of a variable): TensorFlow computes them at each step, and fusecli must count
them as saved activations, batch-independent, unless they are a variable's buffer under another name
(``tf_buffer``: a Reshape of a variable). ``assert_matches`` checks that split too.

fusecli models TensorFlow's habits (``grad.profiles.TENSORFLOW``) for SavedModels, each once a
difference this oracle found: ``AddV2``/``Sub`` gradients take ``shape(x)`` and ``shape(y)`` unless both
shapes are fully known and equal, which keeps both inputs alive under an unknown batch; an op with
several outputs gets ``zeros_like`` for the outputs without a gradient (``FusedBatchNormV3``'s batch
statistics), which keeps them; ``Reshape``'s gradient reshapes to a ``-1`` wildcard when one dim is
unknown, which keeps nothing. The differences are still named tensor by tensor below, so that a
regression says which habit it broke; the test asserts that none is left. Two more, found on Keras
applications (EfficientNet, ConvNeXt): a ``tf.custom_gradient`` (Keras swish) is differentiated by its
registered gradient function, which reads only what it captured (x, not swish's Sigmoid); and the
gradient of a called function covers all its float inputs and variables, trainable or not, so the
input normalization ahead of the first conv keeps ``x - mean`` for the (unused) gradient of its divisor.

Precision and recall by tensor name must be >= 0.99.
Where both keep a tensor, TensorFlow may read its value where fusecli reads only its shape: graph-mode
gradient functions also compute the gradient of a constant operand (``Mul(x, 0.5)`` reads ``x``).
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace

import pytest

from fusecli.grad.backward import build_backward
from fusecli.grad.profiles import TENSORFLOW, Profile
from fusecli.load import load_model
from fusecli.memory.liveness import analyze_liveness
from fusecli.pipeline import Options, analyze_graph

tf = pytest.importorskip("tensorflow")
from tests.load.test_savedmodel import KERAS3, SEEDS, saved_models  # noqa: E402

from .keras_apps import APPS, saved_app  # noqa: E402

_CALLS = ("StatefulPartitionedCall", "PartitionedCall")
_NOT_ACTIVATIONS = ("ReadVariableOp", "Const", "VarHandleOp")
_BROADCAST_ADDS = ("AddV2", "Add", "Sub")

@pytest.fixture(scope="module")
def models():
    return saved_models()


def _output_index(node, out_arg: str, k: int) -> int:
    """The flat output index of a FunctionDef reference ``node:out_arg:k``, from TensorFlow's OpDef."""
    from tensorflow.python.framework import op_def_registry

    index = 0
    for arg in op_def_registry.get(node.op).output_arg:
        if arg.name == out_arg:
            return index + k
        if arg.number_attr:
            index += node.attr[arg.number_attr].i
        elif arg.type_list_attr:
            index += len(node.attr[arg.type_list_attr].list.type)
        else:
            index += 1
    raise KeyError(out_arg)


def tf_saved(path: str, signature: str = "serving_default") -> dict[str, tuple[str, frozenset]]:
    """TensorFlow's saved tensors: fusecli's name (``node:index``) -> (producer op type or 'arg', the op
    types in the backward functions that read it)."""
    return _traced(path, signature)[0]


def tf_saved_bytes(path: str, feeds: dict, signature: str = "serving_default") -> dict[str, int]:
    """The bytes of each tensor TensorFlow keeps for backward (fusecli's name -> bytes) when the
    ``__forward_*`` function runs on ``feeds`` (input name -> array), pruned out of the traced training
    step: its extra outputs, and those of its own outputs that the tape's gradient ops read (the
    ``Shape`` of an output of unknown shape, for ``reduce_sum``'s gradient)."""
    _, forward = _traced(path, signature)
    values = forward(feeds)
    return {name: values[i].numpy().nbytes for name, i in forward.indices.items()}


@functools.cache
def _traced(path: str, signature: str):
    """(``tf_saved``'s answer, the forward function: feeds -> its outputs, with ``indices``: fusecli's
    name -> its output index)."""
    from tensorflow.python.eager import wrap_function

    loaded = tf.saved_model.load(path)  # kept alive by the forward function below: its variables
    fn = loaded.signatures[signature]
    trainable = [v for v in fn.variables if v.trainable]
    specs = fn.structured_input_signature[1]

    @tf.function
    def train_step(**inputs):
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(tf.cast(y, tf.float32)) for y in fn(**inputs).values()])
        return tape.gradient(loss, trainable)

    concrete = train_step.get_concrete_function(**specs)
    graph_def = concrete.graph.as_graph_def()
    n_outputs = len(fn.structured_outputs)
    library = {f.signature.name: f for f in graph_def.library.function}

    def called(prefix: str):
        found = [n for n in graph_def.node
                 if n.op in _CALLS and n.attr["f"].func.name.startswith(prefix)]
        assert len(found) == 1, [n.name for n in found]
        return found[0]

    forward_call, backward_call = called("__forward_"), called("__inference___backward_")
    forward = library[forward_call.attr["f"].func.name]

    def producer(fdef, index: int, prefix: str, caller=None) -> tuple[str, str]:
        return made_by(fdef, fdef.ret[fdef.signature.output_arg[index].name], prefix, caller)

    def made_by(fdef, ref: str, prefix: str, caller) -> tuple[str, str]:
        """The producer of ``ref`` in ``fdef``; ``caller`` = (function, call node, prefix, its caller)."""
        if ":" not in ref:  # an argument: in a nested call, what the caller passed (XLA blocks return
            if caller is None:  # their inputs for backward: that is the caller's tensor, kept)
                return "arg", prefix + ref
            outer, call, outer_prefix, outer_caller = caller
            i = [a.name for a in fdef.signature.input_arg].index(ref)
            return made_by(outer, [r for r in call.input if not r.startswith("^")][i], outer_prefix,
                           outer_caller)
        node_name, out_arg, k = ref.split(":")
        node = next(n for n in fdef.node_def if n.name == node_name)
        if node.op in _CALLS:
            return producer(library[node.attr["f"].func.name], int(k), f"{prefix}{node.name}/",
                            (fdef, node, prefix, caller))
        index = _output_index(node, out_arg, int(k))
        if node.op == "IdentityN":  # a custom gradient's IdentityN: its outputs are its inputs
            return made_by(fdef, [r for r in node.input if not r.startswith("^")][index], prefix, caller)
        return node.op, f"{prefix}{node.name}:{index}"

    def readers(fdef, arg: str) -> set[str]:
        """Op types that read argument ``arg`` of ``fdef``, through nested calls."""
        ops = set()
        for node in fdef.node_def:
            for j, ref in enumerate(node.input):
                if ref != arg:
                    continue
                if node.op in _CALLS:
                    inner = library[node.attr["f"].func.name]
                    ops |= readers(inner, inner.signature.input_arg[j].name)
                else:
                    ops.add(node.op)
        return ops

    backward = library[backward_call.attr["f"].func.name]
    read_by = {}  # forward output index -> op types of the backward that read it
    for j, ref in enumerate(backward_call.input):
        name, _, k = ref.partition(":")
        if name == forward_call.name:
            read_by[int(k or 0)] = frozenset(readers(backward, backward.signature.input_arg[j].name))
    saved, indices = {}, {}
    for i in range(n_outputs, len(forward.signature.output_arg)):
        op, name = producer(forward, i, "")
        saved[name] = (op, read_by.get(i, frozenset()))
        indices.setdefault(name, i)
        assert saved[name][1], f"{name}: a forward output that no backward op reads"
    for node in graph_def.node:  # the loss's gradient, outside the backward function
        for ref in node.input if node.name.startswith("gradient_tape/") else ():
            name, _, k = ref.partition(":")
            if name == forward_call.name and int(k or 0) < n_outputs:
                indices.setdefault(producer(forward, int(k or 0), "")[1], int(k or 0))
    feeds = [t for t in concrete.inputs if t.dtype != tf.resource]  # the signature's inputs
    op = concrete.graph.get_operation_by_name(forward_call.name)
    pruned = wrap_function.WrappedFunction(concrete.graph, variable_holder=None).prune(
        feeds=feeds, fetches=list(op.outputs))

    def run(values: dict) -> list:
        return pruned(*[tf.constant(values[t.name.split(":")[0]]) for t in feeds])

    run.indices, run.loaded = indices, loaded
    return saved, run


def compare(path: str, profile: Profile | None = None) -> dict:
    """Both saved sets (by tensor name: activations and tensors computed from variables), the named
    differences, and the numbers; fusecli's with the profile ``analyze_graph`` picks (TensorFlow's), or
    ``profile``. Tensors computed from Const ops alone (``tf_buffer``: Grappler folds them; Tensordot's
    permutation, a Normalization's ``sqrt(variance)`` given as constants), which TensorFlow's function
    gradient differentiates too, are set apart on both sides (``constants``)."""
    graph = load_model(path)
    if profile is None:
        live = analyze_graph(path, graph, Options(batch=2)).liveness
    else:
        joint = build_backward(graph, profile=profile)
        live = analyze_liveness(joint, 2, keeps_for_shape=profile.keeps_for_shape)
    theirs, tf_reads, constants = {}, {}, set()
    for name, (op, reads) in tf_saved(path).items():
        if op == "arg" or op in _NOT_ACTIVATIONS:
            continue
        t = graph.tensors.get(name)
        assert t is not None and t.producer is not None, \
            f"TensorFlow saves {name!r} ({op}), which fusecli's graph lacks"
        if tf_buffer(graph, name) == "constant":
            constants.add(name)
            continue
        theirs[name], tf_reads[name] = op, reads
    outputs = {t.name for t in graph.outputs}
    ours = {}
    for s in live.saved:
        t = s.tensor
        if t.producer is None or t.producer.op_type == "Const" or t.name in outputs:
            continue
        if tf_buffer(graph, t.name) == "constant":
            constants.add(t.name)
        else:
            ours[t.name] = s

    def add_shape(name: str) -> bool:  # TensorFlow reads only its shape, for an AddV2/Sub gradient
        t = graph.tensors[name]
        return (tf_reads[name] <= {"Shape", "ShapeN"} and not t.shape_known
                and any(c.op_type in _BROADCAST_ADDS for c in t.consumers))

    def zeros_like(name: str) -> bool:  # an output without a gradient, read only by ZerosLike
        t = graph.tensors[name]
        return (tf_reads[name] == {"ZerosLike"} and t.is_float and not t.consumers
                and len(t.producer.outputs) > 1)

    def reshape_wildcard(name: str) -> bool:
        s = ours[name]
        return (s.reads == "shape" and s.tensor.shape is not None
                and sum(d is None for d in s.tensor.shape) == 1
                and all(graph.node(n.meta["forward"]).op_type == "Reshape" for n in s.needed_by))

    tf_only, ours_only = set(theirs) - set(ours), set(ours) - set(theirs)
    named = {"add_shape": sorted(n for n in tf_only if add_shape(n)),
             "zeros_like": sorted(n for n in tf_only if zeros_like(n)),
             "reshape_wildcard": sorted(n for n in ours_only if reshape_wildcard(n))}
    common = len(set(theirs) & set(ours))
    left_tf = tf_only - set(named["add_shape"]) - set(named["zeros_like"])
    left_ours = ours_only - set(named["reshape_wildcard"])
    return {"theirs": theirs, "tf_reads": tf_reads, "ours": ours, "named": named, "constants": constants,
            "tf_only": left_tf, "ours_only": left_ours,
            "raw": (common / max(len(ours), 1), common / max(len(theirs), 1)),
            "adjusted": (common / max(common + len(left_ours), 1), common / max(common + len(left_tf), 1))}


@pytest.mark.parametrize("name", [*SEEDS, *KERAS3, "tf_keras_cnn"])
def test_saved_set_matches_tensorflow(models, name):
    if name not in models:
        pytest.skip("tf_keras is not installed")
    assert_matches(models[name])


@pytest.mark.parametrize("name", list(APPS))
def test_keras_application_matches_tensorflow(name):
    """EfficientNet's swish is a custom gradient, ConvNeXt's blocks nested calls: both as TensorFlow.
    The EfficientNetV2B0s (the same habits, 1.5 minutes each) run with FUSECLI_ALL_KERAS_APPS=1."""
    if "v2" in name and not os.environ.get("FUSECLI_ALL_KERAS_APPS"):
        pytest.skip("EfficientNetV2B0: set FUSECLI_ALL_KERAS_APPS=1 (same habits as EfficientNetB0)")
    if APPS[name][0] == "tf_keras":
        pytest.importorskip("tf_keras")
    assert_matches(saved_app(name))


def test_custom_gradients_are_what_made_efficientnet_agree():
    """With the registered gradients ignored, fusecli differentiates swish's ops one by one and keeps
    its Sigmoid outputs, which TensorFlow never keeps."""
    path = saved_app("keras3_efficientnetb0")
    graph = load_model(path)
    assert len(graph.meta["custom_gradients"]) == 49  # 16 blocks x 3 swishes + the stem + the top
    r = compare(path, replace(TENSORFLOW, custom_gradients=False))
    assert r["raw"][0] < 1.0 and r["raw"][1] == 1.0, r["raw"]  # nothing missed, 49 Sigmoids more
    sigmoids = {n for n in r["ours_only"] if graph.tensors[n].producer.op_type == "Sigmoid"}
    assert len(sigmoids) >= 49, len(sigmoids)


# TensorFlow ops whose output is their input's buffer (Tensor::CopyFrom: Reshape, Squeeze, ExpandDims,
# Identity); every other op allocates its output
_FORWARDS_BUFFER = frozenset({"Reshape", "Squeeze", "ExpandDims", "Identity"})


def tf_buffer(graph, name: str) -> str:
    """Whose buffer TensorFlow's tensor ``name`` is, read from the graph TensorFlow runs (fusecli's copy
    of it, same node names): "variable" (a variable's value, through ops that forward it), "constant"
    (computed from Const ops alone: Grappler folds it), else "allocated" (made at each step; a view of
    an activation is counted as one, fusecli's TensorFlow profile has no views)."""
    t = graph.tensors[name]
    while t.producer is not None and t.producer.op_type in _FORWARDS_BUFFER:
        t = t.producer.inputs[0]
    if t.producer is None:
        return "variable" if "variable" in t.meta else "constant" if t.kind == "constant" else "allocated"
    seen, stack = set(), [t]
    while stack:
        u = stack.pop()
        if u.producer is None:
            if u.kind != "constant" or "variable" in u.meta:
                return "allocated"
        elif id(u.producer) not in seen:
            seen.add(id(u.producer))
            stack += [i for i in u.producer.inputs if i is not None]
    return "constant"


def assert_matches(path: str) -> None:
    r = compare(path)
    assert r["theirs"], "TensorFlow saves no activation: the oracle found nothing to compare"
    assert not r["tf_only"] and not r["ours_only"], (r["tf_only"], r["ours_only"])
    graph = load_model(path)
    # what TensorFlow allocates at each step and keeps is what fusecli counts as saved activations
    allocated = {n for n in r["theirs"] if tf_buffer(graph, n) == "allocated"}
    assert allocated == {n for n, s in r["ours"].items() if s.tensor.kind == "activation"}, \
        (allocated ^ {n for n, s in r["ours"].items() if s.tensor.kind == "activation"})
    assert r["named"] == {"add_shape": [], "zeros_like": [], "reshape_wildcard": []}, r["named"]
    precision, recall = r["raw"]
    assert precision >= 0.99 and recall >= 0.99, r["raw"]
    for t in set(r["theirs"]) & set(r["ours"]):  # a shape-only read on one side is one on the other,
        tf_shape_only = r["tf_reads"][t] <= {"Shape", "ShapeN"}  # or a constant operand's gradient
        const_operand = any(c.op_type == "Mul" and any(i.kind == "constant" for i in c.inputs)
                            for c in graph.tensors[t].consumers)
        assert tf_shape_only == (r["ours"][t].reads == "shape") or const_operand, t


def test_tensorflow_habits_are_modelled(models):
    """The residual add keeps both operands (shapes under an unknown batch); BatchNorm's unused outputs
    are kept by zeros_like; the Keras 3 BatchNorm's scaled conv output is kept for an add's shape."""
    cnn = compare(models["keras3_cnn"])
    scaled = "StatefulPartitionedCall/functional_1/batch_normalization_1/batchnorm/mul_1:0"
    assert cnn["ours"][scaled].reads == "shape" and scaled in cnn["theirs"]
    assert {f"StatefulPartitionedCall/functional_1/{n}:0" for n in (
        "conv2d_1/BiasAdd", "re_lu_1/Relu", "global_average_pooling2d_1/Mean")} <= set(cnn["ours"])
    bn_add = compare(models["bn_add_relu"])
    bn = "StatefulPartitionedCall/FusedBatchNormV3"
    assert {"StatefulPartitionedCall/Conv2D_1:0", f"{bn}:0"} <= set(bn_add["ours"])
    assert {f"{bn}:{i}" for i in (1, 2, 3, 4)} <= set(bn_add["ours"])
    assert bn_add["ours"][f"{bn}:0"].reads == "shape"


def test_training_batch_norm_saves_reserve_space_not_its_input_twice(models):
    """FusedBatchNormV3(is_training=True): both read x, gamma and the saved batch statistics."""
    r = compare(models["conv_bn_relu"])
    bn = "StatefulPartitionedCall/FusedBatchNormV3"
    assert set(r["ours"]) == {"StatefulPartitionedCall/Conv2D:0", f"{bn}:1", f"{bn}:2", f"{bn}:3",
                              f"{bn}:4", f"{bn}:5", "StatefulPartitionedCall/Relu:0"}
    assert set(r["theirs"]) == set(r["ours"])
    graph = load_model(models["conv_bn_relu"])
    live = analyze_graph(models["conv_bn_relu"], graph, Options(batch=2)).liveness
    kept = {s.tensor.name for s in live.saved}
    assert {f"{bn}:{i}" for i in (3, 4, 5)} <= kept and f"{bn}:0" not in kept


def test_pipeline_keeps_tensors_read_for_an_unknown_shape(models):
    """analyze_graph passes keeps_for_shape for SavedModels: shape-only reads are listed as 'shape'."""
    path = models["keras3_resnet"]
    live = analyze_graph(path, load_model(path), Options(batch=2)).liveness
    shape_reads = [s for s in live.saved if s.reads == "shape"]
    assert shape_reads and all(None in s.tensor.meta.get("graph_shape", s.tensor.shape) for s in shape_reads)
    assert all(s.bytes == s.tensor.nbytes({"batch": 2}) for s in shape_reads)


def test_oracle_sees_nested_function_names(models):
    """Keras 3's serving function calls the traced model function: names carry the call node's name."""
    saved = tf_saved(models["keras3_cnn"])
    op, reads = saved["StatefulPartitionedCall/functional_1/re_lu_1/Relu:0"]  # read by value, for
    assert op == "Relu" and "ReluGrad" in reads  # ReLU's gradient (and its shape, for the mean's)
    assert all(n.startswith("StatefulPartitionedCall/") for n, (op, _) in saved.items() if op != "arg")

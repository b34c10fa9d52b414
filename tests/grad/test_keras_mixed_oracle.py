"""Keras 3 models saved under a mixed dtype policy (``mixed_float16``, ``mixed_bfloat16``): fusecli's saved
set against TensorFlow's own (test_tf_savedmodel_oracle's ``__forward_*`` outputs), names and bytes.

Under a mixed policy each layer keeps float32 variables and casts them to the policy's dtype at every
call (Keras's AutoCastVariable): the SavedModel carries a ``Cast`` of each ``ReadVariableOp``, and the
layer's matmul or conv keeps that float16 / bfloat16 copy for backward. It is memory the step allocates,
not a parameter. BatchNormalization and LayerNormalization cast their input to float32 and compute there,
so their kept tensors (and BatchNorm's ``rsqrt(moving_variance + eps) * gamma``) are float32.
"""

from __future__ import annotations

import numpy as np
import pytest

from fusecli.load import load_model
from fusecli.pipeline import Options, analyze_graph

tf = pytest.importorskip("tensorflow")
from .keras_apps import MIXED, POLICIES, saved_mixed  # noqa: E402
from .test_tf_savedmodel_oracle import assert_matches, compare, tf_buffer, tf_saved_bytes  # noqa: E402

BATCH = 2
LOWER = {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}


def _variable_casts(graph, dtype: str) -> list:
    """The Casts of a float32 variable to ``dtype``: the policy's per-call copies."""
    return [n for n in graph.nodes if n.op_type == "Cast" and n.inputs[0] is not None
            and "variable" in n.inputs[0].meta and n.outputs[0].dtype == dtype]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("model", list(MIXED))
def test_saved_set_matches_tensorflow_names_and_bytes(model, policy):
    path = saved_mixed(model, policy)
    graph = load_model(path)
    assert _variable_casts(graph, LOWER[policy]), "the SavedModel does not carry the policy's casts"
    _matches_tensorflow(path, graph)


@pytest.mark.parametrize("policy", ["float16", "bfloat16"])
@pytest.mark.parametrize("model", list(MIXED))
def test_pure_policy_saved_set_matches_tensorflow_names_and_bytes(model, policy):
    """The pure policies (variables and compute in float16 / bfloat16, no per-call casts): the SavedModels
    test_keras_policy compares ``--precision fp16 / bf16`` with, tied to TensorFlow's own outputs too."""
    path = saved_mixed(model, policy)
    graph = load_model(path)
    assert not _variable_casts(graph, policy) and any(
        t.dtype == policy for t in graph.tensors.values() if "variable" in t.meta)
    _matches_tensorflow(path, graph)


def _matches_tensorflow(path: str, graph) -> None:
    assert_matches(path)  # names, value or shape reads, and which of them are allocated storages
    r = compare(path)
    x = graph.inputs[0]
    feeds = {x.name: np.zeros([d if isinstance(d, int) else BATCH for d in x.shape], np.float32)}
    theirs = tf_saved_bytes(path, feeds)
    assert {n: theirs[n] for n in r["theirs"]} == {n: s.bytes for n, s in r["ours"].items()}
    # the kept bytes TensorFlow allocates at each step = fusecli's saved activation bytes, graph outputs
    # (which TensorFlow returns as the function's own outputs) aside
    live = analyze_graph(path, graph, Options(batch=BATCH)).liveness
    outputs = {t.name for t in graph.outputs}
    ours = sum(s.bytes for s in live.saved if s.tensor.kind == "activation" and s.tensor.name not in outputs)
    assert ours == sum(theirs[n] for n in r["theirs"] if tf_buffer(graph, n) == "allocated")


@pytest.mark.parametrize("policy", POLICIES)
def test_a_variables_cast_is_kept_as_an_activation(policy):
    """The Dense kernel's float32 -> float16 / bfloat16 copy: TensorFlow keeps it for MatMul's gradient;
    fusecli counts it in the saved activations at the lower dtype's bytes, batch-independent."""
    path = saved_mixed("cnn", policy)
    graph = load_model(path)
    live = analyze_graph(path, graph, Options(batch=BATCH)).liveness
    casts = {n.outputs[0].name for n in _variable_casts(graph, LOWER[policy])}
    kept = [s for s in live.saved if s.tensor.name in casts]
    assert kept and all(s.tensor.kind == "activation" for s in kept)
    dense = next(s for s in kept if "/dense" in s.tensor.name)
    assert dense.bytes == 8 * 10 * 2  # the (8, 10) kernel at 2 bytes
    big = analyze_graph(path, graph, Options(batch=4 * BATCH)).liveness.saved_by_name[dense.tensor.name]
    assert big.bytes == dense.bytes
    assert {"MatMul"} <= {r.op_type.removesuffix("GradB").removesuffix("GradA") for r in dense.needed_by}


@pytest.mark.parametrize("policy", POLICIES)
def test_normalizations_compute_in_float32(policy):
    """Keras casts BatchNormalization's and LayerNormalization's input to float32: the tensors their
    backward keeps are float32 (their output's cast back is read by the next layer's), the convs' and
    matmuls' are the policy's dtype."""
    for model in MIXED:
        path = saved_mixed(model, policy)
        r = compare(path)
        dtypes = {s.tensor.dtype for s in r["ours"].values()
                  if all("normalization" in n.meta["forward"] for n in s.needed_by)}
        assert dtypes == {"float32"}, dtypes
        assert LOWER[policy] in {s.tensor.dtype for s in r["ours"].values()}

"""SavedModel dims from TensorFlow's shape inference, judged by TensorFlow's own saved tensors.

The model is a Keras 3 transformer encoder built the usual way (``keras.Input((None, 64))``,
MultiHeadAttention, LayerNormalization, a Dense FFN, ``model.export``: tests/grad/keras_apps.py), with a
ReLU and with a GELU FFN. The judge is the ``__forward_*`` function TensorFlow splits off under
``tf.GradientTape``: its extra outputs, run on an input of batch 2 and a sequence of 32, are the tensors
its backward reads, each with its real size. fusecli, given the dim name its own warning prints, must size
every tensor and keep exactly those bytes; its formula, evaluated at a sequence of 48, must give
TensorFlow's bytes there.
"""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from fusecli.cli import main
from fusecli.load import load_model
from fusecli.memory.formulas import evaluate_formula
from fusecli.pipeline import Options, analyze

tf = pytest.importorskip("tensorflow")
pytest.importorskip("keras")
from tests.grad.keras_apps import ENCODER_DIM, saved_encoder  # noqa: E402
from tests.grad.test_tf_savedmodel_oracle import assert_matches, tf_saved, tf_saved_bytes  # noqa: E402

_NOT_ACTIVATIONS = ("arg", "ReadVariableOp", "Const", "VarHandleOp")  # other reads of a variable, the input


def cli_json(*args) -> dict:
    r = CliRunner().invoke(main, ["analyze", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def dim_named_by_warning(path: str) -> str:
    """The name fusecli tells the user to set for the sequence: 'set --dim NAME=VALUE'."""
    r = CliRunner().invoke(main, ["analyze", path, "--batch", "2"])
    assert r.exit_code == 0, r.output
    names = re.findall(r"--dim (\w+)=VALUE", " ".join(r.output.split()))
    assert len(names) == 1, r.output
    return names[0]


def tensorflow_activation_bytes(path: str, batch: int, seq: int) -> dict[str, int]:
    """TensorFlow's saved activations (fusecli's names) -> bytes, its forward run at (batch, seq)."""
    graph = load_model(path)
    x = np.random.default_rng(0).standard_normal((batch, seq, ENCODER_DIM)).astype("float32")
    ops, out = tf_saved(path), {}
    for name, size in tf_saved_bytes(path, {"x": x}).items():
        t = graph.tensors.get(name)
        assert t is not None or ops[name][0] in _NOT_ACTIVATIONS, f"fusecli's graph lacks {name}"
        if t is None or t.producer is None or t.kind != "activation" or t.producer.meta.get("constant"):
            continue  # the input, variables, constants and weight-only subgraphs: not activations
        out[name] = size
    return out


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_dynamic_sequence_encoder_is_sized_as_tensorflow_runs_it(activation):
    path = saved_encoder(activation)
    seq = dim_named_by_warning(path)
    assert seq == "x_dim1"
    r = CliRunner().invoke(main, ["analyze", path, "--batch", "2", "--dim", f"{seq}=32", "--json"])
    assert r.exit_code == 0 and "unknown" not in r.stderr, r.output
    report = json.loads(r.stdout)
    # every forward tensor sized; no total (saved, peak over the joint graph) leaves one out
    assert report["memory"]["unknown_tensors"] == 0 and report["memory"]["incomplete"] == [], report["memory"]
    theirs = tensorflow_activation_bytes(path, 2, 32)
    ours = {s["name"]: s["bytes"] for s in report["saved"] if s["kind"] == "activation"}
    assert ours == theirs  # the same tensors, each of TensorFlow's size
    assert report["memory"]["saved_activation_bytes"] == sum(theirs.values())
    # the formula, at another sequence: TensorFlow's bytes there (the seq^2 attention terms included)
    formula = report["memory"]["formula"]["saved_activation_bytes"]
    assert f"{seq}^2" in formula, formula
    at48 = sum(tensorflow_activation_bytes(path, 2, 48).values())
    assert evaluate_formula(formula, {"batch": 2, seq: 48}) == at48
    assert cli_json(path, "--batch", "2", "--dim", f"{seq}=48")["memory"]["saved_activation_bytes"] == at48


def test_dynamic_encoder_saved_set_is_tensorflows():
    """Sizing the dims keeps TensorFlow's habits, which depend on the shapes its graph had (-1)."""
    assert_matches(saved_encoder("gelu"))


def test_fixed_sequence_sizes_the_tensordot_reshapes():
    """With a fixed sequence TensorFlow still records the Dense layers' Tensordot Reshape (the FFN
    inputs) as [-1, -1]: TensorFlow's inference gives [batch * 32, width]."""
    path = saved_encoder("relu", seq=32)
    a = analyze(path, Options(batch=2))
    reshapes = [t for t in a.graph.tensors.values() if t.producer is not None
                and t.producer.op_type == "Reshape" and "Tensordot/Reshape:" in t.name]
    assert len(reshapes) == 4 and all(t.meta["graph_shape"] == (None, None) for t in reshapes)
    assert {t.shape for t in reshapes} == {("32*batch", ENCODER_DIM), ("32*batch", 4 * ENCODER_DIM)}
    assert not a.unknown_sizes
    theirs = tensorflow_activation_bytes(path, 2, 32)
    ours = {s.tensor.name: s.bytes for s in a.liveness.saved if s.tensor.name in theirs}
    assert ours == theirs and {t.name for t in reshapes} <= set(theirs)


def test_without_tensorflow_the_dims_stay_unknown_and_a_warning_says_why(monkeypatch):
    path = saved_encoder("relu", positions=True)  # a Range of the sequence: no rule of tf_shapes sizes it
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # 'import tensorflow' raises ImportError
    a = analyze(path, Options(batch=2, dims={"x_dim1": 32}))
    assert a.unknown_sizes
    assert any(w.startswith("TensorFlow is not installed") for w in a.warnings), a.warnings
    assert a.liveness.incomplete()
    open_ = next(w for w in a.warnings if "with unknown dims" in w)  # every dim given: no --dim can help
    assert "--dim" not in open_ and "every dim of the model is given" in open_, open_


def test_tensorflow_shape_inference_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("FUSECLI_TENSORFLOW_SHAPES", "0")
    a = analyze(saved_encoder("relu", positions=True), Options(batch=2, dims={"x_dim1": 32}))
    assert a.unknown_sizes and any("FUSECLI_TENSORFLOW_SHAPES=0" in w for w in a.warnings), a.warnings

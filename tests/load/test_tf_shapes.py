"""SavedModel dims sized by fusecli's own shape rules (``load.tf_shapes``), judged by TensorFlow's.

The judge is TensorFlow's own shape inference, as ``load.tf_sizes`` runs it with the rules off
(``rules=False``: the whole graph imported into a ``tf.Graph`` at several points, each dim fitted to a
polynomial): on the Keras applications (Keras 3 and tf-keras, weights=None, 32x32) every tensor's dims
must come out the same, and TensorFlow must not be needed at all; on the Keras 3 encoder with a dynamic
sequence, the rules and TensorFlow on what they leave open must give TensorFlow's dims everywhere.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from fusecli.cli import main
from fusecli.load import load_model
from fusecli.load.tf_sizes import resolve_sizes
from fusecli.memory.sizes import bind

pytest.importorskip("tensorflow")
pytest.importorskip("keras")
from tests.grad.keras_apps import saved_app, saved_encoder  # noqa: E402

NO_TENSORFLOW = """
import json, sys
from click.testing import CliRunner
from fusecli.cli import main
r = CliRunner().invoke(main, ["analyze", sys.argv[1], "--batch", "2", "--json"])
print(json.dumps({"exit": r.exit_code, "out": r.stdout, "err": r.stderr,
                  "tensorflow": "tensorflow" in sys.modules}))
"""


def sized_graphs(path: str, dims: dict[str, int] | None = None):
    """The graph sized by the rules (then TensorFlow on what they leave open), and by TensorFlow alone."""
    out = []
    for rules in (True, False):
        g = load_model(path)
        sizes, _ = bind(g, 2, dims or {})
        resolve_sizes(g, sizes, sizes.variables, rules=rules)
        out.append(g)
    return out


def reserve_space(t) -> bool:
    """An inference FusedBatchNormV3's reserve_space_3: TensorFlow's shape function leaves it unknown, the
    rules size it as the kernel's empty dummy."""
    n = t.producer
    return n is not None and n.op_type == "FusedBatchNormV3" and len(n.outputs) == 6 and n.outputs[5] is t \
        and n.attrs.get("is_training") is False


def assert_same_dims(ours, theirs) -> None:
    assert ours.tensors.keys() == theirs.tensors.keys()
    differ = [(n, t.shape, u.shape) for n, t in ours.tensors.items() for u in [theirs.tensors[n]]
              if not reserve_space(t) and (t.shape != u.shape
                                           or t.meta.get("graph_shape") != u.meta.get("graph_shape"))]
    assert not differ, differ[:5]
    assert all(t.shape == (0,) for t in ours.tensors.values() if reserve_space(t))


@pytest.mark.parametrize("name", ["keras3_resnet50", "keras3_mobilenetv2", "keras3_efficientnetb0",
                                  "keras3_densenet121", "tf_keras_resnet50", "tf_keras_mobilenetv2",
                                  "tf_keras_efficientnetb0", "tf_keras_densenet121"])
def test_application_dims_are_tensorflows_without_tensorflow(name):
    ours, theirs = sized_graphs(saved_app(name))
    assert_same_dims(ours, theirs)
    opened = [t for t in ours.tensors.values() if t.meta.get("graph_shape", t.shape) != t.shape
              and not reserve_space(t)]
    assert len(opened) > 100  # the batch was -1 in each of them: the rules sized them all
    assert not ours.meta.get("tensorflow_sizes")  # and TensorFlow was not asked
    assert theirs.meta["tensorflow_sizes"]["tensors"] == sorted(t.name for t in opened)


def test_encoder_dims_are_tensorflows_without_tensorflow():
    """MultiHeadAttention's Einsums and the Dense layers' Tensordot arithmetic (Shape, GatherV2, Prod,
    Pack, Reshape) sized by the rules, the sequence carried as its name."""
    ours, theirs = sized_graphs(saved_encoder("gelu"), {"x_dim1": 32})
    assert_same_dims(ours, theirs)
    assert not ours.meta.get("tensorflow_sizes") and len(theirs.meta["tensorflow_sizes"]["tensors"]) > 50


def test_tensorflow_sizes_what_the_rules_leave_open_on_the_part_it_depends_on():
    """A position embedding read at ``arange(shape(x)[1])``: the Range (and the gather of it) only
    TensorFlow's inference evaluates; the rest, the rules (the Add broadcasts the batch against it)."""
    path = saved_encoder("relu", positions=True)
    ours, theirs = sized_graphs(path, {"x_dim1": 32})
    assert_same_dims(ours, theirs)
    by_tf = ours.meta["tensorflow_sizes"]["tensors"]
    assert ours.meta["tensorflow_sizes"]["imported"] and any(n.endswith("/range:0") for n in by_tf)
    assert 0 < len(by_tf) < 10 < len(theirs.meta["tensorflow_sizes"]["tensors"])
    args = ["analyze", path, "--batch", "2", "--dim", "x_dim1=32"]
    doc = json.loads(CliRunner().invoke(main, [*args, "--json"]).stdout)
    assert doc["tensorflow"] == {"imported": True, "sized": by_tf}
    assert doc["memory"]["unknown_tensors"] == 0
    text = CliRunner().invoke(main, args, env={"COLUMNS": "80"}).stdout
    assert f"sizes: TensorFlow imported for {len(by_tf)} tensors" in " ".join(text.split())


@pytest.mark.parametrize("name", ["keras3_resnet50", "tf_keras_mobilenetv2"])
def test_analyze_of_an_application_imports_no_tensorflow(name):
    path = saved_app(name)
    done = subprocess.run([sys.executable, "-c", NO_TENSORFLOW, path], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["exit"] == 0, result["err"]
    assert not result["tensorflow"]  # not imported by anything analyze did
    doc = json.loads(result["out"])
    assert doc["tensorflow"] == {"imported": False, "sized": []}
    unknown = [s for s in doc["saved"] if s["bytes"] is None]
    # tf-keras's inference FusedBatchNormV3 too: its reserve_space_3, which TensorFlow's shape function
    # leaves unknown, is the kernel's empty dummy
    assert doc["memory"]["unknown_tensors"] == 0 and doc["memory"]["incomplete"] == [] and not unknown

"""Every op type of the test corpus has a kind and a gradient rule (issue 24).

An op without one is counted "unsupported", and its backward is assumed to read every input and
output, which inflates saved bytes. The corpus is what the test suite builds: the Hugging Face exports
of ``tests/hf_models.ALL`` by both torch exporters (the session's cached ``hf_onnx`` files), the onnx
package's light zoo and the shipped samples, the fusion tests' models, onnxscript's small transformer
graphs and the Keras applications' SavedModels.
"""

from __future__ import annotations

import inspect

import onnx
import pytest

from fusecli.core.ir import Graph
from fusecli.grad.profiles import choose_profile
from fusecli.load import load_model
from tests import hf_models
from tests.conftest import SAMPLES, ZOO_MODELS
from tests.grad.keras_apps import APPS


def without_rule(graph: Graph) -> dict[str, list[str]]:
    """Op types (domain-qualified outside ONNX's) without a kind or without a rule under the profile
    fusecli picks for the graph, each with a node that has it; weight-only nodes count too."""
    profile, _ = choose_profile(graph)
    missing: dict[str, list[str]] = {}
    for n in graph.nodes:
        if n.kind == "unknown" or profile.rule_for(n.kind) is None:
            key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
            missing.setdefault(key, []).append(n.name)
    return {op: names[:2] for op, names in missing.items()}


def assert_covered(path: str) -> None:
    missing = without_rule(load_model(path))
    assert not missing, f"{path}: op types without a gradient rule: {missing}"


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", hf_models.ALL)
def test_every_hf_export_op_has_a_rule(hf_onnx, name, exporter):
    assert_covered(hf_onnx(name, exporter))


@pytest.mark.parametrize("path", [*ZOO_MODELS, *sorted(SAMPLES.glob("*.onnx"))], ids=lambda p: p.stem)
def test_every_zoo_and_sample_op_has_a_rule(path):
    assert_covered(str(path))


def _fusion_models():
    """The fusion tests' shared builders (tests/fusion/models.py), each with its default arguments."""
    from tests.fusion import models

    for name, fn in vars(models).items():
        if inspect.isfunction(fn) and fn.__module__ == models.__name__ and not name.startswith("_") \
                and inspect.signature(fn).return_annotation in ("onnx.ModelProto", onnx.ModelProto) \
                and all(p.default is not p.empty for p in inspect.signature(fn).parameters.values()):
            yield name, fn


def test_every_fusion_model_op_has_a_rule(tmp_path):
    built = list(_fusion_models())
    assert len(built) >= 5
    for name, fn in built:
        path = tmp_path / f"{name}.onnx"
        onnx.save(fn(), str(path))
        assert_covered(str(path))


def test_every_onnxscript_model_op_has_a_rule(tmp_path):
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnx_ir")
    from tests.load.onnxscript_models import SMALL, save

    for name in SMALL:
        for path in save(name, tmp_path):
            assert_covered(str(path))


@pytest.mark.parametrize("name", APPS)
def test_every_keras_app_op_has_a_rule(name):
    pytest.importorskip("tensorflow")
    from tests.grad.keras_apps import saved_app

    assert_covered(saved_app(name))

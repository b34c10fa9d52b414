"""Shared fixtures: the shipped samples, the onnx package's zoo graphs, and small model builders."""

from __future__ import annotations

import os
from pathlib import Path

# TensorFlow runs NCHW convolutions on the CPU only through oneDNN, which it leaves off on some CPUs
# (AMD EPYC here); the TF oracles build NCHW graphs
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

import onnx
import pytest
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
ZOO = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
ZOO_MODELS = sorted(ZOO.glob("light_*.onnx"))


@pytest.fixture
def sample():
    """Path of a shipped sample by name (``sample('conv_bias_relu')``)."""

    def get(name: str) -> str:
        path = SAMPLES / f"{name}.onnx"
        assert path.is_file(), f"missing sample {path}; run samples/make_samples.py"
        return str(path)

    return get


def make_model(nodes, inputs, outputs, initializers=(), opset=17, value_info=()):
    """A checked ModelProto from onnx.helper pieces (IR version readable by onnxruntime)."""
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(initializers), value_info=value_info)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def vi(name, *shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, list(shape))


@pytest.fixture
def save_model(tmp_path):
    """Write a ModelProto into the test's folder and return its path."""

    def save(model, name="model.onnx") -> str:
        path = os.path.join(tmp_path, name)
        onnx.save(model, path)
        return path

    return save


@pytest.fixture(scope="session")
def hf_onnx(tmp_path_factory):
    """``hf_onnx(name, exporter="torchscript", dynamic=True, batch=2, seq=16, attn="eager")``: the path of a
    small `transformers` model's ONNX export (tests/hf_models.py), made once per test session; ``attn``
    "default" is the attention `transformers` picks when the user says nothing (sdpa); ``layers`` the
    text models' layer count (default 2), ``kv_heads`` Llama's K/V heads, ``cache`` its use_cache
    (hf_models.build), ``precision`` "bf16" or "amp-bf16" (hf_models.at_precision, autocast_of)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests import hf_models

    folder = tmp_path_factory.mktemp("hf")
    made: dict[tuple, str] = {}

    def get(name: str, exporter: str = "torchscript", dynamic: bool = True, batch: int = 2,
            seq: int = 16, attn: str = "eager", layers: int = 2, kv_heads: int | None = None,
            cache: bool = True, precision: str = "fp32") -> str:
        key = (name, exporter, dynamic) + (() if dynamic else (batch, seq))
        key += () if precision == "fp32" else (precision,)
        key += () if attn == "eager" else (attn,)
        key += () if layers == 2 else (f"{layers}layers",)
        key += () if kv_heads is None else (f"{kv_heads}kv",)
        key += () if cache else ("nocache",)
        if key not in made:
            if exporter == "dynamo":
                pytest.importorskip("onnxscript")
            path = folder / ("_".join(map(str, key)) + ".onnx")
            made[key] = hf_models.export(name, str(path), exporter, dynamic, batch, seq, attn=attn,
                                         layers=layers, kv_heads=kv_heads, cache=cache, precision=precision)
        return made[key]

    return get


def assert_savedmodel_refused(tmp_path, option: str, out: str) -> None:
    """``analyze <a SavedModel folder> OPTION OUT`` of an ONNX-only option: one line, exit 1."""
    from click.testing import CliRunner

    from fusecli.cli import main

    folder = tmp_path / "sm"
    folder.mkdir()
    (folder / "saved_model.pb").write_bytes(b"")
    r = CliRunner().invoke(main, ["analyze", str(folder), option, out])
    assert r.exit_code == 1 and "ONNX models only" in r.stderr and len(r.stderr.splitlines()) == 1

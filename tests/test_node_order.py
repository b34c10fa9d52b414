"""A model file listing its nodes in another order is read alike: the same ``analyze --json`` document as
the file as exported (matches, verdicts, sizes, saved bytes, the peak and its schedule), and a rewrite
that verifies and loads in onnxruntime. Every pass reads the canonical order (load/onnx_order.canonical).

Before, a shuffled BART TorchScript export lost all 32 ``matmul_bias`` and its 4 ``bias_gelu`` matches:
ONNX's shape inference walks the file's order, so a node listed before its inputs' makers got no shapes,
and neither did what it feeds.
"""

from __future__ import annotations

from collections import Counter

import onnx
import pytest

from fusecli.pipeline import Options, analyze
from fusecli.rewrite import RewriteOptions, rewrite
from tests import hf_models, transformer_graphs
from tests.conftest import SAMPLES, ZOO_MODELS
from tests.shuffle import document, first_difference, shuffle_file, shuffled

SEEDS = (0, 1)


def assert_read_alike(path: str, options: Options, folder, seeds=SEEDS) -> dict:
    """Each shuffled copy of ``path`` analyzes to the document of ``path``; that document."""
    want = document(analyze(path, options))
    for seed in seeds:
        copy = shuffle_file(path, str(folder / f"shuffled{seed}.onnx"), seed)
        assert first_difference(want, document(analyze(copy, options))) is None, seed
    return want


def assert_rewrites(path: str, options: RewriteOptions, out: str) -> None:
    """The rewrite verifies, and onnxruntime loads what it wrote."""
    import onnxruntime as ort

    r = rewrite(path, options, out)
    assert r.verification is None or r.verification.ok
    if r.applied:
        ort.InferenceSession(out, providers=["CPUExecutionProvider"])


def _small_models() -> list[tuple[str, onnx.ModelProto | str]]:
    models = [(p.stem, str(p)) for p in sorted(SAMPLES.glob("*.onnx"))]
    models += [("rotary", transformer_graphs.rotary_model()),
               ("rotary_shape_bound", transformer_graphs.rotary_model(bound="shape", table="constant")),
               ("llama_block_sdpa", transformer_graphs.llama_block("sdpa")),
               ("llama_block_eager", transformer_graphs.llama_block("eager"))]
    return models


SMALL = _small_models()


@pytest.mark.parametrize("name", [name for name, _ in SMALL])
def test_a_shuffled_small_model_reads_alike_and_rewrites(name, tmp_path):
    model = dict(SMALL)[name]
    path = model if isinstance(model, str) else str(tmp_path / "model.onnx")
    if not isinstance(model, str):
        onnx.save(model, path)
    assert_read_alike(path, Options(batch=2), tmp_path)
    copy = shuffle_file(path, str(tmp_path / "copy.onnx"), 7)
    assert_rewrites(copy, RewriteOptions(batch=2), str(tmp_path / "fused.onnx"))


@pytest.mark.parametrize("path", [str(p) for p in ZOO_MODELS], ids=[p.stem for p in ZOO_MODELS])
def test_a_shuffled_zoo_model_reads_alike(path, tmp_path):
    """onnx's zoo graphs (AlexNet to DenseNet): analysis only here, their rewrites take minutes."""
    assert_read_alike(path, Options(batch=2), tmp_path, seeds=(0,))


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", hf_models.ALL)
def test_a_shuffled_transformers_export_reads_alike(hf_onnx, name, exporter, tmp_path):
    dims = {"seq": 16} if hf_models.spec(name).seq_axis else {}
    assert_read_alike(hf_onnx(name, exporter), Options(batch=2, dims=dims), tmp_path, seeds=(0,))


def test_a_shuffled_bart_keeps_its_matches_and_bytes(hf_onnx, tmp_path):
    """The issue's case: BART's TorchScript export, shuffled, keeps all 32 matmul_bias and 4 bias_gelu
    matches and its saved bytes; its rewrite verifies and loads."""
    path = hf_onnx("bart", "torchscript")
    doc = assert_read_alike(path, Options(batch=2, dims={"seq": 16}), tmp_path)
    counts = Counter(p["pattern"] for p in doc["patterns"])
    assert counts["matmul_bias"] == 32 and counts["bias_gelu"] == 4 and not counts["gelu"], counts
    copy = shuffle_file(path, str(tmp_path / "copy.onnx"), 7)
    assert_rewrites(copy, RewriteOptions(batch=2, dims={"seq": 16}), str(tmp_path / "fused.onnx"))


def test_a_shuffled_mixtral_reads_alike_and_rewrites(hf_onnx, tmp_path):
    path = hf_onnx("mixtral", "torchscript", attn="default")
    assert_read_alike(path, Options(batch=2, dims={"seq": 32}, routing="balanced"), tmp_path)
    copy = shuffle_file(path, str(tmp_path / "copy.onnx"), 7)
    assert_rewrites(copy, RewriteOptions(batch=2, dims={"seq": 32}, routing="balanced",
                                         verify_scope="regions"), str(tmp_path / "fused.onnx"))


def test_nameless_nodes_are_named_by_the_canonical_order(save_model, tmp_path):
    """A node without a name is named after its op and its place, the canonical place: the same in
    every listing."""
    from onnx import helper

    from tests.conftest import make_model, vi

    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    model = make_model(nodes, [vi("x", 2)], [vi("y", 2)])
    names = [n.name for n in analyze(save_model(model), Options()).graph.nodes]
    for seed in range(6):
        path = save_model(shuffled(model, seed), f"s{seed}.onnx")
        assert [n.name for n in analyze(path, Options()).graph.nodes] == names

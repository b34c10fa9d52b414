"""``--precision`` on a TensorFlow graph applies Keras's dtype policy: an fp32 SavedModel analyzed at
``amp-fp16`` / ``amp-bf16`` (``mixed_float16`` / ``mixed_bfloat16``) or ``fp16`` / ``bf16`` (the policies
``float16`` / ``bfloat16``) keeps what the same model built and saved under that policy keeps. The
saved model is the judge: test_keras_mixed_oracle ties its saved set to TensorFlow's own
``__forward_*`` outputs, names and bytes, under all four policies (the pure float16 / bfloat16 ones
too). Same seed, same architecture (tests/grad/keras_apps MIXED).

Saved activations: equal, each tensor's (dtype, bytes) (the names differ: Keras's Casts are named by
the layer, fusecli's by the tensor cast). Step peak: within 0.1% (the exported model casts Python
scalars such as GELU's 0.5 to float16 where the fp32 one keeps float32 constants, and its variable
casts sit where TensorFlow's function placed them)."""

from __future__ import annotations

import pytest

from fusecli.load import load_model
from fusecli.pipeline import Options, analyze_graph

pytest.importorskip("tensorflow")
pytest.importorskip("keras")
from tests.grad.keras_apps import MIXED, saved_mixed  # noqa: E402

BATCH = 2
POLICY = {"amp-fp16": "mixed_float16", "amp-bf16": "mixed_bfloat16", "fp16": "float16", "bf16": "bfloat16"}


def _saved(path: str, precision: str | None = None):
    graph = load_model(path)
    a = analyze_graph(path, graph, Options(batch=BATCH, precision=precision))
    outputs = {t.name for t in graph.outputs}  # TensorFlow returns them: not kept for backward
    kept = sorted((s.tensor.dtype, s.bytes) for s in a.liveness.saved
                  if s.tensor.kind == "activation" and s.tensor.name not in outputs)
    return kept, a


@pytest.mark.parametrize("precision", list(POLICY))
@pytest.mark.parametrize("model", list(MIXED))
def test_fp32_savedmodel_at_a_policy_keeps_what_the_policys_savedmodel_keeps(model, precision):
    ours, a = _saved(saved_mixed(model, "float32"), precision)
    theirs, b = _saved(saved_mixed(model, POLICY[precision]))
    assert ours == theirs
    assert abs(a.liveness.peak_bytes - b.liveness.peak_bytes) <= 1e-3 * b.liveness.peak_bytes
    assert a.precision.assumed[0].startswith(f"Keras {POLICY[precision]} policy")
    assert a.precision.to_json()["casts_added"] > 0


def test_keras_keeps_normalizations_softmax_and_mean_in_float32():
    """The float32 parts Keras keeps, found by form: BatchNorm and GlobalAveragePooling's mean (CNN),
    LayerNorm and the attention's softmax (encoder); a BatchNorm kept tensor is float32."""
    _, a = _saved(saved_mixed("cnn", "float32"), "amp-fp16")
    bn = [s for s in a.liveness.saved if s.tensor.dtype == "float32" and s.tensor.kind == "activation"]
    assert bn and {s.tensor.dtype for s in a.liveness.saved if s.tensor.kind == "activation"} \
        == {"float16", "float32"}
    for model, regions in (("cnn", 3), ("encoder", 3)):  # 2 BatchNorm + mean; 2 LayerNorm + softmax
        _, a = _saved(saved_mixed(model, "float32"), "amp-bf16")
        assert f"{regions} BatchNorm, LayerNorm, softmax and mean" in a.precision.assumed[0]

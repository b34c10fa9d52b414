"""Transformer-era patterns on real exports of `transformers` models (both torch exporters, 2 layers).

Static exports (batch 2, seq 16): P's bytes are batch * heads * seq^2 * 4 with seq the model's own
token count, so bytes_freed is checked against the model configs, not against fusecli's sizes.
"""

from __future__ import annotations

import pytest

from fusecli.pipeline import Options, analyze

LAYERS, HEADS, BATCH = 2, 2, 2
TOKENS = {"bert": 16, "distilbert": 16, "gpt2": 16, "llama": 16, "mistral": 16, "qwen2": 16,
          "t5_encoder": 16, "vit": 17, "clip_vision": 17, "whisper_encoder": 32}  # vit/clip: 16 patches + cls
LLAMA_FAMILY = ("llama", "mistral", "qwen2")
PRE_LN = ("gpt2", "clip_vision", "whisper_encoder", "vit")
EXPORTERS = ("torchscript", "dynamo")


@pytest.fixture(scope="module")
def analyzed(hf_onnx):
    cache: dict = {}

    def get(name: str, exporter: str):
        if (name, exporter) not in cache:
            cache[name, exporter] = analyze(hf_onnx(name, exporter, dynamic=False, batch=BATCH),
                                            Options(batch=BATCH))
        return cache[name, exporter]

    return get


def _of(a, *names):
    return [m for m in a.matches if m.pattern.name in names]


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", list(TOKENS))
def test_one_attention_per_layer_training_safe_if_recomputed(analyzed, name, exporter):
    a = analyzed(name, exporter)
    attention = _of(a, "attention")
    assert len(attention) == LAYERS
    p_bytes = BATCH * HEADS * TOKENS[name] ** 2 * 4
    for m in attention:
        v = m.verdict
        assert v.inference_safe and not v.training_safe and v.state == "training-safe if recomputed"
        p = m.roles["softmax"].outputs[0]
        assert p.name in v.recompute.tensors and v.recompute.bytes_freed == p_bytes
        assert any(b.tensor is p for b in v.blocking)  # SoftmaxGrad and P @ V's backward read P
        # kept instead: one float32 per softmax row (logsumexp), plus any mask nothing else keeps
        assert f"{p.name}.row_stats" in v.recompute.kept
        assert v.recompute.bytes_kept >= BATCH * HEADS * TOKENS[name] * 4
        assert v.recompute.flops > 2 * (p_bytes // 4) * 32  # q k^T again: 2 * head_dim per score at least
        assert "FlashAttention" in v.reason


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", LLAMA_FAMILY)
def test_llama_family_rms_norm_swiglu_rotary(analyzed, name, exporter):
    a = analyzed(name, exporter)
    norms = _of(a, "rms_norm", "skip_rms_norm")  # a skip_rms_norm is an RMSNorm with its residual Add
    assert len(norms) == 2 * LAYERS + 1 and all(m.verdict.training_safe for m in norms)
    assert len(_of(a, "skip_rms_norm")) == 2 * LAYERS  # every norm after the first reads a residual sum
    swiglu = _of(a, "swiglu")
    assert len(swiglu) == LAYERS
    for m in swiglu:
        assert m.verdict.state == "training-safe if recomputed" and m.verdict.recompute.bytes_kept == 0
    for m in _of(a, "attention"):  # 2 query heads share 1 K/V head: repeat_kv joins the match as a view
        assert {"repeat_k", "repeat_v"} <= set(m.roles)
        assert "GroupQueryAttention" in m.verdict.frameworks["onnxruntime"]["note"]
    rotary = _of(a, "rotary")
    assert len(rotary) == 2 * LAYERS and all(m.verdict.training_safe for m in rotary)  # q and k


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", PRE_LN)
def test_pre_ln_skip_layer_norm_is_accepted_with_the_sum_as_output(analyzed, name, exporter):
    a = analyzed(name, exporter)
    skips = _of(a, "skip_layer_norm")
    assert skips and all(m.verdict.training_safe for m in skips)
    # the residual sum is read again by the next block: the kernel writes it out as its extra output
    read_again = [m for m in skips if len(m.bound["x"].consumers) > 1]
    assert read_again


def test_t5_rms_norm(analyzed):
    for exporter in EXPORTERS:
        a = analyzed("t5_encoder", exporter)
        assert len(_of(a, "rms_norm", "skip_rms_norm")) == 2 * LAYERS + 1


@pytest.mark.parametrize(("name", "exporter"), [("llama", "torchscript"), ("gpt2", "dynamo")])
def test_match_counts_hold_on_dynamic_exports(hf_onnx, name, exporter):
    """(The dynamo exporter refuses a dynamic seq on Llama's causal mask, hence GPT-2 for it.)"""
    a = analyze(hf_onnx(name, exporter), Options(batch=2, dims={"seq": 16}))
    assert len(_of(a, "attention")) == LAYERS
    if name == "llama":
        assert len(_of(a, "swiglu")) == LAYERS and len(_of(a, "rms_norm", "skip_rms_norm")) == 2 * LAYERS + 1


ORT_CHECKED = [("gpt2", "torchscript"), ("bert", "torchscript"), ("clip_vision", "torchscript"),
               ("llama", "torchscript"), ("llama", "dynamo")]


@pytest.mark.parametrize(("name", "exporter"), ORT_CHECKED)
def test_onnx_runtime_notes_agree_with_its_optimizer(analyzed, hf_onnx, tmp_path, name, exporter):
    """ONNX Runtime's offline model at ORT_ENABLE_EXTENDED: the matches whose note says it fuses them."""
    import onnx
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "ort.onnx")
    ort.InferenceSession(hf_onnx(name, exporter, dynamic=False, batch=BATCH), so,
                         providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node]
    a = analyzed(name, exporter)
    skip = [m for m in _of(a, "skip_layer_norm") if m.verdict.frameworks["onnxruntime"]["cpu"]]
    assert ops.count("SkipLayerNormalization") == len(skip)  # pre-LN sums read again: ORT leaves them
    gates = {id(n) for m in _of(a, "silu", "swiglu") for n in m.nodes if n.kind == "sigmoid"}
    assert ops.count("QuickGelu") == len(gates)  # x * sigmoid(alpha x), once per gate (silu inside swiglu)
    rms = [m for m in _of(a, "rms_norm") if m.verdict.frameworks["onnxruntime"]["cpu"]]
    assert ("SimplifiedLayerNormalization" in ops) == bool(rms)  # the Div form only, not Reciprocal

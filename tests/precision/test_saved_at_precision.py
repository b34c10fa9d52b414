"""Saved bytes at the precisions users train with, against PyTorch's saved_tensors_hooks on the same
model (tests/hf_models.saved_storages): exports traced under CPU autocast and exports of the model cast
to bf16 (their casts are Cast nodes: within 3%), and fp32 exports analyzed with ``--precision``
amp-bf16 (CPU autocast modelled: within 5%) or bf16 (the model cast modelled: within 5%)."""

from __future__ import annotations

import pytest

from fusecli.pipeline import Options, analyze

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests import hf_models  # noqa: E402

BATCH, SEQ = 2, 32
EXPORTED = [("gpt2", "amp-bf16"), ("llama", "amp-bf16"), ("bert", "amp-bf16"),
            ("gpt2", "bf16"), ("llama", "bf16"), ("bert", "bf16")]
MODELLED = [("gpt2", "torchscript"), ("gpt2", "dynamo"), ("llama", "dynamo"), ("bert", "torchscript"),
            ("bert", "dynamo"), ("olmo", "torchscript"), ("olmo", "dynamo"),  # OLMo: LayerNorm on x.float()
            ("gemma", "torchscript"),  # its 1 + w folded into an initializer
            ("qwen3_gqa", "torchscript"), ("qwen3_gqa", "dynamo")]  # RMSNorms on q and k per head

# RESULTS-precision.md: every row 1.000 but BERT's 1.001 (256 B of 430 kB) and OLMo's at --precision bf16
TOLERANCE = 0.002
OLMO_ROTARY = ("OLMo at --precision bf16, 0.987: its rotary returns cos and sin in float32 (Llama's casts "
               "them to x's dtype), 4,096 B the float32 export shows no cast for")
_reference: dict[tuple[str, str], int] = {}


def pytorch_at(name: str, precision: str) -> int:
    key = (name, precision)
    if key not in _reference:
        _reference[key] = hf_models.pytorch_saved_at(name, precision, BATCH, SEQ)
    return _reference[key]


def saved(path: str, precision: str | None = None) -> int:
    a = analyze(path, Options(batch=BATCH, dims={"seq": SEQ}, precision=precision))
    return a.liveness.saved_activation_bytes


@pytest.mark.parametrize("name,precision", EXPORTED)
def test_exports_at_a_precision_match_pytorch(hf_onnx, name, precision):
    """The dynamo export carries the casts (TorchScript cannot trace bf16 or autocast models here)."""
    path = hf_onnx(name, "dynamo", attn="default", precision=precision)
    got, want = saved(path), pytorch_at(name, precision)
    assert abs(got / want - 1) <= TOLERANCE, \
        f"{name} {precision} export: fusecli {got:,} B, PyTorch {want:,} B"


def _modelled_cases():
    for precision in ("amp-bf16", "bf16"):
        for name, exporter in MODELLED:
            marks = [pytest.mark.xfail(strict=True, reason=OLMO_ROTARY)] \
                if (name, precision) == ("olmo", "bf16") else []
            yield pytest.param(name, exporter, precision, marks=marks, id=f"{precision}-{name}-{exporter}")


@pytest.mark.parametrize(("name", "exporter", "precision"), list(_modelled_cases()))
def test_fp32_exports_at_a_modelled_precision_match_pytorch(hf_onnx, name, exporter, precision):
    path = hf_onnx(name, exporter, attn="default")
    got, want = saved(path, precision), pytorch_at(name, precision)
    assert abs(got / want - 1) <= TOLERANCE, \
        f"{name} {exporter} --precision {precision}: fusecli {got:,} B, PyTorch {want:,} B"
    fp32 = saved(path)  # and the precision changed the answer: neither is the fp32 figure
    assert got < 0.99 * fp32


def test_precision_is_said_in_the_json(hf_onnx):
    from fusecli.report.document import to_json

    path = hf_onnx("llama", "dynamo", attn="default")
    doc = to_json(analyze(path, Options(batch=BATCH, dims={"seq": SEQ}, precision="amp-bf16")))
    p = doc["precision"]
    assert p["precision"] == "amp-bf16" and p["dtype"] == "bfloat16" and p["device"] == "cpu"
    assert p["casts_added"] > 0 and any("autocast" in a for a in p["assumed"])
    plain = to_json(analyze(path, Options(batch=BATCH, dims={"seq": SEQ})))["precision"]
    assert plain == {"precision": "as exported", "parameter_dtypes": ["float32"]}


GPT2_PEAK = ("GPT-2 at 0.951 (amp-bf16 and bf16, seq 128): PyTorch peaks in AddmmBackward0's mm, 132 kB "
             "above fusecli's peak, a MulGrad step (at fp32 both peak in that Mul's backward, exact): the "
             "work buffer oneDNN's bf16 mm takes on CPU, said in memory.peak.not_counted, its size the "
             "library's (tests/report/test_peak_not_counted.py)")


GPT2_XFAIL = pytest.mark.xfail(strict=True, reason=GPT2_PEAK)


@pytest.mark.parametrize("name", [pytest.param("gpt2", marks=GPT2_XFAIL), "llama", "qwen3_gqa"])
@pytest.mark.parametrize("precision", ["amp-bf16", "bf16"])
def test_peak_at_a_modelled_precision_matches_the_profiler(hf_onnx, name, precision):
    """The step's peak at seq 128, against torch.profiler's allocations (hf_models.peak_memory) of the
    same step under that precision, within TOLERANCE (Llama: 1.0004-1.0006); GPT-2 a strict xfail (GPT2_PEAK).
    BERT, within 3% under autocast, has its own test (test_module_arguments_live_through_the_call)."""
    seq = 128
    model, args = hf_models.at_precision(hf_models.build(name, attn="default"),
                                         hf_models.example_inputs(name, BATCH, seq), precision)
    with hf_models.autocast_of(precision):
        want = hf_models.peak_memory(model, args)["peak"]
    a = analyze(hf_onnx(name, "dynamo", attn="default"), Options(batch=BATCH, dims={"seq": seq},
                                                                 precision=precision))
    got = a.liveness.peak_bytes
    print(f"peak at {precision} {name}: fusecli {got} PyTorch {want} ratio {got / want:.4f}")  # with -s
    assert abs(got / want - 1) <= TOLERANCE, f"{name} --precision {precision} peak: fusecli {got:,} B, " \
                                        f"PyTorch {want:,} B"


FRAME_PEAK = 0.03  # BERT amp-bf16 at seq 128: 0.975 on both exporters (0.904 before frames were modelled)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_module_arguments_live_through_the_call(hf_onnx, exporter):
    """BERT under autocast peaks in forward, where the float32 LayerNorm outputs of the layers before are
    still alive: each is an argument of the module calls it was passed to (the next layer, its attention),
    held by their frames until they return (grad.storage.held_by_calls). Without that 0.904 of PyTorch's
    peak; the rest of the gap is not found (the model cast to bf16 reads 0.94)."""
    seq = 128
    model, args = hf_models.build("bert", attn="default"), hf_models.example_inputs("bert", BATCH, seq)
    with hf_models.autocast_of("amp-bf16"):
        want = hf_models.peak_memory(model, args)["peak"]
    a = analyze(hf_onnx("bert", exporter, attn="default"), Options(batch=BATCH, dims={"seq": seq},
                                                                   precision="amp-bf16"))
    got = a.liveness.peak_bytes
    print(f"peak at amp-bf16 bert {exporter}: fusecli {got} PyTorch {want} ratio {got / want:.4f}")
    assert a.liveness.peak_step < a.liveness.boundary  # a forward peak, as PyTorch's
    assert abs(got / want - 1) <= FRAME_PEAK, f"fusecli {got:,} B, PyTorch {want:,} B"


SOFTMAX_PEAK = 0.03  # measured 1.012-1.024 at seq 128 (see the test)


@pytest.mark.parametrize(("analyzed", "exporter"), [("bf16 export", "dynamo"), ("--precision bf16", "dynamo"),
                                                    ("--precision bf16", "torchscript")])
def test_a_float32_softmax_of_a_bf16_model_is_pytorchs(hf_onnx, analyzed, exporter):
    """Gemma's eager attention: softmax(scores, dim=-1, dtype=torch.float32).to(bfloat16) under
    model.to(bfloat16). PyTorch keeps the float32 probabilities for softmax's backward and the bfloat16
    copy for P @ V; the dynamo export of the bf16 model drops both casts (its FX node keeps the dtype), and
    fusecli read 0.78 of PyTorch's saved bytes at seq 128 (0.557 at 1024). The TorchScript export of the
    fp32 model writes the dtype as a float32 Cast after the Softmax and the .to as another: read as a
    softmax in the model's dtype, --precision bf16 gave 0.835 of PyTorch's saved bytes. The bf16 export and
    the fp32 exports analyzed at --precision bf16: saved bytes and the step's peak, against PyTorch's; the
    attention is matched through the cast of P (it was a near miss under every precision but the export's
    own)."""
    seq = 128
    if analyzed == "bf16 export":
        a = analyze(hf_onnx("gemma", "dynamo", attn="eager", precision="bf16"),
                    Options(batch=BATCH, dims={"seq": seq}))
    else:
        a = analyze(hf_onnx("gemma", exporter, attn="eager"), Options(batch=BATCH, dims={"seq": seq},
                                                                       precision="bf16"))
        assert any("softmax(es) compute in float32" in s for s in a.precision.assumed), a.precision.assumed
    model, args = hf_models.at_precision(hf_models.build("gemma", attn="eager"),
                                         hf_models.example_inputs("gemma", BATCH, seq), "bf16")
    saved = sum(b for _, _, b in hf_models.saved_storages(model, args))
    peak = hf_models.peak_memory(model, args)["peak"]
    got = a.liveness.saved_activation_bytes
    assert abs(got / saved - 1) <= TOLERANCE, (got, saved)
    # the peak: 1.024 (export) and 1.012 (--precision) at seq 128, 1.000 and 1.003 at seq 1024
    assert abs(a.liveness.peak_bytes / peak - 1) <= SOFTMAX_PEAK, (a.liveness.peak_bytes, peak)
    assert not a.near_misses and sum(m.pattern.name == "attention" for m in a.matches) == 2


def _normed(norm_class):
    """Linear -> a transformers RMSNorm -> Linear (hidden 64), in eval mode."""
    import torch

    class Normed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.norm, self.b = torch.nn.Linear(64, 64), norm_class(64), torch.nn.Linear(64, 64)
            torch.nn.init.normal_(self.norm.weight)

        def forward(self, x):
            return self.b(self.norm(self.a(x)))

    torch.manual_seed(0)
    return Normed().eval()


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("norm", ["olmo2", "llama"])
def test_an_rms_norm_weighted_in_float32_keeps_its_float32_product(tmp_path, exporter, norm):
    """OLMo2's RMSNorm (and GPT-OSS's, DeepSeek-V4's) returns (self.weight * x).to(input_dtype): under a
    bf16 model cast the weight's product is float32, kept for the weight's gradient, and cast down for
    the next op; Llama's casts down before the weight. Read as Llama's, OLMo2 at --precision bf16 was
    0.855 of PyTorch's saved bytes (seq 128, both exporters); now 0.992 there (its rotary tables, above).
    The fp32 export of each form at --precision bf16 against the module cast to bf16."""
    import warnings

    import torch
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    cls = {"olmo2": Olmo2RMSNorm, "llama": LlamaRMSNorm}[norm]
    x = torch.randn(2, 32, 64)
    path = str(tmp_path / f"{norm}_{exporter}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(_normed(cls), (x,), path, dynamo=False, opset_version=17, input_names=["x"],
                              output_names=["y"], dynamic_axes={"x": {0: "batch", 1: "seq"}})
        else:
            torch.onnx.export(_normed(cls), (x,), dynamo=True, input_names=["x"], output_names=["y"],
                              dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64),
                                               1: torch.export.Dim("seq", min=2, max=256)},),
                              verbose=False).save(path)
    a = analyze(path, Options(batch=2, dims={"seq": 32}, precision="bf16"))
    model, args = hf_models.at_precision(_normed(cls), (x,), "bf16")
    assert a.liveness.saved_activation_bytes == sum(b for _, _, b in hf_models.saved_storages(model, args))


def test_a_module_computing_in_float32_op_by_op_does_under_a_bf16_model_cast(hf_onnx):
    """Cohere's LayerNorm: x.to(float32), mean, variance, rsqrt, weight.to(float32) * x, .to(input_dtype),
    op by op; the dynamo export of the fp32 model drops every cast, and its module's class says it. Read
    in the model's dtype, --precision bf16 was 0.797 of PyTorch's saved bytes at seq 128."""
    seq = 128
    a = analyze(hf_onnx("cohere", "dynamo", attn="default"), Options(batch=BATCH, dims={"seq": seq},
                                                                      precision="bf16"))
    assert any("CohereLayerNorm compute in float32" in s for s in a.precision.assumed), a.precision.assumed
    want = hf_models.pytorch_saved_at("cohere", "bf16", BATCH, seq)
    assert a.liveness.saved_activation_bytes == want

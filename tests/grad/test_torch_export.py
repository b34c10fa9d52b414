"""What a PyTorch export lost, put back before backward (fusecli/grad/torch_export.py), against PyTorch.

Cohere's LayerNorm is written op by op: ``hidden - mean`` twice (once for the variance, once for the
normalisation), each kept by its reader's backward (pow's and mul's), and ``torch.rsqrt`` (saving its
result alone). The dynamo export's common-subexpression pass merges the two subtractions into one Sub,
and writes rsqrt as Reciprocal(Sqrt): fusecli read 0.916 of PyTorch's saved bytes and 0.956 of its peak
at seq 128, both now exact.
"""

from __future__ import annotations

import warnings

import pytest

from fusecli.grad.profiles import PROFILES
from fusecli.grad.torch_export import unmerge_subexpressions
from fusecli.load import load_model
from fusecli.load.torch_meta import torch_node_meta
from fusecli.pipeline import Options, analyze

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests import hf_models  # noqa: E402

BATCH, SEQ = 2, 128


class _Prop:
    def __init__(self, key: str, value: str) -> None:
        self.key, self.value = key, value


def test_an_fx_node_names_itself_and_what_it_reads():
    meta = torch_node_meta([_Prop("pkg.torch.onnx.fx_node",
                                  "%cat : [num_users=1] = call_function[target=torch.ops.aten.cat.default]"
                                  "(args = ([%neg, %slice_1], -1), kwargs = {})")])
    assert meta["fx_call"] == ("cat", ("neg", "slice_1"))


def test_a_merged_subtraction_is_two_tensors_as_eager_makes_them(hf_onnx):
    path = hf_onnx("cohere", "dynamo", attn="default")
    graph = load_model(path, None, None)
    assert unmerge_subexpressions(graph, PROFILES["pytorch"]().views) == 3  # one per LayerNorm
    assert unmerge_subexpressions(graph, PROFILES["pytorch"]().views) == 0  # nothing left merged
    a = analyze(path, Options(batch=BATCH, dims={"seq": SEQ}))
    model, args = hf_models.build("cohere", attn="default"), hf_models.example_inputs("cohere", BATCH, SEQ)
    saved = sum(b for _, _, b in hf_models.saved_storages(model, args))
    peak = hf_models.peak_memory(hf_models.build("cohere", attn="default"), args)["peak"]
    assert a.liveness.saved_activation_bytes == saved
    assert a.liveness.peak_bytes == pytest.approx(peak, rel=0.002)
    backward = [n.op_type for n in a.joint.nodes if n.phase == "backward"]
    assert backward.count("RsqrtBackward0") == 3 and "SqrtGrad" not in backward  # rsqrt is one aten op


def _attention(form: str):
    """A tiny eager attention whose softmax is written ``form``: "dtype" (softmax(s, dtype=float32).to,
    transformers'), "float" (softmax(s.float()).to, MPT's) or "plain" (softmax(s).type, GPT-2's)."""
    import torch

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.o = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)

        def forward(self, x):
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            s = q @ k.transpose(-1, -2)
            if form == "dtype":
                p = torch.softmax(s, dim=-1, dtype=torch.float32).to(v.dtype)
            elif form == "float":
                p = torch.softmax(s.float(), dim=-1).to(v.dtype)
            else:
                p = torch.softmax(s, dim=-1).type(v.dtype)
            return self.o(p @ v)

    torch.manual_seed(0)
    return Attention().eval()


@pytest.mark.parametrize("form", ["dtype", "float", "plain"])
def test_a_traced_float32_softmax_computes_in_float32_under_a_bf16_model_cast(tmp_path, form):
    """An fp32 TorchScript export at --precision bf16 against the module cast to bf16: the first two
    forms keep float32 probabilities for softmax's backward and a bf16 copy for P @ V (read as bf16 once,
    fusecli's saved bytes were 0.73-0.76 of PyTorch's on Llama-eager, BLOOM and MPT), the third one bf16
    tensor."""
    import torch

    x = torch.randn(2, 64, 16)
    path = str(tmp_path / f"{form}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_attention(form), (x,), path, dynamo=False, opset_version=17, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "batch", 1: "seq"}})
    a = analyze(path, Options(batch=2, dims={"seq": 64}, precision="bf16"))
    model, args = hf_models.at_precision(_attention(form), (x,), "bf16")
    assert a.liveness.saved_activation_bytes == sum(b for _, _, b in hf_models.saved_storages(model, args))
    said = any("softmax(es) compute in float32" in s for s in a.precision.assumed)
    assert said == (form != "plain")

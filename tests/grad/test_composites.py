"""PyTorch's composite ops, one per case: the module's ONNX export (as each torch exporter writes it),
analyzed with the PyTorch profile, against what eager PyTorch's autograd saves for it.

The judge is ``saved_tensors_hooks``: bytes of the distinct storages autograd saves that are not
parameters (the input x, which requires grad, counts). fusecli's side: the saved activations and
inputs of the joint graph differentiated w.r.t. parameters and inputs. Each composite must match, and
the plain per-op rules (which differentiate the spelled-out ops one by one) must keep something else.
Hand-written Python spellings (GPT-2's ``gelu_new``) run op by op in eager PyTorch too: they must not
be matched, and their per-op bytes must equal PyTorch's as well.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from fusecli.grad.backward import build_backward
from fusecli.grad.profiles import OPS, get_profile
from fusecli.load import load_model
from fusecli.memory.liveness import analyze_liveness
from fusecli.pipeline import Options, size_graph
from tests.conftest import make_model, vi

torch = pytest.importorskip("torch")
F = torch.nn.functional


@dataclass(frozen=True)
class Case:
    id: str
    fn: object  # (module, x) -> y
    exporter: str  # "torchscript" | "dynamo"
    composite: str | None  # the composite the export must match (None: none may match)
    opset: int | None = None  # TorchScript 17, dynamo 18 (from 20 it writes ONNX's Gelu op itself)
    shape: tuple[int, ...] = (2, 3, 4, 8)
    internal: int = 0  # bytes PyTorch saves that no ONNX tensor holds (said in ``why``)
    why: str = ""
    differs: bool = True  # the per-op rules keep other tensors than the composite


class _Module(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(1 + 0.1 * torch.randn(8, generator=g))
        self.b = torch.nn.Parameter(0.1 * torch.randn(8, generator=g))

    def forward(self, x):
        return self.fn(self, x)


def _gelu_new(m, x):  # transformers' NewGELUActivation, written out in Python
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def _sdpa(m, x):
    return F.scaled_dot_product_attention(x, x * 2, x * 3)


def _sdpa_bool_mask(m, x):
    """A mask made from the input's values: the fused kernel, which saves it converted to float."""
    return F.scaled_dot_product_attention(x, x * 2, x * 3, attn_mask=x[..., :4] > -0.5)


def _sdpa_learned_bias(m, x):
    """A float mask that needs a gradient: PyTorch falls back to the math kernel, which saves P."""
    return F.scaled_dot_product_attention(x, x * 2, x * 3, attn_mask=m.w[:4].reshape(1, 4) * m.b[:4, None])


CASES = [
    *(Case(f"gelu_erf_{e}", lambda m, x: F.gelu(x), e, "gelu_erf") for e in ("torchscript", "dynamo")),
    *(Case(f"gelu_tanh_{e}", lambda m, x: F.gelu(x, approximate="tanh"), e, "gelu_tanh")
      for e in ("torchscript", "dynamo")),
    *(Case(f"silu_{e}", lambda m, x: F.silu(x), e, "silu") for e in ("torchscript", "dynamo")),
    Case("hardswish_opset13", lambda m, x: F.hardswish(x), "torchscript", "hardswish", opset=13),
    Case("layer_norm_opset13", lambda m, x: F.layer_norm(x, (8,), m.w, m.b), "torchscript", "layer_norm",
         opset=13),
    Case("rms_norm_dynamo", lambda m, x: F.rms_norm(x, (8,), m.w, 1e-6), "dynamo", "rms_norm"),
    *(Case(f"sdpa_{e}", _sdpa, e, "sdpa") for e in ("torchscript", "dynamo")),  # q, k, v, out, logsumexp
    *(Case(f"sdpa_bool_mask_{e}", _sdpa_bool_mask, e, "sdpa") for e in ("torchscript", "dynamo")),
    *(Case(f"sdpa_learned_bias_{e}", _sdpa_learned_bias, e, "sdpa", differs=e == "torchscript")
      for e in ("torchscript", "dynamo")),  # the math kernel: dynamo's ops save what it saves
    *(Case(f"gelu_new_python_{e}", _gelu_new, e, None) for e in ("torchscript", "dynamo")),
    Case("gelu_erf_python", lambda m, x: x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))), "torchscript",
         None),
]


def _export(case: Case, path: str) -> str:
    module, x = _module_and_input(case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if case.exporter == "torchscript":
            torch.onnx.export(module, (x,), path, dynamo=False, opset_version=case.opset or 17,
                              do_constant_folding=False)
        else:
            pytest.importorskip("onnxscript")
            torch.onnx.export(module, (x,), dynamo=True, opset_version=case.opset or 18,
                              verbose=False).save(path)
    return path


def _module_and_input(case: Case):
    g = torch.Generator().manual_seed(1)
    return _Module(case.fn).eval(), torch.randn(*case.shape, generator=g, requires_grad=True)


def pytorch_bytes(case: Case) -> int:
    """Bytes of the distinct storages eager autograd saves, parameters left out."""
    module, x = _module_and_input(case)
    skip = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in skip:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x).sum().backward()
    return sum(seen.values())


def fusecli_bytes(graph, profile) -> tuple[int, dict]:
    sizes = size_graph(graph, Options(batch=2))[0]  # the export's opaque dims resolved, as analyze does
    joint = build_backward(graph, wrt_inputs=True, profile=profile)
    joint.lint()
    live = analyze_liveness(joint, sizes)
    kept = [s for s in live.saved if s.tensor.kind in ("activation", "input") and s.reads == "value"]
    return sum(s.bytes for s in kept), joint.meta["composites"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_composite_saves_what_pytorch_saves(case, tmp_path):
    graph = load_model(_export(case, str(tmp_path / f"{case.id}.onnx")))
    ours, composites = fusecli_bytes(graph, get_profile("pytorch"))
    per_op, _ = fusecli_bytes(graph, OPS)
    if case.composite is None:
        assert composites == {}, composites
        assert ours == per_op
    else:
        assert list(composites.values()) == [case.composite]
        assert ours != per_op or not case.differs  # the per-op rules keep other tensors
    assert ours + case.internal == pytorch_bytes(case), case.why


def _softmax_graph(log: bool):
    """softmax / log_softmax spelled out over the last axis, as opset < 13 exports of other axes do."""
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], "max", axes=[-1]),
             helper.make_node("Sub", ["x", "m"], ["s"], "sub"),
             helper.make_node("Exp", ["s"], ["e"], "exp"),
             helper.make_node("ReduceSum", ["e", "axes"], ["z"], "sum")]
    if log:
        nodes += [helper.make_node("Log", ["z"], ["lz"], "log"),
                  helper.make_node("Sub", ["s", "lz"], ["y"], "y")]
    else:
        nodes.append(helper.make_node("Div", ["e", "z"], ["y"], "y"))
    return make_model(nodes, [vi("x", 2, 3, 8)], [vi("y", 2, 3, 8, dtype=TensorProto.FLOAT)], [axes])


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_decomposed_softmax_saves_its_output(log, save_model):
    graph = load_model(save_model(_softmax_graph(log)))
    ours, composites = fusecli_bytes(graph, get_profile("pytorch"))
    assert list(composites.values()) == ["log_softmax" if log else "softmax"]
    x = torch.randn(2, 3, 8, requires_grad=True)
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        (F.log_softmax if log else F.softmax)(x, -1).sum().backward()
    assert ours == sum(seen.values()) == 2 * 3 * 8 * 4  # y only

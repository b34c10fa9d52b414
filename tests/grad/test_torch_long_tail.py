"""The long tail of real exports (issue 24) against PyTorch itself: a tiny module per op, exported by both
torch exporters, analyzed by fusecli with the profile it picks, and its saved activation bytes compared
with what eager autograd saves (``saved_tensors_hooks``: bytes of the distinct storages that are neither
parameters, buffers nor model inputs, the convention of ``tests/hf_models.pytorch_saved``; PyTorch's
int64 index tensors count as they do there).

Parameter views: ``self.w[e]`` for a constant ``e`` is a view of the parameter in PyTorch, and its
Gather (or Slice, Squeeze) in the export is the parameter too: never an activation.
"""

from __future__ import annotations

import warnings

import onnx
import pytest

from fusecli.pipeline import Options, analyze

torch = pytest.importorskip("torch")
nn = torch.nn

BATCH, SEQ, H = 2, 6, 8
EXPORTERS = ("torchscript", "dynamo")


class GatherElements(nn.Module):
    """DeBERTa-v2's relative-position gather: torch.gather of an activation by an int64 activation."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(3, H)

    def forward(self, x, ids):
        idx = ids.remainder(H)  # (B, S, 3) int64, computed from the inputs
        return self.b(torch.tanh(torch.gather(self.a(x), 2, idx)))


class CumSum(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x, ids):
        return self.b(torch.cumsum(self.a(x), 1))


class TopK(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(3, H)

    def forward(self, x, ids):
        values, _ = torch.topk(self.a(x), 3, dim=-1)
        return self.b(values)


class Trilu(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, SEQ), nn.Linear(SEQ, H)

    def forward(self, x, ids):
        scores = self.a(x)[:, :, :SEQ]  # (B, S, S)
        return self.b(torch.triu(scores) + torch.tril(scores, -1) * 0.5)


class ScatterElements(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.u, self.b = nn.Linear(H, H), nn.Linear(H, 2), nn.Linear(H, H)

    def forward(self, x, ids):
        idx = ids[:, :, :2].remainder(H // 2) * 2  # two distinct columns per row
        idx = idx + torch.arange(2).reshape(1, 1, 2)
        return self.b(torch.tanh(self.a(x).scatter(2, idx, self.u(x))))


class ExpertWeights(nn.Module):
    """A mixture of experts' weight slices: ``self.w[e]`` for constant e, and a column slice."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, H, H) * 0.3)

    def forward(self, x, ids):
        h = torch.tanh(x @ self.w[1])
        h = h @ self.w[2].t()
        return torch.tanh(h) @ self.w[0][:, : H // 2]


MODULES = {"gather_elements": (GatherElements, "GatherElements"), "cumsum": (CumSum, "CumSum"),
           "top_k": (TopK, "TopK"), "trilu": (Trilu, "Trilu"),
           "scatter_elements": (ScatterElements, "ScatterElements"),
           "parameter_view": (ExpertWeights, "MatMul")}


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(BATCH, SEQ, H, generator=g), torch.randint(0, 100, (BATCH, SEQ, 3), generator=g)


def _module(name):
    torch.manual_seed(0)
    return MODULES[name][0]().eval()


def pytorch_saved_bytes(model, args) -> int:
    """Bytes of the distinct storages autograd saves for backward of sum(output), parameters, buffers and
    inputs left out."""
    skip = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers(), *args)}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip and storage.nbytes() > 0:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(*args)
    out.sum().backward()
    return sum(seen.values())


def export(name: str, exporter: str, path: str) -> str:
    """The module's export; the parameter views' without constant folding (which would turn each view
    into an initializer of its own, hiding the Gather and Slice of the parameter)."""
    model, args = _module(name), _inputs()
    fold = name != "parameter_view"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(model, args, path, dynamo=False, opset_version=17, input_names=["x", "ids"],
                              do_constant_folding=fold)
        else:
            pytest.importorskip("onnxscript")
            torch.onnx.export(model, args, dynamo=True, input_names=["x", "ids"], optimize=fold,
                              verbose=False).save(path)
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("long_tail")
    made: dict[tuple[str, str], str] = {}

    def get(name: str, exporter: str) -> str:
        if (name, exporter) not in made:
            made[name, exporter] = export(name, exporter, str(folder / f"{name}_{exporter}.onnx"))
        return made[name, exporter]

    return get


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", list(MODULES))
def test_saved_bytes_match_pytorch(exported, name, exporter):
    path = exported(name, exporter)
    op = MODULES[name][1]
    assert op in {n.op_type for n in onnx.load(path).graph.node}, f"the export writes no {op}"
    result = analyze(path, Options(batch=BATCH))
    assert result.profile.name == "pytorch", result.profile_reason
    assert not result.unsupported(), result.unsupported()
    sizes = [s.bytes for s in result.liveness.saved if s.tensor.kind == "activation"]
    assert None not in sizes
    theirs = pytorch_saved_bytes(_module(name), _inputs())
    assert theirs > 0
    assert sum(sizes) == theirs, ([(s.tensor.name, s.bytes) for s in result.liveness.saved
                                   if s.tensor.kind == "activation"], theirs)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_parameter_views_are_parameters(exported, exporter):
    """Every tensor computed from the parameter by constants alone (its Gather, Slice, Transpose) is the
    parameter, never an activation, in both exports."""
    result = analyze(exported("parameter_view", exporter), Options(batch=BATCH))
    graph = result.graph
    views = [n for n in graph.nodes if n.op_type in ("Gather", "Slice", "Transpose", "Squeeze")
             and any(t is not None and t.kind == "parameter" for t in n.inputs)]
    assert views, "the export has no view of the parameter"
    for n in views:
        assert all(t.kind == "parameter" for t in n.outputs if t is not None and t.is_float), n
    assert not [s for s in result.liveness.saved if s.tensor.kind == "activation"
                and s.tensor.producer is not None and s.tensor.producer in views]

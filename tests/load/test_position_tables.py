"""Sinusoidal position tables told by their values (fusecli/load/position_tables.py), against PyTorch.

RoFormer's ``nn.Embedding(..., _freeze=True)`` holds sin/cos of the positions and has requires_grad=False;
both torch exports write it as a parameter. Multiplied into q (RoFormer's rotary), a trained table would
make autograd keep q for the table's gradient: the frozen one keeps only the tables.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fusecli.load.position_tables import is_sinusoidal
from fusecli.pipeline import Options, analyze
from tests.grad.test_torch_long_tail import pytorch_saved_bytes

torch = pytest.importorskip("torch")
nn = torch.nn

BATCH, SEQ, H, POSITIONS = 2, 6, 8, 64


def roformer_table(n_pos: int, dim: int) -> np.ndarray:
    """transformers' RoFormerSinusoidalPositionalEmbedding.create_weight, as it is written there."""
    position_enc = np.array([[pos / np.power(10000, 2 * (j // 2) / dim) for j in range(dim)]
                             for pos in range(n_pos)])
    out = np.empty((n_pos, dim), dtype=np.float32)
    sentinel = dim // 2 if dim % 2 == 0 else (dim // 2) + 1
    out[:, 0:sentinel] = np.sin(position_enc[:, 0::2])
    out[:, sentinel:] = np.cos(position_enc[:, 1::2])
    return out


def xlm_table(n_pos: int, dim: int) -> np.ndarray:
    """XLM's create_sinusoidal_embeddings: sin and cos interleaved."""
    position_enc = np.array([[pos / np.power(10000, 2 * (j // 2) / dim) for j in range(dim)]
                             for pos in range(n_pos)])
    out = np.empty((n_pos, dim), dtype=np.float32)
    out[:, 0::2], out[:, 1::2] = np.sin(position_enc[:, 0::2]), np.cos(position_enc[:, 1::2])
    return out


def test_sinusoidal_tables_are_told_from_learned_ones():
    assert is_sinusoidal(roformer_table(POSITIONS, 32)) and is_sinusoidal(xlm_table(POSITIONS, 32))
    assert is_sinusoidal(roformer_table(7, 5))  # an odd width: sin takes the larger half
    rng = np.random.default_rng(0)
    assert not is_sinusoidal(rng.standard_normal((POSITIONS, 32)).astype(np.float32))
    nudged = roformer_table(POSITIONS, 32)
    nudged[3, 4] += 1e-3  # one trained step away
    assert not is_sinusoidal(nudged)


class Rotary(nn.Module):
    """RoFormer's rotary: its position table gathered by arange(seq), chunked into sin and cos, each
    repeated per pair, and q * cos + rotate(q) * sin."""

    def __init__(self, frozen: bool):
        super().__init__()
        self.q, self.o = nn.Linear(H, H), nn.Linear(H, H)
        self.positions = nn.Embedding(POSITIONS, H, _freeze=frozen)
        if frozen:
            with torch.no_grad():
                self.positions.weight.copy_(torch.from_numpy(roformer_table(POSITIONS, H)))

    def forward(self, x):
        s = x.shape[1]
        sin, cos = self.positions(torch.arange(s)).chunk(2, dim=-1)
        sin = torch.stack([sin, sin], dim=-1).reshape(s, H)
        cos = torch.stack([cos, cos], dim=-1).reshape(s, H)
        q = self.q(x)
        rotated = torch.stack([-q[..., 1::2], q[..., ::2]], dim=-1).reshape_as(q)
        return self.o(q * cos + rotated * sin)


def _export(model, x, exporter: str, path: str) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17, input_names=["x"],
                              dynamic_axes={"x": {1: "seq"}})
        else:
            pytest.importorskip("onnxscript")
            seq = torch.export.Dim("seq", min=2, max=POSITIONS)
            torch.onnx.export(model, (x,), dynamo=True, input_names=["x"], dynamic_shapes=({1: seq},),
                              verbose=False).save(path)
    return path


@pytest.mark.parametrize("frozen", [True, False], ids=["frozen_sinusoidal", "learned"])
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_saved_bytes_match_pytorch(tmp_path, exporter, frozen):
    torch.manual_seed(0)
    model = Rotary(frozen).eval()
    x = torch.randn(BATCH, SEQ, H, generator=torch.Generator().manual_seed(0))
    a = analyze(_export(model, x, exporter, str(tmp_path / "rotary.onnx")),
                Options(batch=BATCH, dims={"seq": SEQ}))
    said = [w for w in a.warnings if "position table" in w]
    assert bool(said) == frozen, a.warnings
    ours = sum(s.bytes for s in a.liveness.saved if s.tensor.kind == "activation")
    assert ours == pytorch_saved_bytes(model, (x,)), [(s.tensor.name, s.bytes) for s in a.liveness.saved
                                                    if s.tensor.kind == "activation"]

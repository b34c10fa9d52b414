"""The PyTorch-side peak oracle (``hf_models.peak_memory``), checked by hand on a 2-layer MLP.

x (B, D) -> Linear(D, H) -> ReLU -> Linear(H, D) -> sum, fp32, eval(), gradients None before the step. The
profiler's allocation events carry the bytes each tensor asked the CPU allocator for (no rounding, no
allocator overhead), so the sums are exact. Forward: h = addmm (B*H), r = relu(h) (B*H; h frees after it, as
ReLU's backward keeps its result), y = addmm (B*D), loss (one float). Backward: the loss gradient (one
float), then Linear 2's grad_r (B*H), dW2 (H*D) and db2 (D) (each of its two mms copies the stride-0
gradient of sum, B*D, and frees the copy), ReLU's grad_h (B*H) after which grad_r and r free, then Linear 1's
dW1 (D*H) and db1 (H) (x needs no gradient: no mm for it) while grad_h is alive: the peak, at db1's sum.
With ``.grad`` None, AccumulateGrad keeps the buffers backward allocated (no copy). About 3 s, most of it
torch's import and the profiler's first start.
"""

from __future__ import annotations

import pytest

from tests import hf_models

B, D, H = 4, 256, 512
F = 4  # bytes of a float32


def _mlp(inplace: bool):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(D, H), torch.nn.ReLU(inplace=inplace), torch.nn.Linear(H, D))
    return model.eval(), (torch.randn(B, D),)


@pytest.mark.parametrize("inplace", [False, True], ids=["relu", "relu_"])
def test_mlp_peak_is_the_hand_count(inplace):
    pytest.importorskip("torch")
    model, args = _mlp(inplace)
    params = (D * H + H + H * D + D) * F
    resident = params + B * D * F
    grads = params  # one gradient per parameter, each its parameter's size
    out, loss, seed = B * D * F, F, F
    got = hf_models.peak_memory(model, args)
    assert got["resident"] == resident
    # forward: h and r both live inside relu; in place, relu_ allocates nothing and h is r
    forward = B * H * F + out + loss if inplace else 2 * B * H * F
    assert got["forward_peak"] == resident + forward
    # the last moment grad_h is alive: every gradient, the output, the loss and its gradient
    assert got["peak"] == resident + grads + out + loss + seed + B * H * F
    assert got["peak_op"] == "AddmmBackward0/aten::sum"
    assert got["end"] == resident + grads + out + loss  # the loss gradient frees as backward returns
    assert all(p.grad is not None for p in model.parameters())

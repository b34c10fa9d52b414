"""Memory totals as polynomials in the model's input dims (saved, saved activations, peak).

Each total is the sum of its tensors' byte polynomials (``sizes.tensor_formula``), so it is exact, not
fitted: evaluated at the analysis's own dims it gives the reported numbers. The peak's formula is the
bytes alive at the step where the peak falls at those dims (another size may move the peak elsewhere).
"""

from __future__ import annotations

from .ir import Tensor
from .liveness import Liveness
from .sizes import tensor_formula, total_formula

TOTALS = ("saved_bytes", "saved_activation_bytes", "peak_bytes")


def memory_formulas(live: Liveness) -> dict[str, str]:
    """Each total as a formula string; a tensor of unknown size is named, never dropped."""
    groups = {
        "saved_bytes": [s.tensor for s in live.saved],
        "saved_activation_bytes": [s.tensor for s in live.saved if s.tensor.kind == "activation"],
        "peak_bytes": live.live_at_peak,
    }
    out = {}
    for key, tensors in groups.items():
        poly, missing = total_formula(tensors)
        text = str(poly)
        if missing:
            text += f" + unknown ({missing} tensor{'s' if missing > 1 else ''} of unknown size)"
        out[key] = text
    return out


def tensor_bytes_formula(t: Tensor) -> str | None:
    """One tensor's bytes as a formula, or None when its rank or a dim is unknown."""
    f = tensor_formula(t.shape, t.dtype)
    return None if f is None else str(f)

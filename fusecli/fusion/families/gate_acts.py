"""Gate activations x * gate(x): silu / swish / quick_gelu, SwiGLU, hard_swish."""

from __future__ import annotations

from ...core.trees import Var, op
from ...spellings.acts import HARD_SWISH, SILU
from ..pattern_kit import (
    Pattern,
    is_activation,
    projected,
)

PATTERNS: tuple[Pattern, ...] = (
    Pattern("swiglu", tuple(op("mul", s, Var("up", check=is_activation), commutative=True, role="swiglu")
                            for s in SILU),
            "SwiGLU (silu(a) * b in one pass, as Liger-Kernel)",
            "y = silu(x W1) * (x W3) (W1 and W3 apart, or one projection split in two): backward reads "
            "a = x W1 and b = x W3, silu(a) is recomputed",
            require=lambda roles, bound: "act_beta" not in roles
            and projected(bound["act_in"]) and projected(bound["up"])),
    Pattern("silu", SILU, "SiLU / Swish / QuickGelu (one elementwise kernel)",
            "y = x sigmoid(beta x): backward reads x and recomputes sigmoid (PyTorch's silu saves x only)"),
    Pattern("hard_swish", HARD_SWISH[1:], "HardSwish",
            "y = x relu6(x + 3) / 6: one op whose backward reads x"),
)

KERNELS = {"silu": "silu", "swiglu": "swiglu", "hard_swish": "hard_swish"}

NOTES = {
    "swiglu": {"onnxruntime": (False, False, "no ONNX Runtime fusion of silu(a) * b"),
               "pytorch": (None, None, "torch.compile or Liger-Kernel's SwiGLU fuse silu(a) * b, recomputing "
                           "silu(a)")},
    "silu": {"tensorflow": (None, False, "Sigmoid + Mul becomes _MklSwish only in oneDNN CPU builds"),
             "onnxruntime": (True, True, "QuickGelu(alpha) (QuickGeluFusion: x * sigmoid(alpha x))"),
             "pytorch": (True, True, "F.silu is one kernel that saves x and recomputes sigmoid in backward")},
    "hard_swish": {"onnxruntime": (False, False, "no fusion of the decomposed form (the HardSwish op itself "
                                   "is one kernel)"),
                   "pytorch": (True, True, "F.hardswish is one kernel that saves x")},
}

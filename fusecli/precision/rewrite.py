"""What ``--precision`` applied (``Precision``, for the report and JSON); the Cast nodes it adds are
core/casts.py's ``Rewrite``: shared by PyTorch's rules (transform) and Keras's (keras)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.casts import ONNX_DTYPES, Rewrite


@dataclass
class Precision:
    """What ``--precision`` applied, for the report and JSON."""

    name: str  # one of PRECISIONS
    device: str
    dtype: str  # the lower (or only) float dtype
    casts: int = 0  # Cast nodes added
    assumed: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"precision": self.name, "device": self.device, "dtype": self.dtype, "casts_added": self.casts,
                "assumed": self.assumed}


__all__ = ["ONNX_DTYPES", "Precision", "Rewrite"]

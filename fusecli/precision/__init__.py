"""Training precision as the framework runs it (``--precision``): the forward graph's dtypes rewritten
before backward is built, so that saved bytes, the peak and plans count what a mixed-precision step
keeps. ``autocast`` holds PyTorch's op lists, ``transform`` applies a precision to a graph."""

from .transform import PRECISIONS, Precision, apply_precision, precision_entry

__all__ = ["PRECISIONS", "Precision", "apply_precision", "precision_entry"]

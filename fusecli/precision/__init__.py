"""Training precision as the framework runs it (``--precision``): the forward graph's dtypes rewritten
before backward is built, so that saved bytes, the peak and plans count what a mixed-precision step
keeps. ``autocast`` holds PyTorch's op lists, ``transform`` applies a precision to a graph. This module
holds only the names, so that the command line reads them without importing the passes."""

PRECISIONS = ("fp32", "bf16", "fp16", "amp-bf16", "amp-fp16")

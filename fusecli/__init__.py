"""fusecli: which ops may be fused for inference and for training, and why not where not."""

__version__ = "0.1.0"

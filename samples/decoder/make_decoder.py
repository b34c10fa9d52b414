"""Write a small Llama-style decoder as ONNX, for ``fusecli plan``'s distributed layouts:
``python samples/decoder/make_decoder.py [OUT.onnx]`` (needs torch, transformers and onnxscript).

2 layers, hidden 64, 4 query heads sharing 2 K/V heads (grouped-query attention), vocab 100, rotary
positions; the default attention (sdpa), weights seeded; exported by torch's dynamo exporter with dynamic
``batch`` and ``seq``.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path


def main(out: str) -> None:
    import torch
    import transformers as tr

    torch.manual_seed(0)
    config = tr.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    inner = tr.LlamaModel(config).eval()

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids):
            return self.inner(input_ids=input_ids).last_hidden_state

    ids = torch.randint(0, 100, (2, 16))
    shapes = ({0: torch.export.Dim("batch", min=1, max=1024), 1: torch.export.Dim("seq", min=2, max=4096)},)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(Decoder(), (ids,), dynamo=True, dynamic_shapes=shapes,
                                    input_names=["input_ids"], output_names=["output"])
    program.save(out)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).with_name("llama_tiny.onnx")))

"""A trial on architectures the tests do not build: what a new user gets from `fusecli analyze`.

Each architecture is a small `transformers` model (2 layers, hidden 64, random weights) with its DEFAULT
attention, exported by both torch exporters (TorchScript with dynamic axes, dynamo). Per export: attention
blocks found, near misses, ops without a gradient rule, tensors of unknown size, and saved-activation
bytes against PyTorch's own `saved_tensors_hooks` at batch 2, seq 32.

    python benchmarks/trial_exports.py [ARCH ...] > benchmarks/RESULTS-trial.md
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from tests import hf_models  # noqa: E402

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
             vocab_size=100, max_position_embeddings=256)
ARCHS = {  # model_type -> config overrides (transformers' AutoConfig.for_model)
    "falcon": dict(new_decoder_architecture=True, num_kv_heads=2),
    "qwen3": dict(num_key_value_heads=2, head_dim=32),
    "gemma": dict(num_key_value_heads=2, head_dim=32),
    "gemma3_text": dict(num_key_value_heads=2, head_dim=32, sliding_window=8),
    "olmo": dict(num_key_value_heads=2),
    "olmo2": dict(num_key_value_heads=2),
    "stablelm": dict(num_key_value_heads=2),
    "gptj": dict(n_embd=64, n_layer=2, n_head=2, rotary_dim=16, n_positions=256),
    "codegen": dict(n_embd=64, n_layer=2, n_head=2, rotary_dim=16, n_positions=256, n_ctx=256),
    "granite": dict(num_key_value_heads=2),
    "starcoder2": dict(num_key_value_heads=2),
    "phi": dict(num_key_value_heads=2),
    "xlm-roberta": dict(pad_token_id=1, max_position_embeddings=260),
    "electra": dict(embedding_size=64),
    "albert": dict(embedding_size=32),
    "qwen2_moe": dict(num_key_value_heads=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
                      num_experts=4, num_experts_per_tok=2),
    "olmoe": dict(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2),
    # ESM-2's rotary (a non-persistent inv_freq buffer TorchScript writes as a float initializer)
    "esm": dict(position_embedding_type="rotary", pad_token_id=1, mask_token_id=2),
    # multi-head latent attention (k = new_empty + two slice copy_: ScatterND in TorchScript), a dense
    # first layer then routed experts
    "deepseek_v3": dict(num_key_value_heads=2, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
                        qk_nope_head_dim=16, v_head_dim=16, moe_intermediate_size=32, n_routed_experts=4,
                        num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1),
    # FalconConfig's default: one K/V head for every query head (multi_query), the old decoder
    "falcon_multi_query": dict(model_type="falcon"),
    "gpt_neox": dict(rotary_pct=0.5),  # q, k, v split from one projection's output
}
MOE_TYPES = ("qwen2_moe", "olmoe", "deepseek_v3")  # built with transformers' eager experts
BATCH, SEQ = 2, 32


def build(model_type: str):
    import torch
    import transformers as tr

    torch.manual_seed(0)
    overrides = dict(ARCHS[model_type])
    config = tr.AutoConfig.for_model(overrides.pop("model_type", model_type), **{**SMALL, **overrides})
    kw = {"experts_implementation": "eager"} if model_type in MOE_TYPES else {}
    inner = tr.AutoModel.from_config(config, **kw).eval()
    hf_models.perturb_vectors(inner)  # as the tests' models: identical norms would merge in a dynamo export

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, ids):
            return self.inner(input_ids=ids).last_hidden_state

    return Wrapped().eval(), inner.config._attn_implementation


def export(model, path: str, exporter: str) -> None:
    import torch

    ids = torch.randint(0, 100, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(model, (ids,), path, dynamo=False, opset_version=17, input_names=["input_ids"],
                              output_names=["output"], dynamic_axes={"input_ids": {0: "batch", 1: "seq"}})
        else:
            dims = {0: torch.export.Dim("batch", min=1, max=64), 1: torch.export.Dim("seq", min=2, max=256)}
            torch.onnx.export(model, (ids,), dynamo=True, dynamic_shapes=(dims,), input_names=["input_ids"],
                              output_names=["output"], verbose=False).save(path)


def pytorch_saved_bytes(model) -> int:
    """The tests' judge (``hf_models.saved_storages``): distinct storages the autograd nodes of backward
    keep, neither parameters, buffers nor the input."""
    import torch

    ids = torch.randint(0, 100, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    return sum(b for _, _, b in hf_models.saved_storages(model, (ids,)))


def trial(model_type: str, folder: str) -> list[str]:
    from fusecli.pipeline import Options, analyze
    from fusecli.report.document import to_json

    rows = []
    model, attn = build(model_type)
    pytorch = pytorch_saved_bytes(model)
    for exporter in ("torchscript", "dynamo"):
        path = os.path.join(folder, f"{model_type}_{exporter}.onnx")
        try:
            export(model, path, exporter)
        except Exception as e:  # the exporter's own refusal is a result too
            rows.append(f"| {model_type} | {attn} | {exporter} | export failed: {type(e).__name__} | | | | |")
            continue
        a = analyze(path, Options(batch=BATCH, dims={"seq": SEQ}, routing="balanced"))
        doc = to_json(a)
        attention = sum(p["pattern"] == "attention" for p in doc["patterns"])
        unsupported = ", ".join(f"{u['op']} x{u['count']}" for u in doc["unsupported"]) or "-"
        ratio = doc["memory"]["saved_activation_bytes"] / pytorch
        rows.append(f"| {model_type} | {attn} | {exporter} | {attention} | {len(doc['near_misses'])} | "
                    f"{unsupported} | {doc['memory']['unknown_tensors']} | {ratio:.3f} |")
    return rows


def main(argv: list[str]) -> None:
    names = argv or list(ARCHS)
    print("| model | attention | exporter | attention blocks | near misses | unsupported | unknown tensors "
          "| saved activations / PyTorch |")
    print("|---|---|---|---:|---:|---|---:|---:|")
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            try:
                rows = trial(name, folder)
            except Exception as e:
                traceback.print_exc(file=sys.stderr)
                rows = [f"| {name} | | | build failed: {type(e).__name__}: {str(e)[:80]} | | | | |"]
            for r in rows:
                print(r, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

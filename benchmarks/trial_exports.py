"""A trial on architectures the tests do not build: what a new user gets from `fusecli analyze`.

Each architecture is a small `transformers` model (2 layers, hidden 64, random weights) with its DEFAULT
attention, fed what a user feeds it (KINDS: an attention_mask with a padded row for encoders, pixel_values,
input_values, decoder_input_ids for encoder-decoders), exported by both torch exporters (TorchScript
with dynamic axes, dynamo). Per export: attention
blocks found, near misses, ops without a gradient rule, tensors of unknown size, and saved-activation
bytes against PyTorch's own `saved_tensors_hooks` at batch 2, seq 32.

    python benchmarks/trial_exports.py [ARCH ...] > table.md
    python benchmarks/trial_exports.py --storages ARCH torchscript|dynamo  # per-storage accounting
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from tests import hf_models  # noqa: E402

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
             vocab_size=100, max_position_embeddings=256)
VISION_SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                    image_size=32, patch_size=8)
SEQ2SEQ_SMALL = dict(vocab_size=100, d_model=64, encoder_layers=2, decoder_layers=2,
                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=128,
                     decoder_ffn_dim=128, max_position_embeddings=256, pad_token_id=1, bos_token_id=0,
                     eos_token_id=2, decoder_start_token_id=2)
SPEECH_SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                    vocab_size=32,
                    conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                    num_conv_pos_embedding_groups=2)
# what a user feeds each kind (KINDS: forward()'s inputs, in order):
#   decoder: input_ids; encoder: input_ids and an attention_mask with a padded row; vision: pixel_values
#   (3 x 32 x 32; stages: a hierarchical model's own config); speech: input_values (raw samples);
#   seq2seq: input_ids, attention_mask (a padded row) and decoder_input_ids
#   whisper: input_features (mel frames) and decoder_input_ids
KINDS = {"decoder": ("input_ids",), "encoder": ("input_ids", "attention_mask"), "vision": ("pixel_values",),
         "stages": ("pixel_values",),
         "speech": ("input_values",), "seq2seq": ("input_ids", "attention_mask", "decoder_input_ids"),
         "whisper": ("input_features", "decoder_input_ids")}
FEEDS = {"decoder": "ids", "encoder": "ids + padded mask", "vision": "pixels", "stages": "pixels",
         "speech": "samples", "seq2seq": "ids + padded mask + decoder ids",
         "whisper": "mel frames + decoder ids"}  # the table's input column
BASE = {"decoder": SMALL, "encoder": SMALL, "vision": VISION_SMALL, "stages": dict(image_size=32),
        "speech": SPEECH_SMALL, "seq2seq": SEQ2SEQ_SMALL, "whisper": {}}
ARCHS = {  # model_type -> (kind, config overrides) (transformers' AutoConfig.for_model)
    "falcon": ("decoder", dict(new_decoder_architecture=True, num_kv_heads=2)),
    "qwen3": ("decoder", dict(num_key_value_heads=2, head_dim=32)),
    "gemma": ("decoder", dict(num_key_value_heads=2, head_dim=32)),
    "gemma3_text": ("decoder", dict(num_key_value_heads=2, head_dim=32, sliding_window=8)),
    "olmo": ("decoder", dict(num_key_value_heads=2)),
    "olmo2": ("decoder", dict(num_key_value_heads=2)),
    "stablelm": ("decoder", dict(num_key_value_heads=2)),
    "gptj": ("decoder", dict(n_embd=64, n_layer=2, n_head=2, rotary_dim=16, n_positions=256)),
    "codegen": ("decoder", dict(n_embd=64, n_layer=2, n_head=2, rotary_dim=16, n_positions=256, n_ctx=256)),
    "granite": ("decoder", dict(num_key_value_heads=2)),
    "starcoder2": ("decoder", dict(num_key_value_heads=2)),
    "phi": ("decoder", dict(num_key_value_heads=2)),
    "xlm-roberta": ("encoder", dict(pad_token_id=1, max_position_embeddings=260)),
    "electra": ("encoder", dict(embedding_size=64)),
    "albert": ("encoder", dict(embedding_size=32)),
    "qwen2_moe": ("decoder", dict(num_key_value_heads=2, moe_intermediate_size=64,
                                  shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2)),
    "olmoe": ("decoder", dict(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2)),
    # ESM-2's rotary (a non-persistent inv_freq buffer TorchScript writes as a float initializer)
    "esm": ("encoder", dict(position_embedding_type="rotary", pad_token_id=1, mask_token_id=2)),
    # multi-head latent attention (k = new_empty + two slice copy_: ScatterND in TorchScript), a dense
    # first layer then routed experts
    "deepseek_v3": ("decoder", dict(num_key_value_heads=2, q_lora_rank=32, kv_lora_rank=16,
                                    qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                                    moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                                    n_group=1, topk_group=1, first_k_dense_replace=1)),
    # FalconConfig's default: one K/V head for every query head (multi_query), the old decoder
    "falcon_multi_query": ("decoder", dict(model_type="falcon")),
    # differential attention: two sdpa calls per layer on the same q, k (one per half of V), a GroupNorm
    "diffllama": ("decoder", dict(num_key_value_heads=2)),
    # xIELU: a learned activation of one-element parameters (softplus, expm1)
    "apertus": ("decoder", dict(num_key_value_heads=2)),
    "gpt_neox": ("decoder", dict(rotary_pct=0.5)),  # q, k, v split from one projection's output
    # issue 43: encoders with a padded row, vision, speech and encoder-decoder models
    "roberta": ("encoder", dict(pad_token_id=1, max_position_embeddings=260)),
    "data2vec-text": ("encoder", dict(pad_token_id=1, max_position_embeddings=260)),
    "mobilebert": ("encoder", dict(embedding_size=32, true_hidden_size=32, intra_bottleneck_size=32,
                                   num_feedforward_networks=2)),  # bottlenecks, NoNorm
    "gpt_bigcode": ("decoder", dict(n_embd=64, n_layer=2, n_head=2, n_positions=256, bos_token_id=0,
                                    eos_token_id=0)),  # multi-query
    "biogpt": ("decoder", {}),
    "xglm": ("decoder", dict(d_model=64, num_layers=2, attention_heads=2, ffn_dim=128)),
    "mpt": ("decoder", dict(d_model=64, n_heads=2, n_layers=2, expansion_ratio=2, max_seq_len=256)),  # ALiBi
    "persimmon": ("decoder", {}),  # q/k LayerNorms, partial rotary
    "nemotron": ("decoder", dict(num_key_value_heads=2, head_dim=32)),  # squared-ReLU MLP, partial rotary
    "helium": ("decoder", dict(num_key_value_heads=2, head_dim=32)),
    # interleaved partial rotary
    "glm": ("decoder", dict(num_key_value_heads=2, head_dim=32, pad_token_id=0, eos_token_id=0)),
    "deit": ("vision", {}),
    "dinov2": ("vision", dict(mlp_ratio=2)),  # layer scale
    "yolos": ("vision", dict(image_size=[32, 32], num_detection_tokens=4)),  # detection tokens, interpolated
    "swinv2": ("stages", dict(patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4)),
    "levit": ("stages", dict(image_size=64, hidden_sizes=[32, 64], num_attention_heads=[2, 4], depths=[1, 1],
                             key_dim=[8, 8], mlp_ratio=[2, 2], attention_ratio=[2, 2],
                             down_ops=[["Subsample", 8, 4, 4, 2, 2]])),  # conv stem, attention subsampling
    "wav2vec2": ("speech", {}),
    "marian": ("seq2seq", dict(decoder_start_token_id=1)),
    "pegasus": ("seq2seq", {}),
    "mbart": ("seq2seq", {}),
    "t5": ("seq2seq", dict(d_model=64, d_kv=32, d_ff=128, num_layers=2, num_heads=2, decoder_start_token_id=0,
                           pad_token_id=0)),
    # held out until the merges of 2026-11-28: encoders with rotary, grouped and conv attention, speech
    # models with a gated relative bias, two more encoder-decoders, and decoders with their MoE variants
    "roformer": ("encoder", dict(embedding_size=64)),  # rotary in an encoder
    "squeezebert": ("encoder", dict(embedding_size=64)),  # grouped 1x1 convs for q, k, v and the FFN
    "convbert": ("encoder", dict(embedding_size=64)),  # span-based dynamic conv beside attention
    "rembert": ("encoder", dict(input_embedding_size=32, output_embedding_size=32)),
    "wavlm": ("speech", {}),  # gated relative position bias
    "data2vec-audio": ("speech", dict(num_conv_pos_embeddings=2, conv_pos_kernel_size=3)),
    "m2m_100": ("seq2seq", {}),
    "blenderbot": ("seq2seq", {}),
    "cohere2": ("decoder", dict(num_key_value_heads=2, sliding_window=8)),
    "smollm3": ("decoder", dict(num_key_value_heads=2, pad_token_id=0)),
    "granitemoe": ("decoder", dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)),
    "qwen3_moe": ("decoder", dict(num_key_value_heads=2, head_dim=32, num_experts=4, num_experts_per_tok=2,
                                  moe_intermediate_size=64)),
    "whisper": ("whisper", dict(vocab_size=100, d_model=64, encoder_layers=2, encoder_attention_heads=2,
                                decoder_layers=2, decoder_attention_heads=2, encoder_ffn_dim=128,
                                decoder_ffn_dim=128, num_mel_bins=hf_models.WHISPER_MELS,
                                max_source_positions=hf_models.WHISPER_FRAMES // 2, max_target_positions=256,
                                pad_token_id=0, bos_token_id=0, eos_token_id=0, decoder_start_token_id=0)),
}
# built with transformers' eager experts
MOE_TYPES = ("qwen2_moe", "olmoe", "deepseek_v3", "granitemoe", "qwen3_moe")
BATCH, SEQ = 2, 32
# the named dims each kind's export has besides batch (images have none)
DIMS = {"vision": {}, "stages": {}, "speech": {"samples": hf_models.SAMPLES_PER_STEP * SEQ},
        "seq2seq": {"seq": SEQ, "decoder_seq": SEQ}, "whisper": {"decoder_seq": SEQ}}


def build(model_type: str):
    import torch
    import transformers as tr

    torch.manual_seed(0)
    kind, overrides = ARCHS[model_type]
    overrides = dict(overrides)
    config = tr.AutoConfig.for_model(overrides.pop("model_type", model_type), **{**BASE[kind], **overrides})
    kw = {"experts_implementation": "eager"} if model_type in MOE_TYPES else {}
    inner = tr.AutoModel.from_config(config, **kw).eval()
    hf_models.perturb_vectors(inner)  # as the tests' models: identical norms would merge in a dynamo export
    names = KINDS[kind]

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, *args):  # what the export outputs is what the judge differentiates
            return self.inner(**dict(zip(names, args, strict=True))).last_hidden_state

    return Wrapped().eval(), inner.config._attn_implementation


def inputs(model_type: str):
    """The example inputs, as a user runs the model (KINDS), and each one's dynamic axes."""
    import torch

    g = torch.Generator().manual_seed(0)
    kind = ARCHS[model_type][0]
    text = {0: "batch", 1: "seq"}
    ids = torch.randint(3, 100, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.int64)
    mask[0, SEQ // 2:] = 0  # a padded row: the additive mask is not all zeros
    if kind == "decoder":
        return (ids,), (text,)
    if kind == "encoder":
        return (ids, mask), (text, text)
    decoder = {0: "batch", 1: "decoder_seq"}  # its own length: a source and a target need not match
    if kind == "seq2seq":
        return (ids, mask, torch.randint(3, 100, (BATCH, SEQ), generator=g)), (text, text, decoder)
    if kind in ("vision", "stages"):
        size = ARCHS[model_type][1].get("image_size", VISION_SMALL["image_size"])
        size = size[0] if isinstance(size, list) else size
        return (torch.randn(BATCH, 3, size, size, generator=g),), ({0: "batch"},)
    if kind == "speech":  # SAMPLES_PER_STEP raw samples per seq step, as the tests' HuBERT
        samples = torch.randn(BATCH, hf_models.SAMPLES_PER_STEP * SEQ, generator=g)
        return (samples,), ({0: "batch", 1: "samples"},)
    feats = torch.randn(BATCH, hf_models.WHISPER_MELS, hf_models.WHISPER_FRAMES, generator=g)
    return (feats, torch.randint(3, 100, (BATCH, SEQ), generator=g)), ({0: "batch"}, decoder)


@contextlib.contextmanager
def _stdout_to_stderr():
    """The TorchScript exporter prints the traced graph to stdout when it fails: keep the table clean."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def runs(model_type: str, path: str) -> str | None:
    """Why onnxruntime cannot run the export on the example inputs (one line), or None when it can."""
    import onnxruntime as ort

    args = inputs(model_type)[0]
    try:
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        session.run(None, {i.name: a.numpy() for i, a in zip(session.get_inputs(), args, strict=True)})
    except Exception as e:
        return f"{type(e).__name__}: {str(e).split(chr(10))[0][:100]}"
    return None


def export(model, model_type: str, path: str, exporter: str) -> None:
    import torch

    args, axes = inputs(model_type)
    names = list(KINDS[ARCHS[model_type][0]])
    with warnings.catch_warnings(), _stdout_to_stderr():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(model, args, path, dynamo=False, opset_version=17, input_names=names,
                              output_names=["output"], dynamic_axes=dict(zip(names, axes, strict=True)))
        else:
            dims = {"batch": torch.export.Dim("batch", min=1, max=64),
                    "seq": torch.export.Dim("seq", min=2, max=256),
                    "decoder_seq": torch.export.Dim("decoder_seq", min=2, max=256),
                    "samples": torch.export.Dim("samples", min=4 * hf_models.SAMPLES_PER_STEP, max=16000)}
            shapes = (tuple({i: dims[n] for i, n in a.items()} for a in axes),)  # forward(*args): one tuple
            torch.onnx.export(model, args, dynamo=True, dynamic_shapes=shapes, input_names=names,
                              output_names=["output"], verbose=False).save(path)


def pytorch_saved_bytes(model, model_type: str) -> int:
    """The tests' judge (``hf_models.saved_storages``): distinct storages the autograd nodes of backward
    keep, neither parameters, buffers nor the input, of the same module and inputs as the export."""
    return sum(b for _, _, b in hf_models.saved_storages(model, inputs(model_type)[0]))


def trial(model_type: str, folder: str) -> list[str]:
    from fusecli.pipeline import Options, analyze
    from fusecli.report.document import to_json

    rows = []
    model, attn = build(model_type)
    attn = f"{FEEDS[ARCHS[model_type][0]]} | {attn}"  # the input column, then the attention
    pytorch = pytorch_saved_bytes(model, model_type)
    for exporter in ("torchscript", "dynamo"):
        path = os.path.join(folder, f"{model_type}_{exporter}.onnx")
        try:  # the same weights (seed 0), built afresh: LeViT's eval forward caches its attention biases
            export(build(model_type)[0], model_type, path, exporter)
        except Exception as e:  # the exporter's own refusal is a result too
            rows.append(f"| {model_type} | {attn} | {exporter} | export failed: {type(e).__name__} | | | | |")
            continue
        broken = runs(model_type, path)
        if broken is not None:  # an export onnxruntime refuses is the exporter's failure, not fusecli's
            rows.append(f"| {model_type} | {attn} | {exporter} | export invalid: onnxruntime refuses it | "
                        f"| | | |")
            print(f"{model_type} {exporter}: {broken}", file=sys.stderr)
            continue
        dims = DIMS.get(ARCHS[model_type][0], {"seq": SEQ})
        a = analyze(path, Options(batch=BATCH, dims=dims, routing="balanced"))
        doc = to_json(a)
        attention = sum(p["pattern"] == "attention" for p in doc["patterns"])
        unsupported = ", ".join(f"{u['op']} x{u['count']}" for u in doc["unsupported"]) or "-"
        ratio = doc["memory"]["saved_activation_bytes"] / pytorch
        rows.append(f"| {model_type} | {attn} | {exporter} | {attention} | {len(doc['near_misses'])} | "
                    f"{unsupported} | {doc['memory']['unknown_tensors']} | {ratio:.3f} |")
    return rows


def pytorch_storages(model, model_type: str) -> list[tuple[int, tuple, str, list[str]]]:
    """PyTorch's saved storages one by one: (bytes, shape, dtype, the autograd nodes that save it), of the
    nodes backward runs (each node's ``_saved_*``), parameters, buffers and inputs left out."""
    import torch

    args = inputs(model_type)[0]
    skip = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers(), *args)}
    found: dict[int, tuple[int, tuple, str, list[str]]] = {}
    seen, stack = set(), [model(*args).float().sum().grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        for attr in (a for a in dir(fn) if a.startswith("_saved_")):
            try:
                value = getattr(fn, attr)
            except RuntimeError:
                continue
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > 0 \
                        and t.untyped_storage().data_ptr() not in skip:
                    storage = t.untyped_storage()
                    entry = found.setdefault(storage.data_ptr(), (
                        storage.nbytes(), tuple(t.shape), str(t.dtype).removeprefix("torch."), []))
                    entry[3].append(f"{fn.name()}.{attr.removeprefix('_saved_')}")
        stack.extend(f for f, _ in fn.next_functions)
    return sorted(found.values(), key=lambda e: -e[0])


def storages(model_type: str, exporter: str) -> None:
    """Per-storage accounting of one export: PyTorch's saved storages beside fusecli's saved activations,
    and the sizes whose counts differ."""
    import collections

    from fusecli.pipeline import Options, analyze

    theirs = pytorch_storages(build(model_type)[0], model_type)
    print(f"PyTorch: {sum(e[0] for e in theirs)} B")
    for size, shape, dtype, nodes in theirs:
        print(f"  {size:9d} {shape} {dtype} {sorted(set(nodes))}")
    with tempfile.TemporaryDirectory() as folder:
        path = export_to(build(model_type)[0], model_type, folder, exporter)
        a = analyze(path, Options(batch=BATCH, dims=DIMS.get(ARCHS[model_type][0], {"seq": SEQ}),
                                  routing="balanced"))
    ours = sorted((s for s in a.liveness.saved if s.tensor.kind == "activation"),
                  key=lambda s: -(s.bytes or 0))
    print(f"fusecli: {sum(s.bytes or 0 for s in ours)} B")
    for s in ours:
        made = s.tensor.producer.op_type if s.tensor.producer else "-"
        print(f"  {s.bytes or 0:9d} {s.tensor.name} {s.tensor.shape} {s.tensor.dtype} made by {made}, "
              f"read by {sorted({n.op_type for n in s.needed_by})}")
    mine, pt = collections.Counter(s.bytes or 0 for s in ours), collections.Counter(e[0] for e in theirs)
    print("sizes whose counts differ (bytes: PyTorch, fusecli):")
    for size in sorted(set(mine) | set(pt), reverse=True):
        if mine[size] != pt[size]:
            print(f"  {size}: {pt[size]}, {mine[size]}")


def export_to(model, model_type: str, folder: str, exporter: str) -> str:
    path = os.path.join(folder, f"{model_type}_{exporter}.onnx")
    export(model, model_type, path, exporter)
    return path


def main(argv: list[str]) -> None:
    if argv[:1] == ["--storages"]:  # --storages ARCH EXPORTER: where one export's bytes differ
        storages(argv[1], argv[2])
        return
    names = argv or list(ARCHS)
    print("| model | input | attention | exporter | attention blocks | near misses | unsupported "
          "| unknown tensors | saved activations / PyTorch |")
    print("|---|---|---|---|---:|---:|---|---:|---:|")
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            try:
                rows = trial(name, folder)
            except Exception as e:
                traceback.print_exc(file=sys.stderr)
                rows = [f"| {name} | | | | build failed: {type(e).__name__}: {str(e)[:80]} | | | | |"]
            for r in rows:
                print(r, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

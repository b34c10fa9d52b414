"""Small Hugging Face models built from `transformers` configs (random weights, nothing downloaded),
exported to ONNX by both torch exporters, and PyTorch's own record of what autograd saves.

One place for the test corpus: `build(name)` makes the eager-attention model (2 layers, hidden 64),
`export(name, path, exporter, dynamic, batch, seq)` writes the ONNX file (TorchScript exporter with
`dynamic_axes`, or the dynamo exporter with `dynamic_shapes`; `dynamic=False` fixes every dim), and
`pytorch_saved_bytes(name, batch, seq)` measures bytes of the distinct storages autograd saves that are
neither parameters nor model inputs (`torch.autograd.graph.saved_tensors_hooks`, model in eval()), of the
autograd nodes backward runs (a pooler the output does not use saves tensors that free with it).
The `hf_onnx` fixture in conftest.py caches each export once per test session.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

TEXT = ("bert", "distilbert", "gpt2", "llama", "mistral", "qwen2", "t5_encoder")
VISION = ("vit", "clip_vision", "convnext", "swin", "segformer", "mobilevit")
AUDIO = ("whisper_encoder",)
ALL = TEXT + VISION + AUDIO
# architectures built with their default attention only (the attention tests): encoders, decoders with and
# without grouped-query attention, ALiBi (BLOOM), soft-capping (Gemma2), cross-attention (BART), a
# relative-position bias (BEiT)
MORE_TEXT = ("roberta", "opt", "gpt_neox", "gemma", "gemma2", "gemma3_text", "bloom", "bart", "phi3",
             "deberta_v2", "esm", "deepseek_v3", "falcon_mq")
# mixture-of-experts with transformers' eager experts (a loop over experts, each fed the tokens
# nonzero(one_hot(topk(router)))[e] picks): its default, grouped_mm, has no TorchScript export (aten::histc)
MOE = ("mixtral",)
# TorchScript exports whose attention reads shapes of interior tensors (Shape(Cast(q)), Shape(Cast(k^T)))
# and scales by 1 / sqrt(Shape(q)[-1:]): the rewrite tests
SHAPE_READS = ("falcon", "codegen")
# grouped-query decoders, 4 query heads sharing 2 K/V heads (GroupQueryAttention's rewrite tests); the
# "_padded" one takes an attention_mask (a padding mask from the inputs' values)
GQA = ("llama_gqa", "qwen2_gqa", "llama_gqa_padded", "mistral_gqa",  # Mistral: a sliding window of 8 keys
       "qwen3_gqa", "starcoder2_gqa")  # Qwen3: q/k RMSNorms; Starcoder2: LayerNorm, biases, a GELU MLP
# falcon's new decoder with 2 K/V heads for 4: q, k, v from one query_key_value projection, each K/V head
# broadcast (broadcast_to) to its group of query heads, then the groups flattened
FUSED_GQA = ("falcon_gqa",)
# speech encoders read raw samples (input_values, its axis 1 named "samples": SAMPLES_PER_STEP samples per
# "seq" step); the dynamo export's conv output lengths are unnamed dims (unk..), one per copy
SPEECH = ("hubert", "wav2vec2")
SAMPLES_PER_STEP = 25  # seq 16 -> 400 samples -> 39 frames after the two convolutions (strides 5, 2)
REWRITE_TEXT = ("olmo",)
# an encoder fed packed full-length sequences, token ids only (no attention_mask: masked-LM pretraining's
# form, and what a pipeline stage, which takes one tensor, runs)
PACKED = ("distilbert_packed",)
# multi-query attention with its own repeat of the one K/V head (unsqueeze, expand, view of the cache's cat)
MULTI_QUERY = ("gpt_bigcode",)
# rotary on interleaved pairs (GPT-J's rotate_every_two: x[..., ::2], x[..., 1::2] stacked and flattened)
INTERLEAVED = ("cohere",)  # a Cast after each LayerNorm that the next residual reads too: the rewrite tests
MORE_VISION = ("beit", "swinv2")
ATTENTION = ("eager", "default")  # default: whatever transformers picks (sdpa where the model supports it)
IMAGE_SIZE = 32
WHISPER_MELS, WHISPER_FRAMES = 16, 64  # 2 * max_source_positions frames


@dataclass(frozen=True)
class Spec:
    inputs: tuple[str, ...]  # input names, in forward() order
    seq_axis: bool  # whether axis 1 of the inputs is a sequence the user can size


def spec(name: str) -> Spec:
    if name in ("bert", "distilbert", "roberta", "opt", "llama_gqa_padded", "deberta_v2"):
        return Spec(("input_ids", "attention_mask"), True)
    if name in (*TEXT, *MORE_TEXT, *MOE, *SHAPE_READS, *REWRITE_TEXT, *GQA, *FUSED_GQA, *INTERLEAVED, *PACKED,
                *MULTI_QUERY):
        return Spec(("input_ids",), True)
    if name in AUDIO:
        return Spec(("input_features",), False)
    if name in SPEECH:
        return Spec(("input_values",), True)
    return Spec(("pixel_values",), False)


def _config(name: str):
    import transformers as tr

    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)
    if name == "bert":
        return tr.BertConfig(vocab_size=100, max_position_embeddings=256, **small)
    if name in ("distilbert", "distilbert_packed"):
        return tr.DistilBertConfig(vocab_size=100, dim=64, n_layers=2, n_heads=2, hidden_dim=128,
                                   max_position_embeddings=256)
    if name == "gpt_bigcode":
        return tr.GPTBigCodeConfig(vocab_size=100, n_embd=64, n_layer=2, n_head=2, n_positions=256,
                                   bos_token_id=0, eos_token_id=0)  # multi_query: one K/V head
    if name == "gpt2":
        return tr.GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=2, n_positions=256, bos_token_id=0,
                              eos_token_id=0)
    if name in ("llama", "mistral", "qwen2"):
        cls = {"llama": tr.LlamaConfig, "mistral": tr.MistralConfig, "qwen2": tr.Qwen2Config}[name]
        return cls(vocab_size=100, max_position_embeddings=256, num_key_value_heads=1, head_dim=32,
                   **small)  # grouped-query attention: 2 query heads share one K/V head
    if name == "falcon_gqa":
        return tr.FalconConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                               new_decoder_architecture=True, num_kv_heads=2, max_position_embeddings=256)
    if name in GQA:
        cls = {"qwen2": tr.Qwen2Config, "mistral": tr.MistralConfig, "qwen3": tr.Qwen3Config,
               "starcoder2": tr.Starcoder2Config}.get(name.split("_")[0], tr.LlamaConfig)
        window = {"sliding_window": 8} if name.startswith("mistral") else {}
        return cls(vocab_size=100, max_position_embeddings=256, num_key_value_heads=2, head_dim=16,
                   **dict(small, num_attention_heads=4), **window)
    if name == "roberta":
        return tr.RobertaConfig(vocab_size=100, max_position_embeddings=260, pad_token_id=1, **small)
    if name == "opt":
        return tr.OPTConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, ffn_dim=128,
                            num_attention_heads=2, max_position_embeddings=256, word_embed_proj_dim=64,
                            pad_token_id=1, bos_token_id=0, eos_token_id=0)
    if name == "gpt_neox":
        return tr.GPTNeoXConfig(vocab_size=100, max_position_embeddings=256, rotary_pct=0.5, **small)
    if name == "gemma2":  # soft-capped attention logits (tanh(s / 50) * 50), tanh-GELU MLP
        return tr.Gemma2Config(vocab_size=100, max_position_embeddings=256, num_key_value_heads=1,
                               head_dim=32, sliding_window=8, **small)
    if name == "gemma":  # tanh-GELU MLP written x*(x*x) by TorchScript, sqrt(hidden)-scaled embeddings
        return tr.GemmaConfig(vocab_size=100, max_position_embeddings=256, num_key_value_heads=2, head_dim=32,
                              **small)
    if name == "gemma3_text":  # q/k norms, sliding-window and global layers, tanh-GELU MLP
        return tr.Gemma3TextConfig(vocab_size=100, max_position_embeddings=256, num_key_value_heads=2,
                                   head_dim=32, sliding_window=8, **small)
    if name == "deberta_v2":  # disentangled attention: relative positions gathered (GatherElements)
        return tr.DebertaV2Config(vocab_size=100, max_position_embeddings=256, pad_token_id=0,
                                  relative_attention=True, position_buckets=16, pos_att_type=["p2c", "c2p"],
                                  norm_rel_ebd="layer_norm", share_att_key=True, **small)
    if name == "phi3":  # gate and up as one projection, split in two (gate_up_proj)
        return tr.Phi3Config(vocab_size=100, max_position_embeddings=256, num_key_value_heads=2,
                             pad_token_id=0, bos_token_id=0, eos_token_id=0, **small)
    if name == "mixtral":  # 4 experts, top-2; gate and up as one 3-D parameter per layer
        return tr.MixtralConfig(vocab_size=100, max_position_embeddings=256, num_key_value_heads=2,
                                num_local_experts=4, num_experts_per_tok=2, **small)
    if name == "falcon":  # new decoder architecture: q, k, v from one projection, rotary, parallel MLP
        return tr.FalconConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                               new_decoder_architecture=True, num_kv_heads=2, max_position_embeddings=256)
    if name == "falcon_mq":  # FalconConfig's default: multi-query (one K/V head sdpa broadcasts), old decoder
        return tr.FalconConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                               max_position_embeddings=256)
    if name == "esm":  # rotary frequencies a persistent buffer (nn.Buffer): TorchScript writes an initializer
        return tr.EsmConfig(vocab_size=100, max_position_embeddings=256, position_embedding_type="rotary",
                            pad_token_id=1, mask_token_id=2, **small)
    if name == "deepseek_v3":  # multi-head latent attention (k: new_empty and two slice copy_), dense layers
        return tr.DeepseekV3Config(vocab_size=100, max_position_embeddings=256, num_key_value_heads=2,
                                   q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16,
                                   v_head_dim=16, first_k_dense_replace=2, **small)
    if name == "codegen":  # rotary on part of the head; k transposed before its Cast
        return tr.CodeGenConfig(vocab_size=100, n_embd=64, n_layer=2, n_head=2, rotary_dim=16,
                                n_positions=256, n_ctx=256, bos_token_id=0, eos_token_id=0)
    if name == "olmo":  # LayerNorm without weights, cast to float32 and back around it
        return tr.OlmoConfig(vocab_size=100, max_position_embeddings=256, pad_token_id=1, bos_token_id=0,
                             eos_token_id=0, **small)
    if name == "cohere":  # parallel attention and MLP, LayerNorm without bias, interleaved rotary
        return tr.CohereConfig(vocab_size=100, max_position_embeddings=256, num_key_value_heads=2,
                               pad_token_id=0, bos_token_id=1, eos_token_id=2, **small)
    if name == "hubert":  # conv feature encoder, conv position embedding, post-norm encoder
        return tr.HubertConfig(vocab_size=32, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                               num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, **small)
    if name == "wav2vec2":  # the same encoder, a weight-normalised positional conv (parametrizations)
        return tr.Wav2Vec2Config(vocab_size=32, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                                 num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, **small)
    if name == "bloom":  # ALiBi position bias
        return tr.BloomConfig(vocab_size=100, hidden_size=64, n_layer=2, n_head=2)
    if name == "bart":  # encoder-decoder: the decoder's cross-attention reads the encoder's output
        return tr.BartConfig(vocab_size=100, d_model=64, encoder_layers=2, decoder_layers=2,
                             encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=128,
                             decoder_ffn_dim=128, max_position_embeddings=256, pad_token_id=1,
                             bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    if name == "beit":  # relative-position bias added to the scores
        return tr.BeitConfig(image_size=IMAGE_SIZE, patch_size=8, use_relative_position_bias=True, **small)
    if name == "t5_encoder":
        return tr.T5Config(vocab_size=100, d_model=64, d_kv=32, d_ff=128, num_layers=2, num_heads=2)
    if name == "vit":
        return tr.ViTConfig(image_size=IMAGE_SIZE, patch_size=8, **small)
    if name == "clip_vision":
        return tr.CLIPVisionConfig(image_size=IMAGE_SIZE, patch_size=8, **small)
    if name == "whisper_encoder":
        return tr.WhisperConfig(vocab_size=100, d_model=64, encoder_layers=2, encoder_attention_heads=2,
                                decoder_layers=1, decoder_attention_heads=2, encoder_ffn_dim=128,
                                decoder_ffn_dim=128, num_mel_bins=WHISPER_MELS,
                                max_source_positions=WHISPER_FRAMES // 2, max_target_positions=32,
                                pad_token_id=0, bos_token_id=0, eos_token_id=0, decoder_start_token_id=0)
    if name == "convnext":
        return tr.ConvNextConfig(num_channels=3, num_stages=2, hidden_sizes=[16, 32], depths=[1, 1],
                                 image_size=IMAGE_SIZE)
    if name == "swin":
        return tr.SwinConfig(image_size=IMAGE_SIZE, patch_size=4, embed_dim=16, depths=[1, 1],
                             num_heads=[2, 2], window_size=4)
    if name == "swinv2":  # continuous position bias (an MLP on a coordinate table), cosine attention
        return tr.Swinv2Config(image_size=IMAGE_SIZE, patch_size=4, embed_dim=16, depths=[1, 1],
                               num_heads=[2, 2], window_size=4)
    if name == "segformer":
        return tr.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                                  hidden_sizes=[16, 32], num_attention_heads=[1, 2],
                                  patch_sizes=[7, 3], strides=[4, 2], decoder_hidden_size=32)
    if name == "mobilevit":
        return tr.MobileViTConfig(image_size=IMAGE_SIZE, hidden_sizes=[32, 48, 64],
                                  neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64])
    raise KeyError(name)


def perturb_vectors(model) -> None:
    """Norm gains near 1 and biases near 0, not exactly: fresh ones and zeros would hide swapped operands,
    and identical norms would let the dynamo exporter merge them (one LayerNorm where eager runs two)."""
    import torch

    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in pname.lower() or "ln" in pname.lower()) and "weight" in pname:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn_like(p))


def build(name: str, seed: int = 0, attn: str = "eager", layers: int = 2, kv_heads: int | None = None,
          cache: bool = True):
    """The model in eval() mode with non-trivial random weights, wrapped so that forward() takes the spec's
    inputs positionally and returns plain tensors. ``attn``: "eager" (matmul/softmax attention) or
    "default" (what `transformers` picks when the user says nothing: sdpa where the model supports it);
    ``layers``: the text models' layer count (2 unless a test needs more blocks to choose from);
    ``kv_heads``: Llama-like models' K/V heads (default 1: grouped-query attention; 2: one per query head,
    which TorchScript can export under sdpa); ``cache=False``: ``use_cache`` off, as activation
    checkpointing wants it (a cache updated again by a block's re-run would grow twice)."""
    import torch
    import transformers as tr

    torch.manual_seed(seed)
    config = _config(name)
    if layers != 2:
        config.num_hidden_layers = layers  # GPT-2's n_layer through its attribute_map
    if kv_heads is not None:
        config.num_key_value_heads = kv_heads
    if not cache and hasattr(config, "use_cache"):
        config.use_cache = False
    kw = {"attn_implementation": "eager"} if attn == "eager" else {}
    if name in MOE:
        kw["experts_implementation"] = "eager"
    if attn == "eager":
        config._attn_implementation = "eager"
    if name == "t5_encoder":
        inner = tr.T5EncoderModel._from_config(config, **kw)
    elif name == "whisper_encoder":
        inner = tr.WhisperModel._from_config(config, **kw).get_encoder()
    elif name == "clip_vision":
        inner = tr.CLIPVisionModel._from_config(config, **kw)
    else:
        inner = tr.AutoModel.from_config(config, **kw)
    perturb_vectors(inner)

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            out = self.inner(**dict(zip(spec(name).inputs, args, strict=True)))
            return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    return Wrapped().eval()


def example_inputs(name: str, batch: int = 2, seq: int = 16, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    s = spec(name)
    if s.inputs[0] == "input_ids":
        ids = torch.randint(0, 100, (batch, seq), generator=g)
        if len(s.inputs) == 2:
            mask = torch.ones(batch, seq, dtype=torch.int64)
            mask[0, seq // 2:] = 0  # a padded row: the additive mask is not all zeros
            return ids, mask
        return (ids,)
    if s.inputs[0] == "input_values":
        return (torch.randn(batch, SAMPLES_PER_STEP * seq, generator=g),)
    if s.inputs[0] == "input_features":
        return (torch.randn(batch, WHISPER_MELS, WHISPER_FRAMES, generator=g),)
    return (torch.randn(batch, 3, IMAGE_SIZE, IMAGE_SIZE, generator=g),)


def attention_of(name: str, attn: str = "default") -> str:
    """The attention implementation `build(name, attn=attn)` runs ("sdpa", "eager", ...)."""
    return build(name, attn=attn).inner.config._attn_implementation


def export(name: str, path: str, exporter: str = "torchscript", dynamic: bool = True,
           batch: int = 2, seq: int = 16, opset: int = 17, attn: str = "eager", layers: int = 2,
           kv_heads: int | None = None, cache: bool = True, precision: str = "fp32") -> str:
    """Write the ONNX export of `name` to `path` and return it. Dynamic dims are named `batch` and
    `seq` (text models) as users name them in `dynamic_axes`. ``precision``: "fp32", "bf16" (the model
    cast, ``at_precision``) or "amp-bf16" (traced under CPU autocast)."""
    import torch

    model, s = build(name, attn=attn, layers=layers, kv_heads=kv_heads, cache=cache), spec(name)
    model, args = at_precision(model, example_inputs(name, batch, seq), precision)
    second = "samples" if name in SPEECH else "seq"
    axes = {0: "batch", 1: second} if s.seq_axis else {0: "batch"}
    with warnings.catch_warnings(), autocast_of(precision), _repeated_kv(exporter), \
            _no_packed_sequences(exporter, cache):
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(model, args, path, dynamo=False, opset_version=opset,
                              input_names=list(s.inputs), output_names=["output"],
                              dynamic_axes={i: axes for i in s.inputs} if dynamic else None)
        elif exporter == "dynamo":
            shapes = None
            if dynamic:
                dims = {0: torch.export.Dim("batch", min=1, max=64)}
                if s.seq_axis and name in SPEECH:
                    dims[1] = torch.export.Dim("samples", min=4 * SAMPLES_PER_STEP, max=16000)
                elif s.seq_axis:
                    dims[1] = torch.export.Dim("seq", min=2, max=256)
                shapes = (tuple(dims for _ in s.inputs),)  # forward(*args): one entry, a tuple
            program = torch.onnx.export(model, args, dynamo=True, dynamic_shapes=shapes,
                                        input_names=list(s.inputs), output_names=["output"], verbose=False)
            program.save(path)
        else:
            raise ValueError(exporter)
    return path


def _repeated_kv(exporter: str):
    """TorchScript cannot export sdpa's enable_gqa: transformers' own repeat of the K/V heads (repeat_kv)
    instead, the form it exports whenever a mask is passed, and always before it used enable_gqa."""
    import contextlib

    if exporter != "torchscript":
        return contextlib.nullcontext()
    from unittest import mock

    from transformers.integrations import sdpa_attention

    return mock.patch.object(sdpa_attention, "use_gqa_in_sdpa", lambda *args, **kwargs: False)


def _no_packed_sequences(exporter: str, cache: bool):
    """Without a cache or a mask, transformers probes position_ids for packed sequences (torch.diff, which
    TorchScript cannot export; under tracing it keeps the probe's tensor and masks by it). Eager finds no
    packing in these inputs and returns None: the trace is told the same."""
    import contextlib

    if exporter != "torchscript" or cache:
        return contextlib.nullcontext()
    from unittest import mock

    from transformers import masking_utils

    return mock.patch.object(masking_utils, "find_packed_sequence_indices", lambda position_ids: None)


def at_precision(model, args, precision: str):
    """The model and inputs as a step at ``precision`` gets them: "bf16" casts the model and its float
    inputs (model.to(torch.bfloat16)); "fp32" and "amp-bf16" leave both as they are."""
    import torch

    if precision != "bf16":
        return model, args
    return model.to(torch.bfloat16), tuple(a.to(torch.bfloat16) if a.is_floating_point() else a for a in args)


def autocast_of(precision: str):
    """The context a step at ``precision`` runs in: CPU autocast for "amp-bf16", else none."""
    import contextlib

    import torch

    return torch.autocast("cpu", torch.bfloat16) if precision == "amp-bf16" else contextlib.nullcontext()


def pytorch_saved_at(name: str, precision: str, batch: int = 2, seq: int = 16, attn: str = "default") -> int:
    """``pytorch_saved_bytes`` of a step at ``precision`` (at_precision, autocast_of)."""
    model, args = at_precision(build(name, attn=attn), example_inputs(name, batch, seq), precision)
    with autocast_of(precision):
        return sum(b for _, _, b in saved_storages(model, args))


def pytorch_saved(name: str, batch: int = 2, seq: int = 16, attn: str = "eager",
                  seed: int = 0) -> list[tuple[tuple[int, ...], str, int]]:
    """What PyTorch's autograd saves for backward of `sum(output)`, one entry per distinct storage that is
    neither a parameter nor a model input: (shape, dtype, storage bytes); ``seed`` draws the input."""
    return saved_storages(build(name, attn=attn), example_inputs(name, batch, seq, seed))


def saved_storages(model, args, held_by=()) -> list[tuple[tuple[int, ...], str, int]]:
    """``pytorch_saved`` of a given model (eval() mode) and inputs. ``held_by``: submodules run under
    activation checkpointing; the tensors they are called with count too, as the checkpoint holds them
    for its re-run whether or not torch routes them through saved_tensors_hooks (non-reentrant
    checkpoint's own hooks hide everything saved inside the region from the outer hooks)."""
    import torch

    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    skip |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    skip |= {a.untyped_storage().data_ptr() for a in args}
    seen: dict[int, tuple[tuple[int, ...], str, int]] = {}

    def pack(t):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in skip and ptr not in seen and storage.nbytes() > 0:
            seen[ptr] = (tuple(t.shape), str(t.dtype).removeprefix("torch."), storage.nbytes())
        return t

    held_storages: set[int] = set()

    def held(module, args, kwargs):
        stack = [*args, *kwargs.values()]  # tuples too: transformers passes (cos, sin) as one kwarg
        while stack:
            t = stack.pop()
            if isinstance(t, (tuple, list)):
                stack.extend(t)
            elif isinstance(t, torch.Tensor):
                pack(t)
                held_storages.add(t.untyped_storage().data_ptr())

    handles = [m.register_forward_pre_hook(held, with_kwargs=True) for m in held_by]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(*args)
        loss = out.float().sum()
        # what a dead branch saved (a pooler the output does not use) frees with it
        reached = _reachable_storages(loss) | held_storages
        seen = {ptr: v for ptr, v in seen.items() if ptr in reached}
        loss.backward()
    finally:
        for h in handles:
            h.remove()
    return list(seen.values())


def _reachable_storages(loss) -> set[int]:
    """Storages of the tensors saved by the autograd nodes that backward of ``loss`` runs: each node's
    ``_saved_*`` attributes (a Python Function's ``saved_tensors``)."""
    import torch

    out, seen, stack = set(), set(), [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        for attr in dir(fn):
            if attr.startswith("_saved_") or attr == "saved_tensors":
                try:
                    value = getattr(fn, attr)
                except RuntimeError:  # freed, or not a tensor this node kept
                    continue
                for t in value if isinstance(value, (list, tuple)) else (value,):
                    if isinstance(t, torch.Tensor):
                        out.add(t.untyped_storage().data_ptr())
        stack.extend(f for f, _ in fn.next_functions)
    return out


def pytorch_saved_bytes(name: str, batch: int = 2, seq: int = 16, attn: str = "eager", seed: int = 0) -> int:
    return sum(b for _, _, b in pytorch_saved(name, batch, seq, attn, seed))


def pytorch_peak_bytes(name: str, batch: int = 2, seq: int = 16, attn: str = "default",
                       seed: int = 0) -> dict:
    """Peak of live CPU bytes over one eager fp32 training step of `name` (forward, ``sum(output)``, backward;
    model in eval() as in ``pytorch_saved_bytes``; parameter gradients start as None so backward allocates
    them): ``peak_memory`` of ``build(name, attn=attn)`` on ``example_inputs(name, batch, seq, seed)``."""
    return peak_memory(build(name, attn=attn), example_inputs(name, batch, seq, seed))


def peak_memory(model, args) -> dict:
    """Live-byte peak of ``loss = model(*args).float().sum(); loss.backward()`` on CPU, from the profiler's
    allocation events (``torch.profiler.profile(profile_memory=True)``).

    Returns ``peak`` (resident + the largest running sum of the allocations and frees in the profiled
    region), ``resident`` (the distinct storages of parameters, buffers and inputs, alive before it),
    ``forward_peak`` (resident + the largest running sum up to the start of backward), ``peak_op``
    (the op whose allocation reached the peak: ``"MulBackward0/aten::mul"``,
    ``"aten::layer_norm/aten::empty"``), ``peak_in`` ("forward" or "backward") and ``end`` (resident + the
    running sum when backward returns: gradients, output and loss).

    Which events: torch 2.13's ``prof.events()`` folds every allocation made inside an op into that op's
    ``cpu_memory_usage`` and lists as ``[memory]`` only those made outside any op (mostly the frees autograd
    does between nodes): summed alone they only go down. Replaying each op's ``self_cpu_memory_usage`` by
    op start puts a node's frees (counted on its ``evaluate_function`` parent, which starts first) before
    its children's allocations and hides a temporary's peak inside an op (an mm cloning its stride-0
    gradient): on the MLP of tests/memory/test_peak_oracle.py it gives 1051656 B above resident where the
    peak is 1063944 B, on GPT-2 at seq 128 9% low. The raw allocation records of
    ``kineto_results.experimental_event_tree()`` (what ``torch.profiler._memory_profiler`` reads) carry each
    allocation and free with its size, pointer, time and enclosing op: those are summed here, in time
    order. A free counts only when this region allocated the pointer: the CPU allocator reports no free of
    a block it allocated while no profiler ran, but it does report one of a block allocated during an
    earlier profiled region (an earlier model's garbage), which would otherwise count as a negative.

    What this does not see: memory that does not come from c10's CPU allocator (oneDNN/MKL scratch space,
    Python objects), and allocations on threads that do not carry the profiler's thread-local state (the
    OpenMP workers of an intra-op parallel loop; ATen's kernels allocate their outputs and buffers on the
    calling thread, and CPU autograd runs backward on the calling thread)."""
    import gc

    import torch
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile, record_function

    storages: dict[int, int] = {}
    for t in (*model.parameters(), *model.buffers(), *args):
        if isinstance(t, torch.Tensor):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    resident = sum(storages.values())
    for p in model.parameters():
        p.grad = None
    gc.collect()  # no earlier garbage freed inside the region
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = model(*args)
        loss = out.float().sum()
        with record_function("## backward ##"):
            loss.backward()
    events, backward_start = [], None
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        if e.typed[0] == _EventType.Allocation:
            events.append(e)
        elif e.name == "## backward ##":
            backward_start = e.start_time_ns
        stack.extend(e.children)
    assert backward_start is not None, "the profiler recorded no backward"
    events.sort(key=lambda e: e.start_time_ns)
    live: dict[int, int] = {}  # pointer -> bytes, of the blocks this region allocated and has not freed
    total = peak = forward_peak = 0
    peak_event = None
    for e in events:
        size, ptr = e.extra_fields.alloc_size, e.extra_fields.ptr
        if size > 0:
            live[ptr] = size
        elif live.pop(ptr, None) is None:
            continue  # a block allocated before the region
        total += size
        if total > peak:
            peak, peak_event = total, e
        if e.start_time_ns < backward_start:
            forward_peak = max(forward_peak, total)
    return {"peak": resident + peak, "resident": resident, "forward_peak": resident + forward_peak,
            "peak_op": _op_of(peak_event), "peak_in": "forward" if peak == forward_peak else "backward",
            "end": resident + total}


def _op_of(event) -> str | None:
    """The op an allocation event happened in, under the autograd node running it ("MulBackward0/aten::mul")
    or, outside backward's nodes, under the outermost op ("aten::layer_norm/aten::empty")."""
    if event is None:
        return None
    ops, e = [], event.parent
    while e is not None:
        if e.name != "## backward ##":
            ops.append(e.name)
        e = e.parent
    if not ops:
        return "[memory]"
    node = next((n.removeprefix("autograd::engine::evaluate_function: ") for n in ops
                 if n.startswith("autograd::engine::evaluate_function: ")), ops[-1])
    return f"{node}/{ops[0]}" if node != ops[0] else ops[0]

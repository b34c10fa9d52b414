"""The judge of fusecli's per-rank memory under pipeline parallelism: one training step of a
tests/hf_models.py text model cut into one stage per rank (gloo, CPU), run by torch's own pipeline
schedules under ``torchrun``, each rank writing what it holds to ``OUT/<run>/rank_<r>.json`` (run:
``1f1b-128-4``). The pipeline analogue of torch_ranks.py, whose measuring it shares.

    torchrun --standalone --nproc-per-node=2 tests/parallel/torch_pipeline.py --model llama \
        --runs gpipe:128:4,1f1b:128:4,1f1b:128:2 --batch 4 --out DIR [--kv-heads 2] [--layers 4] \
        [--replicas R]

With ``--replicas R`` the world is a (stages, R) mesh, pp outermost as torchtitan's (rank = stage * R +
replica): R replicas of the pipeline, each stage's module wrapped in DistributedDataParallel over its
replicas (``init_sync=False``, as torch_ranks.py's; the schedule runs each backward but the last under
``no_sync``), every replica reading the same batch (the gradients' check holds as it is). With
``--fsdp`` too the R ranks shard each stage instead, as torchtitan applies FSDP2 under a pipeline:
``fully_shard`` on each of the stage's blocks (``reshard_after_forward`` False, torchtitan's default under
a pipeline, or True with the run's ``reshard`` flag), then on the stage's module (False); the schedule
keeps the gathered parameters and the unsharded gradients from each backward to the last one's end
(``set_reshard_after_backward(False)``, ``set_requires_gradient_sync(False)``), then reduce-scatters.
With ``--tp T`` instead the world is a (stages, T) mesh, the tensor-parallel ranks innermost (rank =
stage * T + tp index): each stage's blocks tensor-parallel as torch_ranks.py's ``tp`` mode makes them
(``ColwiseParallel`` on q/k/v and gate/up, ``RowwiseParallel`` on o and down, by name), the stages
sending whole (replicated) hidden states. With ``--stages-per-rank V`` (a pipeline alone, schedule
``interleaved-1f1b``: ScheduleInterleaved1F1B) each rank holds V stages of the blocks split into
ranks x V, stage g on rank g mod ranks; the rank writes its compute actions in torch's order
(``actions``); with ``--replicas R --fsdp`` too, torchtitan's 3-D mesh
(stages, R, T): tensor parallel on the inner dim, then FSDP2 over the middle one.

A run is ``SCHEDULE:SEQ:MICROBATCHES[:outputs][:amp][:zero1]`` (``amp``: the step under CPU autocast to
bf16, torchtitan's mixed precision without FSDP; ``zero1``: with replicas, torch's ZeroRedundancyOptimizer
over them; ``reshard``: under --fsdp, the blocks' reshard_after_forward; ``bf16``: under --fsdp,
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, torchtitan's default; ``ckpt``: each of the
stage's blocks under non-reentrant torch.utils.checkpoint, its inputs counted saved): ``gpipe``
(torch.distributed.pipelining's ScheduleGPipe: every microbatch's forward, then every backward) or
``1f1b`` (Schedule1F1B: stage s runs ``world - s`` forwards before its first backward, then alternates),
``--batch`` the global batch of a step,
split along dim 0 into MICROBATCHES equal microbatches; ``outputs``: ``step(return_outputs=True)``, the
last stage keeping every microbatch's output for the merged one, until the next step clears them (so in
``resident_bytes`` too); by default False, a training step that reads only the losses. Models:
``llama``, ``qwen2``, ``mistral`` (embed_tokens, layers, norm, rotary_emb), ``gpt2`` (wte, wpe, h,
ln_f) and the encoders ``distilbert`` and ``distilbert_packed`` (embeddings, transformer.layer, no final
norm; the packed one's spec takes the token ids alone), as
``hf_models.build(name, attn="default", cache=False)`` makes them. The
blocks split evenly, in order, over the ranks: stage 0 the embeddings and the first blocks, the last stage
the last blocks and the final norm (``make_stage``: what the model's own forward computes between them, no
cache, the causal mask from transformers' create_causal_mask, DistilBERT's bidirectional one from
create_bidirectional_mask). DistilBERT's example inputs pad one row (an attention_mask), but a stage takes
one tensor: its steps read no padding, each stage building the mask the model builds for an all-ones
attention_mask (under sdpa none at all), and the whole-model reference is called with an all-ones one
(an export with the padded mask computes more than these stages do: the tests judge
``distilbert_packed``, whose export reads no mask either).
Each rank builds the whole model from the
one seed and keeps only its stage's modules (``parameter_bytes`` is its stage's alone). Loss
``sum(output)`` of each microbatch on the last stage (a dummy target for the schedule), ``scale_grads=False``
so the step's gradients are those of ``sum(output)`` over the global batch, as torch_ranks.py's; AdamW (its
CPU default, the for-loop form), stepped and zeroed (set_to_none) in "## optimizer ##".

Checked before anything is measured, on every rank in one process (``check_*``): the stages chained
reproduce the whole model's output on the global batch, and microbatch by microbatch (max abs difference
at most 1e-5); and in the warm-up step, the pipeline's accumulated gradients of this rank's parameters
equal the whole model's full-batch gradients (relative to their largest, at most 1e-4).

Per rank, the steps after a warm-up one (which also runs the stages' shape inference and allocates their
P2P receive buffers): ``parameter_bytes``, ``gradient_bytes`` and ``optimizer_bytes`` (distinct storages of
the stage's parameters, of their gradients after the schedule's step, of the optimizer's state),
``recv_buffer_bytes`` (the stage's persistent P2P receive buffers, one per microbatch: activations on a
stage that has a previous one, gradients on one that has a next one; resident, in ``resident_bytes``), and
what autograd saves, seen by saved_tensors_hooks on the first measured step (distinct storages that are no
parameter, buffer or input of the stage: the stage 0 token ids, a later stage's receive buffer, whose
storage the buffer holds anyway): ``saved_bytes_by_microbatch`` (each microbatch's forward's),
``saved_bytes_per_microbatch`` (their largest) and ``saved_bytes_max_in_flight`` = ``saved_bytes``: each
saved storage held by a weak reference (StorageWeakRef), the bytes of those still alive summed after each
forward and backward of a microbatch (``saved_timeline``; saved storages only grow during a forward and
only free during a backward, so the largest of these samples is the largest at any moment), at their
largest; ``microbatches_in_flight_max`` how many microbatches held saved storages then.
``peak_bytes``, ``resident_bytes``, ``phase_peaks``, ``peak_op``: torch_ranks._peak of the profiler's live
bytes, recorded from before the model is built, the least over the measured steps. Its marks: the whole
``schedule.step`` inside "## step ##", and "## backward ##" an empty mark at the start of this stage's
first backward in the step, so that ``phase_peaks["forward"]`` is the peak over the forwards before any
backward (all microbatches' under gpipe, ``world - stage`` of them under 1f1b) and
``phase_peaks["backward"]`` the peak over the rest of the schedule (1f1b's interleaved forwards, the
cool-down's backwards and the P2P waits between them); "## optimizer ##" as torch_ranks.py's.

A run that hangs (pipelining over gloo has been known to) ends the process rather than the session:
the process group's timeout (``--timeout``, 300 s) bounds each P2P wait, and faulthandler's watchdog dumps
every thread's traceback and exits 1 when a run takes longer than it.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import functools
import gc
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.parallel.torch_ranks import STEPS, _blocks, _peak, _settle_collectives, _storages  # noqa: E402

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
DECODERS = ("llama", "qwen2", "mistral")  # embed_tokens, layers, norm, rotary_emb
ENCODERS = ("distilbert", "distilbert_packed")  # embeddings, transformer.layer (post-norm, no final norm)
MODELS = (*DECODERS, "gpt2", *ENCODERS)
RUN = "SCHEDULE:SEQ:MICROBATCHES[:outputs][:amp][:zero1][:reshard][:bf16][:ckpt]"  # a step: 1f1b:128:4
OUTPUT_TOLERANCE = 1e-5  # max abs difference of the chained stages' output from the whole model's
GRAD_TOLERANCE = 1e-4  # max abs difference of the pipeline's gradients, relative to the largest
AMP_GRAD_TOLERANCE = 2e-2  # under bf16 autocast: microbatches round differently from the whole batch


def parse_run(text: str) -> dict:
    schedule, seq, microbatches, *flags = text.split(":")
    assert schedule in SCHEDULES and set(flags) <= {"outputs", "amp", "zero1", "reshard", "bf16", "ckpt"}, \
        text
    return {"schedule": schedule, "seq": int(seq), "microbatches": int(microbatches),
            "return_outputs": "outputs" in flags, "amp": "amp" in flags, "zero1": "zero1" in flags,
            "reshard": "reshard" in flags, "bf16": "bf16" in flags, "checkpointed": "ckpt" in flags}


def run_name(text: str) -> str:
    return text.replace(":", "-")


def stage_blocks(n_blocks: int, world: int, stage: int) -> list[int]:
    """The block indices of ``stage``: the blocks in order, split as evenly as they go, the first stages
    taking one more (torchtitan's split, and fusecli's)."""
    q, r = divmod(n_blocks, world)
    start = stage * q + min(stage, r)
    return list(range(start, start + q + (stage < r)))


def _layer_types(config, n_blocks: int) -> list[str]:
    """Each block's attention, as the model's forward picks its mask: Qwen2's ``layer_types``,
    Mistral's sliding window for every layer, else full (causal) attention."""
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)
    if config.model_type == "mistral" and getattr(config, "sliding_window", None) is not None:
        return ["sliding_attention"] * n_blocks
    return ["full_attention"] * n_blocks


def make_stage(name: str, inner, stage: int, world: int):
    """Stage ``stage`` of ``world`` of the base model ``inner`` (hf_models.build(name).inner): an nn.Module
    holding the stage's modules of ``inner`` (the very modules, and nothing else of ``inner``: what the
    stage does not hold, it does not keep alive), whose forward takes the stage's input (token ids on
    stage 0, else the hidden states) and returns its output tensor, computing what ``inner.forward``
    computes between them (no cache)."""
    assert name in MODELS, f"{name}: pipeline stages are written for {MODELS}"
    blocks = _blocks(inner)
    indices = stage_blocks(len(blocks), world, stage)
    return _stage_class()(name, inner, blocks, indices, stage == 0, stage == world - 1)


@functools.cache
def _stage_class():
    """make_stage's class (torch imported on first use; its methods close over no model)."""
    import torch
    from transformers.masking_utils import (
        create_bidirectional_mask,
        create_causal_mask,
        create_sliding_window_causal_mask,
    )

    class Stage(torch.nn.Module):
        def __init__(self, name, inner, blocks, indices, first, last):
            super().__init__()
            self.name, self.indices, self.first, self.last = name, indices, first, last
            self.config = inner.config
            self.blocks = torch.nn.ModuleList(blocks[i] for i in indices)
            if name == "gpt2":
                if first:
                    self.wte, self.wpe, self.drop = inner.wte, inner.wpe, inner.drop
                if last:
                    self.ln_f = inner.ln_f
                self.layer_types = ["full_attention"] * len(indices)
            elif name in ENCODERS:
                if first:
                    self.embeddings = inner.embeddings  # word and position embeddings, LayerNorm, dropout
            else:
                if first:
                    self.embed_tokens = inner.embed_tokens
                if last:
                    self.norm = inner.norm
                self.rotary_emb = inner.rotary_emb  # buffers only (inv_freq): every stage computes cos/sin
                types = _layer_types(self.config, len(blocks))
                self.layer_types = [types[i] for i in indices]

        def _masks(self, hidden, position_ids) -> dict:
            kw = {"config": self.config, "inputs_embeds": hidden, "attention_mask": None, "cache": None,
                  "position_ids": position_ids}
            masks = {"full_attention": create_causal_mask(**kw)}
            if "sliding_attention" in self.layer_types:
                masks["sliding_attention"] = create_sliding_window_causal_mask(**kw)
            return masks

        def forward(self, x):
            position_ids = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
            if self.name == "gpt2":
                h = self.drop(self.wte(x) + self.wpe(position_ids)) if self.first else x
                mask = self._masks(h, position_ids)["full_attention"]
                for block in self.blocks:
                    h = block(h, None, mask, None, encoder_attention_mask=None, use_cache=False,
                              position_ids=position_ids)
                return self.ln_f(h) if self.last else h
            if self.name in ENCODERS:  # DistilBertModel.forward: no padding, the mask of an all-ones one
                h = self.embeddings(x) if self.first else x
                mask = create_bidirectional_mask(config=self.config, inputs_embeds=h, attention_mask=None)
                for block in self.blocks:
                    h = block(h, mask)
                return h
            h = self.embed_tokens(x) if self.first else x
            masks = self._masks(h, position_ids)
            position_embeddings = self.rotary_emb(h, position_ids=position_ids)
            for block, kind in zip(self.blocks, self.layer_types, strict=True):
                h = block(h, attention_mask=masks[kind], position_embeddings=position_embeddings,
                          position_ids=position_ids, cache=None, use_cache=False)
            return self.norm(h) if self.last else h

    return Stage


def reference(name: str, batch: int, seq: int, microbatches: int, kv_heads: int | None, layers: int,
              world: int, mine: list[int], amp: bool = False) -> tuple[dict, dict]:
    """The checks' reference, in this process, before anything is profiled: the whole model and every
    stage of it, their outputs compared on the global batch and microbatch by microbatch (asserted), and
    the whole model's full-batch gradients of ``sum(output)`` for this rank's stages (``mine``, of
    ``world``), by parameter name."""
    import torch

    from tests import hf_models

    module = hf_models.build(name, attn="default", kv_heads=kv_heads, layers=layers, cache=False)
    ids = hf_models.example_inputs(name, batch, seq, seed=0)[0]
    inputs = _whole_inputs(name, ids)
    stages = [make_stage(name, module.inner, s, world) for s in range(world)]

    def chained(x, stages=stages):
        for stage in stages:
            x = stage(x)
        return x

    with torch.no_grad():
        whole = module(*inputs)
        whole_diff = (chained(ids) - whole).abs().max().item()
        split = torch.cat([chained(c) for c in ids.tensor_split(microbatches)])
        split_diff = (split - whole).abs().max().item()
    assert whole_diff <= OUTPUT_TOLERANCE and split_diff <= OUTPUT_TOLERANCE, (whole_diff, split_diff)
    with hf_models.autocast_of("amp-bf16" if amp else "fp32"):
        out = module(*inputs)
    out.float().sum().backward()
    names = {id(p): n for n, p in module.inner.named_parameters()}
    grads = {names[id(p)]: p.grad for s in mine for p in stages[s].parameters()}
    checks = {"check_output_max_abs_diff": whole_diff, "check_microbatched_output_max_abs_diff": split_diff,
              "check_output_max_abs": whole.abs().max().item()}
    del module, stages
    gc.collect()
    return grads, checks


def _whole_inputs(name: str, ids) -> tuple:
    """The whole model's inputs for the token ids ``ids``: with an all-ones attention_mask where its
    spec takes one (no padding, as the stages read none)."""
    import torch

    from tests import hf_models

    extra = hf_models.spec(name).inputs[1:]
    assert set(extra) <= {"attention_mask"}, f"{name}: inputs {extra} beyond the token ids"
    return (ids, *(torch.ones_like(ids) for _ in extra))


class _SavedTracker:
    """What autograd saves on this stage, per microbatch (the module docstring): ``pack`` records each
    distinct storage the forward of the microbatch ``current`` saves, skipping ``skip`` (the stage's
    parameters and buffers) and ``inputs`` (the storages of the stage's input in that forward), and keeps a
    StorageWeakRef to it; ``sample`` sums the bytes of the recorded storages still alive."""

    def __init__(self, skip: set[int], module=None):
        self.skip = skip
        self.module = module  # under FSDP: its parameters while a block runs (the gathered ones) skipped too
        self.inputs: set[int] = set()
        self.current: int | None = None
        self.active = False
        self.backward_marked = False
        self.by_microbatch: dict[int, dict[int, int]] = {}
        self.refs: list = []  # (StorageWeakRef, pointer, bytes, microbatch)
        self.timeline: list[dict] = []
        self.input_bytes = self.output_bytes = 0

    def pack(self, t):
        from torch.distributed.tensor import DTensor
        from torch.multiprocessing.reductions import StorageWeakRef

        if self.active and self.current is not None:
            s = (t._local_tensor if isinstance(t, DTensor) else t).untyped_storage()
            ptr, size = s.data_ptr(), s.nbytes()
            held = _storages(self.module.parameters()) if self.module is not None else {}
            if size > 0 and ptr not in self.skip and ptr not in self.inputs and ptr not in held:
                seen = self.by_microbatch.setdefault(self.current, {})
                if ptr not in seen:
                    seen[ptr] = size
                    self.refs.append((StorageWeakRef(s), ptr, size, self.current))
        return t

    def sample(self, action: str) -> None:
        if not self.active:
            return
        live, microbatches = {}, set()
        for ref, ptr, size, mb in self.refs:
            if not ref.expired():  # a live storage's pointer is no other live storage's
                live[ptr] = size
                microbatches.add(mb)
        self.timeline.append({"action": action, "saved_bytes": sum(live.values()),
                              "microbatches": sorted(microbatches)})


def _instrument(stage, module, tracker: _SavedTracker) -> None:
    """The stage's per-microbatch forward and backward wrapped: the microbatch whose forward runs, its
    input's storages (a forward pre-hook), a sample of the saved storages alive after each, and the empty
    "## backward ##" mark at the first backward of the step."""
    import torch
    from torch.profiler import record_function

    def inputs(module, args):
        ts = [a for a in args if isinstance(a, torch.Tensor)]
        tracker.inputs = set(_storages(ts))
        tracker.input_bytes = sum(t.numel() * t.element_size() for t in ts)

    module.register_forward_pre_hook(inputs)
    forward, backward = stage.forward_one_chunk, stage.backward_one_chunk

    def forward_one_chunk(chunk, *args, **kwargs):
        tracker.current = (stage.stage_index, chunk)  # a microbatch on this stage (of several per rank)
        with record_function(f"pp forward {chunk}"):
            out = forward(chunk, *args, **kwargs)
        tracker.current = None
        tracker.inputs = set()
        ts = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, torch.Tensor)]
        tracker.output_bytes = sum(t.numel() * t.element_size() for t in ts)
        tracker.sample(f"F{chunk}")
        return out

    def backward_one_chunk(chunk, *args, **kwargs):
        if not tracker.backward_marked:
            tracker.backward_marked = True
            with record_function("## backward ##"):
                pass  # a mark: _peak reads its start only
        with record_function(f"pp backward {chunk}"):
            backward(chunk, *args, **kwargs)
        tracker.sample(f"B{chunk}")

    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk


def _recv_buffers(stage) -> dict[int, int]:
    infos = [*stage.args_recv_info.values(), *stage.grad_recv_info.values()]
    return _storages(getattr(i, "buffer", None) for info in infos for i in info)


def _tensors(tree) -> list:
    """The tensors in nested tuples, lists and dicts."""
    import torch

    out, stack = [], [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (tuple, list)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
    return out


def _whole(t):
    """A gradient whole: an FSDP2 shard's full tensor (an all-gather over its shard group), else itself."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _bucket_bytes(ddp) -> int:
    """The bytes of DDP's reducer buckets, as its own logging data lists them (0 without DDP)."""
    if ddp is None:
        return 0
    return sum(int(x) for x in re.findall(r"\d+", str(ddp._get_ddp_logging_data()["bucket_sizes"])))


def measure(name: str, batch: int, kv_heads: int | None, layers: int, schedule: str, seq: int,
            microbatches: int, return_outputs: bool, amp: bool = False, zero1: bool = False,
            reshard: bool = False, bf16: bool = False, checkpointed: bool = False, mesh=None,
            fsdp: bool = False, tp: bool = False, virtual: int = 1) -> dict:
    """One configuration's steps on this rank, and what it holds (the module docstring); ``mesh``: the
    (pp, dp) mesh of --replicas, None for a pipeline alone."""
    import torch
    import torch.distributed as dist
    from torch._C._profiler import _EventType
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )
    from torch.profiler import ProfilerActivity, profile, record_function

    from tests import hf_models

    rank, world = dist.get_rank(), dist.get_world_size()
    stages = mesh["pp"].size() if mesh is not None else world
    replicas = world // stages  # the ranks of each stage (its data-parallel and tensor-parallel ones)
    index = rank // replicas
    assert batch % microbatches == 0, f"batch {batch} does not split into {microbatches} microbatches"
    assert replicas > 1 or not zero1, "zero1 shards the optimizer over replicas: give --replicas"
    assert virtual == 1 or (mesh is None and schedule == "interleaved-1f1b"), "virtual stages: interleaved"
    total = stages * virtual  # the pipeline's stages, chunk g on rank g mod stages
    chunk_ids = [index + k * stages for k in range(virtual)]
    ref_grads, checks = reference(name, batch, seq, microbatches, kv_heads, layers, total, chunk_ids, amp)
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        module = hf_models.build(name, attn="default", kv_heads=kv_heads, layers=layers, cache=False)
        names = {id(p): n for n, p in module.inner.named_parameters()}
        n_blocks = len(_blocks(module.inner))
        parts = [make_stage(name, module.inner, g, total) for g in chunk_ids]
        part = parts[0]
        del module  # the modules of other stages free with it
        gc.collect()
        if checkpointed:  # before any wrapping, as torchtitan applies it
            from tests.parallel.torch_ranks import _checkpoint

            for pt in parts:
                _checkpoint(pt.blocks, {}, [])
        params = [p for pt in parts for p in pt.parameters()]
        param_names = [names[id(p)] for p in params]
        del names
        wrapped = None
        if tp:  # tensor parallel first, then FSDP2 over it (torchtitan's order)
            from tests.parallel.torch_ranks import _tensor_parallel

            _tensor_parallel(part, mesh["tp"], False)
            params = list(part.parameters())
        pipe_stages = None
        if virtual > 1:
            pipe_stages = [PipelineStage(pt, g, total, device=torch.device("cpu"))
                           for pt, g in zip(parts, chunk_ids, strict=True)]
            stage = pipe_stages[0]
        elif mesh is None:
            stage = PipelineStage(part, index, stages, device=torch.device("cpu"))
        elif tp and not fsdp:
            stage = PipelineStage(part, index, stages, device=torch.device("cpu"),
                                  group=mesh["pp"].get_group())
        elif fsdp:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else \
                MixedPrecisionPolicy()
            for block in part.blocks:
                fully_shard(block, mesh=mesh["dp"], reshard_after_forward=reshard, mp_policy=mp)
            fully_shard(part, mesh=mesh["dp"], reshard_after_forward=False, mp_policy=mp)
            params = list(part.parameters())
            stage = PipelineStage(part, index, stages, device=torch.device("cpu"),
                                  group=mesh["pp"].get_group())
        else:
            from torch.nn.parallel import DistributedDataParallel as DDP

            wrapped = DDP(part, process_group=mesh["dp"].get_group(), init_sync=False)
            stage = PipelineStage(wrapped, index, stages, device=torch.device("cpu"),
                                  group=mesh["pp"].get_group())
        buffers = (b for pt in parts for b in pt.buffers())
        tracker = _SavedTracker(set(_storages(params)) | set(_storages(buffers)), part if fsdp else None)
        for st, pt in zip(pipe_stages or [stage], parts, strict=True):
            _instrument(st, pt, tracker)
        if checkpointed:  # what each checkpoint keeps for its re-run: its block's inputs and the CPU
            def kept(module, args, kwargs):  # generator's state (its own hooks hide the block's saved
                for t in _tensors((args, kwargs)):  # tensors from the tracker's)
                    tracker.pack(t)

            for block in (b for pt in parts for b in pt.blocks):
                block.register_forward_pre_hook(kept, with_kwargs=True)
            rng_state = torch.get_rng_state

            def kept_rng_state():  # torch.utils.checkpoint's preserve_rng_state, called per checkpoint
                state = rng_state()
                tracker.pack(state)
                return state

            torch.get_rng_state = kept_rng_state
        # every rank passes the loss: a schedule without one runs no backward on any stage
        cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B,
               "interleaved-1f1b": ScheduleInterleaved1F1B}[schedule]
        pipe = cls(pipe_stages or stage, microbatches, loss_fn=lambda out, target: out.float().sum(),
                   scale_grads=False)
        if zero1:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW,
                                          process_group=mesh["dp"].get_group(), lr=1e-3)
        else:
            opt = torch.optim.AdamW(params, lr=1e-3)
        ids = hf_models.example_inputs(name, batch, seq, seed=0)[0]  # the global batch, read by stage 0
        first = any(st.is_first for st in pipe_stages or [stage])
        last = any(st.is_last for st in pipe_stages or [stage])
        args = (ids,) if first else ()
        target = torch.zeros(batch) if last else None  # the schedule splits a target per microbatch

        for step in range(1 + STEPS):
            gc.collect()
            measured = step == 1  # the saved set is the same at every step: hooked on the first
            tracker.active, tracker.backward_marked = measured, False
            with record_function("## step ##" if step else "## warm-up ##"):
                with hf_models.autocast_of("amp-bf16" if amp else "fp32"):
                    if measured:
                        with torch.autograd.graph.saved_tensors_hooks(tracker.pack, lambda t: t):
                            pipe.step(*args, target=target, return_outputs=return_outputs)
                    else:
                        pipe.step(*args, target=target, return_outputs=return_outputs)
                grads = _storages(p.grad for p in params if p.grad is not None)
                if step == 0:
                    with torch.no_grad():
                        worst = max((_whole(p.grad) - ref_grads[n]).abs().max().item()
                                    for p, n in zip(params, param_names, strict=True))
                        scale = max(g.abs().max().item() for g in ref_grads.values())
                    checks |= {"check_grad_max_abs_diff": worst, "check_grad_max_abs": scale}
                    assert worst <= (AMP_GRAD_TOLERANCE if amp or bf16 else GRAD_TOLERANCE) * scale, \
                        (worst, scale)
                    del ref_grads
                with record_function("## optimizer ##"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
        inner_opt = opt.optim if zero1 else opt  # ZeroRedundancyOptimizer's own: this rank's partition
        state = [v for s in inner_opt.state.values() for v in s.values()]
        by_mb = {mb: sum(s.values()) for mb, s in sorted(tracker.by_microbatch.items())}
        top = max(tracker.timeline, key=lambda e: e["saved_bytes"])
        result = {"rank": rank, "world": world, "model": name, "schedule": schedule, "seq": seq,
                  "microbatches": microbatches, "batch": batch, "microbatch_size": batch // microbatches,
                  "return_outputs": return_outputs, "autocast": amp, "stage": index, "replicas": replicas,
                  "zero1": zero1, "blocks": n_blocks,
                  "stage_layers": [i for pt in parts for i in pt.indices], "first": first, "last": last,
                  "parameter_bytes": sum(_storages(params).values()),
                  "gradient_bytes": sum(grads.values()),
                  "optimizer_bytes": sum(_storages(state).values()),
                  "recv_buffer_bytes": sum(sum(_recv_buffers(st).values()) for st in pipe_stages or [stage]),
                  "chunks": chunk_ids, "actions": [str(a) for a in getattr(pipe, "pipeline_order", {}).get(
                      index, []) if a is not None],
                  "ddp_bucket_bytes": _bucket_bytes(wrapped),
                  "input_bytes_per_microbatch": tracker.input_bytes,
                  "output_bytes_per_microbatch": tracker.output_bytes,
                  "saved_bytes": top["saved_bytes"],
                  "saved_bytes_per_microbatch": max(by_mb.values()),
                  "saved_bytes_by_microbatch": list(by_mb.values()),
                  "saved_bytes_max_in_flight": top["saved_bytes"],
                  "microbatches_in_flight_max": len(top["microbatches"]),
                  "saved_timeline": tracker.timeline, **checks}
    result.update(_peak(prof, _EventType))
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, choices=MODELS)
    ap.add_argument("--runs", required=True, help=f"comma-separated {RUN}")
    ap.add_argument("--batch", type=int, default=4, help="the global batch of a step")
    ap.add_argument("--kv-heads", type=int, default=None, help="hf_models.build's kv_heads")
    ap.add_argument("--layers", type=int, default=2, help="hf_models.build's layers (blocks)")
    ap.add_argument("--replicas", type=int, default=1, help="replicas of the pipeline, DDP over each stage's")
    ap.add_argument("--fsdp", action="store_true", help="the replicas shard each stage (FSDP2) instead")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks per stage (innermost)")
    ap.add_argument("--stages-per-rank", type=int, default=1, help="interleaved-1f1b: each rank's stages")
    ap.add_argument("--timeout", type=int, default=300, help="seconds: a P2P wait's, and a run's")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    _settle_collectives()
    mesh = None
    assert args.tp == 1 or args.replicas == 1 or args.fsdp, "--tp with --replicas: with --fsdp only"
    if args.replicas > 1 or args.tp > 1:
        from torch.distributed.device_mesh import init_device_mesh

        inner = args.replicas * args.tp
        dims = (("dp", args.replicas),) * (args.replicas > 1) + (("tp", args.tp),) * (args.tp > 1)
        mesh = init_device_mesh("cpu", (dist.get_world_size() // inner, *(d for _, d in dims)),
                                mesh_dim_names=("pp", *(n for n, _ in dims)))
    for text in args.runs.split(","):
        faulthandler.dump_traceback_later(args.timeout, exit=True)  # a hang exits 1 with the stacks
        result = measure(args.model, args.batch, args.kv_heads, args.layers, **parse_run(text), mesh=mesh,
                         fsdp=args.fsdp, tp=args.tp > 1, virtual=args.stages_per_rank)
        out = Path(args.out) / run_name(text)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank_{result['rank']}.json").write_text(json.dumps(result, indent=1))
        dist.barrier()
        faulthandler.cancel_dump_traceback_later()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

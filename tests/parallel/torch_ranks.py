"""The judge of fusecli's per-rank memory: one training step of a tests/hf_models.py model on real
torch.distributed ranks (gloo, CPU), run under ``torchrun``, each rank writing what it holds to
``OUT/<run>/rank_<r>.json`` (run: ``fsdp-128-bf16``).

    torchrun --standalone --nproc-per-node=2 tests/parallel/torch_ranks.py --model llama \
        --runs ddp:128,fsdp:128,fsdp:128:no-reshard,fsdp:16:bf16 --batch 2 --out DIR

Modes, as users write them: ``single`` (no wrapper: one device's step, for a world of 1), ``ddp``
(DistributedDataParallel, default 25 MiB buckets), ``zero1`` (DDP and torch's ZeroRedundancyOptimizer),
``tp`` (tensor parallel: each block's ``parallelize_module`` with ``ColwiseParallel`` on q/k/v and
gate/up, ``RowwiseParallel`` on o and down, found by their module names; every rank reads one batch;
``sp``: sequence parallel as torchtitan writes it for Llama-like blocks (and Megatron's for DistilBERT's
post-norm ones, SP_PLANS): ``SequenceParallel`` on the norms, the attention's and MLP's input all-gathered
by ``PrepareModuleInput``, o and down (out_lin and lin2) ``RowwiseParallel(output_layouts=Shard(1))``,
the first block's input split and the last block's output gathered whole for the final norm; checked
before anything is profiled: the parallelized model's output and gradients against the unparallelized
model's (``check_tensor_parallel``); ``amp``: the forward under CPU autocast to bf16, torchtitan's mixed
precision where FSDP's is not in use),
``fsdp`` (FSDP2: ``fully_shard`` on every block, then on the root as torchtitan does; ``no-reshard``:
the blocks' ``reshard_after_forward=False``; ``bf16``: ``MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)``), ``fsdp_tp`` (torchtitan's 2-D layout on a (world / 2, 2) mesh: ``tp``'s plan on
the inner dim, then ``fsdp``'s on the outer; each tensor-parallel pair reads one batch; the flags of both
apply), ``ddp_tp`` (Megatron's data x tensor parallel on a (world / 2, 2) mesh: ``tp``'s plan on the inner
dim, then torch's ``_pre_dp_module_transform`` (the DTensor parameters as local tensors, DDP's way with
tensor parallelism) and DistributedDataParallel over the outer; each tensor-parallel pair reads one batch),
``hsdp`` (FSDP2 on a (world / 2, 2) mesh: replicated across the outer dim, sharded within the inner).
Optimizer AdamW (its CPU default, the for-loop form). Each rank reads its own batch (seed = rank), loss
``sum(output)``, the output kept through backward as a training loop's name keeps it.

Per rank, the step measured is the second (the first makes the optimizer state, as any step after the
first finds it): ``parameter_bytes``, ``gradient_bytes`` and ``optimizer_bytes`` (distinct storages of the
local parameters, of their gradients after backward, of the optimizer's state), ``saved_bytes`` (what
saved_tensors_hooks sees, distinct storages that are no parameter the module holds at that moment (FSDP's
all-gathered parameters are the module's while its block runs), buffer or input) and ``peak_bytes``: the
profiler's live bytes, recorded from before the model is built, at their largest during the step
(forward, backward, optimizer step), with ``resident_bytes`` the live bytes when the step begins.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = ("single", "ddp", "zero1", "fsdp", "tp", "fsdp_tp", "ddp_tp", "hsdp")
MESH_TP = 2  # fsdp_tp, ddp_tp: a (world / 2, 2) mesh, the tensor-parallel pairs innermost
# tensor parallel: the linears by their module names, Megatron's pairs (column-parallel, then row-parallel)
COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "q_lin", "k_lin", "v_lin", "lin1")
ROWWISE = ("o_proj", "down_proj", "out_lin", "lin2")
# sequence parallel (Llama-like blocks): the norms, and the modules whose input is gathered (how they
# are called: the attention with hidden_states=, the MLP positionally)
SP_NORMS = ("input_layernorm", "post_attention_layernorm")
SP_GATHERED = {"self_attn": "hidden_states", "mlp": None}
# sequence parallel per block family, the one whose modules the block has (_sequence_family): its norms,
# its gathered modules (the keyword their input comes as, None: the first positional argument), how many
# positional arguments the block is called with (the first block's first one is split along the sequence,
# the rest pass as they are) and whether the norms return local tensors (SequenceParallel's
# use_local_output): a pre-norm block's norm outputs flow into a gathered module only, a post-norm block's
# are also the next residual, added to a row-parallel linear's local output (DTensor and Tensor don't mix)
SP_PLANS = {
    "llama": {"norms": SP_NORMS, "gathered": SP_GATHERED, "block_args": 1, "local_norms": False},
    # DistilBERT's TransformerBlock(hidden_states, attention_mask): attention(hidden_states,
    # attention_mask=), its q_lin, k_lin and v_lin reading the one gathered input; sa_layer_norm(attention
    # + input), ffn(that), output_layer_norm(ffn + that)
    "distilbert": {"norms": ("sa_layer_norm", "output_layer_norm"),
                   "gathered": {"attention": None, "ffn": None}, "block_args": 2, "local_norms": True},
}
CHECK_TOLERANCE = 1e-4  # tensor parallel: max abs output difference; gradients', relative to the largest
SETTLE_SECONDS = 0.01  # _settle_collectives' pause with a core per rank
STEPS = 3  # measured steps after the warm-up (the least of them is the measurement: _peak)
sys.path.insert(0, str(ROOT))


def _storages(tensors) -> dict[int, int]:
    import torch
    from torch.distributed.tensor import DTensor

    out = {}
    for t in tensors:
        if isinstance(t, DTensor):
            t = t._local_tensor
        if isinstance(t, torch.Tensor):
            s = t.untyped_storage()
            out[s.data_ptr()] = s.nbytes()
    return out


def _settle_collectives() -> None:
    """After each blocking collective, a pause holding its tensors: gloo's worker thread drops its
    references to them before the caller goes on, so the caller's release is the last one and the
    profiler, which follows the calling thread only, records the free (timing changes, bytes do not).
    The pause grows with the ranks per core: a starved worker thread takes longer."""
    import time

    import torch.distributed as dist

    pause = SETTLE_SECONDS * max(1.0, dist.get_world_size() / (os.cpu_count() or 1))

    def settled(collective):
        def run(*args, **kwargs):
            work = collective(*args, **kwargs)
            if not kwargs.get("async_op", False):
                time.sleep(pause)
            return work
        return run

    for name in ("all_gather_single", "all_gather_into_tensor", "reduce_scatter_single",
                 "reduce_scatter_tensor", "all_reduce", "broadcast"):
        setattr(dist, name, settled(getattr(dist, name)))
    # DTensor's collectives (tensor parallel) are functional: waited on when their result is first read
    from torch.distributed import _functional_collectives as funcol

    funcol.wait_tensor = settled(funcol.wait_tensor)


def _wrap(model, mode: str, reshard: bool, param_dtype: str | None, sequence: bool = False):
    import torch.distributed as dist

    if mode == "single":
        return model
    if mode == "fsdp_tp":  # torchtitan's 2-D order: tensor parallel on the inner dim, then FSDP2 on the outer
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (dist.get_world_size() // MESH_TP, MESH_TP),
                                mesh_dim_names=("dp", "tp"))
        return _shard(_tensor_parallel(model, mesh["tp"], sequence), mesh["dp"], reshard, param_dtype)
    if mode == "ddp_tp":  # tensor parallel on the inner dim, DDP over the outer (the local shards' gradients)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform
        from torch.nn.parallel import DistributedDataParallel as DDP

        mesh = init_device_mesh("cpu", (dist.get_world_size() // MESH_TP, MESH_TP),
                                mesh_dim_names=("dp", "tp"))
        model = _tensor_parallel(model, mesh["tp"], sequence)
        _pre_dp_module_transform(model)
        return DDP(model, process_group=mesh["dp"].get_group(), init_sync=False)
    if mode == "hsdp":  # a (world / 2, 2) mesh: replicated across the outer dim, sharded within the inner
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (dist.get_world_size() // MESH_TP, MESH_TP),
                                mesh_dim_names=("replicate", "shard"))
        return _shard(model, mesh, reshard, param_dtype)
    if mode == "tp":
        from torch.distributed.device_mesh import init_device_mesh

        return _tensor_parallel(model, init_device_mesh("cpu", (dist.get_world_size(),)), sequence)
    if mode in ("ddp", "zero1"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        # every rank builds the same model from one seed: no initial broadcast, whose flat buffers gloo's
        # threads free unrecorded (the step's own collectives are settled: _settle_collectives)
        return DDP(model, init_sync=False)
    from torch.distributed.device_mesh import init_device_mesh

    return _shard(model, init_device_mesh("cpu", (dist.get_world_size(),)), reshard, param_dtype)


def _shard(model, mesh, reshard: bool, param_dtype: str | None):
    """FSDP2 as torchtitan applies it: ``fully_shard`` on every block, then on the root."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=getattr(torch, {"bf16": "bfloat16"}[param_dtype]),
                              reduce_dtype=torch.float32) if param_dtype else MixedPrecisionPolicy()
    for block in _blocks(model):
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)  # the root as torchtitan's: kept gathered after forward
    return model


def _tensor_parallel(model, mesh, sequence: bool):
    """Each block's column/row-parallel linears by name (COLWISE, ROWWISE), and with ``sequence`` its
    sequence-parallel plan (SP_PLANS)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    blocks = _blocks(model)
    for block in blocks:
        names = {n: ColwiseParallel() if n.rsplit(".", 1)[-1] in COLWISE else
                 RowwiseParallel(**_sequence_output() if sequence else {})
                 for n, m in block.named_modules() if n.rsplit(".", 1)[-1] in COLWISE + ROWWISE}
        assert names, "no linear named as a tensor-parallel pair"
        if sequence:
            names |= _sequence_plan(block)
        # every rank built the same model from one seed: each keeps its own share, no scatter from rank 0
        # (whose send buffers gloo's thread frees unrecorded)
        parallelize_module(block, mesh, names, src_data_rank=None)
    if sequence:
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import PrepareModuleInput, PrepareModuleOutput

        rest = (None,) * (SP_PLANS[_sequence_family(blocks[0])]["block_args"] - 1)
        parallelize_module(blocks[0], mesh, PrepareModuleInput(
            input_layouts=(Replicate(), *rest), desired_input_layouts=(Shard(1), *rest),
            use_local_output=True))
        parallelize_module(blocks[-1], mesh, PrepareModuleOutput(
            output_layouts=Shard(1), desired_output_layouts=Replicate(), use_local_output=True))
    return model


def _sequence_output() -> dict:
    from torch.distributed.tensor import Shard

    return {"output_layouts": Shard(1)}  # reduce-scattered along the sequence


def _sequence_family(block) -> str:
    """The SP_PLANS family of ``block``: the one whose norms and gathered modules it has, by name."""
    names = dict(block.named_modules())
    families = [f for f, p in SP_PLANS.items() if set(p["norms"]) | set(p["gathered"]) <= names.keys()]
    assert len(families) == 1, f"no one sequence-parallel plan for the block ({families}): {sorted(names)}"
    return families[0]


def _sequence_plan(block) -> dict:
    """torchtitan's sequence-parallel entries for the block, as its family's SP_PLANS entry names them.
    A gathered module called with keywords is gathered per keyword (PrepareModuleInput redistributes each
    keyword's tensor on its own: the one tensor passed as query=, key= and value= would be all-gathered
    three times); the blocks here call theirs with the hidden states once."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, SequenceParallel

    family = SP_PLANS[_sequence_family(block)]
    plan = {n: SequenceParallel(use_local_output=family["local_norms"]) for n in family["norms"]}
    for n, kwarg in family["gathered"].items():
        plan[n] = PrepareModuleInput(
            input_kwarg_layouts={kwarg: Shard(1)}, desired_input_kwarg_layouts={kwarg: Replicate()},
            use_local_output=True) if kwarg else PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True)
    return plan


def check_tensor_parallel(name: str, batch: int, kv_heads: int | None, seq: int, sequence: bool) -> dict:
    """The tensor-parallel model (sequence parallel too where ``sequence``) against the unparallelized one
    built from the same seed, on the batch every rank reads, in fp32 and outside any profiling: their
    outputs (max abs difference at most CHECK_TOLERANCE, asserted on every rank: the output is whole on
    each) and the gradients of ``sum(output)`` (the parallel ones gathered whole, the max abs difference
    at most CHECK_TOLERANCE of the largest), by parameter name."""
    import torch
    from torch.distributed.tensor import DTensor

    from tests import hf_models

    inputs = hf_models.example_inputs(name, batch, seq, seed=0)
    plain = hf_models.build(name, attn="default", kv_heads=kv_heads)
    parallel = _wrap(hf_models.build(name, attn="default", kv_heads=kv_heads), "tp", True, None, sequence)
    want, got = plain(*inputs), parallel(*inputs)
    assert not isinstance(got, DTensor), type(got)
    out_diff = (got - want).abs().max().item()
    want.float().sum().backward()
    got.float().sum().backward()
    grads = dict(plain.named_parameters())
    worst = scale = 0.0
    with torch.no_grad():
        for n, p in parallel.named_parameters():
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            worst = max(worst, (g - grads[n].grad).abs().max().item())
            scale = max(scale, grads[n].grad.abs().max().item())
    assert out_diff <= CHECK_TOLERANCE, f"tensor-parallel output off by {out_diff}"
    assert worst <= CHECK_TOLERANCE * scale, f"tensor-parallel gradients off by {worst} (largest {scale})"
    checks = {"check_output_max_abs_diff": out_diff, "check_output_max_abs": want.abs().max().item(),
              "check_grad_max_abs_diff": worst, "check_grad_max_abs": scale}
    del plain, parallel, want, got, grads
    gc.collect()
    return checks


def _blocks(model):
    """The model's repeated blocks: the children of its one ModuleList."""
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    assert len(lists) == 1, f"expected one ModuleList of blocks, found {len(lists)}"
    return list(lists[0])


RUN = "MODE:SEQ[:no-reshard][:bf16][:ckpt][:sp][:amp]"  # a step on the command line: fsdp:128:bf16


def parse_run(text: str) -> dict:
    mode, seq, *flags = text.split(":")
    assert mode in MODES and set(flags) <= {"no-reshard", "bf16", "ckpt", "sp", "amp"}, text
    assert "sp" not in flags or mode in ("tp", "fsdp_tp", "ddp_tp"), text
    return {"mode": mode, "seq": int(seq), "reshard": "no-reshard" not in flags,
            "param_dtype": "bf16" if "bf16" in flags else None, "checkpointed": "ckpt" in flags,
            "sequence": "sp" in flags, "amp": "amp" in flags}


def run_name(text: str) -> str:
    return text.replace(":", "-")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--runs", required=True, help=f"comma-separated {RUN}")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--kv-heads", type=int, default=None, help="hf_models.build's kv_heads")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    _settle_collectives()
    for text in args.runs.split(","):
        result = measure(args.model, args.batch, args.kv_heads, **parse_run(text))
        out = Path(args.out) / run_name(text)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank_{result['rank']}.json").write_text(json.dumps(result, indent=1))
        dist.barrier()
    dist.destroy_process_group()


def _checkpoint(blocks, held: dict, measuring: list) -> None:
    """Each block's forward under non-reentrant torch.utils.checkpoint (the form ``plan``'s helper and
    torchtitan apply, before sharding); while ``measuring``, the tensors each is called with join
    ``held``: the checkpoint keeps them for its re-run, while its own hooks hide what the block saves
    inside from the outer ones (hf_models.saved_storages' ``held_by``)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    def keep(module, args, kwargs):
        stack = [*args, *kwargs.values()]
        while measuring and stack:
            t = stack.pop()
            if isinstance(t, (tuple, list)):
                stack.extend(t)
            elif isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > 0:
                held[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()

    for block in blocks:
        forward = block.forward
        block.forward = lambda *a, _f=forward, **k: checkpoint(_f, *a, use_reentrant=False, **k)
        block.register_forward_pre_hook(keep, with_kwargs=True)


def measure(name: str, batch: int, kv_heads: int | None, mode: str, seq: int, reshard: bool,
            param_dtype: str | None, checkpointed: bool = False, sequence: bool = False,
            amp: bool = False) -> dict:
    """One configuration's steps on this rank, and what it holds (the module docstring)."""
    import torch
    import torch.distributed as dist
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile, record_function

    from tests import hf_models

    rank = dist.get_rank()
    checks = check_tensor_parallel(name, batch, kv_heads, seq, sequence) if mode == "tp" else {}
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        module = hf_models.build(name, attn="default", kv_heads=kv_heads, cache=not checkpointed)
        held: dict[int, int] = {}
        measuring: list = []
        if checkpointed:
            _checkpoint(_blocks(module), held, measuring)
        model = _wrap(module, mode, reshard, param_dtype, sequence)
        params = list(model.parameters())
        if mode == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=1e-3)
        else:
            opt = torch.optim.AdamW(params, lr=1e-3)
        # tensor-parallel ranks read one batch (under fsdp_tp, each pair its own); data-parallel ones theirs
        seed = 0 if mode == "tp" else rank // MESH_TP if mode in ("fsdp_tp", "ddp_tp") else rank
        inputs = hf_models.example_inputs(name, batch, seq, seed=seed)

        # the local parameters' storages: under ddp_tp the module's forward holds them as DTensors set as
        # plain attributes (_pre_dp_module_transform), which module.parameters() does not list then
        local = _storages(params)

        def pack(t):
            from torch.distributed.tensor import DTensor

            current = _storages(module.parameters()) | _storages(module.buffers()) | _storages(inputs) | local
            s = (t._local_tensor if isinstance(t, DTensor) else t).untyped_storage()
            if s.data_ptr() not in current and s.nbytes() > 0:
                held[s.data_ptr()] = s.nbytes()
            return t

        for step in range(1 + STEPS):
            gc.collect()
            measured = step == 1  # the saved set is the same at every step: hooked on the first
            measuring[:] = [True] if measured else []
            with record_function("## step ##" if step else "## warm-up ##"):
                with hf_models.autocast_of("amp-bf16" if amp else "fp32"):
                    if measured:
                        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                            out = model(*inputs)
                    else:
                        out = model(*inputs)
                loss = out.float().sum()  # the output kept through backward, as a training loop names it
                with record_function("## backward ##"):
                    loss.backward()
                del loss, out
                grads = _storages(p.grad for p in params if p.grad is not None)
                with record_function("## optimizer ##"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
        state = [v for s in opt.optim.state.values() for v in s.values()] if mode == "zero1" else \
            [v for s in opt.state.values() for v in s.values()]
        result = {"rank": rank, "world": dist.get_world_size(), "model": name, "mode": mode, "seq": seq,
                  "reshard_after_forward": reshard, "param_dtype": param_dtype, "sequence_parallel": sequence,
                  "autocast": amp,
                  "parameter_bytes": sum(_storages(params).values()),
                  "gradient_bytes": sum(grads.values()),
                  "optimizer_bytes": sum(_storages(state).values()),
                  "saved_bytes": sum(held.values()), **checks}
    result.update(_peak(prof, _EventType))
    return result


def _peak(prof, event_type) -> dict:
    """Live bytes over the whole profiled run, in time order (hf_models.peak_memory's replay of the raw
    allocation records), per measured step: at its start, and at its largest in each phase.

    The profiler follows the calling thread only. Gloo's reduce-scatter copies its input (``aten::clone``
    inside ``c10d::_reduce_scatter_base_``: it reduces the copy with an all-reduce) and its worker thread
    frees the copy when the collective completes, unrecorded: a buffer allocated inside a ``c10d::`` op
    counts as freed when the caller of that op returns (a blocking collective has completed by then). A
    pointer handed out again was freed too. Any other miss only adds bytes, so of the STEPS equal steps
    the least is the measurement: ``resident_bytes`` the least live total at a step's start,
    ``peak_bytes`` the least of the steps' largest totals (each phase's alike)."""
    events, marks = [], {}  # (time, size, pointer)
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        if e.typed[0] == event_type.Allocation:
            size, ptr = e.extra_fields.alloc_size, e.extra_fields.ptr
            events.append((e.start_time_ns, size, ptr, e))
            op = e.parent
            while op is not None and not op.name.startswith("c10d::"):
                op = op.parent
            if size > 0 and op is not None:
                caller = op.parent if op.parent is not None else op
                events.append((caller.end_time_ns, -size, ptr, None))
        elif e.name.startswith("## "):
            marks.setdefault(e.name, []).append((e.start_time_ns, e.end_time_ns))
        stack.extend(e.children)
    events.sort(key=lambda e: e[0])
    steps = sorted(marks["## step ##"])

    def inside(name, start, end):
        return next(b for b in marks[name] if start <= b[0] <= end)

    bounds = [(start, end, inside("## backward ##", start, end)[0], inside("## optimizer ##", start, end)[0])
              for start, end in steps]
    starts = [None] * len(steps)
    tops = [{"forward": 0, "backward": 0, "optimizer": 0} for _ in steps]
    live: dict[int, int] = {}
    total = 0
    k = 0
    where = [None] * len(steps)
    for t, size, ptr, e in events:
        while k < len(steps) and t > bounds[k][1]:
            k += 1
        if k < len(steps) and starts[k] is None and t >= bounds[k][0]:
            starts[k] = total
        if size > 0:
            total -= live.pop(ptr, 0)  # handed out again: it was freed on a thread the profiler missed
            live[ptr] = size
        elif live.pop(ptr, None) is None:
            continue
        total += size
        if k < len(steps) and t >= bounds[k][0]:
            start, _, backward, optimizer = bounds[k]
            phase = "optimizer" if t >= optimizer else "backward" if t >= backward else "forward"
            if total > max(tops[k].values()):
                where[k] = e
            tops[k][phase] = max(tops[k][phase], total)
    peaks = [max(top.values()) for top in tops]
    least = peaks.index(min(peaks))
    return {"peak_op": _ops(where[least]), "resident_bytes": min(s for s in starts if s is not None),
            "peak_bytes": min(peaks),
            "phase_peaks": {p: min(top[p] for top in tops) for p in tops[0]},
            "step_starts": starts, "step_peaks": peaks}


def _ops(event) -> str | None:
    """The ops an allocation happened in, innermost last, without the profiler's own marks."""
    names, e = [], event.parent if event is not None else None
    while e is not None:
        if not e.name.startswith("## "):
            names.append(e.name.removeprefix("autograd::engine::evaluate_function: "))
        e = e.parent
    return " < ".join(names[:4]) if names else None


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

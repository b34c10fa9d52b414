"""Each rank's training step under a parallel layout: the one-device step (liveness's timeline at the
rank's own batch) with the parameters, gradients, optimizer state and communication buffers as DDP,
ZeroRedundancyOptimizer and FSDP2 hold them on that rank, read from torch's sources (2.13):

- DDP: whole parameters, gradients and state, and the reducer's buckets: a flat copy of every gradient,
  made at construction and kept (``gradient_as_bucket_view=False``, the default);
- ZeRO-1 (``ZeroRedundancyOptimizer``): the state of the parameters this rank owns, assigned largest
  first to the rank with the fewest elements so far;
- FSDP2 (``fully_shard`` per block, then the root): fsdp.py;
- tensor parallelism: tensor.py's split, each split tensor a 1/t share;
- the optimizer step: AdamW on CPU runs its for-loop form (``loop_temporaries``); on CUDA the foreach
  form (``torch._foreach_sqrt`` of every state: one temporary the size of all of them), modelled, not
  measured here.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from ..core.dims import Poly
from ..core.errors import UsageError
from ..core.ir import Tensor, dtype_size
from ..memory.sizes import model_variables
from ..plan.candidates import saved_after
from ..plan.planner import OPTIMIZERS, StepModel, largest_fitting, solve_values
from .fsdp import Unit, gather, parameters, reduce_scatter, shard_rows, stage_units, units
from .interleaved import Chunk, rank_actions, rank_peak
from .layout import DEVICES, INTERLEAVED, Layout
from .pipeline import (
    Gathered,
    Profile,
    autocast_copies,
    in_flight,
    sent_storages,
    stage_peak,
    stage_step,
    stages_of,
    step_index,
)
from .tensor import Split, find_split
from .timeline import Timeline

STEP_BYTES = 4  # AdamW's ``step``: a float32 scalar tensor per parameter (capturable=False)


def loop_temporaries(local: list[int]) -> int:
    """AdamW's for-loop form (_single_tensor_adam) at its largest: each parameter's sqrt(v) and its
    quotient by sqrt(1 - beta2^t), while ``denom``, the loop's variable, still holds the previous
    parameter's quotient: max over i of 2 s_i + s_(i-1), in the optimizer's order of parameters."""
    return max((2 * s + (local[i - 1] if i else 0) for i, s in enumerate(local)), default=0)


def optimizer_temporaries(local: list[int], moments: int, device: str) -> int:
    """The optimizer step's transients over the resident state (``local``: each parameter's state tensor
    bytes, in the optimizer's order): the for-loop form's on CPU, the foreach form's (one per parameter)
    on CUDA, none for a stateless optimizer."""
    if not moments:
        return 0
    return loop_temporaries(local) if device == "cpu" else sum(local)


@dataclass
class RankMemory:
    """What one rank (or several equal ones) holds in the step, in bytes."""

    ranks: list[int]
    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    saved_activation_bytes: int
    buffer_bytes: int  # communication buffers at the peak (DDP's buckets, FSDP's gathered parameters, ...)
    peak_bytes: int
    peak_phase: str  # forward | backward | optimizer
    peak_step: int | None  # the schedule step of the peak (None: the optimizer step)
    alive_at_peak: dict[str, int] = field(default_factory=dict)  # category -> bytes there
    in_flight: int | None = None  # a pipeline stage: the microbatches whose activations it holds at once

    def key(self) -> tuple:
        return (self.parameter_bytes, self.gradient_bytes, self.optimizer_bytes,
                self.saved_activation_bytes, self.buffer_bytes, self.peak_bytes)


def zero1_owners(numels: list[int], n: int) -> list[int]:
    """ZeroRedundancyOptimizer's partition: parameters largest first, each to the rank with the fewest
    elements so far (the lowest rank on a tie)."""
    order = sorted(range(len(numels)), key=lambda i: -numels[i])  # sorted() is stable: model order on ties
    heap = [(0, r) for r in range(min(n, len(numels)))]  # (elements so far, rank): the emptiest first
    owner = [0] * len(numels)
    for i in order:
        total, r = heapq.heappop(heap)
        owner[i] = r
        heapq.heappush(heap, (total + numels[i], r))
    return owner


def rank_memory(analysis, layout: Layout, optimizer: str = "adamw", dims: dict[str, int] | None = None,
                chosen: list | None = None) -> list[RankMemory]:
    """Each distinct rank of ``layout`` (equal ranks merged, their ids listed), for the analysis' step at
    its own dims (the rank's local batch), or at ``dims`` where given (the formulas evaluated there), with
    the recomputations ``chosen`` (plan.candidates: checkpointed blocks, fused kernels) applied."""
    layout.check()
    device = analysis.profile.device if analysis.profile is not None else "cpu"
    if device not in DEVICES:
        raise UsageError(f"a parallel layout needs --device cpu or cuda, not {device!r}")
    if analysis.profile is not None and analysis.profile.name == "tensorflow":
        raise UsageError("a parallel layout models PyTorch's DDP, FSDP2 and tensor parallelism; this model "
                         "trains as TensorFlow does (--autodiff pytorch to see it as PyTorch would)")
    graph, joint, live, sizes = analysis.graph, analysis.joint, analysis.liveness, analysis.sizes
    values = {**{n: sizes[n] for n in sizes}, **(dims or {})}
    if layout.pp > 1:
        return _pipeline_ranks(analysis, layout, optimizer, values, chosen or [])
    model = StepModel(joint, live, values, Poly())
    own = not chosen and all(sizes.get(k) == v for k, v in (dims or {}).items())  # the analysis' step
    params = parameters(graph)
    shapes = {p.name: sizes.shape(p) for p in params}
    unknown = [p.name for p in params if shapes[p.name] is None]
    if unknown:
        raise UsageError(f"{len(unknown)} parameters of unknown shape ({unknown[0]}, ...): give their dims")
    moments = OPTIMIZERS[optimizer][0]
    precision = analysis.precision.name if analysis.precision is not None else None
    compute = {p.name: p.dtype for p in params}
    # FSDP2's MixedPrecisionPolicy(param_dtype=<the model's 16-bit dtype>, reduce_dtype=float32): the
    # sharded parameters, their gradients and the state stay float32; a model cast without sharding keeps
    # 16-bit weights and float32 master weights (plan.planner.step_lines)
    mixed = layout.sharded and precision in ("bf16", "fp16")
    grads = {t.meta["grad_of"]: t for t in joint.outputs if t.meta.get("grad_of") in compute}
    owner = zero1_owners([int(np.prod(shapes[p.name], dtype=object)) for p in params], layout.dp_replicate) \
        if layout.zero == 1 else None
    split = find_split(graph, joint, layout.tp, layout.sp, _storage_names(live)) if layout.tp > 1 else None
    step = _Step(analysis, model, values, layout, params, shapes, grads, compute, moments, mixed, precision,
                 device, units(graph, joint, live) if layout.sharded else [], list(chosen or ()), own, owner,
                 split)
    out: list[RankMemory] = []
    for rank, ids in _classes(layout, [shapes[p.name] for p in params], owner):
        entry = _one_rank(step, rank)
        same = next((e for e in out if e.key() == entry.key()), None)
        if same is not None:
            same.ranks = sorted(same.ranks + ids)
        else:
            entry.ranks = ids
            out.append(entry)
    return out


def _pipeline_ranks(analysis, layout: Layout, optimizer: str, values: dict[str, int],
                    chosen: list) -> list[RankMemory]:
    """Each stage's rank under a pipeline (parallel.pipeline): one microbatch's step on the stage at the
    microbatch's size, the microbatches in flight by schedule, the stage's parameters, gradients and
    AdamW state resident. With ``dp_replicate`` replicas of the pipeline (torchtitan's mesh, pp
    outermost: rank = stage * replicas + replica) each stage is DDP over its replicas: the reducer's
    buckets, a flat copy of the stage's gradients, resident (the schedule's backwards run under
    ``no_sync`` but the last, which reduces); under ZeRO-1 each replica holds the state of the stage's
    parameters it owns. ``chosen``: recomputations applied (checkpointed blocks: each stage's step with
    them)."""
    graph, joint, live = analysis.graph, analysis.joint, analysis.liveness
    m, p, r = layout.chunks, layout.pp, layout.dp_replicate
    interleaved = layout.pp_schedule == INTERLEAVED
    stages, of_step = stages_of(graph, live, p * (layout.virtual if interleaved else 1))
    sent = sent_storages(joint, live, of_step)
    batch_dims = model_variables(graph)[1]
    for b in batch_dims:
        if values.get(b) is not None and values[b] % m:
            raise UsageError(f"--microbatches {m}: the batch, {values[b]}, is not a multiple of it")
    micro = {**values, **{b: values[b] // m for b in batch_dims if b in values}}
    model = StepModel(joint, live, micro, Poly())
    params = parameters(graph)
    grads = {t.meta["grad_of"]: t for t in joint.outputs if t.meta.get("grad_of") in {q.name for q in params}}
    gradient_names = {g.name for g in grads.values()}
    precision = analysis.precision.name if analysis.precision is not None else None
    cached = autocast_copies(live) if (precision or "").startswith("amp") else set()
    moments = OPTIMIZERS[optimizer][0]
    device = analysis.profile.device if analysis.profile is not None else "cpu"
    constants = {t.name: t for t in joint.tensors.values() if t.kind == "constant" and t.producer is None}
    fsdp_units = units(graph, joint, live) if layout.sharded else []
    t = layout.tp  # the tensor-parallel ranks of each stage: rank = stage * t + tp index
    split = find_split(graph, joint, t, False, _storage_names(live)) if t > 1 else None
    split_names, split_params = (split.tensors, split.parameters) if split else (set(), set())

    def share(name: str, value: int) -> int:
        return value // t if name in split_names else value

    # an all-reduce's output beside its input, whole, where it is made
    reduced = [(live.lifetimes[name][0], model.value[name]) for name in (split.reduced if split else ())
               if name in model.value]
    changed, stats = model.changes(chosen) if chosen else ({}, [])
    out: list[RankMemory] = []
    chunks: dict[int, tuple] = {}  # interleaved: virtual stage -> (the Stage, its step, its parameters)
    step_of = step_index(live.schedule)
    for stage in stages:
        step = stage_step(stage, of_step, model, live, gradient_names, sent, {q.name for q in params},
                          step_of, cached, share, tuple(reduced), changed, tuple(stats))
        mine = [q for q in params if q.name in step.touched]
        if interleaved:
            chunks[stage.index] = (stage, step, mine)
            continue
        param_bytes, fixed, numel, state_dtype, master = _held(model, mine, step.touched, constants,
                                                               precision, split_params, t)
        grad_bytes = sum(share(grads[q.name].name, model.value.get(grads[q.name].name, 0)) for q in mine
                         if q.name in grads)
        buckets = grad_bytes if r > 1 else 0  # DDP's reducer: a flat copy of the stage's gradients
        buffers = m * step.received + buckets  # a receive buffer per microbatch
        k = in_flight(layout.pp_schedule, p, stage.index, m)
        saved = k * step.saved + step.copies
        if layout.sharded:
            out += _sharded_stage(stage, step, mine, model, fixed, grad_bytes, buffers, k, saved, layout,
                                  fsdp_units, moments, device, split_params, precision in ("bf16", "fp16"))
            continue
        top, at = stage_peak(step, layout.pp_schedule, k, m, grad_bytes, last=stage.index == p - 1)
        where = stage.steps[at] if stage.steps else None
        owner = zero1_owners(numel, r) if layout.zero == 1 else None
        for replica, ids in _replica_classes(owner, r):
            owned = [e for i, e in enumerate(numel) if owner is None or owner[i] == replica]
            state = sum(moments * state_dtype * e + STEP_BYTES for e in owned) if moments else 0
            resident = param_bytes + fixed + state + master + buffers
            peak, phase = resident + top, "forward" if at < stage.boundary else "backward"
            local = [e * state_dtype for e in owned]
            if layout.zero == 1:  # ZeroRedundancyOptimizer lists a rank's parameters largest first
                local.sort(reverse=True)
            optimizer_peak = resident + grad_bytes + optimizer_temporaries(local, moments, device)
            entry = RankMemory([(stage.index * r + j) * t + i for j in ids for i in range(t)], param_bytes,
                               grad_bytes, state, saved, buffers, peak, phase, where, in_flight=k)
            if optimizer_peak > peak:
                entry.peak_bytes, entry.peak_phase, entry.peak_step = optimizer_peak, "optimizer", None
            out.append(entry)
    if interleaved:
        out = [_interleaved_rank(rank, chunks, layout, model, grads, constants, moments, precision, device)
               for rank in range(p)]
    return out


def _interleaved_rank(rank: int, chunks: dict[int, tuple], layout: Layout, model: StepModel, grads: dict,
                      constants: dict, moments: int, precision: str | None, device: str) -> RankMemory:
    """A rank's step under Interleaved1F1B (parallel.interleaved): its virtual stages' parameters,
    gradients, state and receive buffers resident, and its actions' peak."""
    p, v, m = layout.pp, layout.virtual, layout.chunks
    mine_chunks = [g for g in sorted(chunks) if g % p == rank]
    touched = set().union(*(chunks[g][1].touched for g in mine_chunks))
    mine = list({q.name: q for g in mine_chunks for q in chunks[g][2]}.values())
    param_bytes, fixed, numel, state_dtype, master = _held(model, mine, touched, constants, precision)
    state = sum(moments * state_dtype * e + STEP_BYTES for e in numel) if moments else 0

    def gradient_bytes(qs) -> int:
        return sum(model.value.get(grads[q.name].name, 0) for q in qs if q.name in grads)

    grad_bytes = gradient_bytes(mine)
    buffers = m * sum(chunks[g][1].received for g in mine_chunks)  # each stage's, one per microbatch
    last = p * v - 1
    info = {g: Chunk(chunks[g][1], chunks[g][0].boundary, gradient_bytes(chunks[g][2]), g == last)
            for g in mine_chunks}
    top, chunk, at, saved, flight = rank_peak(rank_actions(rank, p, v, m), info)
    resident = param_bytes + fixed + state + master + buffers
    stage = chunks[chunk][0]
    peak, phase = resident + top, "forward" if at < stage.boundary else "backward"
    entry = RankMemory([rank], param_bytes, grad_bytes, state, saved, buffers, peak, phase,
                       stage.steps[at] if stage.steps else None, in_flight=flight)
    optimizer_peak = resident + grad_bytes + optimizer_temporaries([e * state_dtype for e in numel], moments,
                                                                   device)
    if optimizer_peak > peak:
        entry.peak_bytes, entry.peak_phase, entry.peak_step = optimizer_peak, "optimizer", None
    return entry


def _held(model: StepModel, mine: list[Tensor], touched: set[str], constants: dict, precision: str | None,
          split: set[str] = frozenset(), t: int = 1) -> tuple[int, int, list[int], int, int]:
    """What a pipeline rank's parameters ``mine`` (their tensor-parallel shares where ``split`` holds
    them) and the constants its steps read keep resident: (parameter bytes, constant bytes, each
    parameter's elements, the optimizer state's dtype size, the float32 master copy's bytes under a
    16-bit model)."""
    param_bytes = sum(local_param(q.name, model.bytes_formula(q).evaluate(model.sizes) or 0, split, t)
                      for q in mine)
    fixed = sum(model.bytes_formula(c).evaluate(model.sizes) or 0 for name, c in constants.items()
                if name in touched and model.bytes_formula(c) is not None)
    numel = [local_param(q.name, int(np.prod(q.shape, dtype=object)) if q.shape else 1, split, t)
             for q in mine]
    sixteen = precision in ("bf16", "fp16")
    state_dtype = 4 if sixteen else dtype_size(mine[0].dtype) if mine else 4
    return param_bytes, fixed, numel, state_dtype, 4 * sum(numel) if sixteen else 0


def _sharded_stage(stage, step, mine: list[Tensor], model: StepModel, fixed: int, whole_grads: int,
                   received: int, k: int, saved: int, layout: Layout, fsdp_units: list[Unit], moments: int,
                   device: str, split: set[str], mixed: bool) -> list[RankMemory]:
    """A stage's ranks under FSDP2 in a pipeline (fsdp.stage_units; the mesh (pp, shard, tp): rank =
    (stage * shards + shard index) * tp + tp index): each holds its padded shards of the stage's
    parameters (of their tensor-parallel shares, ``split`` naming the split ones; the step's activations
    are the share's already) and their state (``mixed``: MixedPrecisionPolicy(param_dtype=<the model's
    16-bit dtype>, reduce_dtype=float32): float32 shards and state, 16-bit gathers, and each backward's
    16-bit gradients accumulated into float32 ones); the schedule gathers each
    unit's parameters (gather) and leaves every backward's gathered, and the unsharded gradients
    accumulating, to the last microbatch's backward, whose end reshards and reduce-scatters each unit's
    (its input beside the whole gradients; on gloo its copy too), leaving sharded gradients for the
    optimizer step."""
    n = layout.dp_shard
    local = stage_units(fsdp_units, stage.blocks, step.touched, stage.steps, stage.boundary)
    steps = len(stage.steps)
    size = {q.name: dtype_size(q.dtype) for q in mine}  # the gathered (compute) dtype
    orig = {q.name: 4 if mixed else size[q.name] for q in mine}  # the shards', their state's, the reduce's
    if mixed and mine:  # the accumulated unsharded gradients are float32 (the model cast to one dtype)
        whole_grads = whole_grads * 4 // size[mine[0].name]
    t = layout.tp
    shapes = {q.name: tp_local(q.shape or (), q.name in split, t) for q in mine}
    for u in local:  # every rank's padded shard, gathered in the compute dtype, reduce-scattered in orig
        u.padded = sum(_padded(shapes[q.name], n) * size[q.name] for q in u.params if q.name in size)
        u.reduce = sum(_padded(shapes[q.name], n) * orig[q.name] for q in u.params if q.name in size)
    profiles = []
    for found in (False, True):  # the warm-up's forwards gather; a forward after a backward finds them
        line = Timeline(steps, model.base.dtype)
        gather(line, local, layout.reshard_after_forward, steps, stage.boundary, device, gathered=found)
        profiles.append(Profile(np.cumsum(line.at)[1:steps + 1], np.cumsum(line.between)[:steps + 1],
                                [(point, extra) for point, extra, _ in line.moments]))
    whole = sum(u.padded for u in local)
    gathered = Gathered(*profiles, whole, layout.reshard_after_forward)
    top, at = stage_peak(step, layout.pp_schedule, k, layout.chunks, whole_grads, gathered,
                         last=stage.index == layout.pp - 1)
    where = stage.steps[at] if stage.steps else None
    clone = device == "cpu"
    end = whole + whole_grads + max((u.reduce * (1 + clone) for u in local), default=0)
    out: list[RankMemory] = []
    for shard, hi in shard_groups(shapes.values(), n):
        param_bytes = state = 0
        shards = []
        for q in mine:
            c, rows, rest = shard_rows(shapes[q.name], n, shard)
            param_bytes += c * rest * orig[q.name]
            state += (moments * rows * rest * orig[q.name] + STEP_BYTES) if moments else 0
            shards.append(rows * rest * orig[q.name])
        resident = param_bytes + fixed + state + received
        peak, phase, step_at = resident + top, "forward" if at < stage.boundary else "backward", where
        if resident + end > peak:  # the last backward's reduce-scatters
            peak, phase, step_at = resident + end, "backward", stage.steps[-1] if stage.steps else None
        optimizer_peak = resident + param_bytes + optimizer_temporaries(shards, moments, device)
        if optimizer_peak > peak:
            peak, phase, step_at = optimizer_peak, "optimizer", None
        ids = [(stage.index * n + s) * t + j for s in range(shard, hi) for j in range(t)]
        entry = RankMemory(ids, param_bytes, param_bytes, state, saved, received + whole, peak, phase,
                           step_at, in_flight=k)
        same = next((e for e in out if e.key() == entry.key()), None)
        if same is not None:
            same.ranks += entry.ranks
        else:
            out.append(entry)
    return out


def _padded(shape: tuple[int, ...], n: int) -> int:
    """The elements FSDP2 gathers for a parameter: every rank's dim-0 shard, padded to ceil(d0 / n) rows."""
    c, _, rest = shard_rows(shape, n, 0)
    return c * n * rest


def _replica_classes(owner: list[int] | None, replicas: int) -> list[tuple[int, list[int]]]:
    """The replica indices that hold alike (all of them but under ZeRO-1, where each holds the state of
    the parameters it owns), each as (a representative, every index like it)."""
    if owner is None:
        return [(0, list(range(replicas)))]
    groups: dict[tuple, list[int]] = {}
    for j in range(replicas):
        groups.setdefault(tuple(i for i, o in enumerate(owner) if o == j), []).append(j)
    return [(ids[0], ids) for ids in groups.values()]


def _classes(layout: Layout, shapes: list, owner: list[int] | None) -> list[tuple[int, list[int]]]:
    """The ranks that can differ, each as (a representative, every rank id like it): under FSDP the
    shard indices of one shard_groups range hold alike; under ZeRO-1 a replica differs by the parameters
    it owns."""
    n, world, t = layout.dp_shard, layout.size, layout.tp
    if layout.sharded:
        # the mesh's order: replicas outer, shards, then tensor-parallel ranks innermost
        # (rank = (replica * n + shard index) * t + tp index), the tensor-parallel ranks alike
        return [(lo * t, [(q * n + s) * t + j for q in range(layout.dp_replicate) for s in range(lo, hi)
                          for j in range(t)])
                for lo, hi in shard_groups(shapes, n)]
    if owner is not None:
        owned: dict[int, list[int]] = {}
        for i, o in enumerate(owner):
            owned.setdefault(o, []).append(i)
        groups: dict[tuple, list[int]] = {}
        for r in range(world):
            groups.setdefault(tuple(owned.get(r, ())), []).append(r)
        return [(ids[0], ids) for ids in groups.values()]
    return [(0, list(range(world)))]


def shard_groups(shapes, n: int) -> list[tuple[int, int]]:
    """The shard indices that hold alike under FSDP, as ranges [lo, hi): a shard index's dim-0 rows
    change only where some parameter's last full, partial or empty shard begins (at most two places per
    parameter), so the indices between those places hold alike."""
    cuts = {0, n}
    for shape in shapes:
        d0 = shape[0] if shape else 1
        c = -(-d0 // n)
        cuts.update(k for k in (d0 // c, -(-d0 // c)) if 0 < k < n)
    edges = sorted(cuts)
    return list(zip(edges, edges[1:], strict=False))


@dataclass
class _Step:
    """What every rank's evaluation of one step reads (rank_memory makes it once)."""

    analysis: object
    model: StepModel  # the one-device step's lifetimes and bytes at ``values``
    values: dict[str, int]
    layout: Layout
    params: list[Tensor]
    shapes: dict[str, tuple[int, ...]]
    grads: dict[str, Tensor]  # parameter name -> its gradient in the joint graph
    compute: dict[str, str]  # parameter name -> the dtype it computes in
    moments: int  # optimizer state tensors per parameter
    mixed: bool  # FSDP2's MixedPrecisionPolicy: fp32 shards, 16-bit gathers
    precision: str | None
    device: str
    fsdp_units: list[Unit]
    chosen: list  # recomputations applied
    own: bool  # at the analysis' own dims, nothing recomputed
    owner: list[int] | None  # ZeRO-1: each parameter's rank
    split: Split | None  # tensor parallel


def _one_rank(step_: _Step, rank: int) -> RankMemory:
    (analysis, model, values, layout, params, shapes, grads, compute, moments, mixed, precision, device,
     fsdp_units, chosen, own, owner, split) = (getattr(step_, f) for f in _Step.__dataclass_fields__)
    shard = (rank // layout.tp) % layout.dp_shard  # the mesh (replicate, shard, tp), tp innermost
    live = analysis.liveness
    steps = model.steps
    line = Timeline(steps, model.base.dtype)
    sharded = layout.sharded
    mine_grads = {g.name for g in grads.values()} if sharded else set()
    changed, stats = model.changes(chosen) if chosen else ({}, [])
    t = split.t if split is not None else 1
    split_names = split.tensors if split is not None else set()

    def on_rank(name: str, value: int) -> int:
        """A tensor's bytes on this rank: a tensor-parallel split's share, else whole."""
        return value // t if name in split_names else value

    for name, value in model.value.items():  # the one-device step's tensors (FSDP's gradients below)
        if name not in mine_grads:
            for born, last in changed.get(name, [live.lifetimes[name]]):
                line.add(born, last, on_rank(name, value))
    for x, step in live.transients:
        if (f := model.bytes_formula(x)) is not None:
            line.add(step, step, on_rank(x.name, f.evaluate(values) or 0))
    for (born, last), f in stats:  # kept statistics, a re-run block's outputs made again
        line.add(born, last, f.evaluate(values) or 0)
    # an all-reduce's output beside its input; a tensor split as it enters the blocks, whole when made
    for name in [*split.reduced, *split.chunked] if split is not None else ():
        if name in model.value:
            born, _ = live.lifetimes[name]
            line.add(born, born, model.value[name], buffer=True)
    mine_params = split.parameters if split is not None else set()
    weights = sum(model.bytes_formula(p).evaluate(values) or 0 for p in params)
    constants = (model.resident.evaluate(values) or 0) - weights
    weights = sum(local_param(p.name, model.bytes_formula(p).evaluate(values) or 0, mine_params, t)
                  for p in params)
    numel = {p.name: local_param(p.name, int(np.prod(shapes[p.name], dtype=object)) if shapes[p.name] else 1,
                                 mine_params, t) for p in params}
    n = layout.dp_shard
    buckets = 0
    if not sharded:
        state_dtype = 4 if precision in ("bf16", "fp16") else dtype_size(params[0].dtype) if params else 4
        mine = list(range(len(params)))
        if owner is not None:
            mine = [i for i in mine if owner[i] == rank]
        param_bytes = weights
        grad_bytes = sum(on_rank(g.name, model.value.get(g.name, 0)) for g in grads.values())
        state = sum(moments * state_dtype * numel[params[i].name] + STEP_BYTES * bool(moments)
                    for i in mine)
        master = 4 * sum(numel.values()) if precision in ("bf16", "fp16") else 0
        resident_state = param_bytes + constants + state + master
        if layout.dp_replicate > 1:  # the reducer's buckets, one flat copy of every gradient
            buckets = grad_bytes
            line.add(-1, steps - 1, buckets, buffer=True)
        local = [numel[params[i].name] * state_dtype for i in mine]
        if owner is not None:  # ZeroRedundancyOptimizer's partition lists a rank's parameters largest first
            local.sort(reverse=True)
    else:
        orig = {p.name: 4 if mixed else dtype_size(p.dtype) for p in params}
        reduce = {p.name: 4 if mixed else dtype_size(compute[p.name]) for p in params}
        param_bytes = state = 0
        local = []
        for u in fsdp_units:
            u.padded = u.reduce = u.sharded = 0
            for p in u.params:
                c, mine_rows, rest = shard_rows(tp_local(shapes[p.name], p.name in mine_params, t), n, shard)
                param_bytes += c * rest * orig[p.name]
                u.sharded += c * rest * orig[p.name]
                u.padded += c * n * rest * dtype_size(compute[p.name])
                u.reduce += c * n * rest * reduce[p.name]
                state += (moments * mine_rows * rest * orig[p.name] + STEP_BYTES) if moments else 0
                local.append(mine_rows * rest * orig[p.name])
        gather(line, fsdp_units, layout.reshard_after_forward, steps, live.boundary, device)
        grad_bytes = param_bytes
        resident_state = param_bytes + constants + state
        reduce_scatter(line, live, model, fsdp_units, grads, steps, device, on_rank)
    top, step, buffered = line.top()
    optimizer_peak = resident_state + grad_bytes + buckets + optimizer_temporaries(local, moments, device)
    peak = resident_state + top
    phase = "forward" if step is not None and step < live.boundary else "backward"
    if optimizer_peak > peak:
        peak, phase, step, buffered = optimizer_peak, "optimizer", None, buckets
    if split is None:
        saved = live.saved_activation_bytes if own else model.saved(chosen).evaluate(values) or 0
    else:
        kept, kept_stats = saved_after(chosen, live)
        saved = sum(on_rank(x.name, f.evaluate(values) or 0) for x in kept
                    if (f := model.bytes_formula(live_storage(live, x))) is not None) + \
            sum(f.evaluate(values) or 0 for f in kept_stats)
    return RankMemory([rank], param_bytes, grad_bytes, state, saved, buffered, peak, phase, step)


def _storage_names(live) -> dict[str, str]:
    """Tensor name -> the name of the tensor whose storage holds it (views and their bases)."""
    return {x.name: base.name for x, base in (live.storage or {}).items() if base is not None}


def tp_local(shape: tuple[int, ...], split: bool, t: int) -> tuple[int, ...]:
    """A parameter's shape on a tensor-parallel rank, as FSDP2 shards it: its 1/t share (its bytes; the
    split dim taken as the first one t divides)."""
    if not split or t == 1 or not shape:
        return shape
    k = next((i for i, d in enumerate(shape) if isinstance(d, int) and d % t == 0), 0)
    return (*shape[:k], shape[k] // t, *shape[k + 1:])


def local_param(name: str, value: int, split: set[str], t: int) -> int:
    """A parameter's bytes (or elements) on a tensor-parallel rank: its shard where the split holds it."""
    return value // t if name in split else value


def live_storage(live, x: Tensor) -> Tensor:
    """The tensor whose storage holds ``x`` (itself unless a view)."""
    base = live.storage.get(x, x) if live.storage else x
    return base if base is not None else x


def largest(analysis, layout: Layout, budget: int, names: list[str], optimizer: str = "adamw",
            chosen: list | None = None) -> int | None:
    """The largest value of the dims ``names`` (set together: the local batch, or the sequence) whose
    step fits ``budget`` on every rank (``chosen`` recomputed); 0 when not even 1 does, None when there is
    no such dim. Under a pipeline a batch is a whole number of microbatches."""
    if not names:
        return None
    unit = layout.chunks if set(names) <= set(model_variables(analysis.graph)[1]) else 1

    def fits(v: int) -> bool:
        dims = solve_values(analysis.sizes, names, v * unit)
        return max(e.peak_bytes for e in rank_memory(analysis, layout, optimizer, dims, chosen)) <= budget

    return largest_fitting(fits) * unit

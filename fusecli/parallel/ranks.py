"""Each rank's training step under a parallel layout: the one-device step (liveness's timeline at the
rank's own batch) with the parameters, gradients, optimizer state and communication buffers as DDP,
ZeroRedundancyOptimizer and FSDP2 hold them on that rank, read from torch's sources (2.13):

- DDP: whole parameters, gradients and state, and the reducer's buckets: a flat copy of every gradient,
  made at construction and kept (``gradient_as_bucket_view=False``, the default);
- ZeRO-1 (``ZeroRedundancyOptimizer``): the state of the parameters this rank owns, assigned largest
  first to the rank with the fewest elements so far;
- FSDP2 (``fully_shard`` per block, then the root): fsdp.py;
- tensor parallelism: tensor.py's split, each split tensor a 1/t share;
- the optimizer step: AdamW on CPU runs its for-loop form (three temporaries the size of the parameter it
  updates); on CUDA the foreach form (``torch._foreach_sqrt`` of every state: one temporary the size of
  all of them), modelled, not measured here.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from ..core.dims import Poly
from ..core.errors import UsageError
from ..core.ir import Tensor, dtype_size
from ..plan.candidates import saved_after
from ..plan.planner import OPTIMIZERS, StepModel, largest_fitting
from .fsdp import Unit, gather, parameters, reduce_scatter, shard_rows, units
from .layout import DEVICES, Layout
from .tensor import Split, find_split
from .timeline import Timeline

STEP_BYTES = 4  # AdamW's ``step``: a float32 scalar tensor per parameter (capturable=False)
LOOP_TEMPORARIES = 3  # _single_tensor_adamw: sqrt(v), its quotient, and the update's, of one parameter


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
    step = _Step(analysis, model, values, layout, params, shapes, grads, compute, moments, mixed, precision,
                 device, units(graph, joint, live) if layout.sharded else [], list(chosen or ()), own, owner,
                 find_split(graph, joint, layout.tp) if layout.tp > 1 else None)
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


def _classes(layout: Layout, shapes: list, owner: list[int] | None) -> list[tuple[int, list[int]]]:
    """The ranks that can differ, each as (a representative, every rank id like it): under FSDP a shard
    index's dim-0 rows change only where some parameter's last full, partial or empty shard begins (at
    most two places per parameter), so the indices between those places hold alike; under ZeRO-1 a
    replica differs by the parameters it owns."""
    n, world = layout.dp_shard, layout.size
    if layout.sharded:
        cuts = {0, n}
        for shape in shapes:
            d0 = shape[0] if shape else 1
            c = -(-d0 // n)
            cuts.update(k for k in (d0 // c, -(-d0 // c)) if 0 < k < n)
        edges = sorted(cuts)
        # the mesh's order: replicas outer, shards inner (rank = replica * n + shard index)
        return [(lo, [q * n + s for q in range(layout.dp_replicate) for s in range(lo, hi)])
                for lo, hi in zip(edges, edges[1:], strict=False)]
    if owner is not None:
        owned: dict[int, list[int]] = {}
        for i, o in enumerate(owner):
            owned.setdefault(o, []).append(i)
        groups: dict[tuple, list[int]] = {}
        for r in range(world):
            groups.setdefault(tuple(owned.get(r, ())), []).append(r)
        return [(ids[0], ids) for ids in groups.values()]
    return [(0, list(range(world)))]


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
    shard = rank % layout.dp_shard
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
    for name in split.reduced if split is not None else ():  # an all-reduce's output beside its input
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
    else:
        orig = {p.name: 4 if mixed else dtype_size(p.dtype) for p in params}
        reduce = {p.name: 4 if mixed else dtype_size(compute[p.name]) for p in params}
        param_bytes = state = 0
        local = []
        for u in fsdp_units:
            u.padded = u.reduce = u.sharded = 0
            for p in u.params:
                c, mine_rows, rest = shard_rows(shapes[p.name], n, shard)
                param_bytes += c * rest * orig[p.name]
                u.sharded += c * rest * orig[p.name]
                u.padded += c * n * rest * dtype_size(compute[p.name])
                u.reduce += c * n * rest * reduce[p.name]
                state += (moments * mine_rows * rest * orig[p.name] + STEP_BYTES) if moments else 0
                local.append(mine_rows * rest * orig[p.name])
        gather(line, fsdp_units, layout.reshard_after_forward, steps, live.boundary, device)
        grad_bytes = param_bytes
        resident_state = param_bytes + constants + state
        reduce_scatter(line, live, model, fsdp_units, grads, steps, device)
    top, step, buffered = line.top()
    temporaries = LOOP_TEMPORARIES * max(local, default=0) if device == "cpu" else sum(local)
    optimizer_peak = resident_state + grad_bytes + buckets + (temporaries if moments else 0)
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
    no such dim."""
    if not names:
        return None
    base = {n: analysis.sizes[n] for n in analysis.sizes}

    def fits(v: int) -> bool:
        dims = {**base, **{n: v for n in names}}
        return max(e.peak_bytes for e in rank_memory(analysis, layout, optimizer, dims, chosen)) <= budget

    return largest_fitting(fits)



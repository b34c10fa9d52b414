"""Each rank's training step under a data-parallel layout: the one-device step (liveness's timeline at the
rank's own batch) with the parameters, gradients, optimizer state and communication buffers as DDP,
ZeroRedundancyOptimizer and FSDP2 hold them on that rank, read from torch's sources (2.13):

- DDP: whole parameters, gradients and state, and the reducer's buckets: a flat copy of every gradient,
  made at construction and kept (``gradient_as_bucket_view=False``, the default);
- ZeRO-1 (``ZeroRedundancyOptimizer``): the state of the parameters this rank owns, assigned largest
  first to the rank with the fewest elements so far;
- FSDP2 (``fully_shard`` per block, then the root): each parameter's dim-0 shard padded to
  ceil(d0 / N) rows; a block's parameters all-gathered (padded, in ``param_dtype``) when its forward begins
  and freed when it ends (``reshard_after_forward``; else kept to its backward), gathered again when the
  block after it starts its backward (the default backward prefetch) and freed after its own; the root's
  gathered from the first step to the last; a block's gradients made whole by backward, copied into one
  reduce-scatter input (padded, in ``reduce_dtype``) after its backward and freed, the input kept until
  the next block's reduce-scatter, the sharded gradients views of its output;
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
from ..core.ir import Graph, Tensor, dtype_size
from ..plan.candidates import block_scopes, saved_after
from ..plan.planner import MAX_SOLVE, OPTIMIZERS, StepModel
from .layout import DEVICES, Layout
from .tensor import Split, find_split

ROOT = "(root)"  # the FSDP unit of the parameters no block holds: embeddings, the last norm, the head
STEP_BYTES = 4  # AdamW's ``step``: a float32 scalar tensor per parameter (capturable=False)
LOOP_TEMPORARIES = 3  # _single_tensor_adamw: sqrt(v), its quotient, and the update's, of one parameter


@dataclass
class Unit:
    """One FSDP unit (a block, or the root) and the schedule steps its parameters are gathered for."""

    name: str
    params: list[Tensor]
    forward: tuple[int, int]  # first and last forward step
    backward: tuple[int, int] | None  # first and last backward step (None: no backward reaches it)
    prefetch: int = 0  # where its backward gather begins: the backward start of the unit after it
    padded: int = 0  # bytes gathered (every rank's padded shard, in the compute dtype)
    reduce: int = 0  # bytes of its reduce-scatter input (padded, in the reduce dtype)
    sharded: int = 0  # bytes of this rank's padded shard (parameters, and their gradients alike)


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


def parameters(graph: Graph) -> list[Tensor]:
    return [t for t in graph.tensors.values() if t.kind == "parameter" and t.producer is None]


def units(graph: Graph, joint: Graph, live) -> list[Unit]:
    """The FSDP units in forward order: one per block (plan.candidates.block_scopes) holding the
    parameters only its nodes read (through weight-only subgraphs: a transpose, a cast), and the root
    holding the rest."""
    at = {n.name: i for i, n in enumerate(live.schedule[:live.boundary])}
    backward: dict[str, list[int]] = {}
    for i, n in enumerate(live.schedule):
        if n.phase == "backward" and n.meta.get("forward") is not None:
            backward.setdefault(n.meta["forward"], []).append(i)
    owner: dict[str, str] = {}
    blocks = block_scopes(graph)
    for scope, nodes in blocks.items():
        for n in nodes:
            owner[n.name] = ".".join(scope)
    found: dict[str, list[Tensor]] = {}
    for p in parameters(graph):
        found.setdefault(_owner(p, owner), []).append(p)
    out = []
    for scope, nodes in blocks.items():
        name = ".".join(scope)
        if name not in found:
            continue
        steps = [at[n.name] for n in nodes if n.name in at]
        back = [i for n in nodes for i in backward.get(n.name, ())]
        out.append(Unit(name, found[name], (min(steps), max(steps)),
                        (min(back), max(back)) if back else None))
    out.sort(key=lambda u: u.forward[0])
    last = len(live.schedule) - 1
    out.append(Unit(ROOT, found.get(ROOT, []), (0, last), (live.boundary, last), live.boundary))
    for u, after in zip(out, out[1:], strict=False):
        if u.backward is not None:
            u.prefetch = min(u.backward[0], after.backward[0] if after.backward else u.backward[0])
    return out


def _owner(p: Tensor, owner: dict[str, str]) -> str:
    """The block whose nodes read ``p`` (through nodes that read only weights), else the root."""
    seen, stack, blocks = set(), [p], set()
    while stack:
        t = stack.pop()
        for c in t.consumers:
            if id(c) in seen:
                continue
            seen.add(id(c))
            if c.name in owner:
                blocks.add(owner[c.name])
            elif all(i is None or i.kind in ("parameter", "constant") or i.meta.get("from_parameter")
                     for i in c.inputs):
                stack.extend(o for o in c.outputs if o is not None)
            else:
                blocks.add(ROOT)
    return blocks.pop() if len(blocks) == 1 else ROOT


def _rows(shape: tuple[int, ...], n: int, rank: int) -> tuple[int, int, int]:
    """FSDP2's dim-0 shard: (padded rows, this rank's rows, elements per row)."""
    d0 = shape[0] if shape else 1
    rest = int(np.prod(shape[1:], dtype=object)) if len(shape) > 1 else 1
    c = -(-d0 // n)
    mine = max(0, min(d0, (rank + 1) * c) - rank * c)
    return c, mine, rest


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
        raise UsageError(f"a data-parallel layout needs --device cpu or cuda, not {device!r}")
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
    fsdp_units = units(graph, joint, live) if layout.sharded else []
    split = find_split(graph, joint, layout.tp) if layout.tp > 1 else None
    out: list[RankMemory] = []
    n = layout.dp_shard
    owner = zero1_owners([int(np.prod(shapes[p.name], dtype=object)) for p in params], layout.dp_replicate) \
        if layout.zero == 1 else None
    for rank, ids in _classes(layout, [shapes[p.name] for p in params], owner):
        entry = _one_rank(analysis, model, values, layout, params, shapes, grads, compute, moments,
                          mixed, precision, rank % n, rank, device, fsdp_units, list(chosen or ()), own,
                          owner, split)
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


class Timeline:
    """Live bytes at each schedule step and at each point between a step and the next (where FSDP's
    hooks run: a block's gather before its first op, its frees and reduce-scatter after its last), as
    difference arrays; and moments: the bytes while a hook runs, above its point's."""

    def __init__(self, steps: int, dtype) -> None:
        self.steps = steps
        self.at = np.zeros(steps + 2, dtype=dtype)  # index s + 1: step s
        self.between = np.zeros(steps + 2, dtype=dtype)  # index b + 1: after step b (b = -1: before 0)
        self.buffers_at = np.zeros(steps + 2, dtype=dtype)  # the communication buffers among them
        self.buffers_between = np.zeros(steps + 2, dtype=dtype)
        self.moments: list[tuple[int, int, int]] = []  # (point, bytes above it, of them buffers)

    def add(self, born: int, last: int, value: int, buffer: bool = False) -> None:
        """Made by step ``born`` (or before it: -1 before the first) and freed after step ``last``."""
        StepModel.add_span(self.at, (born, last), value)
        if last > born:
            StepModel.add_span(self.between, (born, last - 1), value)
        if buffer:
            StepModel.add_span(self.buffers_at, (born, last), value)
            if last > born:
                StepModel.add_span(self.buffers_between, (born, last - 1), value)

    def hooked(self, first: int, last: int, value: int, buffer: bool = True) -> None:
        """Made by a hook before step ``first`` and freed by one after step ``last``."""
        if last >= first:
            StepModel.add_span(self.at, (first, last), value)
            if buffer:
                StepModel.add_span(self.buffers_at, (first, last), value)
        StepModel.add_span(self.between, (first - 1, last - 1), value)
        if buffer:
            StepModel.add_span(self.buffers_between, (first - 1, last - 1), value)

    def top(self) -> tuple[int, int | None, int]:
        """(largest live bytes, the step at or after which it happens, buffer bytes there)."""
        at = np.cumsum(self.at)[1:self.steps + 1]
        between = np.cumsum(self.between)[:self.steps + 1]
        buffers_at = np.cumsum(self.buffers_at)[1:self.steps + 1]
        buffers_between = np.cumsum(self.buffers_between)[:self.steps + 1]
        best = (int(at.max()), int(at.argmax()), int(buffers_at[at.argmax()])) if self.steps else (0, None, 0)
        b = int(between.argmax())
        if between[b] > best[0]:
            best = (int(between[b]), max(b - 1, 0), int(buffers_between[b]))
        for point, extra, buffered in self.moments:
            value = int(between[point + 1]) + extra
            if value > best[0]:
                best = (value, max(point, 0), int(buffers_between[point + 1]) + buffered)
        return best


def _one_rank(analysis, model: StepModel, values: dict[str, int], layout: Layout, params, shapes, grads,
              compute, moments, mixed, precision, shard, rank, device, fsdp_units: list[Unit],
              chosen: list, own: bool, owner: list[int] | None, split: Split | None) -> RankMemory:
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
                c, mine_rows, rest = _rows(shapes[p.name], n, shard)
                param_bytes += c * rest * orig[p.name]
                u.sharded += c * rest * orig[p.name]
                u.padded += c * n * rest * dtype_size(compute[p.name])
                u.reduce += c * n * rest * reduce[p.name]
                state += (moments * mine_rows * rest * orig[p.name] + STEP_BYTES) if moments else 0
                local.append(mine_rows * rest * orig[p.name])
        _gather(line, fsdp_units, layout.reshard_after_forward, steps, live.boundary, device)
        grad_bytes = param_bytes
        resident_state = param_bytes + constants + state
        _reduce(line, live, model, fsdp_units, grads, steps, device)
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

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= MAX_SOLVE and fits(hi):
        lo, hi = hi, hi * 2
    if hi > MAX_SOLVE:
        return MAX_SOLVE
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _gather(line: Timeline, fsdp_units: list[Unit], reshard: bool, steps: int, boundary: int,
            device: str) -> None:
    """The units' gathered parameters over the schedule (module docstring). Each gather fills one flat
    output (on gloo (cpu) the all-gather fills a buffer of its own beside it while it runs), copied out
    into one tensor per parameter in the hook before the unit's first op. In forward the flat output
    stays until the next unit's copy-out is done (the last one until forward ends); in backward it goes
    as soon as it is copied out, a prefetch's flat output living from the gather (before the next unit's
    backward) to the unit's own copy-out."""
    temp = device == "cpu"
    forward = sorted(fsdp_units, key=lambda u: -1 if u.name == ROOT else u.forward[0])
    for k, u in enumerate(forward):
        first = 0 if u.name == ROOT else u.forward[0]
        if u.name == ROOT:
            line.hooked(0, steps - 1, u.padded)
        elif u.backward is None or reshard:
            line.hooked(first, u.forward[1], u.padded)
        else:
            line.hooked(first, u.backward[1], u.padded)
        nxt = forward[k + 1] if k + 1 < len(forward) else None
        line.hooked(first, (nxt.forward[0] - 1) if nxt is not None else boundary - 1, u.padded)  # flat
        before = forward[k - 1].padded if k else 0  # the last flat output, alive through this copy-out
        extra = before + (u.padded if temp and not k else 0)
        if extra:
            line.moments.append((first - 1, extra, extra))
        if reshard and u.name != ROOT and u.backward is not None:
            line.hooked(u.backward[0], u.backward[1], u.padded)
            line.hooked(u.prefetch, u.backward[0] - 1, u.padded)  # the prefetch's flat output
            line.moments.append((u.backward[0] - 1, u.padded, u.padded))  # both at the copy-out
            if temp:
                line.moments.append((u.prefetch - 1, u.padded, u.padded))


def _reduce(line: Timeline, live, model: StepModel, fsdp_units: list[Unit], grads, steps: int,
            device: str) -> None:
    """Gradients under FSDP: each unit's whole gradients die in its post-backward hook, after its last
    op; the reduce-scatter input made there lives until the next unit's hook, the sharded gradients
    from then to the end. While the hook runs: the whole gradients beside the input (the copy-in), then
    the input, the output and, on gloo (cpu), the copy of the input gloo reduces with an all-reduce."""
    order = [u for u in fsdp_units if u.backward is not None]
    order.sort(key=lambda u: u.backward[1])  # post-backward order
    for k, u in enumerate(order):
        end = u.backward[1]
        whole = 0
        for p in u.params:
            g = grads.get(p.name)
            if g is None or g.name not in model.value:
                continue
            born, _ = live.lifetimes[g.name]
            line.add(born, max(born, end), model.value[g.name])
            whole += model.value[g.name]
        nxt = order[k + 1].backward[1] if k + 1 < len(order) else end
        line.hooked(end + 1, nxt, u.reduce)
        line.hooked(end + 1, steps - 1, u.sharded, buffer=False)
        clone = u.reduce if device == "cpu" else 0
        line.moments.append((end, max(whole - u.sharded, clone), max(0, clone)))


"""Pipeline parallelism: the blocks split into ``pp`` stages, one per rank, the batch into microbatches,
and the microbatches a stage holds in flight by schedule (torch.distributed.pipelining's
``ScheduleGPipe``: every forward before any backward, so each stage holds all m; ``Schedule1F1B``:
p - s warm-up forwards on stage s, then one backward per forward, so min(p - s, m)).

A stage runs its blocks' nodes, the nodes before the first block (the embeddings) on the first stage and
those after the last (the final norm, the head, the loss) on the last; a node outside the blocks whose
outputs several stages read (the attention mask, the rotary tables) runs on each of them, as each stage's
module computes them. One microbatch's step on a stage is the one-device schedule's steps of that stage,
in order, each tensor's lifetime cut to them; what crosses stages is held as the schedule holds it: a
stage's output to the end of the microbatch's backward there, the gradient it sends until made, and
what it receives (its input, its output's gradient) in one receive buffer per microbatch, kept.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from ..core.errors import UsageError
from ..core.kinds import GRADIENT_SUM
from ..plan.candidates import block_scopes
from .tensor import SHAPE_READS


@dataclass
class Stage:
    """One pipeline stage: its blocks and the one-device schedule steps it runs, in order."""

    index: int
    blocks: list[str]
    steps: list[int]
    boundary: int  # the local index of its first backward step (len(steps) when none)


def in_flight(schedule: str, stages: int, stage: int, microbatches: int) -> int:
    """Microbatches whose activations stage ``stage`` holds at once (the module docstring)."""
    return microbatches if schedule == "gpipe" else min(stages - stage, microbatches)


def even_split(names: list[str], p: int) -> list[list[str]]:
    """The blocks in p contiguous runs as even as possible, the first stages taking one more."""
    q, r = divmod(len(names), p)
    out, i = [], 0
    for s in range(p):
        out.append(names[i:i + q + (s < r)])
        i += q + (s < r)
    return out


def stages_of(graph, live, p: int) -> tuple[list[Stage], list[frozenset[int]]]:
    """The p stages and, for every schedule step, the stages that run it; UsageError for a model with no
    blocks or fewer blocks than stages."""
    scopes = block_scopes(graph)
    at = {n.name: i for i, n in enumerate(live.schedule[:live.boundary])}
    order = sorted(scopes, key=lambda s: min((at.get(n.name, len(at)) for n in scopes[s]), default=0))
    names = [".".join(s) for s in order]
    if not names:
        raise UsageError(f"--pp {p}: the model has no repeated blocks to split into stages")
    if len(names) < p:
        raise UsageError(f"{p} pipeline stages: the model has {len(names)} blocks, fewer than the stages")
    runs = even_split(names, p)
    stage_of_block = {b: s for s, run in enumerate(runs) for b in run}
    node_stage: dict[str, frozenset[int]] = {}
    for scope, nodes in scopes.items():
        s = frozenset({stage_of_block[".".join(scope)]})
        for n in nodes:
            node_stage[n.name] = s
    schedule, boundary = live.schedule, live.boundary
    last = frozenset({p - 1})
    graded = {o.meta.get("like") for n in schedule[boundary:] for o in n.outputs if o is not None}
    for n in reversed(schedule[:boundary]):
        # outside the blocks, a node runs on the stages that read what it makes; so does one whose outputs
        # take no gradient (a mask, a rotary table, the one copy TorchScript's export shares between blocks):
        # each stage makes its own, no stage sends it
        readers = {s for o in n.outputs if o is not None for c in o.consumers
                   for s in node_stage.get(c.name, ()) if c.phase != "backward" and c.kind not in SHAPE_READS}
        if n.name not in node_stage:
            node_stage[n.name] = frozenset(readers) or last
        elif readers and not any(o is not None and o.name in graded for o in n.outputs):
            node_stage[n.name] |= readers
    of_step: list[frozenset[int]] = []
    made: dict[str, frozenset[int]] = {}  # tensor -> the stages that make it
    for i, n in enumerate(schedule):
        if i < boundary:
            on = node_stage.get(n.name, last)
        elif n.meta.get("forward") in node_stage:
            on = node_stage[n.meta["forward"]]
        else:  # a sum of partial gradients: on the earliest stage making one (the later ones send theirs)
            makers = [s for x in n.inputs if x is not None for s in made.get(x.name, ())]
            on = frozenset({min(makers)}) if makers else last
        of_step.append(on)
        made.update((o.name, on) for o in n.outputs if o is not None)
    out = []
    for s in range(p):
        steps = [i for i, on in enumerate(of_step) if s in on]
        out.append(Stage(s, runs[s], steps, sum(1 for i in steps if i < boundary)))
    return out, of_step


def sent_storages(joint, live, of_step: list[frozenset[int]]) -> set[str]:
    """What the stages send: the storages a step makes that a stage not making them reads (a stage's
    output; the gradient of its input), and the model's outputs (each stage keeps its output to the
    microbatch's backward, the last one too)."""
    storage = live.storage
    outputs = [x for x in joint.outputs if x.meta.get("grad_of") is None]  # not the parameters' gradients
    out = {(storage.get(x) or x).name if x in storage else x.name for x in outputs}
    makers: dict[str, frozenset[int]] = {}
    for i, n in enumerate(live.schedule):
        for x in () if n.kind in SHAPE_READS else n.inputs:
            base = storage.get(x, x) if x is not None and x in storage else x
            if base is not None and base.name in makers and not of_step[i] <= makers[base.name]:
                out.add(base.name)
        makers.update((o.name, of_step[i]) for o in n.outputs if o is not None and o not in storage)
    return out


def autocast_copies(live) -> set[str]:
    """The storages of the weights' casts (autocast's bf16 copies): made once per step and cached by
    autocast for every microbatch of it (the schedule's step runs inside one autocast region), kept
    until the region ends."""
    made_of_weights: set[str] = set()
    out: set[str] = set()
    for n in live.schedule[:live.boundary]:
        ins = [i for i in n.inputs if i is not None]
        if ins and all(i.kind in ("parameter", "constant") or i.name in made_of_weights for i in ins):
            made_of_weights.update(o.name for o in n.outputs if o is not None)
            if n.kind == "cast":
                out.update((live.storage.get(o) or o).name if o in live.storage else o.name
                           for o in n.outputs if o is not None)
    return out


def step_index(schedule) -> dict[str, int]:
    """Node name -> its step in the one-device schedule."""
    return {n.name: i for i, n in enumerate(schedule)}


def _read_elsewhere(tensors: list, stage: Stage, step_of: dict[str, int], of_step) -> bool:
    """Whether a stage other than ``stage`` reads one of ``tensors``."""
    return any(stage.index not in of_step[step_of[c.name]] for x in tensors for c in x.consumers
               if c.name in step_of)


@dataclass
class StageStep:
    """One microbatch's step on a stage: live bytes along its steps, the parameter gradients among them,
    what one microbatch holds from its forward to its backward there, and what it receives."""

    live: np.ndarray  # bytes alive at each local step
    gradients: np.ndarray  # of them, parameter gradients made at an earlier step
    between: np.ndarray  # bytes alive between steps: index b + 1 after local step b (b = -1 before the first)
    gradients_between: np.ndarray  # of them, parameter gradients
    held: int  # bytes alive across the stage's forward/backward boundary
    saved: int  # of them, what autograd saved (not the stage's output, held for its backward)
    received: int  # bytes the stage receives: its input, and its output's gradient
    sent_gradient: int  # bytes of the gradient it sends (its input's), which a schedule's send holds
    copies: int  # autocast's weight copies that backward reads, made once for every microbatch
    touched: set[str]  # the parameters and constants its steps read


def stage_step(stage: Stage, of_step: list[frozenset[int]], model, live, gradient_names: set[str],
               sent: set[str], weights: set[str], step_of: dict[str, int], cached: set[str] = frozenset(),
               share=lambda name, value: value, extra: tuple = (), changed: dict | None = None,
               stats: tuple = ()) -> StageStep:
    """One microbatch's lifetimes on ``stage`` (module docstring), at the StepModel's dims. What the
    stage receives lands in receive buffers of its own, one per microbatch, allocated once and kept
    (torch.distributed.pipelining's), so it is counted apart (``received``), not along the steps; a
    partial gradient of a weight that stages share (``weights``: tied embeddings) is no such thing:
    each stage keeps its own copy's gradient, summed across stages after the step. ``step_of``: node
    name -> its schedule step (step_index, made once for every stage). ``cached``
    (autocast_copies) is made by the first microbatch and kept to the end, once for all of them.
    ``share``: a tensor's bytes on this rank (its tensor-parallel share); ``extra``: (schedule step,
    bytes) made and freed there (an all-reduce's output beside its input); ``changed`` and ``stats``
    (StepModel.changes): the lifetimes a recompute plan gives (a checkpointed block's activations freed
    after its forward and made again in its backward), on the schedule's steps."""
    schedule = live.schedule
    pos = {i: k for k, i in enumerate(stage.steps)}
    end = len(stage.steps) - 1
    spans: dict[str, list[int]] = {}  # storage name -> [first, last] local step touching it
    tensors = {}
    touched: set[str] = set()
    storage = live.storage
    # a storage another stage made that this stage's gradient sums accumulate into (the residual
    # stream's gradient, which one device accumulates in place through every block): the stage
    # receives it into its buffer, which autograd does not accumulate into, so its sums are its own
    writes: dict[str, int] = {}  # storage name -> the first local step writing it
    written: dict[str, list] = {}  # storage name -> the tensors the stage writes into it
    for i in stage.steps:
        n = schedule[i]
        for x in [*(() if n.kind in SHAPE_READS else n.inputs), *n.outputs]:
            if x is None:
                continue
            if x.kind in ("parameter", "constant") and x.producer is None:
                touched.add(x.name)
            base = storage.get(x, x) if x in storage else x
            if base is None or base.name not in model.value:
                continue
            k = pos[i]
            tensors[base.name] = base
            span = spans.setdefault(base.name, [k, k])
            span[0], span[1] = min(span[0], k), max(span[1], k)
            if x is not base and x.producer is n and n.op_type == GRADIENT_SUM:
                writes.setdefault(base.name, k)
                written.setdefault(base.name, []).append(x)
    delta = np.zeros(len(stage.steps) + 2, dtype=model.base.dtype)
    grads = np.zeros_like(delta)
    gap = np.zeros_like(delta)  # between steps: alive after step b when first <= b < last (index b + 1)
    gap_grads = np.zeros_like(delta)
    held = saved = received = sent_gradient = copies = 0
    backward = stage.boundary <= end
    changed = changed or {}

    def local(span: tuple[int, int]) -> tuple[int, int] | None:
        """A span of schedule steps on the stage's local steps (None when it runs on none of them)."""
        lo, hi = bisect.bisect_left(stage.steps, span[0]), bisect.bisect_right(stage.steps, span[1]) - 1
        return (lo, hi) if lo <= hi else None

    def add(first: int, last: int, value: int) -> None:
        delta[first + 1] += value
        delta[last + 2] -= value
        if last > first:
            gap[first + 1] += value
            gap[last + 1] -= value

    for name, (first, last) in spans.items():
        born, gone = live.lifetimes[name]
        value = share(name, model.value[name])
        if born >= 0 and stage.index not in of_step[born]:  # made on another stage: received
            if tensors[name].meta.get("like") not in weights:
                received += value
            if name in writes and born >= live.boundary:  # the stage's own copy (``writes``)
                add(writes[name], last, value)
                if _read_elsewhere(written[name], stage, step_of, of_step):
                    sent_gradient += value  # the stage's input gradient, sent back
            continue
        output = name in sent and born < live.boundary and backward
        if name in changed and not output:  # recomputed: each of its lifetimes (the stage's output, the
            for span in filter(None, map(local, changed[name])):  # root of its backward, is held still)
                add(*span, value)
                if span[0] < stage.boundary <= span[1]:
                    held += value
                    saved += value
            continue
        if name in sent and born >= live.boundary:
            sent_gradient += value
        if output:
            last = end  # the stage's output, the root of its backward, held until that returns
        if name in gradient_names or name in cached:
            last = end  # alive to the step's end (the model's output is not: each microbatch's loss is
            # taken on the last stage, and the output freed)
        add(first, last, value)
        if name in gradient_names and last > first:  # once it exists, a later microbatch's is a
            grads[first + 2] += value  # transient at its birth, added into it (AccumulateGrad)
            grads[last + 2] -= value
            gap_grads[first + 1] += value
            gap_grads[last + 1] -= value
        elif name in cached:
            copies += value if first < stage.boundary <= spans[name][1] else 0  # saved, once for all
        elif first < stage.boundary <= last:
            held += value
            saved += 0 if output else value
    transients = [(step, share(x.name, f.evaluate(model.sizes) or 0)) for x, step in live.transients
                  if (f := model.bytes_formula(x)) is not None]
    for step, v in [*transients, *extra]:
        if step in pos:
            k = pos[step]
            delta[k + 1] += v
            delta[k + 2] -= v
    for span, f in stats:  # kept statistics, a re-run block's outputs made again
        if span[0] in pos and (mapped := local(span)) is not None:
            value = f.evaluate(model.sizes) or 0
            add(*mapped, value)
            if mapped[0] < stage.boundary <= mapped[1]:
                held += value
                saved += value
    n = len(stage.steps)
    return StageStep(np.cumsum(delta)[1:n + 1], np.cumsum(grads)[1:n + 1], np.cumsum(gap)[:n + 1],
                     np.cumsum(gap_grads)[:n + 1], held, saved, received, sent_gradient, copies, touched)


@dataclass
class Profile:
    """Gathered parameter bytes along one microbatch's local steps: at each step, between steps (index
    b + 1 after step b), and (point b, bytes above between[b + 1]) while a hook runs there."""

    at: np.ndarray
    between: np.ndarray
    moments: list[tuple[int, int]]


@dataclass
class Gathered:
    """FSDP2's gathered parameters on a stage's microbatch (parallel.fsdp.stage_units; none without FSDP):
    ``first`` as the warm-up's forwards and the first backward gather them, ``steady`` as a forward after
    a backward finds them (gathered, freed after the forward by ``reshard``) and the backward after it
    gathers them again, and ``whole``, every unit's, as a backward after a backward (or any step when
    nothing reshards) finds them: the pipeline's backwards leave them gathered to the step's end."""

    first: Profile
    steady: Profile
    whole: int
    reshard: bool  # reshard_after_forward

    @staticmethod
    def none(steps: int) -> Gathered:
        empty = Profile(np.zeros(steps, dtype=np.int64), np.zeros(steps + 1, dtype=np.int64), [])
        return Gathered(empty, empty, 0, False)


def _top(at: np.ndarray, between: np.ndarray, gathered: Profile | int) -> tuple[int, int]:
    """(the largest live bytes of one situation, its local step): activations ``at`` the steps and
    ``between`` them, with the parameters gathered as ``gathered`` says (a Profile, or bytes throughout);
    a hook between steps b and b + 1 counts at step b + 1, the op it runs before."""
    if isinstance(gathered, int):
        gathered = Profile(np.full(len(at), gathered), np.full(len(between), gathered), [])
    total_at, total_between = at + gathered.at, between + gathered.between
    best = (int(total_at.max()), int(total_at.argmax()))
    last = len(at) - 1
    b = int(total_between.argmax())
    if int(total_between[b]) > best[0]:
        best = (int(total_between[b]), min(b, last))
    for point, extra in gathered.moments:
        value = int(total_between[point + 1]) + extra
        if value > best[0]:
            best = (value, min(point + 1, last))
    return best


def stage_peak(step: StageStep, schedule: str, k: int, microbatches: int, all_gradients: int,
               gathered: Gathered | None = None, last: bool = False) -> tuple[int, int]:
    """(the activations' peak above the resident state, its local step): the first backward with ``k``
    microbatches in flight and no gradient yet, or a later one, every parameter gradient made, with the
    microbatches then in flight and what the schedule's variables still hold. Under Schedule1F1B's steady
    state k are in flight, the last sent gradient is held (the loop's variable keeps its send op until the
    next backward's) and, after two or more warm-up forwards, the first one's output too (its send's work,
    kept until the steady state ends); under ScheduleGPipe backward j (j >= 1) has m - j in flight and
    all j sent gradients held (their sends are waited on after the last backward), and the j outputs
    whose backward is done (their sends' works are kept in a list until the step returns; ``last``: the
    last stage sends none). ``gathered``: FSDP2's parameters (Gathered): a backward right after a forward
    finds them as that forward left them, one after a backward (GPipe's, the cool-down's) finds every
    unit's gathered."""
    if not len(step.live):
        return 0, 0
    gathered = gathered or Gathered.none(len(step.live))
    # the k-th forward and the first backward: every unit gathered already unless the stage runs one
    # microbatch before it (k = 1) or a forward reshards
    fresh = k == 1 or gathered.reshard
    best = _top((k - 1) * step.held + step.live, (k - 1) * step.held + step.between,
                gathered.first if fresh else gathered.whole)
    later = []  # (microbatches in flight, sent gradients held, outputs held, after a backward)
    if schedule == "1f1b" and microbatches > k:
        later.append((k, 1, int(k >= 2), False))
        if k >= 2 and gathered.reshard:  # the cool-down: backwards in a row, every unit gathered
            later.append((k - 1, 1, 0, True))
    elif microbatches > 1:  # no steady state: the second backward, one fewer in flight; GPipe's list of
        # forward sends keeps every microbatch's output (each send's work) until the step returns
        kept = 0 if last or schedule != "gpipe" else 1  # the last stage sends no output
        later.append((k - 1, 1, kept, True))
        if schedule == "gpipe":
            later.append((1, microbatches - 1, kept * (microbatches - 1), True))  # the last backward
    rest = step.live - step.gradients + all_gradients
    rest_between = step.between - step.gradients_between + all_gradients
    output = step.held - step.saved
    for flight, sends, outputs, whole in later:
        extra = (flight - 1) * step.held + sends * step.sent_gradient + outputs * output
        top = _top(rest + extra, rest_between + extra,
                   gathered.whole if whole or not gathered.reshard else gathered.steady)
        if top[0] > best[0]:
            best = top
    return best

"""fusecli plan: a whole training step's memory as formulas, and what to recompute to fit a budget.

The step = liveness's backward peak (weights, gradients as backward makes them, saved and transient
activations: ``memory.peak_polys`` over the joint schedule) + optimizer state (+ fp32 master weights in
mixed precision), which live through the whole step. When that exceeds the budget, candidates
(``plan.candidates``) are taken cheapest FLOPs per freed byte first; one that does not lower the step
peak is passed over. That sequence does not depend on the budget, and each step in it lowers the peak,
so the plan for a budget (the shortest prefix that fits) has a peak monotone in the budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..core.dims import Poly
from ..core.errors import FuseError, UsageError
from ..core.ir import FLOAT_DTYPES, Tensor, dtype_size
from ..core.units import format_bytes
from ..memory.formulas import INT64_SAFE, max_text, peak_polys
from ..memory.liveness import Liveness
from ..memory.sizes import model_variables, tensor_formula
from ..precision import PRECISIONS
from ..precision.transform import precision_entry
from .candidates import (
    Candidate,
    Interval,
    block_candidates,
    forward_last_use,
    fusion_candidates,
    planned_intervals,
    rng_state_bytes,
    saved_after,
)

# name -> (state tensors per parameter, what they are)
OPTIMIZERS = {"adamw": (2, "AdamW: two moments (m, v)"), "adam": (2, "Adam: two moments (m, v)"),
              "sgd": (0, "SGD without momentum: none"), "sgd-momentum": (1, "SGD with momentum: one buffer"),
              "none": (0, "none")}
MAX_SOLVE = 1 << 40  # the largest dim value the solver tries


@dataclass
class PlanOptions:
    budget: int  # bytes
    optimizer: str = "adamw"
    # --precision, which the analysis applied (precision.transform): None, the export's dtypes
    precision: str | None = None
    solve: str = "batch"  # which dim "largest" solves for: batch | seq
    recompute: str = "all"  # all (fused kernels and checkpointed blocks) | blocks (checkpointing only)
    # a budget below one device's floor is an error, but where each rank holds a share (parallel/)
    floor_check: bool = True


@dataclass
class Line:
    """One line of the step's memory: its bytes at the given dims and its formula in the model's dims."""

    name: str
    bytes: int
    formula: str
    note: str = ""


@dataclass
class Step:
    """One recomputation in the plan's sequence, and the step's memory once it (and those before) apply."""

    candidate: Candidate
    freed_bytes: int  # how much the saved activations shrink (freed minus kept), at the given dims
    flops: int | None  # FLOPs this step adds to backward
    saved_bytes: int  # saved activations after it
    peak_bytes: int  # step peak after it


@dataclass
class Plan:
    options: PlanOptions
    dims: dict[str, int]  # the dims the numbers are at
    solve_dim: str | None  # the dim 'largest' solves for (None: the model has no such dim)
    lines: list[Line]  # parameters, gradients, optimizer state, master weights, saved, backward peak
    floor: int  # weights + gradients + optimizer state (+ master weights): what no recomputation frees
    peak: Line  # the step peak, nothing recomputed
    saved: Line  # saved activations, nothing recomputed
    largest: int | None  # largest solve_dim value that fits with nothing recomputed
    sequence: list[Step]  # every step the planner would take, cheapest first
    chosen: int  # how many of them this budget needs
    planned_peak: Line | None = None  # after the chosen steps (None: nothing chosen)
    planned_saved: Line | None = None
    planned_largest: int | None = None
    framework: str = "ops"  # pytorch | tensorflow | ops: who applies the checkpoints
    notes: list[str] = field(default_factory=list)
    precision: dict = field(default_factory=dict)  # precision.precision_entry of the analysis
    # plan --sac: (preset, ops to save), the policy the checkpointed blocks run under (plan.sac)
    sac: tuple[str | None, list[str] | None] | None = None
    sac_forced_mm_shapes: list[tuple] = field(default_factory=list)  # torchtitan's router mm shapes
    # plan --recompute ops: every choosable call of the checkpointed blocks, saved or re-run, and why
    # (plan.sac_choose.Decision); the policy is ("chosen", None)
    decisions: list = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return (self.planned_peak or self.peak).bytes <= self.options.budget

    @property
    def steps(self) -> list[Step]:
        return self.sequence[:self.chosen]

    @property
    def checkpoints(self) -> list[str]:
        """Module paths (scopes) of the blocks the plan checkpoints."""
        return [s.candidate.name for s in self.steps if s.candidate.kind == "block"]

    @property
    def activation_share(self) -> int:
        """What the budget leaves for saved activations: budget - (step peak - saved activations)."""
        return self.options.budget - (self.peak.bytes - self.saved.bytes)


class StepModel:
    """The joint schedule's lifetimes as byte polynomials (at the plan's dtype), evaluated on demand."""

    def __init__(self, joint, live: Liveness, sizes, extra: Poly) -> None:
        self.live, self.sizes, self.extra = live, dict(sizes), extra
        self.steps = len(live.schedule)
        self.resident = Poly()
        self.formula: dict[str, Poly] = {}
        self.unknown = 0
        storage = live.storage
        for t in joint.tensors.values():
            if t in storage:  # a view or a tensor never allocated: its base's bytes, or none (liveness)
                continue
            f = self.bytes_formula(t)
            if f is None:
                self.unknown += t.kind in ("parameter", "constant") or t.name in live.lifetimes
            elif t.kind in ("parameter", "constant"):
                self.resident = self.resident + f
            elif t.name in live.lifetimes:
                self.formula[t.name] = f
        self.value = {n: f.evaluate(self.sizes) or 0 for n, f in self.formula.items()}
        # every partial sum is at most twice the sum of all sizes: int64 below that bound, else Python ints
        self.dtype_ = np.int64 if 2 * sum(self.value.values()) < INT64_SAFE else object
        self.base = np.zeros(self.steps + 2, dtype=self.dtype_)
        for n, v in self.value.items():
            self.add_span(self.base, live.lifetimes[n], v)
        self.transients = [(step, f) for t, step in live.transients
                           if (f := self.bytes_formula(t)) is not None]
        for step, f in self.transients:
            self.add_span(self.base, (step, step), f.evaluate(self.sizes) or 0)
        self.fwd_last = forward_last_use(live)

    def bytes_formula(self, t: Tensor) -> Poly | None:
        """A tensor's bytes, in the dtype the analysis gave it (--precision applied there)."""
        return tensor_formula(t.shape, t.dtype)

    @staticmethod
    def add_span(delta, interval: Interval, value) -> None:
        born, last = interval
        delta[born + 1] += value
        delta[last + 2] -= value

    def changes(self, chosen: list[Candidate]):
        over, stats = planned_intervals(chosen, self.live, self.fwd_last)
        return {n: iv for n, iv in over.items() if n in self.formula}, stats

    def timeline(self, chosen: list[Candidate]) -> np.ndarray:
        """Live bytes (resident state aside) after each schedule step, with ``chosen`` applied."""
        over, stats = self.changes(chosen)
        delta = self.base.copy()
        for n, intervals in over.items():
            self.add_span(delta, self.live.lifetimes[n], -self.value[n])
            for iv in intervals:
                self.add_span(delta, iv, self.value[n])
        for iv, f in stats:
            self.add_span(delta, iv, f.evaluate(self.sizes) or 0)
        return np.cumsum(delta)[1:self.steps + 1]

    def held_after(self, chosen: list[Candidate], step: int, excluding: set[str] = frozenset()) -> int:
        """Bytes (resident state aside) still alive once ``step`` has run, with ``chosen`` applied: what
        that step last reads is freed as it returns (the timeline counts it alive during the step);
        the tensors named in ``excluding`` left out."""
        over, stats = self.changes(chosen)
        total = 0
        for n, v in self.value.items():
            if n in excluding:
                continue
            for born, last in over.get(n, [self.live.lifetimes[n]]):
                if born <= step < last:
                    total += v
        for (born, last), f in stats:
            if born <= step < last:
                total += f.evaluate(self.sizes) or 0
        return total

    def peak_bytes(self, chosen: list[Candidate]) -> int:
        """The step peak at the plan's dims with ``chosen`` applied."""
        timeline = self.timeline(chosen)
        top = int(timeline.max()) if self.steps else 0
        return top + (self.resident.evaluate(self.sizes) or 0) + (self.extra.evaluate(self.sizes) or 0)

    def peak_polys(self, chosen: list[Candidate]) -> list[Poly]:
        """The step peak's formula (``max`` of these) with ``chosen`` applied."""
        over, stats = self.changes(chosen)
        changes = []
        for n, f in self.formula.items():
            for born, last in over.get(n, [self.live.lifetimes[n]]):
                changes.append((born, last, f))
        changes.extend((b, e, f) for (b, e), f in stats)
        changes.extend((step, step, f) for step, f in self.transients)
        return [p + self.extra for p in peak_polys(self.resident, changes, self.steps)]

    def saved(self, chosen: list[Candidate]) -> Poly:
        tensors, stats = saved_after(chosen, self.live)
        total = Poly()
        for f in [*(self.bytes_formula(t) for t in tensors), *stats]:
            if f is not None:
                total = total + f
        return total


def largest_fitting(fits) -> int:
    """The largest v >= 1 with ``fits(v)``, for a ``fits`` true up to some v and false above it (a step's
    peak grows with every input dim): 0 when not even 1 fits, MAX_SOLVE at most; doubling, then bisection."""
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


def solve_values(sizes, names: list[str], v: int) -> dict[str, int]:
    """Every dim of the analysis with the dims ``names`` set to ``v``, and each expert's token count
    (``routed1``, ...: --routing balanced) scaled with them, as the assumption spreads the tokens (rounded
    up): tokens are proportional to the batch and the sequence."""
    out = {n: sizes[n] for n in sizes}
    old = new = 1
    for n in names:
        old, new, out[n] = old * out[n], new * v, v
    for n in out:
        if n.startswith("routed") and n not in names:
            out[n] = -(-out[n] * new // old)
    return out


def _solve(polys: list[Poly], sizes, names: list[str], budget: int) -> int | None:
    """The largest value v of the dims ``names`` (set together) with max(polys) <= budget (largest_fitting);
    None when there are no such dims."""
    if not names:
        return None
    return largest_fitting(lambda v: max(p.evaluate(solve_values(sizes, names, v)) or 0
                                         for p in polys) <= budget)


def solve_dims(graph, solve: str) -> list[str]:
    """The dims ``largest`` solves for: the model's batch dims, or its sequence dim ('seq', else its one
    dim that is not a batch dim); UsageError when it has none."""
    variables, batch = model_variables(graph)
    if solve == "batch":
        return batch
    if "seq" in variables:
        return ["seq"]
    rest = [v for v in variables if v not in batch]
    if len(rest) != 1:
        raise UsageError(f"--solve seq: the model has no dim named seq, and {len(rest)} other dims "
                         f"({', '.join(rest) or 'none'}) to choose from")
    return rest


def _parameter_count(graph, sizes) -> tuple[int, int]:
    """(parameters, bytes of each as the graph holds them: the export's dtype, or --precision's)."""
    params = [t for t in graph.tensors.values() if t.kind == "parameter" and t.producer is None]
    count = sum((t.nbytes(sizes) or 0) // max(dtype_size(t.dtype), 1) for t in params)
    floats = [dtype_size(t.dtype) for t in params if t.dtype in FLOAT_DTYPES]
    return count, max(floats, default=4)


def step_lines(n_params: int, options: PlanOptions, width: int = 4) -> tuple[list[Line], Poly]:
    """Parameters, gradients, optimizer state (and master weights): the lines no recomputation frees,
    and the part of them liveness does not hold (optimizer state, master weights). ``width``: bytes per
    parameter as the analysis holds them. Autocast (amp-*) keeps float32 parameters, gradients and state;
    a model cast to 16 bits (bf16, fp16, or an export in that dtype) keeps 16-bit weights and
    gradients, and, as DeepSpeed's and Megatron's bf16 modes do, float32 master weights and state."""
    p = options.precision
    if p is not None:
        width = 4 if p == "fp32" or p.startswith("amp-") else 2
    moments, what = OPTIMIZERS[options.optimizer]
    precision = {4: "fp32", 2: "16-bit"}.get(width, f"{width} B") + \
        (f" (autocast {p.removeprefix('amp-')} compute)" if p and p.startswith("amp-") else "")
    weights = width * n_params
    lines = [Line("parameters", weights, str(weights), f"{n_params:,} x {width} B, {precision}"),
             Line("gradients", weights, str(weights), f"one per parameter, {precision}")]
    state = moments * 4 * n_params
    lines.append(Line("optimizer state", state, str(state), what + (", fp32" if moments else "")))
    extra = state
    if width < 4:
        lines.append(Line("master weights", 4 * n_params, str(4 * n_params),
                          "fp32 copy the optimizer updates (DeepSpeed / Megatron bf16)"))
        extra += 4 * n_params
    return lines, Poly.const(extra)


def _step_lines(analysis, options: PlanOptions) -> tuple[list[Line], Poly]:
    count, width = _parameter_count(analysis.graph, analysis.sizes)
    return step_lines(count, options, width)


def step_model(analysis, options: PlanOptions) -> StepModel:
    """The step's lifetimes with the optimizer's and the weights' bytes ``make_plan`` adds (its peaks)."""
    return StepModel(analysis.joint, analysis.liveness, analysis.sizes, _step_lines(analysis, options)[1])


def make_plan(analysis, options: PlanOptions, blocks: list[Candidate] | None = None) -> Plan:
    """The step's memory, and the recomputation plan for ``options.budget`` (FuseError: below the floor);
    ``blocks``: the block checkpoints to choose from (plan.sac's, under a policy), plain ones by default."""
    graph, joint, live, sizes = analysis.graph, analysis.joint, analysis.liveness, analysis.sizes
    if (options.precision is not None and options.precision not in PRECISIONS) \
            or options.optimizer not in OPTIMIZERS:
        raise UsageError(f"unknown precision {options.precision!r} or optimizer {options.optimizer!r}")
    applied = analysis.precision.name if analysis.precision is not None else None
    if applied != options.precision:
        raise UsageError(f"the plan is at precision {options.precision}, the analysis at {applied}: give "
                         "Options(precision=...) the same value")
    lines, extra = _step_lines(analysis, options)
    floor = sum(line.bytes for line in lines)
    if options.budget < floor and options.floor_check:
        parts = " + ".join(f"{line.name} {format_bytes(line.bytes)}" for line in lines if line.bytes)
        raise FuseError(f"budget {format_bytes(options.budget)} is below the parameters' own memory: the "
                        f"floor is {format_bytes(floor)} ({floor:,} bytes: {parts})")
    model = StepModel(joint, live, sizes, extra)
    dims = {n: sizes[n] for n in sizes.variables}
    names = solve_dims(graph, options.solve)
    solve_dim = names[0] if names else None
    saved0 = model.saved([])
    polys0 = model.peak_polys([])
    peak0 = model.peak_bytes([])
    lines.append(Line("saved activations", saved0.evaluate(sizes) or 0, str(saved0),
                      "what backward keeps from the forward"))
    backward = [p - extra for p in polys0]
    lines.append(Line("backward peak", peak0 - (extra.evaluate({}) or 0), max_text(backward),
                      "liveness: weights, gradients so far, live activations"))
    notes = [f"{model.unknown} tensors of unknown size are left out"] if model.unknown else []
    plan = Plan(options, dims, solve_dim, lines, floor,
                Line("step peak", peak0, max_text(polys0), "backward peak + optimizer state"),
                Line("saved activations", saved0.evaluate(sizes) or 0, str(saved0)),
                _solve(polys0, sizes, names, options.budget), [], 0,
                framework=analysis.profile.name if analysis.profile is not None else "ops", notes=notes,
                precision=precision_entry(graph, analysis.precision))
    plan.sequence = recompute_sequence(analysis, model, options.recompute, blocks)
    if peak0 <= options.budget:
        return plan
    plan.chosen = next((i + 1 for i, s in enumerate(plan.sequence) if s.peak_bytes <= options.budget),
                       len(plan.sequence))
    chosen = [s.candidate for s in plan.steps]
    if chosen:
        polys = model.peak_polys(chosen)
        saved = model.saved(chosen)
        plan.planned_peak = Line("step peak", plan.steps[-1].peak_bytes, max_text(polys))
        plan.planned_saved = Line("saved activations", saved.evaluate(sizes) or 0, str(saved))
        plan.planned_largest = _solve(polys, sizes, names, options.budget)
    return plan


def recompute_sequence(analysis, model: StepModel, which: str = "all",
                       blocks: list[Candidate] | None = None) -> list[Step]:
    """Every recomputation worth taking, in order: cheapest FLOPs per freed byte first (ties: model
    order), passing over one that does not lower the step peak now, and retrying those after the next
    one taken. Independent of the budget. ``blocks``: the block checkpoints (plain ones by default)."""
    graph, joint, live, sizes = analysis.graph, analysis.joint, analysis.liveness, analysis.sizes
    cands = list(blocks) if blocks is not None else \
        block_candidates(graph, joint, live, sizes, rng_state_bytes(analysis))
    if which == "all":
        cands = fusion_candidates(analysis.matches, joint) + cands
    saved_now = model.saved([]).evaluate(sizes) or 0

    def net(c: Candidate) -> int:
        return saved_now - (model.saved([c]).evaluate(sizes) or 0)

    worth = [(c, net(c)) for c in cands]
    worth = [(c, b) for c, b in worth if b > 0]
    # costs equal to two significant digits are ties, taken in model order: an earlier block's re-run
    # comes later in backward, when less is alive
    worth.sort(key=lambda cb: (float(f"{(cb[0].flops or 0) / cb[1]:.2g}"), cb[0].kind != "fusion",
                               cb[0].index))
    chosen: list[Candidate] = []
    steps: list[Step] = []
    peak, saved = model.peak_bytes([]), saved_now
    progress = True
    while progress:
        progress = False
        for c, _ in worth:
            if any(c is d for d in chosen):
                continue
            p = model.peak_bytes([*chosen, c])
            if p < peak:
                chosen.append(c)
                s = model.saved(chosen).evaluate(sizes) or 0
                steps.append(Step(c, saved - s, c.flops, s, p))
                peak, saved, progress = p, s, True
    return steps

"""``fusecli plan`` for people (text lines) and for programs (the JSON document)."""

from __future__ import annotations

from ..core.terminal import dims_line
from ..core.units import format_bytes
from ..memory.formulas import evaluate_formula
from .emit import keras_lines, pytorch_lines
from .planner import Line, Plan


def _flops(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("TFLOP", 10**12), ("GFLOP", 10**9), ("MFLOP", 10**6), ("kFLOP", 10**3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} FLOP"


WIDTH = 110  # a line's note is left to the JSON when the line would be wider


def _line(line: Line, dims: dict[str, int]) -> str:
    text = f"  {line.name:<18} {format_bytes(line.bytes):>10}   {short_formula(line.formula, dims)}"
    note = f"  ({line.note})" if line.note else ""
    return text + note if len(text + note) <= WIDTH else text


def short_formula(text: str, dims: dict[str, int]) -> str:
    """A ``max(...)`` of many step totals as the one that peaks at ``dims`` (the JSON keeps them all)."""
    if not text.startswith("max(") or len(text) <= 100:
        return text
    parts = text[4:-1].split(", ")
    top = max(parts, key=lambda p: evaluate_formula(p, dims) or 0)
    return f"{top}  [peaks here; --json: max of {len(parts)}]"


def _largest(plan: Plan, value: int | None) -> str:
    if plan.solve_dim is None or value is None:
        return "the model has no dynamic batch dim to solve for"
    others = ", ".join(f"{k}={v}" for k, v in plan.dims.items() if k != plan.solve_dim)
    at = f" at {others}" if others else ""
    return f"{plan.solve_dim}={value:,}{at}" if value else f"none (not even {plan.solve_dim}=1{at})"


def plan_lines(plan: Plan, model: str) -> list[str]:
    """The report: the step's memory, then either the headroom or the plan and how to apply it."""
    o = plan.options
    dims = dims_line(plan.dims) or "its fixed sizes"
    precision = o.precision or "as exported"
    out = [f"{model}: training step at {dims}, optimizer {o.optimizer}, precision {precision}; budget "
           f"{format_bytes(o.budget)} ({o.budget:,} bytes)", ""]
    if plan.sac is not None:
        preset, save = plan.sac
        what = f"saving {', '.join(sorted(save))}" if save else f"the {preset} policy"
        if preset == "chosen":
            what = "a policy chosen op by op for the budget (--json: sac.calls, each call's why)"
        out[1:1] = [f"checkpointed blocks run under selective checkpointing: {what}"]
    out += [_line(line, plan.dims) for line in plan.lines] + [_line(plan.peak, plan.dims), ""]
    out.append(f"largest with nothing recomputed: {_largest(plan, plan.largest)}")
    out += [f"note: {n}" for n in plan.notes]
    if plan.chosen == 0 and plan.fits:
        out.append(f"fits: headroom {format_bytes(o.budget - plan.peak.bytes)} "
                   f"({o.budget - plan.peak.bytes:,} bytes) under the budget; nothing to recompute")
        return out
    out += ["", f"does not fit: step peak {format_bytes(plan.peak.bytes)} > budget; activations' share of "
            f"the budget {format_bytes(plan.activation_share)}.",
            "Recompute, cheapest FLOPs per freed byte first:"]
    out.append(f"  {'#':>2}  {'what':<40} {'kind':<6} {'freed':>10} {'FLOPs added':>12} {'step peak':>10}")
    for i, s in enumerate(plan.steps, 1):
        c = s.candidate
        kind = "sac" if plan.sac is not None and c.kind == "block" else c.kind
        out.append(f"  {i:>2}  {c.name:<40} {kind:<6} {format_bytes(s.freed_bytes):>10} "
                   f"{_flops(s.flops):>12} {format_bytes(s.peak_bytes):>10}")
    chosen = {s.candidate.name for s in plan.steps}
    for block in sorted({d.block for d in plan.decisions} & chosen):
        mine = [d for d in plan.decisions if d.block == block]
        for label, pick in (("saves", True), ("re-runs", False)):
            names = [d.call.label for d in mine if d.saved == pick]
            out.append(f"      {block} {label}: {', '.join(names) or 'none of its matmul/attention calls'}")
    if plan.planned_peak is not None:
        out += ["", _line(plan.planned_saved, plan.dims), _line(plan.planned_peak, plan.dims),
                f"largest with this plan: {_largest(plan, plan.planned_largest)}"]
    if not plan.fits:
        last = plan.steps[-1].peak_bytes if plan.steps else plan.peak.bytes
        out.append(f"does not fit even with every recomputation fusecli found: the lowest step peak is "
                   f"{format_bytes(last)}")
    fused = [s.candidate.name for s in plan.steps if s.candidate.kind == "fusion"]
    if fused:
        out.append(f"fused kernels (fusecli rewrite --mode training, or the framework's): {', '.join(fused)}")
    if plan.checkpoints:
        out += ["", *apply_lines(plan)]
    return out


def apply_lines(plan: Plan) -> list[str]:
    """How the checkpoints are applied, by the framework that made the model."""
    if plan.framework == "tensorflow":
        names = [s.candidate.layer for s in plan.steps if s.candidate.kind == "block"]
        return ["apply in Keras (layer names):", *("  " + x for x in keras_lines(names))]
    head = "apply in PyTorch (module paths of the exported module; --emit-pytorch FILE.py writes a helper):"
    return [head, *("  " + x for x in pytorch_lines(plan.checkpoints, plan.sac is not None))]


def _line_json(line: Line | None) -> dict | None:
    return None if line is None else {"bytes": line.bytes, "formula": line.formula, "note": line.note}


def plan_json(plan: Plan) -> dict:
    """The plan as one JSON document."""
    o = plan.options
    return {
        "budget": o.budget, "optimizer": o.optimizer, "precision": plan.precision, "dims": plan.dims,
        "solve": plan.solve_dim, "recompute": o.recompute,
        "sac": None if plan.sac is None else {
            "policy": plan.sac[0] or "custom", "save_ops": sorted(plan.sac[1]) if plan.sac[1] else None,
            "calls": [{"block": d.block, "op": d.call.op, "count": d.call.count, "node": d.call.node.name,
                       "saved": d.saved, "flops": d.flops, "bytes": d.bytes, "peak_bytes": d.peak_bytes,
                       "why": d.why} for d in plan.decisions] if plan.decisions else None},
        "memory": {line.name.replace(" ", "_"): _line_json(line) for line in plan.lines},
        "floor": plan.floor, "step_peak": _line_json(plan.peak), "largest": plan.largest,
        "fits_unplanned": plan.peak.bytes <= o.budget, "fits": plan.fits,
        "headroom": o.budget - (plan.planned_peak or plan.peak).bytes,
        "activation_share": plan.activation_share,
        "plan": [{"kind": s.candidate.kind, "name": s.candidate.name, "freed_bytes": s.freed_bytes,
                  "flops": s.flops, "saved_bytes": s.saved_bytes, "step_peak_bytes": s.peak_bytes,
                  "recipe": s.candidate.recipe} for s in plan.steps],
        "planned": None if plan.planned_peak is None else {
            "saved_activations": _line_json(plan.planned_saved), "step_peak": _line_json(plan.planned_peak),
            "largest": plan.planned_largest},
        "curve": [{"flops": f, "step_peak_bytes": p} for f, p in curve(plan)],
        "framework": plan.framework, "checkpoint_modules": plan.checkpoints, "notes": plan.notes,
    }


def curve(plan: Plan) -> list[tuple[int, int]]:
    """Step peak against cumulative added FLOPs along the whole sequence (the start: no recomputation)."""
    points, total = [(0, plan.peak.bytes)], 0
    for s in plan.sequence:
        total += s.flops or 0
        points.append((total, s.peak_bytes))
    return points

"""What ``fusecli rewrite`` prints: a short human summary, or one JSON object with ``--json``."""

from __future__ import annotations

import os
from collections import Counter

from .. import __version__
from .run import RewriteResult
from .verify.benchverdict import Spread, comparisons

_LEVEL_NAMES = {"disabled": "ORT_DISABLE_ALL", "default": "default optimizations"}


def to_json(r: RewriteResult) -> dict:
    v = r.verification
    return {
        "fusecli": __version__, "model": r.path, "output": r.output, "data_file": r.data_file,
        "target": r.options.target, "mode": r.options.mode, "batch": r.options.batch, "dims": r.dims,
        "nodes": {"before": r.nodes_before, "after": r.nodes_after},
        "passes": r.passes, "folded_constants": r.folded_constants,
        "rewrites": [{"pattern": a.pattern, "kernel": a.kernel, "nodes": a.nodes} for a in r.applied],
        "kernels": r.kernel_counts(),
        "ops": {"before": r.ops_before, "after": r.ops_after},
        "unchanged": r.unchanged, "left_out": r.left_out,
        "verification": None if v is None else {
            "ok": v.ok,
            "levels": _levels(v.checks, "output"),
            "regions": {"count": v.regions, "distinct": v.distinct, "not_cut": v.uncut,
                        "levels": _levels(v.region_checks, "region")},
            "model_skipped": v.model_skipped},
        "bench": [{"model": t.label, "median_ms": t.median_ms, "runs": t.runs,
                   "spread_ms": vars(Spread.of(t.times_ms)) if t.times_ms else None} for t in r.timings],
        "bench_verdicts": [{"original": c.original, "rewritten": c.rewritten, "speedup": c.ratio,
                            "verdict": c.verdict} for c in comparisons(r.timings)],
        "refused": r.refused,
    }


def _levels(checks: dict, key: str) -> dict:
    return {lvl: [{key: c.name, "dtype": c.dtype, "relative_l2_error": c.error, "tolerance": c.tolerance,
                   **({} if c.rounding is None else {  # weighed against float64: explain_by_rounding
                       "float64_errors": {"original": c.rounding[0], "rewritten": c.rounding[1]},
                       "explained_by_rounding": c.explained})}
                  for c in cs] for lvl, cs in checks.items()}


def format_summary(r: RewriteResult) -> str:
    name = os.path.basename(os.path.normpath(r.path))
    where = " (nothing written)" if r.refused else f" -> {r.output}" if r.output else ""
    lines = [f"rewrote {name}{where} (target {r.options.target}, mode {r.options.mode}, "
             f"{r.passes} pass{'es' if r.passes != 1 else ''})",
             f"nodes: {r.nodes_before} -> {r.nodes_after}"
             + (f" ({r.folded_constants} constant tensors folded)" if r.folded_constants else "")]
    if r.left_out:
        lines.append(f"regions left out: {r.left_out} (see the 'not rewritten' warnings)")
    if r.applied:
        lines.append("rewrites:")
        by = Counter((a.kernel, a.pattern) for a in r.applied)
        width = max(len(k) for k, _ in by)
        lines += [f"  {n:4d}  {k:<{width}}  from {p}" for (k, p), n in by.most_common()]
    else:
        lines.append("rewrites: none (no safe match has a kernel on this target and mode)")
    fused = {k: n for k, n in sorted(r.ops_after.items()) if k.startswith("com.microsoft.")
             or k in ("LayerNormalization", "SimplifiedLayerNormalization")}
    if fused:
        lines.append("fused ops in the output: "
                     + ", ".join(f"{k.split('.')[-1]} {n}" for k, n in fused.items()))
    if r.data_file:
        lines.append(f"weights written to {r.data_file}")
    v = r.verification
    if v is not None:
        at = ", ".join(f"{k}={v}" for k, v in r.dims.items()) or "fixed sizes"
        lines.append(f"verified with onnxruntime (CPU, {at}):")
        if v.region_checks:
            errs = ", ".join(f"{v.worst(lvl, regions=True):.2g} ({_LEVEL_NAMES.get(lvl, lvl)})"
                             for lvl in v.region_checks)
            lines.append(f"  {v.regions} fused region{'s' if v.regions != 1 else ''} ({v.distinct} distinct) "
                         f"against the nodes they replaced, largest relative L2 error {errs}")
        if v.uncut:
            lines.append(f"  {len(v.uncut)} region{'s' if len(v.uncut) != 1 else ''} not checked on "
                         f"{'their' if len(v.uncut) != 1 else 'its'} own ({v.uncut[0]}"
                         f"{', ...' if len(v.uncut) > 1 else ''}): "
                         + ("the whole model's run below checks them" if v.checks else
                            f"the whole model was not run either ({v.model_skipped or 'no output'})"))
        if v.checks:
            outs = len(next(iter(v.checks.values()), []))
            errs = ", ".join(f"{v.worst(lvl):.2g} ({_LEVEL_NAMES.get(lvl, lvl)})" for lvl in v.checks)
            lines.append(f"  whole model: {outs} output{'s' if outs != 1 else ''}, largest relative L2 "
                         f"error {errs}")
        elif v.model_skipped:
            lines.append(f"  whole model not run ({v.model_skipped})")
    elif r.unchanged and r.options.verify:
        lines.append("not verified: nothing was rewritten, the output's graph is the input's")
    else:
        lines.append("not verified (--no-verify)")
    if r.timings:
        lines += bench_lines(r.timings)
    return "\n".join(lines)


def bench_lines(timings: list) -> list[str]:
    """Median with min / 25th-75th / max per session, then one verdict in words per level."""
    lines = [f"bench ({timings[0].runs} interleaved runs, spinning off; median [25th-75th] (min-max)):"]
    width = max(len(t.label) for t in timings)
    for t in timings:
        if t.times_ms:
            s = Spread.of(t.times_ms)
            lines.append(f"  {t.label:<{width}}  {s.median:9.3f} ms  [{s.q1:.3f}-{s.q3:.3f}]  "
                         f"({s.low:.3f}-{s.high:.3f})")
        else:
            lines.append(f"  {t.label:<{width}}  {t.median_ms:9.3f} ms")
    for c in comparisons(timings):
        lines.append(f"  {c.rewritten}: {c.words()}")
    return lines

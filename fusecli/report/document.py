"""The JSON document (the machine contract); the human report is in ``fusecli.report.text``."""

from __future__ import annotations

from .. import __version__
from ..core.ir import gc_paused
from ..fusion.match import Match
from ..fusion.recompute import saved_if_recomputed
from ..load.routing import routers_of
from ..memory.formulas import formula_text, memory_formulas
from ..memory.liveness import Saved
from ..pipeline import Analysis, routing_hint
from ..precision.transform import precision_entry
from ..spellings.attention import AttentionForm, read_attention
from .peak import peak_entry


def to_json(a: Analysis) -> dict:
    """The contract documented in docs/json.md; parts a pass has not filled are present and empty."""
    with gc_paused():  # a big model's document is millions of small objects: no garbage among them
        return _document(a)


def _document(a: Analysis) -> dict:
    g, live = a.graph, a.liveness
    return {
        "fusecli": __version__,
        "model": a.path,
        "format": g.format,
        "batch": a.sizes.batch if a.sizes.batch is not None else a.options.batch,
        "dims": {n: a.sizes[n] for n in a.sizes.variables},
        "resolved_dims": dict(a.sizes.opaque),
        "routing": routing_entry(a),
        "tensorflow": tensorflow_entry(g),
        "folded_batch_norms": list(g.meta.get("folded_batch_norms", ())),
        "forward": {"nodes": len(g.nodes), "tensors": len(g.tensors),
                    "constant_weights": g.meta.get("constant_weights", 0)},
        "backward": {"nodes": len(a.joint.backward_nodes())},
        "precision": precision_entry(a.graph, a.precision),
        "autodiff": {"profile": a.profile.name if a.profile else "ops", "reason": a.profile_reason,
                     "composites": len(a.joint.meta.get("composites", ()))},
        "saved": [saved_entry(s) for s in live.saved],
        "memory": {"saved_bytes": live.saved_bytes,
                   "saved_activation_bytes": live.saved_activation_bytes,
                   "peak_bytes": live.peak_bytes,
                   "peak": peak_entry(a),
                   "formula": memory_formulas(live, a.joint),
                   "incomplete": live.incomplete(),
                   "unknown_tensors": sum(a.unknown_sizes.values()),
                   "saved_bytes_if_recomputed": saved_if_recomputed(a.matches, live)},
        "patterns": [pattern_entry(m, a.joint.meta.get("attention_kernels", {})) for m in a.matches],
        "near_misses": [n.to_json() for n in a.near_misses],
        "unsupported": [{"op": op, "count": c}
                        for op, c in sorted(a.unsupported().items(), key=lambda kv: (-kv[1], kv[0]))],
    }


def tensorflow_entry(g) -> dict | None:
    """A SavedModel's sizes: whether TensorFlow was imported for them and the tensors its shape inference
    sized (``load.tf_sizes``; the rest the native rules of ``load.tf_shapes`` sized); null for ONNX."""
    if g.format != "savedmodel":
        return None
    record = g.meta.get("tensorflow_sizes") or {}
    return {"imported": bool(record.get("imported")), "sized": list(record.get("tensors", []))}


def routing_entry(a: Analysis) -> dict | None:
    """--routing: the assumption, the routers it applied to, and the token counts it gave; without it, null,
    or where a router's choices left tensors unsized, no assumption and what --routing balanced would do."""
    if a.options.routing is None:
        hint = routing_hint(a)
        return None if hint is None else {"assumption": None, "hint": hint}
    return {"assumption": a.options.routing, "routers": routers_of(a.graph, a.sizes),
            "tokens_per_expert": {n: v for n, v in a.sizes.opaque.items() if n.startswith("routed")}}


def saved_entry(s: Saved) -> dict:
    t, p = s.tensor, s.tensor.producer
    return {"name": t.name, "producer": t.name if p is None else p.name,
            "op": t.kind if p is None else p.op_type, "kind": t.kind, "bytes": s.bytes,
            "bytes_formula": formula_text(t.shape, t.dtype),  # tensor_bytes_formula, once per shape
            "needed_by": [n.name for n in s.needed_by], "reads": s.reads}


def pattern_entry(m: Match, kernels: dict | None = None) -> dict:
    """One match; an attention also says how its framework runs it (``attention``: the kernel PyTorch
    picks for an sdpa export and why, "eager" for softmax(q k^T) v written out, "unknown" otherwise)."""
    v = m.verdict
    extra = {}
    if m.pattern.name == "attention":
        extra["attention"] = attention_entry(m, kernels or {})
    return {"pattern": m.pattern.name, "nodes": [n.name for n in m.nodes], **extra,
            "inference_safe": v.inference_safe, "training_safe": v.training_safe,
            "blocking": [{"tensor": b.tensor.name, "needed_by": b.needed_by, "bytes": b.bytes}
                         for b in v.blocking],
            "reason": v.reason, "phase": m.pattern.phase, "kernel": m.pattern.kernel,
            "traffic_bytes": v.traffic_bytes, "frameworks": v.frameworks,
            "verdict": v.state, "recompute": v.recompute.to_json() if v.recompute else None}


def attention_entry(m: Match, kernels: dict) -> dict:
    """How an attention match runs in its framework, and what its form holds."""
    form = read_attention(m.roles["pv"])
    entry = {"spelling": "unknown", "kernel": None, "reason": ""}
    if isinstance(form, AttentionForm):
        entry.update({"spelling": "sdpa" if form.sdpa else "eager", "additive_terms": len(form.terms),
                      "bool_masks": len(form.bool_masks), "softcap": form.softcap,
                      "grouped_query": form.k_kv is not None, "kv_cache": form.kv_cache,
                      "nan_guard": form.guard})
    chosen = kernels.get(m.roles["pv"].name)
    if chosen is not None:
        entry.update(chosen)
    elif entry["spelling"] == "eager":
        entry.update({"kernel": "eager", "reason": "softmax(q k^T) v written out: each op saves what its "
                      "own backward reads (P among them)"})
    elif entry["spelling"] == "sdpa":
        entry.update({"kernel": "unknown", "reason": "an sdpa spelling, but no PyTorch kernel was modelled "
                      "(another autodiff profile, or a region read outside)"})
    return entry


def pattern_summary(a: Analysis) -> list[dict]:
    """Per pattern: matches, how many are safe for inference and for training, traffic saved."""
    rows: dict[str, dict] = {}
    for m in a.matches:
        r = rows.setdefault(m.pattern.name, {"pattern": m.pattern.name, "matches": 0, "inference_safe": 0,
                                             "training_safe": 0, "traffic_bytes": 0})
        r["matches"] += 1
        r["inference_safe"] += m.verdict.inference_safe
        r["training_safe"] += m.verdict.training_safe
        r["traffic_bytes"] += m.verdict.traffic_bytes
    return list(rows.values())


def print_report(a: Analysis, options=None, echo=None) -> None:
    """The human report (see ``fusecli.report.text``) on stdout."""
    from .text import print_text_report

    print_text_report(a, options, echo)

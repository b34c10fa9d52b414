"""Two exports of one model compared by what matters to a performance engineer (``fusecli diff``).

Exporters name nodes differently, so nothing is paired by node name: scopes are (``fusecli.core.scopes``),
and a fusion match is keyed by its pattern and the scope its nodes share. Matches left over on both
sides where scopes did not pair are paired by their op structure. Saved tensors pair by scope and op.

The differences are a list of dicts, each with a ``kind`` (see ``KINDS``) and ``regression``; the
document (``compare``) adds a summary whose ``exit`` is what the CLI exits with.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from .. import __version__
from ..core import progress
from ..core.dims import DimParseError, Poly, parse_dim
from ..core.errors import UsageError
from ..core.ir import gc_paused
from ..core.scopes import fold, node_scope, pair_scopes, scope_sets, scoper, shared
from ..fusion.match import Match
from ..fusion.verdict import LADDER
from ..pipeline import Analysis, Options, analyze_graph

FAIL_ON = ("fusions", "verdicts", "memory")
CATEGORY = {"fusion_lost": "fusions", "verdict_worse": "verdicts", "memory": "memory"}
KINDS = ("fusion_lost", "fusion_gained", "verdict_worse", "verdict_better", "attention_kernel", "memory",
         "formula_term", "saved_appeared", "saved_vanished", "near_miss_gained", "near_miss_lost",
         "unsupported_gained", "unsupported_lost",
         "unpaired_scope")
TOTALS = ("saved_bytes", "saved_activation_bytes", "peak_bytes")
TOP_SAVED = 5  # groups of saved tensors listed as appeared / vanished, per side (largest first)


# ---- loading both at the same dims ------------------------------------------------------------------

def analyze_pair(old: str, new: str, batch: int | None, dims: dict[str, int], signature: str | None = None,
                 wrt_inputs: bool = False, precision: str | None = None, device: str = "cpu",
                 ) -> tuple[Analysis, Analysis, list[str], dict[str, str]]:
    """Both models analyzed at the same --batch / --dim (and --precision, --device); a --dim only one
    model has is applied to that one (a note says so), a --dim neither has is a UsageError.
    ``signature`` applies to SavedModels.
    Also returns NEW's batch dim name -> OLD's where the two differ (tf2onnx's ``unk__16`` and a
    SavedModel's ``batch``), so that their formulas compare term by term."""
    import os

    from ..load import load_model
    from ..memory.sizes import model_variables

    graphs = []
    with gc_paused(), progress.stages():
        for path in (old, new):
            progress.stage(f"reading {os.path.basename(os.path.normpath(path))}")
            graphs.append(load_model(path, signature if os.path.isdir(path) else None))
        (names_old, batch_old), (names_new, batch_new) = (model_variables(g) for g in graphs)
        names = [names_old, names_new]
        neither = [d for d in dims if d not in names[0] and d not in names[1]]
        if neither:
            raise UsageError(f"--dim {neither[0]}: neither model has a dim of that name (OLD: "
                             f"{', '.join(names[0]) or 'none'}; NEW: {', '.join(names[1]) or 'none'})")
        notes, rename = [], {}
        if len(batch_old) == len(batch_new) == 1 and batch_old != batch_new:
            rename = {batch_new[0]: batch_old[0]}
            notes.append(f"batch dims named differently: OLD {batch_old[0]!r}, NEW {batch_new[0]!r} "
                         "(compared as one)")
        for d in sorted((set(names[0]) ^ set(names[1])) - set(rename) - set(rename.values())):
            which = "OLD" if d in names[0] else "NEW"
            given = f" (--dim {d}={dims[d]} applies to {which} only)" if d in dims else ""
            notes.append(f"dim {d!r} exists in {which} only{given}")
        out = []
        for path, graph, have in zip((old, new), graphs, names, strict=True):
            options = Options(batch=batch, dims={d: v for d, v in dims.items() if d in have},
                              signature=signature, wrt_inputs=wrt_inputs, precision=precision,
                              device=device)
            out.append(analyze_graph(path, graph, options))
    return out[0], out[1], notes, rename


# ---- fusion blocks ----------------------------------------------------------------------------------

@dataclass
class Block:
    """One match, as the diff sees it."""

    match: Match
    scope: str  # folded, in OLD's spelling once paired
    state: str
    structure: tuple[str, ...]  # the kinds of its nodes, sorted
    attention_kernel: str | None = None

    @property
    def rank(self) -> int:
        return LADDER.index(self.state) if self.state in LADDER else 0


def blocks(a: Analysis, rename: dict[str, str]) -> list[Block]:
    """Every match as a Block, its scope renamed to OLD's where paired."""
    from ..report.document import attention_entry

    kernels = a.joint.meta.get("attention_kernels", {})
    scope_of = scoper(a)
    out = []
    for m in a.matches:
        scope = fold(shared([scope_of(n) for n in m.nodes])) if m.nodes else ""
        att = attention_entry(m, kernels)["kernel"] if m.pattern.name == "attention" else None
        state = m.verdict.state if m.verdict is not None else "not fusable"
        out.append(Block(m, rename.get(scope, scope), state, tuple(sorted(n.kind for n in m.nodes)), att))
    return out


def _holders(bs: list[Block]) -> dict[int, Block]:
    """id(block) -> a block of another pattern whose nodes include all of its nodes (candidates: the
    blocks holding its first node, so this stays linear in the matches on a big model)."""
    by_node: dict[int, list[Block]] = defaultdict(list)
    for b in bs:
        for n in b.match.nodes:
            by_node[id(n)].append(b)
    out = {}
    for b in bs:
        if not b.match.nodes:
            continue
        inner = {id(n) for n in b.match.nodes}
        for c in by_node[id(b.match.nodes[0])]:
            if c is b or c.match.pattern.name == b.match.pattern.name:
                continue
            if len(c.match.nodes) > len(inner) and inner <= {id(n) for n in c.match.nodes}:
                out[id(b)] = c
                break
    return out


def compare_fusions(old: list[Block], new: list[Block], unpaired: set[str]) -> tuple[list[dict], int]:
    """fusion_lost / fusion_gained per (pattern, scope), verdicts and attention kernels that changed;
    and how many matches were paired by op structure alone (their scopes unpaired)."""
    groups: dict[tuple[str, str], tuple[list[Block], list[Block]]] = defaultdict(lambda: ([], []))
    for side, bs in ((0, old), (1, new)):
        for b in bs:
            groups[(b.match.pattern.name, b.scope)][side].append(b)
    lost, gained, changes = [], [], []
    for o, n in groups.values():
        o, n = sorted(o, key=lambda b: b.rank), sorted(n, key=lambda b: b.rank)
        changes += list(zip(o, n, strict=False))
        lost += o[len(n):]
        gained += n[len(o):]
    # left over where a scope could not be paired: pair by pattern and op structure
    by_structure: dict[tuple, list[Block]] = defaultdict(list)
    for b in gained:
        by_structure[(b.match.pattern.name, b.structure)].append(b)
    still_lost, paired = [], 0
    for b in lost:
        cands = by_structure.get((b.match.pattern.name, b.structure))
        if cands and (b.scope in unpaired or cands[0].scope in unpaired):
            changes.append((b, cands.pop(0)))
            paired += 1
        else:
            still_lost.append(b)
    gained = [b for bs in by_structure.values() for b in bs]
    diffs = _fusion_entries("fusion_lost", still_lost, old, new)
    diffs += _fusion_entries("fusion_gained", gained, new, old)
    diffs += _verdict_entries(changes)
    return diffs, paired


def _fusion_entries(kind: str, bs: list[Block], side: list[Block], other: list[Block]) -> list[dict]:
    """Grouped per (pattern, scope); a block held by a larger match that the other model has too is
    'within' it (the loss of bias_softmax inside an attention that stays is no regression)."""
    from ..rewrite.kernels.registry import EMITTERS  # the patterns `fusecli rewrite` has a kernel emitter for

    holders = _holders(side)
    kept = {(b.match.pattern.name, b.scope) for b in other}
    rows: dict[tuple, dict] = {}
    for b in bs:
        h = holders.get(id(b))
        within = h.match.pattern.name if h is not None and (h.match.pattern.name, h.scope) in kept else None
        key = (b.match.pattern.name, b.scope, within)
        r = rows.setdefault(key, {"kind": kind, "pattern": b.match.pattern.name, "scope": b.scope,
                                  "count": 0, "verdict": b.state, "kernel": b.match.pattern.kernel,
                                  "rewrite": b.match.pattern.name in EMITTERS,
                                  "within": within, "nodes": [n.name for n in b.match.nodes][:8],
                                  "regression": kind == "fusion_lost" and within is None
                                  and b.state != "not fusable"})
        r["count"] += 1
    return list(rows.values())


def _verdict_entries(changes: list[tuple[Block, Block]]) -> list[dict]:
    rows: dict[tuple, dict] = {}
    for o, n in changes:
        if o.rank != n.rank:
            kind = "verdict_worse" if n.rank < o.rank else "verdict_better"
            key = (kind, o.match.pattern.name, o.scope, o.state, n.state)
            r = rows.setdefault(key, {"kind": kind, "pattern": o.match.pattern.name, "scope": o.scope,
                                      "old": o.state, "new": n.state, "count": 0,
                                      "nodes": [x.name for x in n.match.nodes][:8],
                                      "regression": kind == "verdict_worse"})
            r["count"] += 1
        if o.attention_kernel != n.attention_kernel:
            key = ("attention_kernel", o.scope, o.attention_kernel, n.attention_kernel)
            r = rows.setdefault(key, {"kind": "attention_kernel", "pattern": "attention", "scope": o.scope,
                                      "old": o.attention_kernel, "new": n.attention_kernel, "count": 0,
                                      "regression": False})
            r["count"] += 1
    return list(rows.values())


# ---- memory -----------------------------------------------------------------------------------------

def _poly(text: str, values: dict[str, int] | None = None) -> Poly | None:
    """A total's formula as a polynomial; for a peak's ``max(...)`` the one that is largest at
    ``values`` (the step that peaks at the given sizes). None for an unknown part or other text."""
    if "unknown" in text:
        return None
    try:
        if text.startswith("max(") and text.endswith(")"):
            if values is None:
                return None
            polys = [parse_dim(p) for p in text[4:-1].split(", ")]
            return max(polys, key=lambda p: p.evaluate(values) or 0) if polys else None
        return parse_dim(text)
    except (DimParseError, RecursionError):
        return None


def _renamed(p: Poly, rename: dict[str, str]) -> Poly:
    out = Poly()
    for m, c in p.terms.items():
        term = Poly.const(c)
        for sym, e in m:
            for _ in range(e):
                term = term * Poly.var(rename.get(sym, sym))
        out = out + term
    return out


def term_name(monomial) -> str:
    """'batch*seq^2'; '1' for the constant term."""
    return str(Poly({monomial: 1})) if monomial else "1"


def compare_memory(old: dict, new: dict, tolerance: float, rename: dict[str, str] | None = None,
                   dims: tuple[dict, dict] = ({}, {})) -> list[dict]:
    """Each total at the given dims (a regression above ``tolerance``), then the formulas term by term
    (the peak's: of the step that peaks at ``dims``, OLD's and NEW's); ``old``/``new`` are the
    analyses' JSON ``memory`` parts, NEW's dims renamed by ``rename``."""
    diffs = []
    for total in TOTALS:
        a, b = old[total], new[total]
        if a == b:
            continue
        change = None if not a else (b - a) / a
        diffs.append({"kind": "memory", "total": total, "old": a, "new": b, "change": change,
                      "regression": b > a and (change is None or change > tolerance)})
    for total in TOTALS:
        p, q = _poly(old["formula"][total], dims[0]), _poly(new["formula"][total], dims[1])
        if p is None or q is None:
            continue
        if rename:
            q = _renamed(q, rename)
        for m in sorted(set(p.terms) | set(q.terms), key=lambda m: (sum(e for _, e in m), m)):
            a, b = p.terms.get(m, 0), q.terms.get(m, 0)
            if a != b:
                what = "appeared" if not a else "vanished" if not b else "changed"
                diffs.append({"kind": "formula_term", "total": total, "term": term_name(m), "old": a,
                              "new": b, "change": what, "regression": False})
    return diffs


def compare_saved(old: Analysis, new: Analysis, rename: dict[str, str]) -> list[dict]:
    """The largest saved activations that appeared or vanished, paired by (scope, op)."""
    from ..memory.formulas import tensor_bytes_formula

    def keyed(a: Analysis, names: dict[str, str]):
        out: dict[tuple[str, str], list] = defaultdict(list)
        for s in a.liveness.saved:
            t = s.tensor
            if t.kind != "activation" or t.producer is None:
                continue
            scope = fold(node_scope(t.producer))
            out[(names.get(scope, scope), t.producer.op_type)].append(s)
        return out

    o, n = keyed(old, {}), keyed(new, rename)
    diffs = []
    for kind, mine, theirs in (("saved_vanished", o, n), ("saved_appeared", n, o)):
        rows: dict[tuple, dict] = {}
        for key, ss in mine.items():
            k = len(ss) - len(theirs.get(key, ()))
            for s in sorted(ss, key=lambda s: -(s.bytes or 0))[:max(k, 0)]:
                formula = tensor_bytes_formula(s.tensor)
                r = rows.setdefault((*key, formula, s.bytes), {
                    "kind": kind, "scope": key[0], "op": key[1], "tensor": s.tensor.name, "count": 0,
                    "bytes": s.bytes, "bytes_formula": formula, "regression": False})
                r["count"] += 1
        top = sorted(rows.values(), key=lambda r: -(r["bytes"] or 0) * r["count"])
        diffs += top[:TOP_SAVED]
    return diffs


def compare_near_misses(old: Analysis, new: Analysis, rename: dict[str, str]) -> list[dict]:
    """Attention-shaped regions that did not match (and the op that broke each) gained or lost, paired
    by the softmax's scope: a lost attention fusion's reason is often NEW's near miss."""
    def keyed(a: Analysis, names: dict[str, str]) -> dict[str, list]:
        out: dict[str, list] = defaultdict(list)
        for n in a.near_misses:
            scope = fold(node_scope(n.softmax))
            out[names.get(scope, scope)].append(n)
        return out

    o, n = keyed(old, {}), keyed(new, rename)
    diffs = []
    for kind, mine, theirs in (("near_miss_lost", o, n), ("near_miss_gained", n, o)):
        for scope, misses in mine.items():
            k = len(misses) - len(theirs.get(scope, ()))
            if k > 0:
                first = misses[0]
                diffs.append({"kind": kind, "scope": scope, "count": k, "op": first.node.op_type,
                              "node": first.node.name, "reason": first.reason, "regression": False})
    return diffs


def compare_unsupported(old: Analysis, new: Analysis) -> list[dict]:
    a, b = Counter(old.unsupported()), Counter(new.unsupported())
    diffs = []
    for op in sorted(set(a) | set(b)):
        if a[op] != b[op]:
            kind = "unsupported_gained" if b[op] > a[op] else "unsupported_lost"
            diffs.append({"kind": kind, "op": op, "old": a[op], "new": b[op], "regression": False})
    return diffs


# ---- the document -----------------------------------------------------------------------------------

@dataclass
class DiffOptions:
    tolerance: float = 0.02  # memory growth allowed, as a fraction
    fail_on: tuple[str, ...] = FAIL_ON
    notes: list[str] = field(default_factory=list)
    dim_rename: dict[str, str] = field(default_factory=dict)  # NEW's dim name -> OLD's (batch dims)


def compare(old: Analysis, new: Analysis, options: DiffOptions | None = None) -> dict:
    """The diff document: both sides, every difference, the scope pairing and a summary."""
    from ..report.document import to_json

    options = options or DiffOptions()
    docs = [to_json(old), to_json(new)]
    (old_direct, old_every), (new_direct, new_every) = scope_sets(old), scope_sets(new)
    rename = pair_scopes(old_every, new_every)
    unpaired_old = sorted(old_direct - set(rename.values()) - {""})
    unpaired_new = sorted(new_direct - set(rename) - {""})
    unpaired = (old_every - set(rename.values())) | (new_every - set(rename))
    old_blocks, new_blocks = blocks(old, {}), blocks(new, rename)
    diffs, by_structure = compare_fusions(old_blocks, new_blocks, unpaired)
    diffs += compare_memory(docs[0]["memory"], docs[1]["memory"], options.tolerance,
                            options.dim_rename, (docs[0]["dims"], docs[1]["dims"]))
    diffs += compare_saved(old, new, rename)
    diffs += compare_near_misses(old, new, rename)
    diffs += compare_unsupported(old, new)
    for side, bs, left in (("OLD", old_blocks, old_every - set(rename.values())),
                           ("NEW", new_blocks, new_every - set(rename))):
        held = Counter(b.scope for b in bs if b.scope in left and b.scope)
        diffs += [{"kind": "unpaired_scope", "side": side, "scope": scope, "matches": n, "regression": False}
                  for scope, n in sorted(held.items())]
    failing = sorted({CATEGORY[d["kind"]] for d in diffs if d["regression"] and d["kind"] in CATEGORY}
                     & set(options.fail_on))
    counts = Counter(d["kind"] for d in diffs)
    return {
        "fusecli": __version__,
        "old": _side(docs[0]), "new": _side(docs[1]),
        "summary": {"regression": bool(failing), "exit": 1 if failing else 0, "failing": failing,
                    "fail_on": list(options.fail_on), "tolerance": options.tolerance,
                    "counts": {k: counts[k] for k in KINDS if counts[k]},
                    "regressions": sum(1 for d in diffs if d["regression"])},
        "differences": diffs,
        "pairing": {"scopes_old": len(old_direct - {""}), "scopes_new": len(new_direct - {""}),
                    "paired": len(set(rename) & (new_direct - {""})),
                    "matches_paired_by_structure": by_structure,
                    "unpaired_old": unpaired_old, "unpaired_new": unpaired_new},
        "notes": list(options.notes),
    }


def _side(doc: dict) -> dict:
    patterns = Counter(p["pattern"] for p in doc["patterns"])
    return {"model": doc["model"], "format": doc["format"], "dims": doc["dims"],
            "forward_nodes": doc["forward"]["nodes"], "backward_nodes": doc["backward"]["nodes"],
            "memory": {k: doc["memory"][k] for k in TOTALS}, "formula": doc["memory"]["formula"],
            "patterns": dict(sorted(patterns.items())),
            "unsupported": {u["op"]: u["count"] for u in doc["unsupported"]}}


def parse_tolerance(text: str) -> float:
    """'2%' or '2' (percent) -> 0.02; UsageError otherwise."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise UsageError(f"--tolerance {text!r}: expected a percentage such as 2% or 0.5%")
    return value / 100


def parse_fail_on(text: str) -> tuple[str, ...]:
    names = tuple(p.strip() for p in text.split(","))
    bad = [n for n in names if n not in FAIL_ON]
    if bad or not names:
        raise UsageError(f"--fail-on {text!r}: expected some of {','.join(FAIL_ON)} separated by commas")
    return names


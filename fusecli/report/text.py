"""The report people read: plain text laid out for the terminal's width (80 columns first).

Order: the model in a few lines, the verdict summary per pattern, memory, the largest saved tensors,
the matches grouped (repeated blocks are one line with a count and a name pattern), what was not fused
and why, unsupported ops. ``-q`` stops after memory; ``-v`` lists every saved tensor and every match.
Names are text, never markup; the scope prefix all node names share is printed once and shown as
``…/``; a name too long for its column is cut in the middle, never to a prefix other rows share.
Every step is linear in the length of the names (no wrapping library on 50k-character names).
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from dataclasses import dataclass

from ..core.names import ELLIPSIS, common_scope, cut, cut_end, fit_unique, name_pattern, skeleton
from ..core.terminal import Style, dims_line, printable, terminal_report
from ..core.units import format_bytes, format_shape, sum_bytes
from ..fusion.match import Match
from ..fusion.recompute import recompute_all
from ..memory.formulas import fold_opaque, grouped_total, memory_formulas
from ..pipeline import Analysis, routing_hint
from ..precision.transform import precision_entry
from .peak import peak_entry, peak_not_counted

MIN_WIDTH, MAX_WIDTH = 60, 200
_UNIT = re.compile(r"(\d) (?=(?:B|KiB|MiB|GiB)\b)")
_NAMEISH = re.compile(r"[^\s,;()]*[/:\d][^\s,;()]*")  # tokens that carry names or numbers


@dataclass
class TextOptions:
    """What the user asked for: ``-v`` (everything), ``-q`` (summary only), ``--all`` (every saved tensor)."""

    verbose: bool = False
    quiet: bool = False
    all_saved: bool = False
    top: int = 10  # saved tensors shown by default (docs/cli.md and --help say the 10 largest)
    width: int | None = None  # None: the terminal's (COLUMNS), 80 when not a terminal
    color: bool = False


def terminal_width() -> int:
    return max(MIN_WIDTH, min(MAX_WIDTH, shutil.get_terminal_size((80, 24)).columns))


# ---- names ---------------------------------------------------------------------------------------

class Namer:
    """Strips the common scope prefix from node and tensor names (backward names 'gradients/<fwd>')."""

    def __init__(self, prefix: str) -> None:
        self.prefix = printable(prefix, newlines=False)

    def __call__(self, name: str) -> str:
        name = printable(name, newlines=False)  # a name is one line on the terminal, its controls escaped
        p = self.prefix
        if p and name.startswith(p):
            return ELLIPSIS + "/" + name[len(p):]
        q = p.lstrip("/")  # backward names drop the forward name's leading '/'
        if q and name.startswith("gradients/" + q):
            return "gradients/" + ELLIPSIS + "/" + name[len(q) + 10:]
        return name

    def text(self, text: str, limit: int = 60) -> str:
        """Names inside free text (a verdict's reason): prefix stripped, each cut to ``limit``."""
        text = printable(text, newlines=False)
        if self.prefix:
            text = text.replace(self.prefix, ELLIPSIS + "/")
        return _NAMEISH.sub(lambda m: cut(m.group(0), limit), text)


# ---- layout --------------------------------------------------------------------------------------

@dataclass
class Column:
    header: str
    right: bool = False
    flex: int = 0  # > 0: shrinks to fit, sharing the space left in this proportion
    names: bool = False  # a flexible column of names: cut so that no two read the same


def table(columns: list[Column], rows: list[list[str]], width: int, indent: str = "  ") -> list[str]:
    """Rows laid out in ``width`` columns; flexible columns are cut (uniquely) to what is left."""
    gap = 2
    natural = [max([len(c.header)] + [len(r[k]) for r in rows]) for k, c in enumerate(columns)]
    fixed = sum(natural[k] for k, c in enumerate(columns) if not c.flex)
    room = width - len(indent) - fixed - gap * (len(columns) - 1)
    flex = [k for k, c in enumerate(columns) if c.flex]
    widths = list(natural)
    if flex:
        # give each flexible column its share; one that needs less hands the rest to the others
        pending = sorted(flex, key=lambda k: natural[k] / columns[k].flex)
        for n, k in enumerate(pending):
            weight = sum(columns[j].flex for j in pending[n:])
            share = max(8, room * columns[k].flex // weight)
            widths[k] = min(natural[k], share)
            room -= widths[k]
        for k in flex:
            if widths[k] < natural[k]:
                cells = [r[k] for r in rows]
                cells = fit_unique(cells, widths[k]) if columns[k].names else \
                    [cut_end(c, widths[k]) for c in cells]
                for r, c in zip(rows, cells, strict=True):
                    r[k] = c
    lines = []
    for r in [[c.header for c in columns], *rows]:
        cells = [(v.rjust(widths[k]) if columns[k].right else v.ljust(widths[k]))
                 for k, v in enumerate(r)]
        lines.append((indent + (" " * gap).join(cells)).rstrip())
    return lines


def wrap(text: str, width: int, indent: str) -> list[str]:
    """Greedy word wrap with the indent kept on every line (linear: words longer than a line are cut)."""
    room = max(20, width - len(indent))
    lines, line = [], ""
    text = _UNIT.sub("\\1\u00a0", text.replace("\n", " "))  # '32 B' stays on one line
    for word in text.split(" "):
        if not word:
            continue
        word = cut(word, room)
        if line and len(line) + 1 + len(word) > room:
            lines.append(indent + line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        lines.append(indent + line)
    return [x.replace("\u00a0", " ") for x in lines]


# ---- verdict classes -------------------------------------------------------------------------------

def verdict_class(m: Match) -> str:
    """'training-safe', 'training-safe if recomputed', 'inference only', 'backward fusion', 'not fusable'."""
    if m.pattern.phase == "backward":
        return "backward fusion" if m.verdict.training_safe else "not fusable"
    return m.verdict.state  # its rung of fusion.verdict.LADDER


def frees_nothing(m: Match) -> bool:
    """A 'training-safe if recomputed' match whose recompute keeps at least as much as it frees."""
    rc = m.verdict.recompute
    return rc is not None and rc.frees_nothing


CLASS_COLOR = {"training-safe": "green", "backward fusion": "green", "training-safe if recomputed": "cyan",
               "inference only": "yellow", "not fusable": "red"}


def _yes(v: bool | None) -> str:
    return {True: "yes", False: "no", None: "?"}[v]


def blocked_bytes(m: Match) -> int | None:
    """Bytes of the interior tensors that backward reads (what keeps the match from training fused)."""
    return sum_bytes(b.bytes for b in m.verdict.blocking) if not m.verdict.training_safe else 0


# ---- sections -------------------------------------------------------------------------------------

def header_lines(a: Analysis, namer: Namer, width: int) -> list[str]:
    g = a.graph
    kinds = Counter(t.kind for t in g.tensors.values())
    lines = [cut(a.path, width),
             *wrap(f"{g.format}: {len(g.nodes)} forward ops, {len(a.joint.backward_nodes())} backward ops; "
                   f"{dims_text(a)}", width, ""),
             cut_end("tensors: " + ", ".join(f"{kinds[k]} {k}" for k in sorted(kinds)), width)]
    hint = routing_hint(a)
    if hint is not None:  # the '?' bytes below, said where a reader starts
        lines += wrap(f"routing: not assumed, so tensors sized by the router's choices count as '?'; {hint}",
                      width, "  ")
    folded = g.meta.get("folded_batch_norms")
    if folded:  # the saved bytes below leave out what training keeps for them, said where a reader starts
        lines += wrap(f"export: {len(folded)} BatchNorm{'s' if len(folded) > 1 else ''} folded into "
                      "convolutions (an inference export): saved bytes and peak leave out what training "
                      "keeps for them (see the warning)", width, "  ")
    if a.profile is not None:
        lines += wrap(f"autodiff: {a.profile.name} ({a.profile_reason})", width, "  ")
    if a.precision is not None:
        p = a.precision
        lines += wrap(f"precision: {p.name} on {p.device} ({p.casts} casts added): " + "; ".join(p.assumed),
                      width, "  ")
    else:
        dtypes = precision_entry(g, None)["parameter_dtypes"]
        lines += wrap(f"precision: as exported ({', '.join(dtypes) or 'no float'} parameters; "
                      "--precision for bf16 or AMP)", width, "  ")
    record = g.meta.get("tensorflow_sizes")
    if record and record.get("imported"):  # only then: a SavedModel the native rules size says nothing
        lines += wrap(f"sizes: TensorFlow imported for {len(record['tensors'])} tensors the native shape "
                      "rules left open", width, "")
    if g.meta.get("constant_weights"):
        lines.append(f"weights: {g.meta['constant_weights']} parameters read from Constant nodes")
    for label, tensors in (("input", g.inputs), ("output", g.outputs)):
        shown = tensors[:4]
        for t in shown:
            lines += wrap(f"{label}: {cut(namer(t.name), width // 2)} {t.dtype} {format_shape(t.shape)}",
                          width, "")
        if len(tensors) > len(shown):
            lines.append(f"{label}: ... {len(tensors) - len(shown)} more")
    if namer.prefix:
        lines.append(cut(f"names: {ELLIPSIS}/ stands for {namer.prefix}", width))
    return lines


def ops_lines(a: Analysis, width: int, verbose: bool) -> list[str]:
    counts = Counter((n.op_type, n.kind) for n in a.graph.forward_nodes())
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if verbose:
        return ["", "ops"] + table([Column("op", flex=1), Column("kind"), Column("count", right=True)],
                                   [[op, kind, str(c)] for (op, kind), c in ranked], width)
    merged = Counter()
    for (op, _), c in ranked:
        merged[op] += c
    return [cut_end("ops: " + ", ".join(f"{c} {op}" for op, c in merged.most_common()), width)]


def summary_lines(a: Analysis, width: int, style: Style) -> list[str]:
    """Per pattern: matches, inference-safe, training-safe, training-safe if recomputed, blocked bytes."""
    if not a.matches:
        return ["", "fusion: no pattern matched"]
    rows: dict[str, dict] = {}
    for m in a.matches:
        r = rows.setdefault(m.pattern.name, {"n": 0, "inf": 0, "train": 0, "recompute": 0, "blocked": [],
                                             "backward": m.pattern.phase == "backward"})
        cls = verdict_class(m)
        r["n"] += 1
        r["inf"] += bool(m.verdict.inference_safe)
        r["train"] += cls in ("training-safe", "backward fusion")
        r["recompute"] += cls == "training-safe if recomputed"
        r["blocked"].append(blocked_bytes(m))
    body = []
    for name, r in rows.items():
        blocked = sum_bytes(r["blocked"])
        body.append([name, str(r["n"]), "-" if r["backward"] else str(r["inf"]), str(r["train"]),
                     "-" if r["backward"] else str(r["recompute"]),
                     "-" if r["backward"] or blocked == 0 else format_bytes(blocked)])
    cols = [Column("pattern"), Column("matches", right=True), Column("inference", right=True),
            Column("training", right=True), Column("recompute", right=True), Column("blocked", right=True)]
    n = len(a.matches)
    title = style(f"fusion: {n} match{'es' if n != 1 else ''}", bold=True) + ", how many are safe to fuse"
    nothing = sum(map(frees_nothing, a.matches))
    note = f" ({nothing} of them free nothing at these dims)" if nothing else ""
    return ["", title] + table(cols, body, width) \
        + wrap(f"recompute: safe if the kernel recomputes{note}; blocked: bytes backward reads inside",
               width, "  ")


def memory_lines(a: Analysis, width: int) -> list[str]:
    """Saved and peak bytes (one small function: a formula line per total fits here)."""
    live = a.liveness
    by_kind: dict[str, list[int | None]] = {}
    for s in live.saved:
        by_kind.setdefault(s.tensor.kind, []).append(s.bytes)
    peak = live.peak_node
    wrt = "parameters and inputs" if a.options.wrt_inputs else "parameters"
    title = wrap(f"memory (gradients w.r.t. {wrt}; {dims_text(a)})", width, "  ")
    return ["", title[0][2:], *title[1:],
            *wrap(f"saved: {format_bytes(sum_bytes(s.bytes for s in live.saved))} in "
                  f"{len(live.saved)} tensors ("
                  + ", ".join(f"{k} {format_bytes(sum_bytes(v))}" for k, v in sorted(by_kind.items())) + ")",
                  width, "  "),
            f"  peak: {format_bytes(live.peak_bytes)}"
            + (f" at step {live.peak_step} of {len(live.schedule)} ({peak.phase})" if peak else ""),
            *(wrap("peak counts storages as eager PyTorch allocates them: views share their base, "
                   "one-kernel composites and sdpa's kernel allocate no interior (--json memory.peak; -v: "
                   "what it holds)", width, "    ") if live.views or live.never_allocated else []),
            *(line for note in peak_not_counted(a) for line in wrap(f"not counted: {note}", width, "    ")),
            *formula_lines(a, width), *recompute_lines(a, width)]


def recompute_lines(a: Analysis, width: int) -> list[str]:
    """What backward would keep if every 'training-safe if recomputed' fusion that frees memory were taken,
    and how much less that is (never more than today: one that frees nothing is not taken)."""
    r = recompute_all(a.matches, a.liveness)
    if not r.recomputable:
        return []
    if r.saved_bytes is None:
        return wrap("if every recomputable fusion that frees memory is taken: ? saved for backward (a size "
                    "is unknown)", width, "  ")
    if not r.taken:
        return wrap(f"recomputing frees nothing: each of the {r.recomputable} recomputable fusions keeps at "
                    "least as much as it frees at these dims", width, "  ")
    less = a.liveness.saved_bytes - r.saved_bytes
    return wrap(f"if every recomputable fusion that frees memory is taken ({r.taken} of {r.recomputable}): "
                f"{format_bytes(r.saved_bytes)} saved for backward, {format_bytes(less)} less", width, "  ")


def formula_lines(a: Analysis, width: int) -> list[str]:
    """One line per total as a formula in the model's dims (when it has any), in bytes."""
    if not a.sizes.variables:
        return []
    incomplete = set(a.liveness.incomplete())
    texts = memory_formulas(a.liveness, a.joint)
    here = {}
    for key, text in texts.items():
        if text.startswith("max("):  # the exact peak is a max of several step totals: the JSON has it
            texts[key], here[key] = str(grouped_total(a.liveness.live_at_peak)[0]), " here"
    texts, notes = fold_opaque(texts, a.sizes.opaque)  # many inner dims of one value (Wav2Vec2's frames)
    lines = []
    for key, text in texts.items():
        note = " (leaves out tensors of unknown size)" if key in incomplete else ""
        if key in here:
            note = " here (--json: exact at any size)" + note
        lines += wrap(f"{key.replace('_bytes', '').replace('_', ' ')} = {text} B{note}", width, "    ")
    return lines + [line for n in notes for line in wrap(n, width, "    ")]


def dims_text(a: Analysis) -> str:
    """'batch=2, seq=128' (and dims sized only as numbers), or 'fixed sizes'."""
    parts = [dims_line({n: a.sizes[n]}) for n in a.sizes.variables]
    opaque = a.sizes.opaque
    if len(opaque) <= 3:
        parts += [f"{n}={v} (resolved)" for n, v in opaque.items()]
    else:  # a list of dozens of numbers says nothing here: the JSON's resolved_dims has each
        parts.append(f"{len(opaque)} inner dims only sized as numbers (--json: resolved_dims)")
    return ", ".join(parts) or "fixed sizes"


def _readers(s) -> str:
    ops = Counter(n.op_type for n in s.needed_by)
    text = ", ".join(op if c == 1 else f"{op} x{c}" for op, c in ops.most_common(2))
    if len(ops) > 2:
        text += f" +{len(ops) - 2}"
    return text + (" (shape)" if s.reads == "shape" else "")


def saved_lines(a: Analysis, namer: Namer, width: int, everything: bool, top: int) -> list[str]:
    saved = a.liveness.saved
    shown = saved if everything else saved[:top]
    if not saved:
        return ["", "saved for backward: nothing"]
    title = "saved for backward" + ("" if len(shown) == len(saved) else
                                    f", largest {len(shown)} of {len(saved)} (--all lists every one)")
    rows = [[format_bytes(s.bytes), s.tensor.kind, namer(s.tensor.name), _readers(s)] for s in shown]
    cols = [Column("bytes", right=True), Column("kind"), Column("tensor", flex=3, names=True),
            Column("read by", flex=2)]
    return ["", title] + table(cols, rows, width)


def peak_lines(a: Analysis, namer: Namer, width: int, top: int) -> list[str]:
    """What the peak is made of: the storages alive at its step (parameters and constants apart), largest
    first, and the op that runs there."""
    live = a.liveness
    node = live.peak_node
    if node is None:
        return []
    alive = [e for e in peak_entry(a)["alive"] if e["kind"] != "transient"]  # largest first
    shown = alive[:top]
    title = wrap(f"alive at the peak (step {live.peak_step}, {node.phase}: {node.op_type} "
                 f"{namer(node.name)}; {format_bytes(live.resident_bytes)} of parameters and constants)"
                 + ("" if len(shown) == len(alive) else f", largest {len(shown)} of {len(alive)}"), width, "")
    rows = [[format_bytes(e["bytes"]), e["kind"], namer(e["name"]), e["op"]] for e in shown]
    cols = [Column("bytes", right=True), Column("kind"), Column("tensor", flex=3, names=True),
            Column("made by", flex=2)]
    return ["", *title] + table(cols, rows, width)


def _scope(name: str) -> str:
    """A node's scope ('…/conv2_block1_1_conv_1' of '…/conv2_block1_1_conv_1/convolution'), or its name."""
    scope = name.rsplit("/", 1)[0]
    return scope if scope and scope not in ("", ELLIPSIS) else name


def _group_key(m: Match) -> tuple:
    f = m.verdict.frameworks or {}
    marks = tuple((k, v.get("cpu"), v.get("gpu")) for k, v in sorted(f.items()))
    return (m.pattern.name, verdict_class(m), frees_nothing(m), tuple(n.op_type for n in m.nodes), marks)


def _frameworks(m: Match, verbose: bool) -> str:
    if verdict_class(m) == "not fusable":
        return "TF, ORT: not fused (the chain is not fusable here)"
    names = {"tensorflow": "TF", "onnxruntime": "ORT", "pytorch": "PyTorch"}
    parts = []
    for key, f in (m.verdict.frameworks or {}).items():
        if not verbose and f.get("cpu") is None and f.get("gpu") is None:
            continue  # nothing known to say in the short form (-v has the note)
        text = f"{names.get(key, key)}: CPU {_yes(f.get('cpu'))}, GPU {_yes(f.get('gpu'))}"
        parts.append(text + (f" ({f['note']})" if verbose and f.get("note") else ""))
    return "; ".join(parts)


def matches_lines(a: Analysis, namer: Namer, width: int, verbose: bool, style: Style) -> list[str]:
    """Matches grouped by pattern, verdict, op chain and name skeleton; ``verbose``: each one."""
    if not a.matches:
        return []
    groups: dict[tuple, list[Match]] = {}
    for m in a.matches:
        groups.setdefault(_group_key(m), []).append(m)
    lines = ["", "matches" + ("" if verbose else " (repeated blocks on one line; -v lists each)"),
             *wrap("would TensorFlow's Grappler (TF) or ONNX Runtime (ORT) fuse it, on CPU and GPU", width,
                   "  ")]
    for (pattern, cls, _, ops, _), ms in groups.items():
        first = ms[0]
        by_skeleton: dict[str, list[str]] = {}  # 'stem_conv', 'stage*_block*_conv': one pattern each
        for m in ms:
            by_skeleton.setdefault(skeleton(m.nodes[0].name), []).append(_scope(namer(m.nodes[0].name)))
        label = f"{pattern} x{len(ms)}" if len(ms) > 1 else pattern
        visible = len(f"  {label}  {cls}  ")
        lines.append(f"  {label}  {style(cls, fg=CLASS_COLOR[cls])}  "
                     + cut(", ".join(name_pattern(names) for names in by_skeleton.values()),
                           max(20, width - visible)))
        chain = " > ".join(ops)
        if verbose:
            lines += wrap(f"{chain}; {_frameworks(first, False)}", width, "      ")
            for m in ms:
                lines.append("    - " + cut(" > ".join(namer(n.name) for n in m.nodes), width - 6))
                lines += wrap(namer.text(m.verdict.reason), width, "      ")
                lines += wrap(_frameworks(m, True), width, "      ")
            continue
        lines += wrap(f"{chain}; {_frameworks(first, False)}", width, "      ")
        if cls not in ("training-safe", "backward fusion"):
            lines += _limited(wrap(("e.g. " if len(ms) > 1 else "") + _why_short(first, namer),
                                   width, "      "), 2, width)
        if cls == "training-safe if recomputed":
            lines += wrap(_recompute_text(first), width, "      ")
    return lines


def _why_short(m: Match, namer: Namer) -> str:
    """The gist of a verdict that is not training-safe: what blocks it, its size, who reads it, and the
    price of recomputing it (-v prints the whole reason)."""
    v = m.verdict
    if not v.blocking:
        return namer.text(v.reason, 40)
    b = v.blocking[0]
    readers = sorted({n.rsplit("/", 1)[-1] for n in b.needed_by})
    text = f"blocked by {namer(b.tensor.name)} ({format_bytes(b.bytes)}), read by {', '.join(readers)}"
    return text


def _recompute_text(m: Match) -> str:
    """'recomputed: frees 1.5 MiB net (4.0 MiB freed, 2.5 MiB kept) for +N FLOPs', or 'frees nothing'."""
    rc = m.verdict.recompute
    flops = "? FLOPs" if rc.flops is None else f"{rc.flops:,} FLOPs"
    net = rc.net_bytes_freed
    frees = "frees nothing" if frees_nothing(m) else f"frees {format_bytes(net)} net"
    return (f"recomputed: {frees} at these dims ({format_bytes(rc.bytes_freed)} freed, "
            f"{format_bytes(rc.bytes_kept)} kept instead) for +{flops} in backward")


def _limited(lines: list[str], most: int, width: int) -> list[str]:
    """At most ``most`` lines, the last ending in '…' when some were left out (-v shows all)."""
    if len(lines) <= most:
        return lines
    last = lines[most - 1].rstrip()
    if len(last) + 2 > width:
        last = last[:width - 2].rstrip()
    return lines[:most - 1] + [last + " " + ELLIPSIS]


def reason_key(reason: str) -> str:
    """A verdict's reason with its names and numbers left out: matches rejected by the same check."""
    return _NAMEISH.sub("…", reason.split(";")[0])


def not_fused_lines(a: Analysis, namer: Namer, width: int) -> list[str]:
    """Matches whose verdict is not fusable, grouped by the check that rejected them."""
    groups: dict[str, list[Match]] = {}
    for m in a.matches:
        if verdict_class(m) == "not fusable":
            groups.setdefault(reason_key(m.verdict.reason), []).append(m)
    if not groups:
        return ["", "not fused: none (every match is fusable at least for inference)"]
    lines = ["", "not fused, and why"]
    for ms in sorted(groups.values(), key=len, reverse=True):
        patterns = Counter(m.pattern.name for m in ms)
        what = ", ".join(f"{p} x{c}" if c > 1 else p for p, c in patterns.most_common())
        lines += _limited(wrap(f"{what}: " + ("e.g. " if len(ms) > 1 else "")
                               + namer.text(ms[0].verdict.reason, 40), width, "  "), 4, width)
    return lines


def near_miss_lines(a: Analysis, namer: Namer, width: int) -> list[str]:
    """Attention-shaped regions that are no attention match, grouped by what broke the form."""
    if not a.near_misses:
        return []
    groups: dict[str, list] = {}
    for nm in a.near_misses:
        groups.setdefault(reason_key(nm.reason), []).append(nm)
    lines = ["", f"attention not found ({len(a.near_misses)} near misses: softmax between two matmuls)"]
    for ms in sorted(groups.values(), key=len, reverse=True):
        lines += _limited(wrap(f"x{len(ms)}: {namer.text(ms[0].reason, 40)}", width, "  "), 3, width)
    return lines


def unsupported_lines(a: Analysis, width: int) -> list[str]:
    unsupported = a.unsupported()
    if not unsupported:
        return []
    return ["", *wrap("unsupported ops (their backward is assumed to read every input and output): "
                      + ", ".join(f"{op} x{c}" for op, c in sorted(unsupported.items(),
                                                                    key=lambda kv: (-kv[1], kv[0]))),
                      width, "")]


def report_lines(a: Analysis, options: TextOptions | None = None, style: Style | None = None) -> list[str]:
    """The whole report as lines of at most ``options.width`` characters."""
    o = options or TextOptions()
    width = o.width or terminal_width()
    style = style or Style(o.color)
    namer = Namer(common_scope([n.name for n in a.graph.nodes if not n.meta.get("constant")]))
    lines = header_lines(a, namer, width) + ops_lines(a, width, o.verbose)
    lines += summary_lines(a, width, style) + memory_lines(a, width)
    if o.quiet:
        return lines
    lines += saved_lines(a, namer, width, o.verbose or o.all_saved, o.top)
    lines += peak_lines(a, namer, width, o.top) if o.verbose else []
    lines += matches_lines(a, namer, width, o.verbose, style)
    lines += not_fused_lines(a, namer, width) if a.matches else []
    return lines + near_miss_lines(a, namer, width) + unsupported_lines(a, width)


def print_text_report(a: Analysis, options: TextOptions | None = None, echo=None) -> None:
    import click

    echo = echo or click.echo
    color = bool(options and options.color)
    echo(terminal_report(lambda style: "\n".join(report_lines(a, options, style)), color))

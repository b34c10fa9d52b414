"""The one-way flow: load -> grad -> liveness -> fusion, as an Analysis that report/render/rewrite read."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .core import progress
from .core.ir import Graph, Node, gc_paused
from .core.kinds import DATA_DEPENDENT_KINDS, data_dependent_origins
from .fusion import find_fusions, select_patterns
from .fusion.match import Match
from .grad.backward import build_backward
from .grad.profiles import OPS, Profile, choose_profile
from .grad.sdpa import unshare_calls
from .grad.storage import held_by_calls, held_to_boundary, storages, transients
from .grad.torch_export import (
    folded_batch_norm_note,
    folded_batch_norms,
    frequency_note,
    scalar_parameter_note,
    scalar_parameters,
    sinusoidal_note,
    softmax_dtypes,
    unmerge_subexpressions,
)
from .load import load_model, resolve_sizes
from .load.broadcast import broadcast_conflicts, broadcast_note
from .load.constant_weights import no_parameter_warning
from .load.routing import ROUTER_OPS, routers_of
from .memory.liveness import Liveness, analyze_liveness
from .memory.sizes import Sizes, bind, model_variables
from .precision.transform import Precision, apply_precision
from .spellings.attention import NearMiss, near_misses


@dataclass
class Options:
    """What the user asked for: sizes, and what to differentiate with respect to."""

    batch: int | None = None  # --batch: the value of the model's batch dims (None: not given)
    dims: dict[str, int] = field(default_factory=dict)  # --dim NAME=VALUE
    wrt_inputs: bool = False
    patterns: tuple[str, ...] = ()
    signature: str | None = None  # SavedModels: which signature (default serving_default)
    constant_weights: bool = True  # ONNX: Constant nodes in a weight's role are trainable parameters
    autodiff: str | None = None  # ops | tensorflow | pytorch; None: by the framework that made the model
    device: str = "cpu"  # where the framework trains (PyTorch's attention kernels differ on cuda)
    routing: str | None = None  # --routing balanced: MoE routers spread tokens evenly (load.routing)
    precision: str | None = None  # --precision: fp32 | bf16 | fp16 | amp-bf16 | amp-fp16 (None: as exported)


@dataclass
class Analysis:
    """Everything a command reports: the forward graph and what the passes derive from it."""

    path: str
    graph: Graph
    options: Options
    joint: Graph
    liveness: Liveness
    matches: list[Match] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    sizes: Sizes = field(default_factory=Sizes)
    unknown_sizes: dict[str, int] = field(default_factory=dict)  # op type -> forward tensors of unknown size
    profile: Profile | None = None  # the autodiff profile the backward was built with
    profile_reason: str = ""  # why that profile
    near_misses: list[NearMiss] = field(default_factory=list)  # attention-shaped regions not matched
    precision: Precision | None = None  # what --precision applied (None: the export's dtypes)

    def unsupported(self) -> dict[str, int]:
        """Op types (domain-qualified when not ONNX's) with no gradient rule, and their counts."""
        counts: dict[str, int] = {}
        for n in self.graph.nodes:
            if n.kind == "unknown" or (self.rule_for(n.kind) is None and not n.meta.get("constant")):
                key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
                counts[key] = counts.get(key, 0) + 1
        return counts

    def rule_for(self, kind: str):
        return (self.profile or OPS).rule_for(kind)


def size_graph(graph: Graph, options: Options) -> tuple[Sizes, list[str], dict[str, int]]:
    """Bind the user's dims, resolve every other dim with the format's shape tools, and count what is
    left unknown (by producing op type); UsageError when the options do not fit the model."""
    sizes, warnings = bind(graph, options.batch, options.dims)
    opaque = resolve_sizes(graph, sizes, options.routing)
    if opaque:
        sizes = Sizes({**sizes, **opaque}, sizes.variables, sizes.batch, opaque)
    if options.routing is not None:
        warnings.append(routing_note(graph, sizes, options.routing))
    unknown: dict[str, int] = {}
    open_: dict[str, int] = {}  # op type -> tensors a --dim could size
    dependent: dict[str, int] = {}  # op type -> tensors whose size depends on values
    origins: dict[str, Node] = {}  # node name -> the data-dependent node, for those
    after = None
    for t in graph.tensors.values():
        if t.nbytes(sizes) is None:
            op = t.producer.op_type if t.producer is not None else t.kind
            unknown[op] = unknown.get(op, 0) + 1
            if after is None:
                after = data_dependent_origins(graph, lambda u: u.nbytes(sizes) is None)
            source = after.get(t.name)
            counts = open_ if source is None else dependent
            counts[op] = counts.get(op, 0) + 1
            if source is not None:
                origins.setdefault(source.name, source)
    if dependent:
        where = ", ".join(f"{n.op_type} at node {n.name!r}" for n in list(origins.values())[:3])
        more = f" and {len(origins) - 3} more" if len(origins) > 3 else ""
        routes = options.routing is None and any(n.op_type in ROUTER_OPS for n in graph.nodes)
        warnings.append(f"{_tensors(dependent)} a data-dependent size (after {where}{more}): not counted in "
                        "the byte totals; no --dim can size them" + (f"; {ROUTING_HINT}" if routes else ""))
    inconsistent = broadcast_note(broadcast_conflicts(graph, sizes))
    if inconsistent:
        warnings.append(inconsistent)
    if open_:
        advice = "the model is inconsistent (above)" if inconsistent else _dims_advice(graph, options)
        warnings.append(f"{_tensors(open_, 'with unknown dims')} not counted in the byte totals; {advice}")
    return sizes, warnings, unknown


ROUTING_HINT = ("--routing balanced sizes the tokens a mixture-of-experts router sends to each expert, "
                "assuming it spreads them evenly")


def routing_hint(a: Analysis) -> str | None:
    """ROUTING_HINT where it applies: no --routing, a router, and tensors a data-dependent op left unsized
    (the report's '?' bytes)."""
    if a.options.routing is not None or not any(n.op_type in ROUTER_OPS for n in a.graph.nodes):
        return None
    unsized = any(n.kind in DATA_DEPENDENT_KINDS and any(o is not None and o.nbytes(a.sizes) is None
                                                         for o in n.outputs) for n in a.graph.nodes)
    return ROUTING_HINT if unsized else None


def _dims_advice(graph: Graph, options: Options) -> str:
    """What could size them: the model's own dims the user left at 1 (--batch N, --dim NAME=VALUE), or
    that every input dim was given and the shape tools could not follow them through."""
    variables, batch_dims = model_variables(graph)
    given = set(options.dims) | (set(batch_dims) if options.batch is not None else set())
    left = [n for n in variables if n not in given]
    if not left:
        return "every dim of the model is given: the shape tools could not size them"
    hints: list[str] = []
    for n in left:
        h = "--batch N" if n in batch_dims else f"--dim {n}=VALUE"
        if h not in hints:
            hints.append(h)
    return f"set {' '.join(hints)}"


def routing_note(graph: Graph, sizes: Sizes, routing: str) -> str:
    """The routing assumption said out loud: which routers, their k of E, the token counts it gives."""
    found = routers_of(graph, sizes)
    if not found:
        return (f"--routing {routing}: no router found (a TopK or ArgMax whose indices size a NonZero or "
                "Compress); nothing assumed")
    kinds = sorted({(r["k"], r["experts"]) for r in found}, key=str)
    choice = ", ".join(f"top-{k} of {e} experts" for k, e in kinds)
    counts = ", ".join(f"{n}={v}" for n, v in sizes.opaque.items() if n.startswith("routed")) or "none"
    return (f"assumed (--routing {routing}): {len(found)} router{'s' if len(found) > 1 else ''} ({choice}) "
            f"send each expert tokens*k/E tokens; tokens per expert: {counts}")


def _tensors(counts: dict[str, int], what: str | None = None) -> str:
    """'3 tensors with unknown dims (Cast x1, ...) are' (``what``), else '3 tensors (...) have'."""
    n = sum(counts.values())
    ops = ", ".join(f"{op} x{c}" for op, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    noun = "tensors" if n > 1 else "tensor"
    if what is None:
        return f"{n} {noun} ({ops}) {'have' if n > 1 else 'has'}"
    return f"{n} {noun} {what} ({ops}) {'are' if n > 1 else 'is'}"


def analyze_graph(path: str, graph: Graph, options: Options) -> Analysis:
    """Every pass over an already loaded forward graph: its sizes at the user's dims, then backward with
    the autodiff profile of the framework that made it (or the user's ``options.autodiff``)."""
    progress.stage("sizes")
    sizes, warnings, unknown = size_graph(graph, options)
    profile, reason = choose_profile(graph, options.autodiff)
    pytorch = profile.name == "pytorch"
    _, assumed, kept = scalar_parameters(graph) if pytorch else ([], [], [])
    if pytorch:
        softmax_dtypes(graph)  # the casts of softmax(x, dtype=float32) a dynamo export dropped
        unshare_calls(graph)  # sdpa calls an exporter's CSE merged: one kernel per call, as eager runs
        unmerge_subexpressions(graph, profile.views)  # and other ops it merged that eager runs twice
    precision = None
    if options.precision is not None:
        precision = apply_precision(graph, options.precision, options.device,
                                    keras=profile.name == "tensorflow")  # said in the report
    profile = replace(profile, device=options.device, dims=dict(sizes))
    progress.stage("backward")
    joint = build_backward(graph, wrt_inputs=options.wrt_inputs, profile=profile)
    progress.stage("liveness")
    liveness = analyze_liveness(joint, sizes, keeps_for_shape=profile.keeps_for_shape,
                                storage=storages(joint, profile), transients=transients(joint, profile),
                                held=held_to_boundary(joint, profile),
                                held_until=held_by_calls(joint, profile), outputs_held=profile.outputs_held)
    progress.stage("fusion")
    matches = find_fusions(graph, joint, liveness, sizes, options.patterns)
    misses = []
    if any(p.name == "attention" for p in select_patterns(options.patterns)):
        found = {id(m.roles["softmax"]) for m in matches if m.pattern.name == "attention"}
        misses = near_misses(graph, found)
    warnings = [*graph.meta.get("warnings", []), *warnings]
    folded = folded_batch_norms(graph)
    if folded:  # a PyTorch export's (tf2onnx's are found and said by its loader)
        graph.meta["folded_batch_norms"] = folded
        warnings.insert(0, folded_batch_norm_note(folded))
    if profile.frozen is not None:
        warnings += [note for note in (frequency_note(graph), sinusoidal_note(graph)) if note]
    scalars = scalar_parameter_note(assumed, kept) if pytorch else None
    if scalars:
        warnings.append(scalars)
    no_params = None if options.wrt_inputs else no_parameter_warning(graph)
    if no_params:
        warnings.append(no_params)
    return Analysis(path, graph, options, joint, liveness, matches, warnings, sizes, unknown, profile, reason,
                    misses, precision)


def analyze(path: str, options: Options | None = None,
            on_stage: progress.StageCallback | None = None) -> Analysis:
    """Load the model at ``path`` and run every pass. Each stage's name goes to ``on_stage``; without
    it, to a spinner on stderr when that is a terminal (``fusecli.core.progress``)."""
    options = options or Options()
    with gc_paused(), progress.stages(on_stage):
        progress.stage("reading")
        graph = load_model(path, options.signature, options.constant_weights)
        return analyze_graph(path, graph, options)

"""The one-way flow: load -> grad -> liveness -> fusion, as an Analysis that report/render/rewrite read."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import progress
from .fusion import find_fusions
from .fusion.match import Match
from .grad.backward import build_backward
from .grad.profiles import OPS, Profile, choose_profile
from .ir import Graph, gc_paused
from .liveness import Liveness, analyze_liveness
from .load import load_model


@dataclass
class Options:
    """What the user asked for: sizes, and what to differentiate with respect to."""

    batch: int = 1
    dims: dict[str, int] = field(default_factory=dict)
    wrt_inputs: bool = False
    patterns: tuple[str, ...] = ()
    signature: str | None = None  # SavedModels: which signature (default serving_default)
    autodiff: str | None = None  # ops | tensorflow | pytorch; None: by the framework that made the model


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
    profile: Profile | None = None  # the autodiff profile the backward was built with
    profile_reason: str = ""  # why that profile

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


def symbolic_dims(graph: Graph) -> list[str]:
    """Names (or '?') of the dims of graph inputs that are not fixed numbers."""
    found: list[str] = []
    for t in graph.inputs:
        for d in t.shape or ():
            if not isinstance(d, int):
                name = d if isinstance(d, str) else "?"
                if name not in found:
                    found.append(name)
    return found


def analyze_graph(path: str, graph: Graph, options: Options) -> Analysis:
    """Every pass over an already loaded forward graph, with the autodiff profile of the framework that
    made it (or the user's ``options.autodiff``)."""
    profile, reason = choose_profile(graph, options.autodiff)
    progress.stage("backward")
    joint = build_backward(graph, wrt_inputs=options.wrt_inputs, profile=profile)
    progress.stage("liveness")
    liveness = analyze_liveness(joint, options.batch, options.dims, keeps_for_shape=profile.keeps_for_shape)
    progress.stage("fusion")
    matches = find_fusions(graph, joint, liveness, options.batch, options.dims, options.patterns)
    return Analysis(path, graph, options, joint, liveness, matches, list(graph.meta.get("warnings", [])),
                    profile, reason)


def analyze(path: str, options: Options | None = None, batch_given: bool = True,
            on_stage: progress.StageCallback | None = None) -> Analysis:
    """Load the model at ``path`` and run every pass. Each stage's name goes to ``on_stage``; without
    it, to a spinner on stderr when that is a terminal (``fusecli.progress``)."""
    options = options or Options()
    with gc_paused(), progress.stages(on_stage):
        progress.stage("reading")
        graph = load_model(path, options.signature)
        result = analyze_graph(path, graph, options)
    unset = [d for d in symbolic_dims(graph) if d not in options.dims]
    if unset and not batch_given:
        result.warnings.append(f"the model has dynamic dims ({', '.join(unset)}); sizes assume "
                               f"batch {options.batch} on the first axis and 1 elsewhere "
                               "(set --batch N, --dim NAME=VALUE)")
    return result

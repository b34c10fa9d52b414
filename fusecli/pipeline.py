"""The one-way flow: load -> (grad -> liveness -> fusion) -> an Analysis that report/render/rewrite read."""

from __future__ import annotations

from dataclasses import dataclass, field

from .ir import Graph
from .load import load_model


@dataclass
class Options:
    """What the user asked for: batch size and symbolic dims."""

    batch: int = 1
    dims: dict[str, int] = field(default_factory=dict)


@dataclass
class Analysis:
    """Everything a command reports: the forward graph and what later passes derive from it."""

    path: str
    graph: Graph
    options: Options
    warnings: list[str] = field(default_factory=list)


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


def analyze(path: str, options: Options | None = None, batch_given: bool = True) -> Analysis:
    """Run every pass on the model at ``path``."""
    options = options or Options()
    graph = load_model(path)
    result = Analysis(path, graph, options, warnings=list(graph.meta.get("warnings", [])))
    unset = [d for d in symbolic_dims(graph) if d not in options.dims]
    if unset and not batch_given:
        result.warnings.append(f"the model has dynamic dims ({', '.join(unset)}); sizes assume "
                               f"batch {options.batch} on the first axis and 1 elsewhere "
                               "(set --batch N, --dim NAME=VALUE)")
    return result

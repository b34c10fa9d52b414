"""``plan`` with a layout: each rank's step, and what every rank needs recomputed to fit the budget.

The recomputations are the one-device plan's, in its order (cheapest FLOPs per freed byte first); the
per-rank plan is the shortest prefix with which every rank fits, priced on each rank's own timeline."""

from __future__ import annotations

from dataclasses import dataclass

from ..plan.planner import Plan, solve_dims
from .layout import Layout
from .ranks import RankMemory, largest, rank_memory


@dataclass
class RankPlan:
    layout: Layout
    device: str
    batch: int | None  # each rank's own
    budget: int
    ranks: list[RankMemory]  # nothing recomputed
    largest: int | None  # the solve dim's largest value that fits every rank, nothing recomputed
    chosen: int  # how many of the one-device sequence every rank needs
    names: list[str]  # what they recompute
    planned: list[RankMemory] | None  # the ranks with them (None: nothing needed)
    planned_largest: int | None

    @property
    def note(self) -> str | None:
        """What the per-rank plan leaves out."""
        if self.layout.pp > 1 and self.planned is not None:
            return ("the recomputations are the one-device plan's, in its order, until every stage fits; "
                    "a stage that fits already may be given some (no plan of each stage's own yet)")
        return None

    @property
    def fits(self) -> bool:
        return all(e.peak_bytes <= self.budget for e in (self.planned or self.ranks))


def plan_ranks(analysis, plan: Plan, layout: Layout, optimizer: str) -> RankPlan:
    budget = plan.options.budget
    names = solve_dims(analysis.graph, plan.options.solve)
    ranks = rank_memory(analysis, layout, optimizer)
    most = largest(analysis, layout, budget, names, optimizer)
    device = analysis.profile.device if analysis.profile is not None else "cpu"
    out = RankPlan(layout, device, analysis.sizes.batch, budget, ranks, most, 0, [], None, None)
    if all(e.peak_bytes <= budget for e in ranks):
        return out
    sequence = [s.candidate for s in plan.sequence]
    for k in range(1, len(sequence) + 1):
        planned = rank_memory(analysis, layout, optimizer, chosen=sequence[:k])
        out.chosen, out.planned = k, planned
        if all(e.peak_bytes <= budget for e in planned):
            break
    if out.chosen:
        out.names = [c.name for c in sequence[:out.chosen]]
        out.planned_largest = largest(analysis, layout, budget, names, optimizer, sequence[:out.chosen])
    return out

"""A selective-checkpointing policy chosen for a budget (``plan --recompute ops``), op by op.

It starts from the block plan at the same budget (``--recompute blocks``: the blocks checkpointed whole)
and gives back re-run FLOPs: each matmul, attention kernel or softmax call of a checkpointed block, most
FLOPs per byte of output first, is saved (SAC caches its output) where the step's peak stays within the
budget, and left to the re-run where it would not. So the chosen policy never re-runs more FLOPs than
block checkpointing at that budget, and fits wherever the block plan does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..fusion.recompute import node_flops
from .candidates import Candidate
from .planner import Plan, PlanOptions, make_plan, step_model
from .sac import MATMULS, SDPA, Call, block_calls, under_policy

CHOOSABLE = MATMULS | SDPA | {"aten._softmax"}  # calls whose aten names the policy_fn sees as fusecli does


@dataclass
class Decision:
    """One call of a checkpointed block: saved or re-run, and why."""

    block: str
    call: Call
    saved: bool
    flops: int  # what saving it takes off the re-run
    bytes: int  # its output, which saving it holds until the re-run
    peak_bytes: int  # the step peak with it saved (and the decisions before it)
    why: str


def choose_policy(analysis, model, blocks: list[str], budget: int
                  ) -> tuple[list[Candidate], list[Decision]]:
    """Each of ``blocks`` (module paths, the block plan's) under the calls chosen for ``budget``, and every
    choosable call's decision in the order they were weighed."""
    sizes = analysis.sizes
    wanted = set(blocks)
    pairs = {c.name: (c, calls) for c, calls in block_calls(analysis) if c.name in wanted}  # model order
    answers = {name: [False] * len(calls) for name, (_, calls) in pairs.items()}
    # each block's checkpoint under its answers so far; only the block a decision touches is rebuilt
    current = {name: under_policy(analysis, c, calls, answers[name]) for name, (c, calls) in pairs.items()}

    weighed = []
    for order, (name, (_, calls)) in enumerate(pairs.items()):
        for i, call in enumerate(calls):
            flops = node_flops(call.node, sizes) if call.op in CHOOSABLE else None
            size = sum(model.value.get(t.name, 0) for t in call.outputs)
            if flops and size:
                weighed.append((flops / size, order, i, name, call, flops, size))
    weighed.sort(key=lambda w: (-w[0], w[1], w[2]))  # most FLOPs per byte first; ties in model order
    decisions = []
    for _, _, i, name, call, flops, size in weighed:
        c, calls = pairs[name]
        answers[name][i] = True
        trial = under_policy(analysis, c, calls, answers[name])
        peak = model.peak_bytes([*(trial if n == name else x for n, x in current.items())])
        saved = peak <= budget
        if saved:
            current[name] = trial
        else:
            answers[name][i] = False
        why = (f"saved: {flops / size:.1f} FLOPs per byte, the peak stays within the budget" if saved else
               f"re-run: saving it would lift the peak to {peak:,} bytes, over the budget")
        decisions.append(Decision(name, call, saved, flops, size, peak, why))
    return list(current.values()), decisions


def plan_ops(analysis, options: PlanOptions) -> Plan:
    """``plan --recompute ops``: the block plan at ``options.budget`` with its blocks under the policy
    chosen for it (``plan.decisions``)."""
    blocks_only = replace(options, recompute="blocks")
    whole = make_plan(analysis, blocks_only)
    blocks, decisions = choose_policy(analysis, step_model(analysis, blocks_only), whole.checkpoints,
                                      options.budget)
    plan = make_plan(analysis, blocks_only, blocks)
    plan.sac, plan.decisions = ("chosen", None), decisions
    return plan

"""FSDP2 as torch 2.13's sources hold it (``fully_shard`` on every block, then on the root): the units,
each parameter's padded dim-0 shard, and each unit's gathers, reduce-scatters and their buffers placed on a
rank's Timeline.

Each parameter's dim-0 shard is padded to ceil(d0 / N) rows; a block's parameters are all-gathered
(padded, in ``param_dtype``) in the hook before its first op and freed after its last (``reshard_after_
forward``; else kept to its backward), gathered again when the block after it starts its backward (the
default backward prefetch) and freed after its own; the root's stay gathered from the first step to the
last. After a block's backward its gradients, made whole by backward, are copied into one reduce-scatter
input (padded, in ``reduce_dtype``) and freed; the input stays until the next block's reduce-scatter, the
sharded gradients are views of its output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.ir import Graph, Tensor
from ..plan.candidates import block_scopes
from ..plan.planner import StepModel
from .timeline import Timeline

ROOT = "(root)"  # the FSDP unit of the parameters no block holds: embeddings, the last norm, the head


@dataclass
class Unit:
    """One FSDP unit (a block, or the root) and the schedule steps its parameters are gathered for."""

    name: str
    params: list[Tensor]
    forward: tuple[int, int]  # first and last forward step
    backward: tuple[int, int] | None  # first and last backward step (None: no backward reaches it)
    prefetch: int = 0  # where its backward gather begins: the backward start of the unit after it
    padded: int = 0  # bytes gathered (every rank's padded shard, in the compute dtype)
    reduce: int = 0  # bytes of its reduce-scatter input (padded, in the reduce dtype)
    sharded: int = 0  # bytes of this rank's padded shard (parameters, and their gradients alike)


def parameters(graph: Graph) -> list[Tensor]:
    return [t for t in graph.tensors.values() if t.kind == "parameter" and t.producer is None]


def units(graph: Graph, joint: Graph, live) -> list[Unit]:
    """The FSDP units in forward order: one per block (plan.candidates.block_scopes) holding the
    parameters only its nodes read (through weight-only subgraphs: a transpose, a cast), and the root
    holding the rest."""
    at = {n.name: i for i, n in enumerate(live.schedule[:live.boundary])}
    backward: dict[str, list[int]] = {}
    for i, n in enumerate(live.schedule):
        if n.phase == "backward" and n.meta.get("forward") is not None:
            backward.setdefault(n.meta["forward"], []).append(i)
    owner: dict[str, str] = {}
    blocks = block_scopes(graph)
    for scope, nodes in blocks.items():
        for n in nodes:
            owner[n.name] = ".".join(scope)
    found: dict[str, list[Tensor]] = {}
    for p in parameters(graph):
        found.setdefault(owner_of(p, owner), []).append(p)
    out = []
    for scope, nodes in blocks.items():
        name = ".".join(scope)
        if name not in found:
            continue
        steps = [at[n.name] for n in nodes if n.name in at]
        back = [i for n in nodes for i in backward.get(n.name, ())]
        out.append(Unit(name, found[name], (min(steps), max(steps)),
                        (min(back), max(back)) if back else None))
    out.sort(key=lambda u: u.forward[0])
    last = len(live.schedule) - 1
    out.append(Unit(ROOT, found.get(ROOT, []), (0, last), (live.boundary, last), live.boundary))
    for u, after in zip(out, out[1:], strict=False):
        if u.backward is not None:
            u.prefetch = min(u.backward[0], after.backward[0] if after.backward else u.backward[0])
    return out


def stage_units(all_units: list[Unit], blocks: list[str], touched: set[str], steps: list[int],
                boundary: int) -> list[Unit]:
    """A pipeline stage's FSDP units (fully_shard on each of its blocks, then on the stage's module: its
    root holds the stage's parameters no block holds) with their steps as the stage's local indices; a
    block's backward reaches the stage's last step, as the pipeline leaves every backward's parameters
    gathered to the step's end, and its backward gather is prefetched when the stage's block after it
    begins its backward; the stage's last block's when the stage's backward begins if the stage computes
    past it (the final norm, the head: the root's backward runs first and prefetches it), else at its
    own. ``boundary``: the stage's first backward step (local)."""
    pos = {i: k for k, i in enumerate(steps)}
    end = len(steps) - 1
    out = []
    for u in all_units:
        if u.name == ROOT:
            mine = [p for p in u.params if p.name in touched]
            out.append(Unit(ROOT, mine, (0, end), (0, end), 0))
        elif u.name in blocks:
            back = (pos[u.backward[0]], end) if u.backward is not None and u.backward[0] in pos else None
            out.append(Unit(u.name, u.params, (pos[u.forward[0]], pos[u.forward[1]]), back))
    blocks_only = sorted((u for u in out if u.name != ROOT), key=lambda u: u.forward[0])
    rooted = any(u.name == ROOT and u.params for u in out)
    for u, after in zip(blocks_only, [*blocks_only[1:], None], strict=True):
        if u.backward is None:
            continue
        if after is not None and after.backward:
            u.prefetch = min(u.backward[0], after.backward[0])
        elif after is None and rooted and u.forward[1] < boundary - 1:
            u.prefetch = min(u.backward[0], boundary)
        else:
            u.prefetch = u.backward[0]
    root = [u for u in out if u.name == ROOT]
    if root and root[0].params:
        root[0].backward = (min((u.backward[0] for u in blocks_only if u.backward), default=0), end)
        root[0].prefetch = root[0].backward[0]
    return blocks_only + [u for u in root if u.params]


def owner_of(p: Tensor, owner: dict[str, str]) -> str:
    """The block whose nodes read ``p`` (through nodes that read only weights), else the root."""
    seen, stack, blocks = set(), [p], set()
    while stack:
        t = stack.pop()
        for c in t.consumers:
            if id(c) in seen:
                continue
            seen.add(id(c))
            if c.name in owner:
                blocks.add(owner[c.name])
            elif all(i is None or i.kind in ("parameter", "constant") or i.meta.get("from_parameter")
                     for i in c.inputs):
                stack.extend(o for o in c.outputs if o is not None)
            else:
                blocks.add(ROOT)
    return blocks.pop() if len(blocks) == 1 else ROOT


def shard_rows(shape: tuple[int, ...], n: int, rank: int) -> tuple[int, int, int]:
    """FSDP2's dim-0 shard: (padded rows, this rank's rows, elements per row)."""
    d0 = shape[0] if shape else 1
    rest = int(np.prod(shape[1:], dtype=object)) if len(shape) > 1 else 1
    c = -(-d0 // n)
    mine = max(0, min(d0, (rank + 1) * c) - rank * c)
    return c, mine, rest


def gather(line: Timeline, fsdp_units: list[Unit], reshard: bool, steps: int, boundary: int,
            device: str, gathered: bool = False) -> None:
    """The units' gathered parameters over the schedule (module docstring). Each gather fills one flat
    output (on gloo (cpu) the all-gather fills a buffer of its own beside it while it runs), copied out
    into one tensor per parameter in the hook before the unit's first op. In forward the flat output
    stays until the next unit's copy-out is done (the last one until forward ends); in backward it goes
    as soon as it is copied out, a prefetch's flat output living from the gather (before the next unit's
    backward) to the unit's own copy-out. ``gathered``: the forward finds every unit's parameters
    gathered already (a pipeline's forward after a backward that left them so): no all-gather in
    forward, each unit's freed after its forward by ``reshard``."""
    temp = device == "cpu"
    forward = sorted(fsdp_units, key=lambda u: -1 if u.name == ROOT else u.forward[0])
    for k, u in enumerate(forward):
        first = 0 if u.name == ROOT else u.forward[0]
        if u.name == ROOT:
            line.hooked(0, steps - 1, u.padded)
        elif u.backward is None or reshard:
            line.hooked(0 if gathered else first, u.forward[1], u.padded)
        else:
            line.hooked(0 if gathered else first, u.backward[1], u.padded)
        if gathered:
            _backward_gather(line, u, reshard, temp)
            continue
        nxt = forward[k + 1] if k + 1 < len(forward) else None
        line.hooked(first, (nxt.forward[0] - 1) if nxt is not None else boundary - 1, u.padded)  # flat
        before = forward[k - 1].padded if k else 0  # the last flat output, alive through this copy-out
        extra = before + (u.padded if temp and not k else 0)
        if extra:
            line.moments.append((first - 1, extra, extra))
        _backward_gather(line, u, reshard, temp)


def _backward_gather(line: Timeline, u: Unit, reshard: bool, temp: bool) -> None:
    """A unit's gather for its backward, after a forward that freed its parameters (``reshard``)."""
    if reshard and u.name != ROOT and u.backward is not None:
        line.hooked(u.backward[0], u.backward[1], u.padded)
        line.hooked(u.prefetch, u.backward[0] - 1, u.padded)  # the prefetch's flat output
        line.moments.append((u.backward[0] - 1, u.padded, u.padded))  # both at the copy-out
        if temp:
            line.moments.append((u.prefetch - 1, u.padded, u.padded))


def reduce_scatter(line: Timeline, live, model: StepModel, fsdp_units: list[Unit], grads, steps: int,
                   device: str, share=lambda name, value: value) -> None:
    """Gradients under FSDP: each unit's whole gradients die in its post-backward hook, after its last
    op; the reduce-scatter input made there lives until the next unit's hook, the sharded gradients
    from then to the end. While the hook runs: the whole gradients beside the input (the copy-in), then
    the input, the output and, on gloo (cpu), the copy of the input gloo reduces with an all-reduce.
    ``share``: a gradient's bytes on this rank (its tensor-parallel share)."""
    order = [u for u in fsdp_units if u.backward is not None]
    order.sort(key=lambda u: u.backward[1])  # post-backward order
    for k, u in enumerate(order):
        end = u.backward[1]
        whole = 0
        for p in u.params:
            g = grads.get(p.name)
            if g is None or g.name not in model.value:
                continue
            born, _ = live.lifetimes[g.name]
            value = share(g.name, model.value[g.name])
            line.add(born, max(born, end), value)
            whole += value
        nxt = order[k + 1].backward[1] if k + 1 < len(order) else end
        line.hooked(end + 1, nxt, u.reduce)
        line.hooked(end + 1, steps - 1, u.sharded, buffer=False)
        clone = u.reduce if device == "cpu" else 0
        line.moments.append((end, max(whole - u.sharded, clone), max(0, clone)))

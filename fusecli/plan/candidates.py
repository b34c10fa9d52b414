"""What a training step can recompute, and what each choice frees, keeps and costs.

Two kinds of candidate, both read off one analysis:
- a **fusion** whose verdict is "training-safe if recomputed" (``fusion.recompute``): its blocking
  tensors leave the saved set, its row statistics or otherwise unkept inputs join it, and the fused
  backward re-runs the cheap ops (a fused kernel applies it, not a framework's checkpoint);
- a **block**: every forward node under one list-indexed scope (``layers.3``, ``h.0``, ``layer.1``), run
  under activation checkpointing. Its saved interior leaves the saved set, the activations it reads from
  outside (its inputs: the checkpoint keeps them) join it, and backward re-runs its whole forward when
  its backward begins (non-reentrant ``torch.utils.checkpoint``, ``tf.recompute_grad``).

Each candidate changes tensor lifetimes in the joint schedule (``intervals``), so the planned peak is
liveness's own timeline with those lifetimes, not a guess.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..core.dims import Poly
from ..core.ir import Graph, Node, Tensor
from ..core.scopes import node_scope
from ..fusion.recompute import node_flops
from ..memory.liveness import Liveness
from ..memory.sizes import tensor_formula

LIST_INDEX = re.compile(r"\.\d+$")  # a module-list entry: 'layers.3', 'h.0' (scopes keep the index)
NUMBERED = re.compile(r"(?:_\d+)+$")  # Keras' numbered names: block, block_1 (Keras 3 scope: block_1_1)
# torch.get_rng_state(): the CPU generator's state, which checkpoint(preserve_rng_state=True) keeps per
# call until the re-run (on CUDA it and the device's small state live in host memory)
CPU_RNG_STATE = 5056
ROW_STATS = ".row_stats"  # fusion.recompute names a softmax's kept row statistics '<output>.row_stats'

Interval = tuple[int, int]  # first and last schedule step a tensor is alive (inclusive; -1: before step 0)


@dataclass
class Candidate:
    """One thing the planner may recompute: a fused kernel or a checkpointed block."""

    kind: str  # "fusion" | "block"
    name: str  # the block's module path ('inner.layers.0'), or '<pattern> at <node>'
    index: int  # position in the model (blocks: order of their first node), the tie-break
    freed: list[Tensor]  # saved tensors that leave the saved set
    kept: list[Tensor]  # tensors that join the saved set (a block's inputs, a fusion's unkept inputs)
    stats: list[tuple[str, Poly]] = field(default_factory=list)  # kept statistics no tensor holds
    flops: int | None = 0  # FLOPs backward adds, at the analysed sizes (None: a size is unknown)
    recompute_at: int | None = None  # blocks: the schedule step where the re-run happens
    recipe: str = ""
    scope: tuple[str, ...] = ()  # blocks: the scope's segments
    layer: str = ""  # blocks: the framework's layer name (Keras: for get_layer)
    # blocks: what the re-run makes again that the step already holds (the block's outputs: checkpoint
    # discards the copies), alive during the re-run only
    remade: list[Tensor] = field(default_factory=list)
    # blocks under selective checkpointing (plan.sac): cached outputs backward does not read, held from
    # forward until the re-run reads them back (each is let go as the re-run consumes it: before the
    # block's backward begins)
    cached: list[Tensor] = field(default_factory=list)
    # blocks: the generator state the checkpoint keeps until the re-run (held, but no saved tensor: the
    # saved-tensor hooks never see it)
    rng_state: int = 0


def block_scopes(graph: Graph) -> dict[tuple[str, ...], list[Node]]:
    """Outermost list-indexed scope -> its forward nodes, in model order ('inner','h','0' -> h.0). A node
    with no scope at all (the dynamo exporter drops the module of some: attention's q/k/v Split) whose
    consumers all lie in one block, and that reads an activation, is that block's."""
    block: dict[int, tuple[str, ...]] = {}
    for n in graph.nodes:
        s = node_scope(n)
        for k, seg in enumerate(s):
            if LIST_INDEX.search(seg):
                block[id(n)] = s[:k + 1]
                break
    if not block:
        block = _numbered_blocks(graph)
    for n in reversed(graph.nodes):  # consumers first, so chains of unscoped nodes are taken whole
        if id(n) in block or node_scope(n) or not any(t is not None and t.kind == "activation"
                                                      for t in n.inputs):
            continue
        owners = {block.get(id(c)) for t in n.outputs if t is not None for c in t.consumers}
        if len(owners) == 1 and None not in owners:
            block[id(n)] = owners.pop()
    out: dict[tuple[str, ...], list[Node]] = {}
    for n in graph.nodes:
        if id(n) in block:
            out.setdefault(block[id(n)], []).append(n)
    return out


def _numbered_blocks(graph: Graph) -> dict[int, tuple[str, ...]]:
    """Keras' repeated layers (no list index in their scopes): the outermost sibling scopes that differ
    only by a number ('block', 'block_1', ...), each holding scopes of its own (a layer of layers)."""
    scopes = [node_scope(n) for n in graph.nodes]
    groups: dict[tuple[tuple[str, ...], str], set[str]] = {}
    for s in scopes:
        for k in range(len(s) - 1):  # s[k] holds a deeper scope
            groups.setdefault((s[:k], NUMBERED.sub("", s[k])), set()).add(s[k])
    repeated = {key for key, members in groups.items() if len(members) > 1}
    block: dict[int, tuple[str, ...]] = {}
    for n, s in zip(graph.nodes, scopes, strict=True):
        for k in range(len(s) - 1):
            if (s[:k], NUMBERED.sub("", s[k])) in repeated:
                block[id(n)] = s[:k + 1]
                break
    return block


def layer_name(nodes: list[Node], scope: tuple[str, ...]) -> str:
    """The framework's name for a block: the first segment its weights' variables share (Keras:
    'block_3/fc1/kernel' -> 'block_3'), else its scope's last segment."""
    heads = Counter(t.meta["variable"].split("/")[0] for n in nodes for t in n.inputs
                    if t is not None and t.kind == "parameter" and t.meta.get("variable"))
    return heads.most_common(1)[0][0] if heads else scope[-1]


def block_candidates(graph: Graph, joint: Graph, live: Liveness, sizes: Mapping[str, int],
                     rng_state: int = 0) -> list[Candidate]:
    """One checkpoint candidate per list-indexed block that backward differentiates; ``rng_state``: the
    bytes of the random generator's state each checkpoint keeps (rng_state_bytes)."""
    step = {id(n): i for i, n in enumerate(live.schedule)}
    at = {n.name: i for i, n in enumerate(live.schedule[:live.boundary])}
    backward_of: dict[str, list[int]] = {}
    for n in live.schedule:
        f = n.meta.get("forward") if n.phase == "backward" else None
        if f is not None:
            backward_of.setdefault(f, []).append(step[id(n)])
    saved = {s.tensor.name: s for s in live.saved}
    out = []
    for scope, nodes in block_scopes(graph).items():
        names = {n.name for n in nodes}
        # where it starts: its first node that reads an activation (constants are scheduled anywhere)
        index = min((at[n.name] for n in nodes if n.name in at and any(
            t is not None and t.kind in ("activation", "input") for t in n.inputs)), default=len(at))
        starts = [i for n in names for i in backward_of.get(n, ())]
        if not starts:
            continue
        inside = {id(n) for n in nodes}
        freed, kept, seen = [], [], set()
        for n in nodes:
            # the joint graph's copy: its outputs include what backward adds (LayerNorm's kept statistics,
            # an sdpa kernel's logsumexp and copies), which the block's re-run makes again too
            for t in joint.node(n.name).outputs if joint.has_node(n.name) else n.outputs:
                s = saved.get(t.name) if t is not None else None
                if s is not None and t.kind == "activation" and \
                        all(r.meta.get("forward") in names for r in s.needed_by):
                    freed.append(t)
            for t in n.inputs:
                if t is None or t.name in seen or t.kind != "activation":
                    continue
                seen.add(t.name)
                if t.producer is None or id(t.producer) not in inside:
                    # what the checkpoint holds is a storage: a view's base once (it may be saved by the
                    # block before, under the base's name), nothing for a tensor eager never makes
                    mine = joint.tensors.get(t.name, t)  # the joint graph's copy: liveness's keys
                    base = live.storage.get(mine, mine)
                    if base is None or base.kind != "activation" or (base is not mine and base.name in seen):
                        continue
                    seen.add(base.name)
                    kept.append(base)
        # what the re-run makes again is storage: a view's base once, nothing for a tensor eager never
        # makes (a causal mask sdpa is told by is_causal), nothing the checkpoint holds already
        remade, made = [], {base.name for base in kept}
        for n in nodes:
            for t in n.outputs:
                if t is None or t.kind != "activation" or t.name not in joint.tensors \
                        or all(id(c) in inside for c in t.consumers):
                    continue
                mine = joint.tensors[t.name]
                base = live.storage.get(mine, mine)
                if base is not None and base.kind == "activation" and base.name not in made:
                    made.add(base.name)
                    remade.append(base)
        flops: int | None = 0
        for n in nodes:
            f = node_flops(n, sizes) if n.outputs and n.outputs[0] is not None else 0
            flops = None if flops is None or f is None else flops + f
        layer = layer_name(nodes, scope)
        path = ".".join(scope) if LIST_INDEX.search(scope[-1]) else layer  # Keras: the layer's name
        out.append(Candidate("block", path, index, freed, kept, [], flops, min(starts),
                             "activation checkpointing: re-run the block's forward when its backward begins",
                             scope, layer, remade, rng_state=rng_state))
    return out


def rng_state_bytes(analysis) -> int:
    """What PyTorch's checkpoint keeps of the random generator's state per block, in device memory: the
    CPU generator's on the CPU; nothing on CUDA (host memory) nor under TensorFlow's recompute_grad."""
    profile = analysis.profile
    torch_cpu = profile is not None and profile.name == "pytorch" and profile.device == "cpu"
    return CPU_RNG_STATE if torch_cpu else 0


def fusion_candidates(matches, joint: Graph) -> list[Candidate]:
    """One candidate per match whose verdict is 'training-safe if recomputed' and whose sizes are known."""
    out = []
    for index, m in enumerate(matches):
        rc = getattr(m.verdict, "recompute", None)
        if rc is None or rc.flops is None:
            continue
        freed = [joint.tensors[n] for n in rc.tensors if n in joint.tensors]
        kept, stats = [], []
        for name in rc.kept:
            if name in joint.tensors:
                kept.append(joint.tensors[name])
            elif name.endswith(ROW_STATS) and name.removesuffix(ROW_STATS) in joint.tensors:
                y = joint.tensors[name.removesuffix(ROW_STATS)]  # one float32 per softmax row
                f = None if y.shape is None else tensor_formula((*y.shape[:-1], 1), "float32")
                if f is not None:
                    stats.append((name, f))
        out.append(Candidate("fusion", f"{m.pattern.name} at {m.root.name}", index, freed, kept, stats,
                             rc.flops, None, rc.recipe))
    return out


def forward_last_use(live: Liveness) -> dict[str, int]:
    """Tensor name -> the last forward step that reads it or a view of it (what a freed storage lives
    until)."""
    out: dict[str, int] = {}
    storage = live.storage
    for i, n in enumerate(live.schedule[:live.boundary]):
        for t in n.inputs:
            if t is not None:
                out[t.name] = i
                base = storage.get(t) if storage else None
                if base is not None:
                    out[base.name] = i
    return out


def planned_intervals(chosen: list[Candidate], live: Liveness, fwd_last: Mapping[str, int]
                      ) -> tuple[dict[str, list[Interval]], list[tuple[Interval, Poly]]]:
    """Lifetimes the chosen candidates change: tensor name -> its intervals, and the kept statistics'
    intervals. A freed tensor dies after its last forward read (and a block's is alive again from the
    block's re-run to its last backward read); a kept input lives until the last re-run that reads it."""
    over: dict[str, list[Interval]] = {}
    stats: list[tuple[Interval, Poly]] = []
    kept_until: dict[str, int] = {}
    for c in chosen:
        for t in c.freed:
            born, last = live.lifetimes[t.name]
            first = (born, max(born, fwd_last.get(t.name, born)))
            if c.kind == "block" and c.recompute_at is not None:
                over[t.name] = [first, (c.recompute_at, max(last, c.recompute_at))]
            elif t.name not in over:
                over[t.name] = [first]
        end = max((live.lifetimes[t.name][1] for t in c.freed), default=live.boundary)
        for t in c.kept:
            until = c.recompute_at if c.kind == "block" else end
            kept_until[t.name] = max(kept_until.get(t.name, -1), until if until is not None else end)
        for t in c.cached:
            until = c.recompute_at - 1 if c.recompute_at is not None else end
            kept_until[t.name] = max(kept_until.get(t.name, -1), until)
        born = min((live.lifetimes[t.name][0] for t in c.freed), default=live.boundary - 1)
        stats.extend(((born, end), f) for _, f in c.stats)
        if c.rng_state:  # taken as the block's forward begins; its frame lives to the last saved read
            stats.append(((born, end), Poly.const(c.rng_state)))
        if c.kind == "block" and c.recompute_at is not None:
            stats.extend(((c.recompute_at, c.recompute_at), f) for t in c.remade
                         if (f := tensor_formula(t.shape, t.dtype)) is not None)
    for name, until in kept_until.items():
        if name not in live.lifetimes:
            continue
        born, last = live.lifetimes[name]
        if name in over:  # freed by one block, read by another that is checkpointed: its input, kept
            (b, e), *rest = over[name]
            over[name] = [(b, max(e, until)), *rest]
        else:
            over[name] = [(born, max(last, until))]
    return over, stats


def saved_after(chosen: list[Candidate], live: Liveness) -> tuple[list[Tensor], list[Poly]]:
    """The saved activations once ``chosen`` are applied (the set a framework's saved-tensor hooks see),
    and the kept statistics no tensor holds."""
    freed = {t.name for c in chosen for t in c.freed}
    out = {s.tensor.name: s.tensor for s in live.saved
           if s.tensor.kind == "activation" and s.tensor.name not in freed}
    for c in chosen:
        for t in [*c.kept, *c.cached]:
            if t.kind == "activation":
                out.setdefault(t.name, t)
    stats = {n: f for c in chosen for n, f in c.stats}
    return list(out.values()), list(stats.values())

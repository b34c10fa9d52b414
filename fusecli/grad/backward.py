"""Forward Graph -> joint forward+backward Graph, by the rules table, in reverse topological order.

The loss is the sum of the graph outputs (its gradient is ones shaped like each output). Only what a
trainable parameter (or, with ``wrt_inputs``, a float graph input) needs gets a backward op; several
consumers of a tensor have their gradients summed by an ``AddN``.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from operator import attrgetter

from ..core.ir import FLOAT_DTYPES, Graph, Node, Tensor
from ..core.kinds import GRADIENT_SUM
from .composites import SHAPE_READERS, Region, custom_gradient_regions, find_regions
from .kept_outputs import KEPT_OUTPUTS, make_kept_outputs
from .layout import Layouts
from .profiles import OPS, Profile
from .rules import Grad
from .storage import made_each_step, per_call_casts

GRAD_PREFIX = "gradients"


def grad_kind(node: Node) -> str:
    """The kind whose rule differentiates ``node``: its own, unless the loader names another
    (TensorFlow's AddV2 keeps its broadcasting gradient when it adds a bias)."""
    return node.meta.get("grad_kind", node.kind)


def requires_grad(graph: Graph, wrt_inputs: bool = False, profile: Profile = OPS) -> set[str]:
    """Names of tensors on a path from a trainable leaf: float parameters (and float inputs)."""
    every = profile.function_inputs  # TensorFlow: a function call's gradient covers all its inputs
    frozen = profile.frozen(graph) if profile.frozen is not None else ()
    rg = {t.name for t in graph.tensors.values()
          if t.dtype in FLOAT_DTYPES and ((t.kind == "parameter" and t.name not in frozen)
                                          or "from_parameter" in t.meta
                                          or ((wrt_inputs or every) and t.kind == "input")
                                          or (every and "variable" in t.meta))}
    rules = _RuleCache(profile)
    for node in graph.nodes:
        if node.meta.get("constant"):
            continue
        rule = rules.of(node)
        if rule == {}:
            continue
        for i, t in enumerate(node.inputs):
            # a differentiable input on a trainable path makes the node's float outputs trainable
            if t is not None and t.name in rg and (rule is None or rule.get(i, rule.get("*")) is not None):
                rg.update(u.name for u in node.outputs if u is not None and u.dtype in FLOAT_DTYPES)
                break
    return rg


class _RuleCache:
    """A profile's rule per gradient kind, looked up once per kind."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.rules: dict[str, dict | None] = {}

    def of(self, node: Node) -> dict[int | str, Grad] | None:
        kind = node.meta.get("grad_kind", node.kind)  # grad_kind(node), inline: called per node
        try:
            return self.rules[kind]
        except KeyError:
            rule = self.rules[kind] = self.profile.rule_for(kind)
            return rule


class _Builder:
    """Adds backward nodes and tensors to the joint graph, and sums partial gradients."""

    def __init__(self, joint: Graph, layouts: Layouts | None = None) -> None:
        self.joint = joint
        self.layouts = layouts  # PyTorch's strides of forward tensors: whether a reshape copies
        self.partials: dict[str, list[Tensor]] = {}
        self.plans = _Plans()

    def node(self, scope: str, op: str, inputs: list[Tensor], like: list[Tensor],
             shape_reads: list[Tensor] = (), forward: Node | None = None) -> list[Tensor]:
        """One backward node reading ``inputs`` and making one gradient shaped like each of ``like``."""
        joint = self.joint
        # PyTorch's names start with '/': 'gradients/m/Conv/ConvGrad', not 'gradients//m/...'
        name = joint.unique_node_name(f"{GRAD_PREFIX}/{scope.lstrip('/')}/{op}")
        tensors = joint.tensors
        outs = []
        for k, t in enumerate(like):
            out_name = f"{name}:{k}"
            out = tensors.get(out_name)  # joint.tensor, inline: called for every gradient
            if out is None:  # "like": the tensor it is the gradient of (parallel/tensor.py reads it)
                out = tensors[out_name] = Tensor(out_name, t.dtype, t.shape, "activation",
                                                 meta={"like": t.name})
            outs.append(out)
        meta = {"shape_reads": list(shape_reads)}
        if forward is not None:
            meta["forward"] = forward.name
            if forward.meta.get("converter_made"):  # a converter's own op (load.tf2onnx): no framework ran it
                meta["converter_made"] = True
        joint.add_node(Node(name, op, "grad", list(inputs), outs, {}, "", "backward", meta))
        return outs

    def add_partial(self, target: Tensor, grad: Tensor) -> None:
        parts = self.partials.get(target.name)
        if parts is None:
            self.partials[target.name] = [grad]
        else:
            parts.append(grad)

    def total(self, t: Tensor) -> Tensor | None:
        """The full gradient of ``t``: its one partial, or the AddN of several (made once: it replaces
        them, as every partial of ``t`` is in before its total is asked for, in reverse topological order)."""
        parts = self.partials.get(t.name)
        if not parts:  # most forward tensors get no gradient: one lookup
            return None
        if len(parts) > 1:
            parts[:] = self.node(t.name, GRADIENT_SUM, parts, [t])
        return parts[0]


def _broadcast(x: Tensor, y: Tensor | None) -> bool:
    """True unless x and y are known to have the same shape (equal dims, none unknown)."""
    if y is None:
        return True
    xs, ys = x.meta.get("graph_shape", x.shape), y.meta.get("graph_shape", y.shape)
    return xs is None or xs != ys or None in xs


def regions_of(graph: Graph, profile: Profile, rg: set[str] = frozenset()) -> list[Region]:
    """The profile's composite regions of ``graph``: TensorFlow's custom gradients, PyTorch's composites."""
    regions = custom_gradient_regions(graph) if profile.custom_gradients else []
    if profile.composites:
        taken = {id(n) for r in regions for n in r.nodes}
        regions += [r for r in find_regions(graph, profile.composites, rg, profile.device, profile.dims)
                    if not any(id(n) in taken for n in r.nodes)]
    return regions


def kernel_interiors(graph: Graph, regions: list[Region]) -> list[str]:
    """The tensors eager PyTorch never allocates for its composites' kernels: those the export spells
    between a region's inputs and its root, read by nothing outside it but for their shapes (sdpa's
    scores and P under the flash kernel; the math kernel, rms_norm and BLOOM's GELU run op by op and
    allocate them), and what only feeds an input the eager call never gets (the causal mask passed as
    is_causal, K and V repeated for enable_gqa), back to the tensors something else reads."""
    out = []
    unread: dict[int, set[int]] = {}  # tensor -> the nodes that read it as an input the kernel drops
    for r in regions:
        inside = {id(n) for n in r.nodes}
        for t in r.unread:
            unread.setdefault(id(t), set()).update(id(c) for c in t.consumers if id(c) in inside)
        if not r.fused or (r.kernel is not None and r.kernel.get("kernel") == "math"):
            continue
        for n in r.nodes[:-1]:
            out += [t.name for t in n.outputs if t is not None and t.consumers and
                    all(id(c) in inside or c.kind in SHAPE_READERS for c in t.consumers)]
    if unread:
        out += _never_made(graph, unread)
    return out


def _never_made(graph: Graph, unread: dict[int, set[int]]) -> list[str]:
    """The forward tensors whose every reader is a kernel that drops them or a node none of whose outputs
    is made, in one pass in reverse order (a node's readers come after it)."""
    outputs = {id(t) for t in graph.outputs}
    dead: set[int] = set()  # nodes none of whose outputs is made
    out = []
    for n in reversed(graph.forward_nodes()):
        made = [t for t in n.outputs if t is not None]
        if not made or any(id(t) in outputs or not t.consumers for t in made):
            continue
        if all(id(c) in dead or id(c) in unread.get(id(t), ()) for t in made for c in t.consumers):
            dead.add(id(n))
            out += [t.name for t in made]
    return out


def build_backward(forward: Graph, wrt_inputs: bool = False, profile: Profile = OPS) -> Graph:
    """The joint graph: a copy of ``forward`` followed by the backward ops of ``loss = sum(outputs)``,
    built as ``profile``'s framework builds it (grad.profiles): its rule overrides; its composite
    regions, each one backward node reading what the framework's formula reads; with
    ``zeros_like_unused`` an op with several float outputs, some without a gradient, gets
    ``ZerosLike(output)`` for those, which reads (and keeps) them; with ``constant_operands`` a gradient
    function differentiates every float input, constants too (``Mul(x, 0.5)`` keeps x for the
    constant's unused gradient).
    """
    joint = forward.copy()
    joint.meta["wrt_inputs"] = wrt_inputs
    joint.meta["made_each_step"] = made_each_step(joint, profile)
    joint.meta["per_call_casts"] = per_call_casts(joint, profile)
    joint.meta["autodiff"] = profile.name
    rg = requires_grad(joint, wrt_inputs, profile)
    # what may get a gradient output, listed before the backward tensors (all activations) join them
    leaves = [t for t in joint.tensors.values()
              if t.kind == "parameter" or "from_parameter" in t.meta or (wrt_inputs and t.kind == "input")]
    regions = regions_of(joint, profile, rg)
    joint.meta["composites"] = {r.root.name: r.name for r in regions}
    joint.meta["attention_kernels"] = {r.root.name: r.kernel for r in regions if r.kernel is not None}
    joint.meta["kernel_interiors"] = kernel_interiors(joint, regions) if profile.composites else []
    # a bool mask's float form the export shares between sdpa calls: eager converts it in each call
    joint.meta["converted_masks"] = {f.name: b.name for r in regions for f, b in r.converted}
    region_of = {id(r.root): r for r in regions}
    interior = {id(n) for r in regions for n in r.nodes[:-1]}
    b = _Builder(joint, Layouts(profile.dims) if profile.views else None)
    for y in joint.outputs:
        if y.name in rg:  # d(sum y)/dy = ones_like(y)
            b.add_partial(y, b.node(y.name, "OnesLike", [], [y], shape_reads=[y])[0])
    rules = _RuleCache(profile)
    total = b.total
    for node in reversed(joint.forward_nodes()):
        if node.meta.get("constant") or id(node) in interior:
            continue
        out_grads = [None if t is None else total(t) for t in node.outputs]
        dys = [g for g in out_grads if g is not None]
        if not dys:
            continue
        region = region_of.get(id(node))
        if region is not None:
            _composite(b, region, dys, rg, profile)
            continue
        if profile.zeros_like_unused and len(dys) < len(node.outputs):
            dys += [b.node(t.name, "ZerosLike", [t], [t])[0] for t, g in zip(node.outputs, out_grads,
                                                                           strict=True)
                    if g is None and t is not None and t.is_float]
        _differentiate(b, node, rules.of(node), dys, rg, profile)
    _finish(joint, b, rg, leaves)
    return joint


def _differentiate(b: _Builder, node: Node, rule: dict[int | str, Grad] | None, dys: list[Tensor],
                   rg: set[str], profile: Profile) -> None:
    """The backward nodes of one forward node by its rule, given its output gradients ``dys``."""
    inputs = node.inputs
    star = None if rule is None else rule.get("*")  # rules.grad_for_input, inline: once per input
    # the rule's small dict first: an input without a gradient skips the lookup in the big rg set
    wanted = [i for i, t in enumerate(inputs) if t is not None
              and (rule is None or rule.get(i, star) is not None) and t.name in rg]
    if profile.constant_operands and wanted and rule is not None:
        wanted = [i for i, t in enumerate(inputs) if t is not None and t.is_float
                  and rule.get(i, star) is not None]
    if not wanted:
        return
    if rule is None:  # unsupported: assume its backward reads every input and output
        reads = [t for t in (*inputs, *node.outputs) if t is not None]
        grads = b.node(node.name, f"{node.op_type}Grad", [*dys, *reads], [inputs[i] for i in wanted],
                       forward=node)
        for i, g in zip(wanted, grads, strict=True):
            b.add_partial(inputs[i], g)
        node.meta["unsupported"] = True
        return
    kind = node.meta.get("grad_kind", node.kind)  # grad_kind(node), inline
    if kind in KEPT_OUTPUTS:  # outputs the kernel keeps for backward though the export names none
        make_kept_outputs(b.joint, node, kind, profile.name, profile.device)
    plan = b.plans.of(node, rule, wanted)
    broadcast = ()
    if plan.checked:  # whether each broadcast-only input was broadcast: its gradient needs an op
        broadcast = tuple(len(dys) != 1 or _broadcast(inputs[i], node.outputs[0]) for i in plan.checked)
    passthrough, ops = plan.ops(broadcast)
    for i in passthrough:
        b.add_partial(inputs[i], dys[0])  # no op, reads nothing
    views = profile.views
    for op, group, value_refs, shape_refs in ops:
        values = {}
        for t in _tensors_at(node, value_refs):
            if views:  # a view keeps its base's storage; a matmul operand folded by a copy keeps its own
                base = profile.storage_of(t, b.layouts)
                if base is not t and kind == "matmul" and b.layouts is not None \
                        and b.layouts.matmul_copies(node, t):
                    base = t
                t = base
            while t.producer is not None and t.producer.meta.get("converter_made"):  # a converter's layout
                t = t.producer.inputs[0]  # copy: the framework's op read the tensor it copies (load.tf2onnx)
            values[t.name] = t  # one read per storage, in the order first read
        shape_reads = _shape_reads(node, shape_refs, values) if shape_refs else []
        grads = b.node(node.name, op, [*dys, *values.values()], [inputs[i] for i in group],
                       shape_reads, node)
        for i, g in zip(group, grads, strict=True):
            b.add_partial(inputs[i], g)


Ref = tuple[bool | None, int]  # (of the inputs (None: every input), index): a parsed read
Op = tuple[str, tuple[int, ...], tuple[Ref, ...], tuple[Ref, ...]]  # op, its inputs, value and shape reads


class _Plan:
    """How one rule differentiates one set of a node's inputs: the rule's entries, parsed once for every
    node they fit. ``checked`` lists the broadcast-only inputs (pass-through unless broadcast)."""

    def __init__(self, entries: list[tuple[int, Grad]], stats: tuple[str, ...] | None) -> None:
        self.entries = entries
        self.stats = stats
        self.checked = tuple(i for i, g in entries if g.op is not None and g.broadcast_only)
        self._ops: dict[tuple[bool, ...], tuple[list[int], list[Op]]] = {}

    def ops(self, broadcast: tuple[bool, ...]) -> tuple[list[int], list[Op]]:
        """The pass-through inputs and the backward ops, given whether each ``checked`` input was
        broadcast: entries naming one op become one backward node, in the order first named."""
        out = self._ops.get(broadcast)
        if out is None:
            was = dict(zip(self.checked, broadcast, strict=True))
            passthrough: list[int] = []
            groups: dict[str, list[tuple[int, Grad]]] = {}
            for i, g in self.entries:
                if g.op is None or not was.get(i, True):
                    passthrough.append(i)
                else:
                    groups.setdefault(g.op, []).append((i, g))
            ops = [(op, tuple(i for i, _ in items), *_plan_reads([g for _, g in items], self.stats))
                   for op, items in groups.items()]
            out = self._ops[broadcast] = (passthrough, ops)
        return out


class _Plans:
    """Each node's _Plan, made once per (rule, inputs differentiated, bias swap, statistics). Keys hold a
    rule by identity: every rule outlives the build that holds this cache."""

    def __init__(self) -> None:
        self.plans: dict[tuple, _Plan] = {}

    def of(self, node: Node, rule: dict[int | str, Grad], wanted: list[int]) -> _Plan:
        meta = node.meta
        swap, stats = False, None
        if meta:  # most nodes have none: no swap (no bias_input), no statistics, no lookups
            # Add(bias, x), as the TorchScript exporter writes it: the rule's x is input 1, its bias input 0
            swap = meta.get("grad_kind", node.kind) == "bias_add" and meta.get("bias_input", 1) == 0
            stats = meta.get("stats")
            if stats is not None:
                stats = tuple(stats)
        key = (id(rule), swap, stats, *wanted)
        plan = self.plans.get(key)
        if plan is None:
            star = rule.get("*")
            entries = [(i, _swapped(rule.get(1 - i if swap else i, star), swap)) for i in wanted]
            plan = self.plans[key] = _Plan(entries, stats)
        return plan


def _swapped(g: Grad | None, swap: bool) -> Grad | None:
    """``g`` with its reads of x0 and x1 exchanged when the node's operands are (``swap``)."""
    if not swap or g is None:  # None: no rule entry, which fails where it is used, as it always did
        return g
    reads = tuple(f"x{1 - int(r[1])}{r[2:]}" if r[:2] in ("x0", "x1") else r for r in g.reads)
    return replace(g, reads=reads)


def _plan_reads(grads: list[Grad], stats: tuple[str, ...] | None) -> tuple[tuple[Ref, ...], tuple[Ref, ...]]:
    """The distinct value and shape refs of ``grads``' reads, in the order first read."""
    values: dict[Ref, None] = {}
    shapes: dict[Ref, None] = {}
    for g in grads:
        for read in g.reads:
            for shape_only, from_inputs, i in _expand(read, stats):
                (shapes if shape_only else values)[from_inputs, i] = None
    return tuple(values), tuple(shapes)


def _expand(read: str, stats: tuple[str, ...] | None) -> list[tuple[bool, bool | None, int]]:
    """A rule's read parsed; ``stats`` becomes the node's statistics reads (default ``x3 x4``)."""
    if read == "stats":
        return [r for ref in (("x3", "x4") if stats is None else stats) for r in _expand(ref, stats)]
    return [_parse_read(read)]


def _tensors_at(node: Node, refs: tuple[Ref, ...]) -> list[Tensor]:
    """The tensors at ``refs`` of ``node``; refs to absent optional tensors drop out."""
    out = []
    for from_inputs, i in refs:
        if from_inputs is None:
            out += [t for t in node.inputs if t is not None]
            continue
        pool = node.inputs if from_inputs else node.outputs
        t = pool[i] if i < len(pool) else None
        if t is not None:
            out.append(t)
    return out


def _shape_reads(node: Node, refs: tuple[Ref, ...], values: dict[str, Tensor]) -> list[Tensor]:
    """The tensors at ``refs`` of ``node`` whose values are not read too, each once, in order."""
    shapes = {t.name: t for t in _tensors_at(node, refs)}
    return [t for name, t in shapes.items() if name not in values]


@cache
def _parse_read(read: str) -> tuple[bool, bool | None, int]:
    """'x1.shape' -> (shape only, of the inputs (None: all of them), index)."""
    shape_only = read.endswith(".shape")
    ref = read.removesuffix(".shape")
    return (shape_only, None, 0) if ref == "*" else (shape_only, ref[0] == "x", int(ref[1:]))


def _region_storage(b: _Builder, region: Region, t: Tensor, profile: Profile) -> Tensor:
    """The storage a composite's backward keeps for its read ``t``: the view's base, but for an operand
    of sdpa's math kernel, whose aten matmuls fold q, k^T and v to 3-D with ``reshape``: where the batch
    and head dims cannot merge (DeepSeek-V3's v, a split of kv_b_proj's output transposed), bmm saves
    that copy, not the base."""
    base = profile.storage_of(t, b.layouts)
    if base is not t and b.layouts is not None and (region.kernel or {}).get("kernel") == "math" \
            and any(n.kind == "matmul" and b.layouts.matmul_copies(n, t) for n in region.nodes):
        return t
    return base


def _composite(b: _Builder, region: Region, dys: list[Tensor], rg: set[str], profile: Profile) -> None:
    """One backward node for a composite region: it reads what the framework's formula reads and
    makes the gradients of the region's outside inputs that need one."""
    targets = [t for t in region.inputs if t.name in rg]
    if not targets:
        return
    if profile.zeros_like_unused:  # the pass-through outputs get no gradient: ZerosLike reads them
        dys = dys + [b.node(t.name, "ZerosLike", [t], [t])[0] for t in region.passthrough if t.is_float]
    reads = list({id(t): t for t in (_region_storage(b, region, r, profile) for r in region.reads)
                  if t.producer is None or t.producer.phase == "forward"}.values())
    for name, dtype, shape in region.new:  # made by the framework's kernel, not in the export (logsumexp)
        t = b.joint.tensor(name, dtype=dtype, shape=shape, kind="activation")
        if t.producer is None:
            t.producer = region.root
            region.root.outputs.append(t)
        reads.append(t)
    grads = b.node(region.root.name, region.op, [*dys, *reads], targets, forward=region.root)
    grads[0].producer.meta["composite"] = region.name
    for t, g in zip(targets, grads, strict=True):
        b.add_partial(t, g)


def _finish(joint: Graph, b: _Builder, rg: set[str], leaves: list[Tensor]) -> None:
    """Parameter (and input) gradients become graph outputs, by name; ``leaves``: the joint graph's
    parameters (and inputs)."""
    partials = b.partials
    for t in sorted((t for t in leaves if t.name in rg and partials.get(t.name)), key=attrgetter("name")):
        total = b.total(t)
        total.meta["grad_of"] = t.name
        joint.outputs.append(total)

"""Selective activation checkpointing: an op-level policy, as users write it for
``torch.utils.checkpoint.create_selective_checkpoint_contexts``, applied to every block.

Each block runs under non-reentrant checkpoint; the policy is asked about every aten op the block
dispatches, in order, in forward and again in the re-run (``ctx.is_recompute``). SAC caches the outputs of
the ops it saves (MUST_SAVE / PREFER_SAVE), not what autograd would have saved: a cached output that
backward reads keeps its lifetime, one that it does not is held until the block's re-run reads it back;
every other op is recomputed, so what it saves for backward is freed after forward and made again in the
re-run, as under plain block checkpointing (plan.candidates). The block's inputs are kept for the re-run.

The export's nodes are mapped to the aten ops PyTorch dispatches for them (``aten_ops``): a linear without
bias is ``aten.mm`` (on a flattened view), with bias ``aten.addmm`` (GPT-2's Conv1D too), a matmul of two
activations ``aten.bmm``, a scaled-dot-product-attention region the kernel the profile chose for the device
(the CPU flash kernel ``aten._scaled_dot_product_flash_attention_for_cpu``; on CUDA flash or
memory-efficient), a softmax ``aten._softmax``; any other node that makes a storage of its own is
``aten.<its kind>`` (``ATEN_NAMES`` where aten names it otherwise: a Conv is ``aten.convolution``); views
make none. A matmul by one expert's slice of a stacked weight (``w[i]``: a view) is an ``aten.mm`` too.

An MoE router is a weight matmul whose scores reach a TopK (through softmax, sigmoid, casts, a bias):
torchtitan recomputes every mm whose second operand has a router weight's shape (its
``per_op_sac_force_recompute_mm_shapes_by_fqns``, ``moe.router.gate`` by default) and leaves it out of
its every-second-mm count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ..core.errors import UsageError
from ..core.ir import Node, Tensor
from ..core.weights import made_of_weights
from ..fusion.recompute import node_flops
from ..grad.storage import linear_bias_add
from .candidates import Candidate, block_candidates, block_scopes, rng_state_bytes

# the sdpa kernel the profile chose (grad.sdpa.choose), by device -> the aten op PyTorch dispatches
SDPA_OPS = {("flash", "cpu"): "aten._scaled_dot_product_flash_attention_for_cpu",
            ("flash", "cuda"): "aten._scaled_dot_product_flash_attention",
            ("efficient", "cuda"): "aten._scaled_dot_product_efficient_attention"}
SDPA = frozenset({*SDPA_OPS.values(), "aten._scaled_dot_product_cudnn_attention"})
MATMULS = frozenset({"aten.mm", "aten.addmm", "aten.bmm"})
# the aten op of a kind whose name is not aten's (a Conv dispatches aten.convolution, TopK aten.topk)
ATEN_NAMES = {"conv": "aten.convolution", "conv_transpose": "aten.convolution", "top_k": "aten.topk"}
# what a router's scores pass through on their way to the TopK that picks the experts (Mixtral and
# Qwen-MoE: softmax; DeepSeek-V3: sigmoid, then a bias added), followed at most ROUTE_STEPS ops
ROUTE_OPS = frozenset({"softmax", "sigmoid", "cast", "add", "mul", "div", "reshape", "flatten", "squeeze",
                       "unsqueeze", "identity", "log_softmax"})
ROUTE_STEPS = 6
# torchtitan's default op-level policy (torchtitan/distributed/activation_checkpoint.py at c5d93d1,
# _get_default_save_ops): torch's compute-intensive ops (mm, addmm, bmm, convolution, the CUDA sdpa
# kernels; not the CPU one), the other sdpa variants, max, topk, linear and the collectives; every second
# mm (or linear) of a block's forward recomputed
TORCHTITAN_SAVE = frozenset({
    "aten.mm", "aten.addmm", "aten.bmm", "aten.convolution", "aten._scaled_mm", "aten.upsample_bilinear2d",
    "aten._scaled_dot_product_flash_attention", "aten._scaled_dot_product_efficient_attention",
    "aten._flash_attention_forward", "aten._efficient_attention_forward",
    "aten._scaled_dot_product_cudnn_attention", "aten._scaled_dot_product_attention_math",
    "aten._scaled_dot_product_fused_attention_overrideable", "aten.max", "aten.topk", "aten.linear",
    "_c10d_functional.reduce_scatter_tensor", "_c10d_functional.all_to_all_single"})


@dataclass(frozen=True)
class Call:
    """One aten op a block dispatches: the op, its place among the block's calls of that op (1-based),
    the node that spells it and the tensors it outputs (their storages)."""

    op: str
    count: int
    node: Node
    outputs: tuple[Tensor, ...]
    rhs: tuple | None = None  # a weight matmul's second operand's shape, as the mm gets it ((in, out))
    router: bool = False  # an MoE router's matmul (module docstring)

    @property
    def label(self) -> str:
        """'mm#3': the op without its namespace and its place among the block's calls of it."""
        return f"{self.op.removeprefix('aten.')}#{self.count}"


Policy = Callable[[Call], bool]  # True: save (cache) the op's outputs


def _save_list(ops) -> Policy:
    return lambda call: call.op in ops


def _megatron(calls: list[Call]) -> list[bool]:
    """Megatron-LM's selective recompute as an op-level policy: the attention core recomputed (the sdpa
    kernel; in eager attention every op from the first bmm, q by k, to the second, by v), every other op
    saved."""
    out, inside = [], False
    for call in calls:
        core = call.op in SDPA or inside or call.op == "aten.bmm"
        if call.op == "aten.bmm":
            inside = not inside
        out.append(not core)
    return out


def _torchtitan(calls: list[Call]) -> list[bool]:
    """torchtitan's policy over a block's calls: an mm whose second operand has a router weight's shape
    recomputed and not counted; of the other mm calls the 1st, 3rd, ... saved, the 2nd, 4th recomputed
    (`to_save = func in _save_list and not (func == mm and meta[mm_count] % 2 == 0)`, the count taken
    before the test, apart in forward and recompute); every other op of its save list saved."""
    forced = set(router_shapes(calls))
    out, mm = [], 0
    for call in calls:
        if call.op == "aten.mm" and call.rhs in forced:
            out.append(False)
            continue
        mm += call.op == "aten.mm"
        out.append(call.op in TORCHTITAN_SAVE and not (call.op == "aten.mm" and mm % 2 == 0))
    return out


def router_shapes(calls: list[Call]) -> list[tuple]:
    """The shapes (in, out) of the block's MoE router weights, as torchtitan's forced-recompute set."""
    return sorted({c.rhs for c in calls if c.router and c.rhs is not None})


def _traced(nodes: list[Node]) -> list[Node]:
    """The nodes in the order the export traced them (its file's order, load.onnx's ``traced``), the
    order PyTorch dispatched them in; the canonical order where the file's is not known."""
    return sorted(nodes, key=lambda n: n.meta.get("traced", -1))


PRESETS: dict[str, Policy | None] = {
    "none": None,  # no checkpoint
    "full": _save_list(()),  # plain block checkpointing: nothing cached
    "attention": _save_list(SDPA),
    "matmul": _save_list(MATMULS | SDPA),
    "torchtitan": _torchtitan,
    "megatron": _megatron,  # decides over the block's calls together
}
# policies that read a block's calls in order, not one at a time
WHOLE_BLOCK = frozenset({_megatron, _torchtitan})


def op_names(save: list[str]) -> frozenset[str]:
    """A user's op names as the policies name them: 'mm' -> 'aten.mm' (a namespace given is kept)."""
    return frozenset(s if s.startswith(("aten.", "_c10d")) else f"aten.{s}" for s in save)


def policy_of(preset: str | None, save: list[str] | None = None) -> Policy | None:
    """The preset's policy, or one saving the aten ops ``save`` names ('aten.mm', ...)."""
    if save:
        return _save_list(op_names(save))
    return PRESETS[preset or "none"]


# the presets as plan.emit writes them: the ops saved, and whether every second mm is recomputed
EMITTED = {"full": (frozenset(), False), "attention": (SDPA, False), "matmul": (MATMULS | SDPA, False),
           "torchtitan": (TORCHTITAN_SAVE, True)}


def emitted_policy(preset: str | None, save: list[str] | None = None) -> tuple[frozenset[str], bool]:
    """The policy as a policy_fn writes it: the ops it saves, and whether it recomputes every second mm
    (KeyError: a preset no op list spells: megatron's reads a block's calls together; none)."""
    return (op_names(save), False) if save else EMITTED[preset]


def aten_ops(nodes: list[Node], kernels: dict[str, dict], weighted: set[str], storage, device: str,
             interiors: set[str] = frozenset()) -> list[Call]:
    """The block's aten calls that policies name, in dispatch order (module docstring); a node inside a
    fused kernel (``interiors``: the tensors the kernel never makes, an sdpa's scores and probabilities)
    dispatches no bmm or softmax."""
    counts: dict[str, int] = {}
    out, absorbed = [], set()  # absorbed: the bias adds of the addmm calls (one aten op, not two)
    for n in _traced(nodes):
        if n.name in absorbed:
            continue
        op, outputs = None, tuple(o for o in n.outputs if o is not None)
        rhs, router = None, False  # a weight matmul's (torchtitan's forced recompute)
        inside = bool(outputs) and all(o.name in interiors for o in outputs)
        if n.name in kernels:
            op = SDPA_OPS.get((kernels[n.name].get("kernel"), device))
        elif n.kind in ("matmul", "gemm"):
            acts = [i for i in n.inputs if i is not None and i.name not in weighted and i.kind != "constant"]
            if len(acts) == 2:
                op = None if inside else "aten.bmm"
            elif acts:
                bias = n.kind == "gemm" and len(n.inputs) > 2 and n.inputs[2] is not None
                add = linear_bias_add(n.outputs[0]) if n.outputs and n.outputs[0] is not None else None
                op = "aten.addmm" if bias or add is not None else "aten.mm"
                rhs, router = _rhs_shape(n, acts[0]), _routes_to_topk(n.outputs[0])
                if add is not None:
                    outputs = tuple(o for o in add.outputs if o is not None)
                    absorbed.add(add.name)
        elif n.kind == "softmax" and not inside:
            op = "aten._softmax"
        elif not inside and any(o not in storage for o in outputs):
            op = ATEN_NAMES.get(n.kind, f"aten.{n.kind}")  # an op of its own storage (views and a fused
            # kernel's interior: none)
        if op is None:
            continue
        counts[op] = counts.get(op, 0) + 1
        bases = tuple(storage.get(o, o) if o in storage else o for o in outputs)
        out.append(Call(op, counts[op], n, tuple(b for b in bases if b is not None), rhs, router))
    return out


def _rhs_shape(n: Node, act: Tensor) -> tuple | None:
    """The weight operand's shape as the mm gets it, (in, out) (Gemm's transB transposes it); None where
    the activation is not the first operand or a dim is not a number."""
    if len(n.inputs) < 2 or n.inputs[0] is not act or n.inputs[1] is None or n.inputs[1].shape is None:
        return None
    shape = tuple(n.inputs[1].shape)
    if n.kind == "gemm" and n.attrs.get("transB"):
        shape = shape[::-1]
    return shape if len(shape) == 2 and all(isinstance(d, int) for d in shape) else None


def _routes_to_topk(t: Tensor | None) -> bool:
    """Whether ``t`` reaches a TopK's scores through ROUTE_OPS, in at most ROUTE_STEPS ops (a router)."""
    frontier = [t] if t is not None else []
    for _ in range(ROUTE_STEPS):
        nxt = []
        for x in frontier:
            for c in x.consumers:
                if c.kind == "top_k" and c.inputs and c.inputs[0] is x:
                    return True
                if c.kind in ROUTE_OPS:
                    nxt += [o for o in c.outputs if o is not None]
        frontier = nxt
    return False


def forced_mm_shapes(preset: str | None, planned) -> list[tuple]:
    """The mm shapes torchtitan's policy always recomputes (its MoE routers' weights), over every block's
    calls in ``planned`` ((block, [(call, saved), ...]) pairs); none for any other policy."""
    if preset != "torchtitan":
        return []
    return sorted({s for _, calls in planned for s in router_shapes([c for c, _ in calls])})


def topk_warning(planned) -> str | None:
    """Said when the policy caches a topk's outputs (an MoE router's choice): PyTorch refuses a cached
    output that the model then changes in place, as transformers' routers do to topk's values."""
    if not any(saved and call.op == "aten.topk" for _, calls in planned for call, saved in calls):
        return None
    return ("the policy caches aten.topk's outputs (an MoE router's choice): where the model then changes "
            "them in place (transformers' routers: router_top_value /= ...), torch.utils.checkpoint raises "
            "'Tensor cached during selective activation checkpoint has been mutated', and with "
            "allow_cache_entry_mutation=True the re-run normalizes them again: gradients change")


def order_warning(analysis) -> str | None:
    """Said when the file's node order is not the order its exporter traced (load.onnx), which a block's
    call numbers (mm#3, torchtitan's every second mm) follow."""
    if analysis.graph.meta.get("traced_order", True):
        return None
    return ("the file's nodes are not in the order its exporter traced them (reordered): selective "
            "checkpointing numbers each block's calls in fusecli's canonical order, which may not be "
            "PyTorch's (torchtitan's every-second-mm choice, --recompute ops' call numbers)")


def require_pytorch(analysis) -> None:
    """Selective checkpointing is torch.utils.checkpoint's: the analysis must follow PyTorch's autodiff."""
    name = analysis.profile.name if analysis.profile is not None else "ops"
    if name != "pytorch":
        habits = {"tensorflow": "TensorFlow's autodiff"}.get(name, "no framework's autodiff (the model's "
                                                                  "producer is not PyTorch)")
        raise UsageError(f"--sac: selective checkpointing is torch.utils.checkpoint's, and this analysis "
                         f"follows {habits}; for an ONNX export of a PyTorch model give --autodiff pytorch")


def block_calls(analysis) -> list[tuple[Candidate, list[Call]]]:
    """Every block's plain checkpoint (plan.candidates) and the aten calls its forward dispatches."""
    graph, joint, live, sizes = analysis.graph, analysis.joint, analysis.liveness, analysis.sizes
    kernels = joint.meta.get("attention_kernels", {})
    interiors = set(joint.meta.get("kernel_interiors", ()))
    device = analysis.profile.device if analysis.profile is not None else "cpu"
    weighted = set(made_of_weights(graph, selects=True))
    scopes = block_scopes(graph)
    return [(c, aten_ops(scopes.get(c.scope, []), kernels, weighted, live.storage, device, interiors))
            for c in block_candidates(graph, joint, live, sizes, rng_state_bytes(analysis))]


def under_policy(analysis, c: Candidate, calls: list[Call], answers: list[bool]) -> Candidate:
    """Block ``c``'s checkpoint with the outputs of the calls ``answers`` saves cached (module docstring),
    their FLOPs left out of the re-run's."""
    joint, live, sizes = analysis.joint, analysis.liveness, analysis.sizes
    cached = [call for call, yes in zip(calls, answers, strict=True) if yes]
    mine = {t.name for call in cached for t in call.outputs}
    mine |= {f"{call.node.name}.logsumexp" for call in cached if call.op in SDPA}
    freed = [t for t in c.freed if _base(live, t).name not in mine]
    held = {t.name for t in c.freed} | {t.name for t in c.kept}
    cache = [joint.tensors[name] for name in sorted(mine) if name in joint.tensors
             and name not in held and name in live.lifetimes and name not in live.saved_by_name]
    flops = c.flops
    for call in cached:
        f = node_flops(call.node, sizes)
        flops = None if flops is None or f is None else max(0, flops - f)
    recipe = f"selective checkpointing: {len(cached)} of {len(calls)} ops' outputs cached"
    return replace(c, freed=freed, cached=cache, flops=flops, recipe=recipe)


def sac_candidates(analysis, policy: Policy) -> list[tuple[Candidate, list[tuple[Call, bool]]]]:
    """Every block's checkpoint under ``policy``, with each block's calls and the policy's answer for
    each."""
    out = []
    for c, calls in block_calls(analysis):
        answers = policy(calls) if policy in WHOLE_BLOCK else [policy(call) for call in calls]
        out.append((under_policy(analysis, c, calls, answers), list(zip(calls, answers, strict=True))))
    return out


@dataclass
class SacStep:
    """The step under a policy: what it holds when forward returns (beyond the model's output and
    inputs), its saved activations, its peak (resident state included) and the FLOPs backward's re-runs
    add."""

    preset: str
    held_at_forward_end: int
    saved_activation_bytes: int
    peak_bytes: int
    recompute_flops: int | None
    blocks: list[Candidate]
    calls: dict[str, list[tuple[Call, bool]]]  # block name -> its calls, and whether each is saved


def evaluate(analysis, preset: str | None, save: list[str] | None = None, dims=None) -> SacStep:
    """The step with every block under the policy (``dims``: the sizes, the analysis' own by default)."""
    from ..core.dims import Poly
    from .planner import StepModel

    live = analysis.liveness
    values = {**{n: analysis.sizes[n] for n in analysis.sizes}, **(dims or {})}
    model = StepModel(analysis.joint, live, values, Poly())
    policy = policy_of(preset, save)
    planned = sac_candidates(analysis, policy) if policy is not None else []
    chosen = [c for c, _ in planned]
    output = sum(model.value.get(_base(live, t).name, 0) for t in analysis.joint.outputs
                 if t.meta.get("grad_of") is None)
    # the model's inputs are the caller's (resident, as the parameters), also where backward reads them
    inputs = {t.name for t in analysis.joint.tensors.values() if t.kind == "input"}
    held = int(model.held_after(chosen, live.boundary - 1, excluding=inputs)) - output if live.boundary else 0
    flops = sum(c.flops for c in chosen) if all(c.flops is not None for c in chosen) else None
    return SacStep(preset or "custom", held, model.saved(chosen).evaluate(values) or 0,
                   model.peak_bytes(chosen), flops, chosen, {c.name: calls for c, calls in planned})


def _base(live, t: Tensor) -> Tensor:
    base = live.storage.get(t, t) if t in live.storage else t
    return base if base is not None else t


def preset_points(analysis, *known: SacStep) -> list[tuple[str, int, int | None]]:
    """Every preset's step as (name, peak bytes, re-run FLOPs), the steps already ``known`` reused (a
    custom list's added last)."""
    done = {s.preset: s for s in known}
    steps = [done.get(name) or evaluate(analysis, name) for name in PRESETS]
    steps += [s for s in known if s.preset not in PRESETS]
    return [(s.preset, s.peak_bytes, s.recompute_flops) for s in steps]


def pareto_front(points: list[tuple[str, int, int | None]]) -> set[str]:
    """The policies no other beats on both the peak and the re-run FLOPs (unknown FLOPs: on none)."""
    known = [(n, p, f) for n, p, f in points if f is not None]
    return {n for n, p, f in known
            if not any(p2 <= p and f2 <= f and (p2, f2) != (p, f) for _, p2, f2 in known)}

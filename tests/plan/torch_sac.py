"""The judge of selective activation checkpointing (SAC): op-level checkpoint policies, as users write them
(``torch.utils.checkpoint.create_selective_checkpoint_contexts`` and ``CheckpointPolicy``), applied to the
repeated blocks of a small tests/hf_models.py model, one training step on CPU, and what PyTorch holds when
forward returns and where its live bytes peak.

    python tests/plan/torch_sac.py --model llama --presets none,full,attention,matmul,torchtitan,megatron \
        --seq 128 [--precision bf16] [--attn eager]

prints a JSON list, one ``measure`` result per preset.

Presets (``PRESETS``: name -> a factory returning a fresh policy_fn; ``apply`` calls it once per block
forward, inside the checkpoint's ``context_fn``, as torchtitan does, so that a stateful policy starts each
block afresh):

- ``none``: no checkpoint at all; ``plain``: ``checkpoint(fn, use_reentrant=False)`` without a
  ``context_fn`` (what ``full`` should equal);
- ``full``: every op PREFER_RECOMPUTE;
- ``attention``: MUST_SAVE the scaled-dot-product-attention kernels (``SDPA_KERNELS``: on CPU
  ``aten._scaled_dot_product_flash_attention_for_cpu``), the rest recomputed; under eager attention
  there is no such kernel and this is ``full``;
- ``matmul``: MUST_SAVE ``aten.mm``, ``aten.addmm``, ``aten.bmm`` and the sdpa kernels;
- ``torchtitan``: torchtitan's selective AC policy (``SelectiveAC``, its ``op`` mode), copied from
  https://github.com/pytorch/torchtitan/blob/c5d93d1098fe5f6f9b4fe6870b4e3d590ffa9cdf/torchtitan/distributed/activation_checkpoint.py
  (``_get_default_save_ops`` and ``SelectiveAC._wrap_block``'s ``_get_custom_policy``): every op of
  ``torch._functorch.partitioners.get_default_op_list().compute_intensive_ops`` (mm, addmm, bmm,
  convolution, the CUDA sdpa kernels and flash/efficient attention forwards, ...) and its own list (the
  cuDNN/math/overrideable sdpa, max, flex_attention, linear, topk, reduce_scatter_tensor,
  all_to_all_single, and the optional ops that exist), saved, except every second ``aten.mm`` /
  ``aten.linear`` of a block (counted per block forward, separately for forward and recompute), and every
  mm whose second operand has a router weight's shape recomputed and not counted (``router_shapes``: its
  ``per_op_sac_force_recompute_mm_shapes_by_fqns``, with transformers' router path). The list is
  kept as torchtitan has it: it does not name ``_scaled_dot_product_flash_attention_for_cpu``, the kernel
  sdpa runs on CPU, so on CPU torchtitan's policy recomputes attention;
- ``megatron``: Megatron-LM's ``--recompute-granularity selective`` (core attention recomputed), as an
  op-level policy: the sdpa kernels recomputed, and under eager attention the ops from the QK^T
  ``bmm``/``baddbmm`` through the next ``bmm`` (softmax(.)V): the scale, the mask's add, ``_softmax``, the
  dropout, V's expand/clone; every other op MUST_SAVE. Two differences from Megatron's module-level
  checkpoint of its CoreAttention: the copies ``matmul`` makes of q and k^T for the QK^T ``bmm`` happen
  before it and are saved (an op-level policy decides as each op runs, before it can know what the output
  feeds); and MUST_SAVE keeps every other op's output, also those autograd would not have saved (an
  add's output that only a view or another add reads), where Megatron's unchecked ops save what autograd
  saves;
- ``save:OP+OP``: ``save_ops(["OP", "OP"])``, e.g.
  ``save:aten.mm+aten._scaled_dot_product_flash_attention_for_cpu``.

torch 2.13 calls a policy in forward only (``SelectiveCheckpointContext.is_recompute`` is deprecated and
always False: the recompute reads the cached outputs by position), so torchtitan's recompute counter is
never used; what the recompute runs is counted by a dispatch mode under SAC's recompute mode (it sees the
ops SAC recomputes, not those it returns from its cache): ``recompute_counts``.

``measure`` profiles (``torch.profiler.profile(profile_memory=True)``, from before the model is built, so
live bytes are absolute) a warm-up step and the measured step, each ``model(*args)`` then
``out.float().sum().backward()``, no optimizer, the gradients set to None before each step; live bytes
are the raw allocation records replayed in time order (hf_models.peak_memory, torch_ranks._peak).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# the fused sdpa kernels, those of them the installed torch has (CPU's first)
SDPA_KERNELS = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
MATMULS = ("mm", "addmm", "bmm")
PLAIN = "plain"  # checkpoint without a context_fn
GRAD_TOLERANCE = {"fp32": 1e-5, "bf16": 1e-2, "amp-bf16": 1e-2}  # max abs diff / max abs grad
PRECISIONS = tuple(GRAD_TOLERANCE)


def _aten(names) -> list:
    """The ``.default`` overloads of the aten ops named, those the installed torch has."""
    import torch

    return [getattr(torch.ops.aten, n).default for n in names if hasattr(torch.ops.aten, n)]


def save_ops(names):
    """A policy that saves the ops named (``"aten.mm"``: every overload of the op, ``"aten.max.default"``:
    that overload) and recomputes the rest."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    overloads, packets = set(), set()
    for name in names:
        parts = name.split(".")
        assert len(parts) in (2, 3), f"an op is named ns.op[.overload]: {name}"
        op = getattr(getattr(torch.ops, parts[0]), parts[1])  # AttributeError: no such op
        if len(parts) == 3:
            overloads.add(getattr(op, parts[2]))
        else:
            packets.add(op)

    def policy(ctx, func, *args, **kwargs):
        if func in overloads or getattr(func, "overloadpacket", None) in packets:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _full():
    from torch.utils.checkpoint import CheckpointPolicy

    def policy(ctx, func, *args, **kwargs):
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _attention():
    return save_ops([f"aten.{k.__name__}" for k in _aten(SDPA_KERNELS)])


def _matmul():
    return save_ops([f"aten.{k.__name__}" for k in _aten(MATMULS + SDPA_KERNELS)])


@functools.cache
def _torchtitan_save_ops() -> frozenset:
    """torchtitan's ``_get_default_save_ops`` (the commit in the module docstring), as it is."""
    import torch
    from torch._functorch.partitioners import get_default_op_list
    from torch.utils.checkpoint import CheckpointPolicy

    # Ops whose outputs are expensive to recompute (matmuls, attention, etc.)
    compute_ops = [
        # SDPA variants
        torch.ops.aten._scaled_dot_product_cudnn_attention.default,
        torch.ops.aten._scaled_dot_product_attention_math.default,
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default,
        # For low precision training, always save the absolute maximum used
        # to compute the scaling factor for quantization.
        torch.ops.aten.max.default,
        # FlexAttention (torch.ops.higher_order.flex_attention is the same object)
        torch._higher_order_ops.flex_attention,
        torch.ops.aten.linear.default,
        # topk can be non-deterministic; save to keep MoE expert assignments
        # stable between forward and recompute.
        torch.ops.aten.topk.default,
        # Inductor compiled code (available when torch.compile is used)
        (torch._higher_order_ops, "inductor_compiled_code"),
        # torch_attn custom backend
        (torch.ops, "torch_attn._varlen_attn.default"),
    ]
    # Communication ops whose outputs should be saved to avoid re-communication.
    comm_ops = [
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
        torch.ops._c10d_functional.all_to_all_single.default,
        # DeepEP (available when deepep is installed)
        (torch.ops, "deepep.dispatch.default"),
        (torch.ops, "deepep.combine.default"),
        # HybridEP (available when hybridep is installed)
        (torch.ops, "hybridep.dispatch.default"),
        (torch.ops, "hybridep.combine.default"),
    ]

    def _resolve_ops(op_specs: list) -> dict:
        ops = {}
        for spec in op_specs:
            if isinstance(spec, tuple):
                obj, path = spec
                try:
                    for part in path.split("."):
                        obj = getattr(obj, part)
                    ops[obj] = CheckpointPolicy.MUST_SAVE
                except AttributeError:
                    pass
            else:
                ops[spec] = CheckpointPolicy.MUST_SAVE
        return ops

    aten_op_types = get_default_op_list()
    save_ops = {op.default for op in aten_op_types.compute_intensive_ops}
    save_ops.update(_resolve_ops(compute_ops))
    save_ops.update(_resolve_ops(comm_ops))
    return frozenset(save_ops)


# how the models whose export or policy needs it are judged (tests/plan/test_sac.py, bench_sac.py)
EXPORTER = {"mixtral": "torchscript"}  # the graph fusecli reads: its dynamo export fails on the experts'
# data-dependent sizes; every other model's dynamo export
ROUTED = {"mixtral"}  # analysed with --routing balanced
# policies that cache topk, which transformers' routers divide in place: apply allows the mutation, and
# the gradients then differ from the unplanned model's (measure's assert_grads)
MUTATES_CACHE = {("mixtral", "torchtitan"), ("mixtral", "megatron")}

# torchtitan's per_op_sac_force_recompute_mm_shapes_by_fqns: its default, and the module path of the
# router in transformers' MoE blocks (Mixtral, Qwen-MoE, OLMoE: ``mlp.gate``), as a user of those writes it
ROUTER_FQNS = ("moe.router.gate", "mlp.gate")


def router_shapes(block) -> set:
    """torchtitan's forced-recompute mm shapes of one block: each router's weight (out, in) as the mm's
    second operand (in, out). torchtitan matches an fqn by substring and wants an nn.Linear; here the path
    ends with the name (``mlp.gate`` would also be in ``mlp.gate_proj``) and any module with a 2-D weight
    serves (transformers' routers hold a weight and call F.linear)."""
    out = set()
    for fqn, m in block.named_modules():
        w = getattr(m, "weight", None)
        if any(fqn == f or fqn.endswith("." + f) for f in ROUTER_FQNS) and w is not None and w.dim() == 2:
            out_f, in_f = w.shape
            out.add((in_f, out_f))
    return out


def _torchtitan(mm_recompute_shapes: set = frozenset()):
    """torchtitan's ``_get_custom_policy()``: a fresh ``meta`` per block forward (its ``context_fn`` is
    ``lambda: create_selective_checkpoint_contexts(_get_custom_policy())``); ``mm_recompute_shapes``: the
    block's ``router_shapes``."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    save_ops = _torchtitan_save_ops()
    # Some backends (e.g. PrivateUse1) register aten.linear as a leaf op
    # instead of decomposing it into aten.mm, so we must handle both.
    mm_ops = (torch.ops.aten.mm.default, torch.ops.aten.linear.default)
    meta = {"forward_mm_count": 0, "recompute_mm_count": 0}

    def wrapped_policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
        # Always save CUDA→CPU results to avoid recomputing them
        # (e.g. MoE D2H sync for all-to-all metadata).
        if (
            func == torch.ops.aten._to_copy.default
            and "cuda" in str(args[0].device)
            and "device" in kwargs
            and str(kwargs["device"]) == "cpu"
        ):
            return CheckpointPolicy.MUST_SAVE

        mode = "recompute" if ctx.is_recompute else "forward"
        mm_count_key = f"{mode}_mm_count"

        if func in mm_ops:
            weight_shape = args[1].shape
            # linear weight is (out, in); normalize to (in, out) to match mm
            if func == torch.ops.aten.linear.default:
                weight_shape = torch.Size((weight_shape[1], weight_shape[0]))
            if weight_shape in mm_recompute_shapes:
                return CheckpointPolicy.PREFER_RECOMPUTE
            meta[mm_count_key] += 1

        # Save all compute/comm ops, except every second mm/linear.
        if func in save_ops:
            if func in mm_ops and meta[mm_count_key] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return wrapped_policy


def _megatron():
    """Core attention recomputed, everything else saved (the module docstring). The eager core: a
    ``bmm``/``baddbmm`` outside it opens it (QK^T), the next ``bmm`` (softmax(.)V) closes it, every op in
    between and both ends recomputed; a block is assumed to have no other bmm (true of these models)."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    kernels = set(_aten(SDPA_KERNELS))
    opens = set(_aten(("bmm", "baddbmm")))
    closes = torch.ops.aten.bmm.default
    state = {"in_core": False}

    def policy(ctx, func, *args, **kwargs):
        if func in kernels:
            return CheckpointPolicy.PREFER_RECOMPUTE
        if state["in_core"]:
            if func == closes:
                state["in_core"] = False
            return CheckpointPolicy.PREFER_RECOMPUTE
        if func in opens:
            state["in_core"] = True
            return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE

    return policy


PRESETS = {"none": None, "full": _full, "attention": _attention, "matmul": _matmul,
           "torchtitan": _torchtitan, "megatron": _megatron}
DEFAULT_PRESETS = ("none", PLAIN, "full", "attention", "matmul", "torchtitan", "megatron")


def factory_of(preset: str):
    """The policy factory of a preset name (PRESETS, ``save:OP+OP``); None for ``none`` and ``plain``."""
    if preset.startswith("save:"):
        names = preset.removeprefix("save:").split("+")
        save_ops(names)  # fails now on a name that is no op
        return lambda: save_ops(names)
    if preset == PLAIN:
        return None
    return PRESETS[preset]


class Record:
    """What the policies decided and the recomputes ran while ``on`` (the measured step), and the
    storages each checkpointed block was called with."""

    def __init__(self, skip=()):
        self.on = False
        self.skip = set(skip)  # storages of parameters and buffers: no activation
        self.policy_calls: Counter = Counter()
        self.saved: Counter = Counter()
        self.saved_storages: dict[int, int] = {}
        self.recompute_policy_calls = 0  # is_recompute True and recompute (torch 2.13: never called)
        self.recomputed: Counter = Counter()
        self.inputs: dict[int, int] = {}

    def policy(self, policy):
        from torch.utils._pytree import tree_leaves
        from torch.utils.checkpoint import CheckpointPolicy

        def recorded(ctx, func, *args, **kwargs):
            decision = policy(ctx, func, *args, **kwargs)
            if isinstance(decision, bool):  # torch's _policy_from_bool
                decision = CheckpointPolicy.MUST_SAVE if decision else CheckpointPolicy.PREFER_RECOMPUTE
            save = decision in (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)
            if self.on and ctx.is_recompute:
                self.recompute_policy_calls += int(not save)
            elif self.on:
                self.policy_calls[str(func)] += 1
                if save:
                    self.saved[str(func)] += 1
                    for t in tree_leaves(ctx.op_output):
                        self._saved(t)
            return decision

        return recorded

    def _saved(self, t) -> None:
        import torch

        if isinstance(t, torch.Tensor):
            s = t.untyped_storage()
            if s.data_ptr() not in self.skip and s.data_ptr() not in self.inputs and s.nbytes() > 0:
                self.saved_storages[s.data_ptr()] = s.nbytes()

    def counting(self):
        """A dispatch mode to enter under SAC's recompute mode: it sees the ops that mode runs again."""
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils.checkpoint import SAC_IGNORED_OPS

        record = self

        class Counting(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if record.on and func not in SAC_IGNORED_OPS:
                    record.recomputed[str(func)] += 1
                return func(*args, **(kwargs or {}))

        return Counting()

    def hold(self, module, args, kwargs) -> None:
        import torch

        stack = [*args, *kwargs.values()]
        while self.on and stack:
            t = stack.pop()
            if isinstance(t, (tuple, list)):
                stack.extend(t)
            elif isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > 0:
                self.inputs[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()


def apply(model, preset: str, record: Record | None = None):
    """Each block (the children of the model's one ModuleList) run under non-reentrant checkpoint with the
    preset's policy, as users write it: ``checkpoint(fn, *args, use_reentrant=False,
    context_fn=lambda: create_selective_checkpoint_contexts(factory()), **kwargs)`` (``plain``: no
    context_fn; ``none``: the model as it is). ``record``: the policy's decisions and the recompute's ops
    recorded (the policy wrapped, a counting mode under the recompute's)."""
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    from tests.parallel.torch_ranks import _blocks

    if preset == "none":
        return model
    factory = factory_of(preset)

    def context_fn(block):
        routers = router_shapes(block)
        policy = factory(routers) if routers and factory is _torchtitan else factory()
        # transformers' routers divide topk's values in place (router_top_value /= ...): a policy that
        # saves topk (torchtitan's, megatron's) has SAC refuse the mutated cache entry unless told to
        # allow it, as its error says; the gradients then differ (measure's assert_grads)
        contexts = functools.partial(create_selective_checkpoint_contexts,
                                     allow_cache_entry_mutation=bool(routers))
        if record is None:
            return contexts(policy)
        forward, recompute = contexts(record.policy(policy))

        @contextlib.contextmanager
        def counted():
            with record.counting(), recompute:  # the counting mode first: beneath SAC's recompute mode
                yield

        return forward, counted()

    for block in _blocks(model):
        forward = block.forward
        if factory is None:
            block.forward = lambda *a, _f=forward, **k: checkpoint(_f, *a, use_reentrant=False, **k)
        else:
            block.forward = lambda *a, _f=forward, _b=block, **k: checkpoint(
                _f, *a, use_reentrant=False, context_fn=functools.partial(context_fn, _b), **k)
        if record is not None:
            block.register_forward_pre_hook(record.hold, with_kwargs=True)
    return model


def _model(name, precision, attn, kv_heads, layers, batch, seq):
    from tests import hf_models

    model = hf_models.build(name, seed=0, attn=attn, layers=layers, kv_heads=kv_heads, cache=False)
    return hf_models.at_precision(model, hf_models.example_inputs(name, batch, seq, seed=0), precision)


def measure(name: str, preset: str, batch: int = 2, seq: int = 128, precision: str = "fp32",
            attn: str = "default", kv_heads: int | None = None, layers: int = 2,
            assert_grads: bool = True) -> dict:
    """One training step of ``name`` with ``preset`` applied to its blocks, and what PyTorch holds (the
    module docstring): ``resident_bytes`` (live bytes as the step begins: parameters, buffers, inputs),
    ``held_at_forward_end`` (live bytes when forward returns, less resident and the output's storage: what
    the step holds for backward), ``peak_bytes`` (absolute) and ``peak_above_resident`` over forward, loss
    and backward, ``peak_phase``, ``peak_op``; what the policy saw and saved (``policy_calls``,
    ``policy_ops``, ``saved_ops``, ``saved_op_bytes``: distinct storages of the saved outputs that are no
    parameter and no block input), ``block_input_bytes`` (distinct storages the checkpointed blocks are
    called with), ``recompute_counts`` (ops the recompute ran; None for ``plain``, which has no context to
    count in) and ``grads_match``: every gradient against the model without checkpointing, asserted unless
    ``assert_grads`` is False (torchtitan on an MoE block mutates its cached topk values: ``apply``)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile, record_function

    from tests import hf_models

    assert precision in PRECISIONS, precision
    factory_of(preset)  # an unknown preset fails before anything runs
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model, args = _model(name, precision, attn, kv_heads, layers, batch, seq)
        fixed = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                 for t in (*model.parameters(), *model.buffers())}
        record = Record(fixed)
        apply(model, preset, record)
        for step in ("warm-up", "step"):
            for p in model.parameters():
                p.grad = None
            gc.collect()
            record.on = step == "step"
            with record_function(f"## {step} ##"):
                with record_function("## forward ##"), hf_models.autocast_of(precision):
                    out = model(*args)
                with record_function("## forward done ##"):
                    pass
                output_bytes = out.untyped_storage().nbytes()
                loss = out.float().sum()
                with record_function("## backward ##"):
                    loss.backward()
            record.on = False
            del loss, out
    grads = {n: p.grad for n, p in model.named_parameters()}
    implementation = model.inner.config._attn_implementation
    del model
    gc.collect()
    result = {"model": name, "preset": preset, "attn": attn, "attn_implementation": implementation,
              "precision": precision, "batch": batch, "seq": seq, "layers": layers, "kv_heads": kv_heads,
              "parameter_bytes": sum(fixed.values()), "output_bytes": output_bytes,
              **_replay(prof, _EventType, output_bytes),
              "block_input_bytes": sum(record.inputs.values()),
              "saved_op_bytes": sum(record.saved_storages.values()),
              "policy_calls": sum(record.policy_calls.values()),
              "policy_ops": dict(sorted(record.policy_calls.items())),
              "saved_ops": dict(sorted(record.saved.items())),
              "recompute_counts": None if preset == PLAIN else sum(record.recomputed.values()),
              "recomputed_ops": dict(sorted(record.recomputed.items())),
              "recompute_policy_calls": record.recompute_policy_calls}
    result.update(_grads_against_plain(name, precision, attn, kv_heads, layers, batch, seq, grads))
    assert result["grads_match"] or not assert_grads, f"{name} {preset} {precision}: gradients off ({result})"
    return result


def _grads_against_plain(name, precision, attn, kv_heads, layers, batch, seq, grads) -> dict:
    """The gradients of the same model without checkpointing (same seed, inputs and precision), against
    ``grads``: max abs difference at most GRAD_TOLERANCE[precision] of the largest gradient."""
    import torch

    from tests import hf_models

    model, args = _model(name, precision, attn, kv_heads, layers, batch, seq)
    with hf_models.autocast_of(precision):
        out = model(*args)
    out.float().sum().backward()
    worst = scale = 0.0
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.grad is None:
                assert grads[n] is None, f"{n}: a gradient without checkpointing has none"
                continue
            assert grads[n] is not None, f"{n}: no gradient under checkpointing"
            worst = max(worst, (grads[n].float() - p.grad.float()).abs().max().item())
            scale = max(scale, p.grad.float().abs().max().item())
    return {"grads_match": worst <= GRAD_TOLERANCE[precision] * scale, "grad_max_abs_diff": worst,
            "grad_max_abs": scale}


def _replay(prof, event_type, output_bytes: int) -> dict:
    """Live bytes over the whole profiled run from the raw allocation records, in time order (hf_models.
    peak_memory's replay; a pointer handed out again without a recorded free was freed on a thread the
    profiler does not follow, as torch_ranks._peak counts it), read at the measured step's marks."""
    from tests.parallel.torch_ranks import _ops

    events, marks = [], {}
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        if e.typed[0] == event_type.Allocation:
            events.append(e)
        elif e.name.startswith("## "):
            marks.setdefault(e.name, []).append((e.start_time_ns, e.end_time_ns))
        stack.extend(e.children)
    events.sort(key=lambda e: e.start_time_ns)
    (step_start, step_end), = marks["## step ##"]

    def mark(name):
        found = [b for b in marks[name] if step_start <= b[0] <= step_end]
        assert len(found) == 1, (name, found)
        return found[0]

    forward, done, backward = mark("## forward ##"), mark("## forward done ##"), mark("## backward ##")
    live: dict[int, int] = {}
    total = 0
    at = {}  # mark -> live total just before it
    tops = {"forward": 0, "backward": 0}
    where = None
    for e in events:
        t = e.start_time_ns
        for key, start in (("step", step_start), ("done", done[0]), ("backward_end", backward[1])):
            if key not in at and t >= start:
                at[key] = total
        size, ptr = e.extra_fields.alloc_size, e.extra_fields.ptr
        if size > 0:
            total -= live.pop(ptr, 0)
            live[ptr] = size
        elif live.pop(ptr, None) is None:
            continue  # a block allocated before the profiler started
        total += size
        if forward[0] <= t <= backward[1]:
            phase = "backward" if t >= backward[0] else "forward"
            if total > max(tops.values()):
                where = e
            tops[phase] = max(tops[phase], total)
    for key in ("step", "done", "backward_end"):
        at.setdefault(key, total)
    resident = at["step"]
    peak = max(tops.values())
    return {"resident_bytes": resident,
            "held_at_forward_end": at["done"] - resident - output_bytes,
            "peak_bytes": peak, "peak_above_resident": peak - resident,
            "peak_phase": max(tops, key=tops.get),
            "forward_peak_above_resident": tops["forward"] - resident,
            "backward_peak_above_resident": tops["backward"] - resident,
            "after_backward_above_resident": at["backward_end"] - resident,
            "peak_op": _ops(where)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="a tests/hf_models.py name")
    ap.add_argument("--presets", default=",".join(DEFAULT_PRESETS),
                    help=f"comma-separated: {', '.join([*PRESETS, PLAIN])}, save:OP+OP")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--precision", default="fp32", choices=PRECISIONS)
    ap.add_argument("--attn", default="default", choices=("default", "eager"))
    ap.add_argument("--kv-heads", type=int, default=None, help="hf_models.build's kv_heads")
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    results = [measure(args.model, p, args.batch, args.seq, args.precision, args.attn, args.kv_heads,
                       args.layers) for p in args.presets.split(",")]
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

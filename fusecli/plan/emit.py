"""A plan as a framework applies it: module paths for ``torch.utils.checkpoint`` (a few printed lines,
or a helper module ``--emit-pytorch`` writes), layer names for Keras' ``tf.recompute_grad``.

Block names are the export's own scopes: a PyTorch export's are module paths relative to the module
that was exported (``model.layers.3``); a SavedModel's are its Keras layer names.
"""

from __future__ import annotations

from ..core.output import atomic_write
from ..core.terminal import source_comment

HELPER = '''"""Activation checkpointing plan written by fusecli plan for {model} ({budget}).

Wraps the planned submodules so that their forward runs under torch.utils.checkpoint (non-reentrant):
backward re-runs them instead of keeping what they save. Paths are relative to the module that was
exported; give ``prefix`` when that module sits inside the one you pass (prefix="model.").
"""

from torch.utils.checkpoint import checkpoint

MODULES = {modules}
# fusecli's prediction at the dims in PREDICTED_AT: saved activation bytes, and the training step's peak
PREDICTED_AT = {dims}
PREDICTED_SAVED_BYTES = {saved}
PREDICTED_PEAK_BYTES = {peak}


def apply(model, prefix=""):
    """Wrap each planned submodule of ``model`` (once); returns the wrapped modules."""
    wrapped = []
    for path in MODULES:
        module = model.get_submodule(prefix + path)
        if getattr(module, "_fusecli_checkpointed", False):
            wrapped.append(module)
            continue
        forward = module.forward

        def run(*args, _forward=forward, _path=path, **kwargs):
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        module.forward = run
        module._fusecli_checkpointed = True
        wrapped.append(module)
    return wrapped
'''


def pytorch_lines(paths: list[str], sac: bool = False) -> list[str]:
    """The few lines a torch.utils.checkpoint user applies the plan with (``sac``: under the policy's
    context_fn, which the helper --emit-pytorch writes holds)."""
    if not sac:
        return ["from torch.utils.checkpoint import checkpoint",
                f"for path in {paths!r}:",
                "    m = model.get_submodule(path)  # paths are relative to the exported module",
                "    m.forward = (lambda f: lambda *a, **k:",
                "                 checkpoint(f, *a, use_reentrant=False, **k))(m.forward)"]
    return ["from torch.utils.checkpoint import checkpoint",
            "from helper import context_fn  # the policy, which --emit-pytorch helper.py writes",
            f"for path in {paths!r}:",
            "    m = model.get_submodule(path)  # paths are relative to the exported module",
            "    m.forward = (lambda f, p: lambda *a, **k: checkpoint(",
            "        f, *a, use_reentrant=False, context_fn=lambda: context_fn(p), **k))(m.forward, path)"]


def keras_lines(names: list[str]) -> list[str]:
    """tf.recompute_grad around each planned Keras layer's call."""
    return [f"for name in {names!r}:",
            "    layer = model.get_layer(name)",
            "    layer.call = tf.recompute_grad(layer.call)"]


# under --sac: the checkpoint call takes the policy's contexts, made afresh per block forward (torchtitan's
# context_fn), and the policy, torch.utils.checkpoint's policy_fn, names ops by their overload packet
SAC_IMPORTS = """from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
"""
SAC_CHOSEN = '''
# selective checkpointing chosen for the budget (plan --recompute ops): per module, the calls whose outputs
# its checkpoint caches, as (aten op, its place among the block forward's calls of that op); the rest re-run
SAVE_CALLS = {calls}


def policy(path):
    """A fresh policy_fn for one forward of the block at ``path`` (its call counts start at zero)."""
    saved, counts = SAVE_CALLS[path], {{}}

    def policy_fn(ctx, func, *args, **kwargs):
        name = str(func.overloadpacket)
        counts[name] = counts.get(name, 0) + 1
        if (name, counts[name]) in saved:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy_fn


def context_fn(path):
    return create_selective_checkpoint_contexts(policy(path))
'''
SAC_POLICY = '''
# selective checkpointing ({policy}): the aten ops whose outputs each checkpoint caches; the rest re-run
SAVE_OPS = frozenset({{{save}}})
# torchtitan's: of each block forward's aten.mm / aten.linear calls, the 2nd, 4th, ... recomputed
EVERY_SECOND_MM_RECOMPUTED = {every_second}
# torchtitan's forced recompute: an mm whose second operand has an MoE router weight's shape (in, out) is
# recomputed and not counted (its per_op_sac_force_recompute_mm_shapes_by_fqns)
FORCE_RECOMPUTE_MM_SHAPES = {forced}


def policy():
    """A fresh policy_fn for one block forward (its mm count starts at zero)."""
    mm = [0]

    def policy_fn(ctx, func, *args, **kwargs):
        name = str(func.overloadpacket)
        if name in ("aten.mm", "aten.linear") and len(args) > 1:
            shape = tuple(args[1].shape)
            if (shape[::-1] if name == "aten.linear" else shape) in FORCE_RECOMPUTE_MM_SHAPES:
                return CheckpointPolicy.PREFER_RECOMPUTE
        if EVERY_SECOND_MM_RECOMPUTED and name in ("aten.mm", "aten.linear"):
            mm[0] += 1
            if mm[0] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if name in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE

    return policy_fn


def context_fn(path=None):
    return create_selective_checkpoint_contexts(policy())
'''


def _set_literal(items: set) -> str:
    return "{" + ", ".join(map(ascii, sorted(items))) + "}" if items else "set()"


def write_pytorch_helper(path: str, plan, model: str) -> str:
    """Write the helper module; a one-line note of what it wraps (under ``plan.sac``, the policy's
    ``policy_fn`` too: every preset but megatron and none)."""
    from ..core.units import format_bytes

    final = plan.planned_peak or plan.peak
    saved = plan.planned_saved or plan.saved
    # a model's strings (its file name, module paths, dim names) reach the source only as ascii() literals
    # or, in the docstring, as printable ASCII with quotes and backslashes escaped: never as code
    dims = {str(k): int(v) for k, v in plan.dims.items()}
    text = HELPER.format(model=source_comment(model), budget=f"budget {format_bytes(plan.options.budget)}",
                         modules=ascii([str(p) for p in plan.checkpoints]), dims=ascii(dims),
                         saved=int(saved.bytes), peak=int(final.bytes))
    sac = plan.sac
    if sac is not None:
        from .sac import emitted_policy

        text = text.replace("from torch.utils.checkpoint import checkpoint\n",
                            "from torch.utils.checkpoint import checkpoint\n" + SAC_IMPORTS)
        text = text.replace("use_reentrant=False, **kwargs)",
                            "use_reentrant=False,\n                              "
                            "context_fn=lambda: context_fn(_path), **kwargs)")
        if sac[0] == "chosen":
            calls: dict[str, set] = {str(p): set() for p in plan.checkpoints}
            for d in plan.decisions:
                if d.saved and d.block in calls:
                    calls[d.block].add((str(d.call.op), int(d.call.count)))
            listed = "".join(f"\n    {ascii(p)}: {_set_literal(c)}," for p, c in calls.items())
            text += SAC_CHOSEN.format(calls="{" + listed + "\n}")
        else:
            save, every_second = emitted_policy(*sac)
            listed = "".join(f"\n    {ascii(op)}," for op in sorted(save)) + "\n" * bool(save)
            forced = {tuple(int(d) for d in shape) for shape in plan.sac_forced_mm_shapes}
            text += SAC_POLICY.format(policy=source_comment(sac[0] or "custom"), save=listed,
                                      every_second=every_second, forced=_set_literal(forced))
    with atomic_write(path) as f:
        f.write(text.encode("ascii"))
    n = len(plan.checkpoints)
    return f"{n} module{'s' if n != 1 else ''} to checkpoint"

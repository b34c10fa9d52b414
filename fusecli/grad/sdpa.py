"""PyTorch's F.scaled_dot_product_attention as autograd runs it: which kernel, and what it saves.

An export of a model with `transformers`' default (sdpa) attention holds the math the kernel computes,
spelled out op by op; autograd saves what the kernel PyTorch picked saves (aten's ``sdp_utils_cpp``, the
CPU selection, checked against PyTorch in tests/grad/test_composites.py and
tests/fusion/test_attention_default.py):

- the fused CPU kernel (``_scaled_dot_product_flash_attention_for_cpu``) saves q, k, v, the output,
  one float32 logsumexp per query row, and the mask as a float tensor (a bool mask is converted per
  call);
- it falls back to the math kernel when the mask needs a gradient (BEiT's relative-position bias), the
  mask is 3-D, q, k or v is not 4-D, or v's head size differs from q's; the math kernel saves q and k^T
  each scaled by sqrt(s), the probabilities P and v.

On CUDA (``--device cuda``, from aten's ``sdp_utils.cpp``, not checked here: no GPU) flash takes
float16/bfloat16 without a mask; otherwise the memory-efficient kernel runs, masks and learned biases
included; both keep the row logsumexp and never P.

`transformers` habits, which decide what reaches the kernel: a mask that depends on no input value (the
causal mask the export spells out) is passed as ``is_causal=True`` and no mask, unless it is a sliding window
(``kv_idx > q_idx - W``: the export reads W) at least as long as the keys (masking_utils'
``_ignore_causal_mask_sdpa`` keeps the mask then); with no mask, grouped-query K and V go in unrepeated
(``enable_gqa``), so the repeat the export shows is not made.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..core.dims import dim_value
from ..core.ir import Graph, Node, Tensor, redirect, unique_name
from ..spellings.attention import AttentionForm, depends_on_input, read_attention, scalar_value

FLASH_OP = "ScaledDotProductFlashAttentionForCpuBackward0"
MATH_OP = "ScaledDotProductAttentionMathBackward"
BACKWARD_OPS = {"flash": FLASH_OP, "math": MATH_OP,
                "efficient": "ScaledDotProductEfficientAttentionBackward0"}


@dataclass
class KernelChoice:
    """The kernel PyTorch runs for one sdpa call, why, and what its backward reads."""

    kernel: str  # "flash" | "math"
    reason: str
    reads: list[Tensor]
    new: list[tuple[str, str, tuple | None]]  # tensors the kernel makes that the export has no name for
    # tensors the export feeds it that the eager call never receives, so never makes: a mask passed as
    # is_causal, K and V repeated for grouped-query heads that enter unrepeated (enable_gqa)
    dropped: list[Tensor] = field(default_factory=list)
    # (the export's float form of a bool mask, the bool): eager hands the kernel the bool, which converts
    # it inside each call (``new``), so the float form the export shares between calls is never made
    converted: list[tuple[Tensor, Tensor]] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "reason": self.reason}


def converted_bool(t: Tensor) -> bool:
    """A float mask that is a bool one converted, Where(m, 0, -inf): the exporters' spelling of the
    conversion sdpa makes inside every call (dynamo may write it once for all layers)."""
    p = t.producer
    return p is not None and p.kind == "where" and len(p.inputs) == 3 and p.inputs[0] is not None \
        and p.inputs[0].dtype == "bool" and all(scalar_value(x) is not None for x in p.inputs[1:])


_WINDOW_OPS = frozenset({"Add", "Sub", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"})


def sliding_window(mask: Tensor, limit: int = 4096) -> int | None:
    """W of a shape-only mask that is a sliding window (transformers' ``kv_idx > q_idx - W``: an integer
    constant > 1 that a Sub, Add or comparison of its cone reads; the smallest such), else None."""
    found = []
    for p in _mask_cone([mask], limit):
        if p.op_type not in _WINDOW_OPS:
            continue
        for i in p.inputs:
            v = i.meta.get("value") if i is not None and i.kind in ("parameter", "constant") else None
            if v is not None and np.size(v) == 1 \
                    and np.issubdtype(np.asarray(v).dtype, np.integer) and abs(int(np.reshape(v, -1)[0])) > 1:
                found.append(abs(int(np.reshape(v, -1)[0])))
    return min(found) if found else None


def _mask_cone(masks: list[Tensor], limit: int = 4096):
    """The nodes that compute ``masks`` (up to ``limit`` tensors), each once, not through shape reads."""
    stack, seen = list(masks), set()
    while stack and len(seen) < limit:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        p = x.producer
        if p is None or p.kind in ("shape", "size"):
            continue
        yield p
        stack.extend(i for i in p.inputs if i is not None)


def _kept_window(form: AttentionForm, windows: list[int], dims: Mapping[str, int]) -> tuple[int, str] | None:
    """(W, why) where transformers passes a shape-only sliding-window mask to sdpa (``windows``: the masks'
    W, ``sliding_window``): the keys are at least W long at the analysis sizes (or their length is
    unknown: assumed so, and said)."""
    w = min(windows)
    keys = form.k.shape[-2] if form.k.shape is not None and len(form.k.shape) >= 2 else None
    n = dim_value(keys, dims) if keys is not None else None
    if n is not None and n < w:
        return None  # the window covers every key: the causal mask, skipped
    at = f"{n} keys" if n is not None else "keys of unknown length, assumed at least that long"
    return w, f"its sliding window of {w} keys is kept as a mask ({at}; transformers skips it below {w})"


# transformers models whose create_causal_mask call passes allow_is_causal_skip=False (5.24): the causal
# mask reaches sdpa even where is_causal would do (Falcon adds ALiBi to it)
NEVER_SKIP = frozenset({"FalconModel", "DogeModel", "Dots3NoteTextModel", "MistralLarge4TextModel",
                        "DiffusionGemmaDecoderModel"})


def _kept_causal(masks: list[Tensor], limit: int = 4096) -> str | None:
    """Why a mask that depends on no input reaches PyTorch's sdpa as a mask in eager runs, or None where
    transformers passes is_causal instead. Exports cannot show it: torch.export never lets transformers
    skip the mask (masking_utils' _ignore_causal_mask_sdpa), and a TorchScript trace may build it where
    eager skips it (a traced cache position); only the model's class, which a dynamo export records per
    node (``torch_classes``), says so."""
    classes = {c for p in _mask_cone(masks, limit) for c in p.meta.get("torch_classes", ())}
    kept = sorted(classes & NEVER_SKIP)
    return f"{kept[0]} hands sdpa its causal mask (allow_is_causal_skip=False)" if kept else None


_FX_CAT = re.compile(r"cat(_\d+)?")  # torch.export's names of aten.cat nodes


def _dropped_cat(pv: Node, index: int, t: Tensor) -> bool:
    """Whether sdpa's argument ``index`` (0: q, 1: K, 2: V) is, in eager PyTorch, a torch.cat the ONNX graph
    lacks, so a fresh contiguous tensor: transformers' DynamicCache.update returns ``torch.cat([empty, k],
    dim=-2)``, and a partial rotary with nothing left to pass (Phi-3) ``torch.cat([q_rot, empty])``.
    TorchScript writes such a cat as a Concat (a copy fusecli sees); the dynamo exporter as an Identity
    its optimizer removes, so sdpa reads the tensor before the cat (GPT-2's K: a view of c_attn's output,
    whose storage q keeps already). The FX node a dynamo export records per node names the call's
    arguments (load/onnx.py's ``fx_args``): one made by aten.cat that the export reads under another
    name is such a copy."""
    args = pv.meta.get("fx_args", ())
    if len(args) <= index or args[index] == t.name or not _FX_CAT.fullmatch(args[index]):
        return False
    return t.producer is None or t.producer.kind != "concat"


_VIEWS_TO_CAT = ("reshape", "expand", "unsqueeze", "squeeze", "transpose", "flatten")
MAX_VIEWS_TO_CAT = 6  # repeat_kv's unsqueeze, expand and view, a transpose: a few views at most


def _cat_behind_views(t: Tensor) -> tuple[str, Tensor] | None:
    """The dropped cat (``_dropped_cat``) that sdpa's argument ``t`` views through a few views
    (GPT-BigCode's repeat of its one K/V head: unsqueeze, expand, view of the cache's ``torch.cat``): a view
    whose FX node reads an FX cat that the graph reads under another name, and the tensor it reads instead
    (the cat's shape: what eager's copy holds). None where there is none."""
    x = t
    for _ in range(MAX_VIEWS_TO_CAT):
        p = x.producer
        if p is None or p.kind not in _VIEWS_TO_CAT or not p.inputs or p.inputs[0] is None:
            return None
        src, call = p.inputs[0], p.meta.get("fx_call")
        if call is not None and call[1] and _FX_CAT.fullmatch(call[1][0]) and call[1][0] != src.name \
                and (src.producer is None or src.producer.kind != "concat"):
            return call[1][0], src
        x = src
    return None


def _needs_grad(t: Tensor, rg: set[str]) -> bool:
    return t.name in rg


def _broadcast_heads(form: AttentionForm) -> bool:
    """K or V enters sdpa with fewer heads than q, broadcast by the call (multi-query Falcon's one K/V head
    for every query head), not repeated: PyTorch's fused kernels need as many (or enable_gqa). Read from the
    two matmuls' operands, (b, h, s, d) as sdpa's math writes them: their head dims differ."""
    return any(_heads(m.inputs[0]) is not None and _heads(m.inputs[1]) is not None
               and _heads(m.inputs[0]) != _heads(m.inputs[1])
               for m in (form.roles["qk"], form.roles["pv"]) if m.kind == "matmul" and len(m.inputs) == 2)


def _heads(t: Tensor | None) -> int | None:
    """Axis 1 of a 4-D operand, where it is a number."""
    shape = t.shape if t is not None else None
    return shape[1] if shape is not None and len(shape) == 4 and isinstance(shape[1], int) else None


def _math_reason(form: AttentionForm, data_masks: list[Tensor], grad_terms: list[Tensor],
                 device: str) -> str | None:
    """Why PyTorch's selection rules leave only the math kernel, or None."""
    if grad_terms and device == "cpu":
        return f"the mask {grad_terms[0].name} needs a gradient (a learned bias)"
    if any(m.shape is not None and len(m.shape) not in (2, 4) for m in data_masks):
        return "the mask is not 2-D or 4-D"
    if any(t.shape is None or len(t.shape) != 4 for t in (form.q, form.k, form.v)):
        return "q, k or v is not 4-D"
    if form.v.shape[-1] != form.q.shape[-1] and device == "cpu":
        return "v's head size differs from q's"
    if _broadcast_heads(form):
        return "K and V have fewer heads than q, broadcast (no enable_gqa): no fused kernel takes them"
    if form.softcap is not None:
        return "soft-capped scores: sdpa has no soft-cap"
    return None


def choose(form: AttentionForm, rg: set[str], memo: dict[int, bool], device: str = "cpu",
           dims: Mapping[str, int] | None = None) -> KernelChoice:
    """The kernel for ``form`` (an sdpa spelling) on ``device``, as sdp_utils and transformers decide it.
    CUDA: flash for float16/bfloat16 without a mask, else the memory-efficient kernel (which takes a
    mask, learned or not); both keep the row logsumexp, not P."""
    pv = form.roles["pv"]
    out = pv.outputs[0]
    masks = [*form.terms, *form.bool_masks]
    data_masks = [m for m in masks if depends_on_input(m, memo) or m.name in rg]
    windows = [] if data_masks else [w for w in map(sliding_window, masks) if w is not None]
    window = _kept_window(form, windows, dims or {}) if windows else None
    if window is not None:
        data_masks = masks  # reaches the kernel as a data mask does
    kept = None if data_masks or windows or not masks else _kept_causal(masks)
    if kept is not None:
        data_masks = masks
    grad_terms = [m for m in form.terms if _needs_grad(m, rg)]
    why_math = _math_reason(form, data_masks, grad_terms, device)
    if why_math is not None:
        qk, sm = form.roles["qk"], form.roles["softmax"]
        reads = [qk.inputs[0], qk.inputs[1], sm.outputs[0], pv.inputs[1]]
        new = []
        if _broadcast_heads(form):  # its matmuls expand k^T and v to q's heads and fold them: copies it saves
            for index, role, other in ((1, "key", qk.inputs[0]), (3, "value", sm.outputs[0])):
                t, heads = reads[index], _heads(other)
                if heads is not None and _heads(t) is not None and _heads(t) != heads:
                    reads[index] = None
                    new.append((f"{pv.name}.{role}_expanded", t.dtype, (t.shape[0], heads, *t.shape[2:])))
        reads = [t for t in reads if t is not None]
        return KernelChoice("math", f"math kernel: {why_math}; it saves P", reads, new)
    grouped = form.k_kv is not None and form.v_kv is not None and not data_masks
    cast_copies: list[tuple[str, str, tuple | None]] = []
    k, v = (form.k_kv, form.v_kv) if grouped else (form.k, form.v)
    reads = [form.q, k, v, out]
    if grouped:  # a K or V the export casts after its repeat: the eager call casts it unrepeated, a new copy
        for index, (role, before, after) in enumerate((("key", k, form.k), ("value", v, form.v)), 1):
            if before.dtype != after.dtype:
                reads[index] = None
                cast_copies.append((f"{pv.name}.{role}_{after.dtype}", after.dtype, before.shape))
    new = [(f"{pv.name}.logsumexp", "float32",
            None if form.q.shape is None else tuple(form.q.shape[:-1])), *cast_copies]
    for role, index, t, given in (("key", 1, k, form.k), ("value", 2, v, form.v)):  # given: what it reads
        if reads[index] is None:
            continue
        if _dropped_cat(pv, index, t):  # the kernel saves the copy, not the tensor the export shows, named
            reads[index] = None  # by the FX cat it is: two calls on one cache update share it
            new.append((f"{pv.meta['fx_args'][index]}.{role}_cat", t.dtype, t.shape))
        elif (behind := _cat_behind_views(given)) is not None:  # a view of such a copy: the copy's storage
            reads[index] = None
            new.append((f"{behind[0]}.{role}_cat", behind[1].dtype, behind[1].shape))
    reads = [t for t in reads if t is not None]
    if device == "cpu":
        kernel, reason = "flash", "flash kernel for CPU: saves q, k, v, the output and the row logsumexp"
    elif form.q.dtype in ("float16", "bfloat16") and not data_masks:
        kernel, reason = "flash", "FlashAttention-2 (CUDA): saves q, k, v, the output and the row logsumexp"
    else:
        kernel = "efficient"
        reason = ("memory-efficient kernel (CUDA; flash takes float16/bfloat16 without a mask): saves q, k, "
                  "v, the output and the row logsumexp (PyTorch pads the rows to a multiple of 32; counted "
                  "per row)")
    notes = []
    if masks and not data_masks:
        notes.append("its mask depends on no input: transformers passes is_causal instead")
    if window is not None:
        notes.append(window[1])
    if kept is not None:
        notes.append(kept)
    if grouped:
        notes.append("K and V enter unrepeated (enable_gqa)")
    for m in data_masks:
        if m.is_float and not converted_bool(m) and m.dtype == form.q.dtype:
            reads.append(m)  # the model's own float mask: one storage, however many layers read it
        elif m.is_float and not converted_bool(m):  # cast to q's dtype (autocast) in each call
            new.append((f"{pv.name}.{m.name}.{form.q.dtype}", form.q.dtype, m.shape))
        else:  # a bool mask becomes a float one per call, which the kernel saves
            new.append((f"{pv.name}.{m.name}.float", form.q.dtype, m.shape))
    if data_masks:
        reason += " and the mask"
    dropped = [*(masks if masks and not data_masks else ()), *((form.k, form.v) if grouped else ())]
    converted = [(m, m.producer.inputs[0]) for m in data_masks if converted_bool(m)]
    return KernelChoice(kernel, "; ".join([reason, *notes]), reads, new, dropped, converted)


def sdpa_region(node: Node, rg: set[str], memo: dict[int, bool], device: str = "cpu",
                dims: Mapping[str, int] | None = None):
    """The sdpa call whose P @ V is ``node``: (form, kernel choice), or None when it is not one."""
    form = read_attention(node)
    if not isinstance(form, AttentionForm) or not form.sdpa:
        return None
    choice = choose(form, rg, memo, device, dims)
    # the output's memory layout (grad.layout), which decides whether transpose(1, 2).contiguous() copies:
    # the CPU flash kernel lays it out as q; CUDA's flash and memory-efficient kernels as (b, s, h, d);
    # the math kernel's P @ V is contiguous
    out = form.roles["pv"].outputs[0]
    if choice.kernel == "math":
        out.meta.pop("sdpa_layout", None)
    else:
        q_copied = _dropped_cat(form.roles["pv"], 0, form.q)  # a contiguous q, whatever the export shows
        out.meta["sdpa_layout"] = ("contiguous" if q_copied else form.q) if device == "cpu" else "bshd"
    return form, choice


def flash_backward_work_bytes(queries: int, keys: int, dtype: str) -> int:
    """Bytes per intra-op thread of the work buffers aten's CPU flash attention backward allocates
    (FlashAttentionKernel.cpp): the scores and their gradient for one query block by one key block in
    float32, and again in q's dtype when that is bf16/fp16; query blocks of 256, 64 or 32 rows (query
    length >= 768, >= 192, else), key blocks of 512."""
    q_split = min(queries, 256 if queries >= 768 else 64 if queries >= 192 else 32)
    reduced = 2 if dtype in ("bfloat16", "float16") else 0
    return 2 * q_split * min(keys, 512) * (4 + reduced)


def unshare_calls(graph: Graph) -> int:
    """Two sdpa calls on the same q, k and mask (DiffLlama's, one per half of V) whose op-by-op spellings
    the exporter's common-subexpression pass merged: P @ V1 and P @ V2 read one P. PyTorch runs one kernel
    per call and never makes P, so each later call gets its own copy of the shared nodes (the scores,
    their mask and softmax), as it was traced; returns how many calls were given one."""
    calls: dict[int, list[tuple[Node, AttentionForm]]] = {}
    for node in graph.nodes:
        if node.phase == "forward" and node.kind in ("matmul", "einsum"):
            form = read_attention(node)
            if isinstance(form, AttentionForm) and form.sdpa:
                calls.setdefault(id(form.roles["softmax"]), []).append((node, form))
    copied = 0
    for group in calls.values():
        first = {id(n) for n in group[0][1].nodes}
        for pv, form in group[1:]:
            shared = [n for n in form.nodes if id(n) in first and n is not pv]
            if shared:
                _copy_before(graph, shared, [n for n in form.nodes if id(n) not in first], pv)
                copied += 1
    return copied


def _copy_before(graph: Graph, shared: list[Node], own: list[Node], pv: Node) -> None:
    """Copies of ``shared`` (in order) placed before ``pv``; ``own`` (the call's nodes outside ``shared``)
    read the copies instead."""
    made: dict[int, Tensor] = {}
    copies = []
    for n in shared:
        outs = []
        for t in n.outputs:
            if t is None:
                outs.append(None)
                continue
            c = graph.tensor(unique_name(f"{t.name}.call", graph.tensors), dtype=t.dtype, shape=t.shape,
                             kind=t.kind)
            c.meta.update(t.meta)
            made[id(t)] = c
            outs.append(c)
        ins = [None if t is None else made.get(id(t), t) for t in n.inputs]
        copies.append(graph.add_node(Node(graph.unique_node_name(f"{n.name}.call"), n.op_type, n.kind, ins,
                                          outs, dict(n.attrs), n.domain, n.phase, dict(n.meta))))
    for n in shared:
        for t in n.outputs:
            if t is not None:
                redirect([r for r in own if any(u is t for u in r.inputs)], t, made[id(t)])
    added = {id(c) for c in copies}
    rest = [n for n in graph.nodes if id(n) not in added]
    at = next(i for i, n in enumerate(rest) if n is pv)
    graph.nodes = [*rest[:at], *copies, *rest[at:]]

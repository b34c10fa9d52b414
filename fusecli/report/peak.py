"""The peak in the JSON document and the report: where it is, what it is made of, how its bytes were
counted and what the framework allocates that it leaves out."""

from __future__ import annotations

from ..core.units import format_bytes
from ..grad.sdpa import flash_backward_work_bytes
from ..pipeline import Analysis


def peak_entry(a: Analysis) -> dict:
    """Where the peak is and what makes it: its step, the op run there, how storages were counted, and the
    storages alive then (parameters and constants apart), largest first."""
    live = a.liveness
    node = live.peak_node
    alive = []
    for t in live.live_at_peak:
        if t.kind in ("parameter", "constant"):
            continue
        n = t.nbytes(a.sizes)
        p = t.producer
        alive.append({"name": t.name, "kind": t.kind, "bytes": n, "phase": "input" if p is None else p.phase,
                      "op": t.kind if p is None else p.op_type})
    for t, step in live.transients:  # a backward formula's second buffer, alive at its step only
        if step == live.peak_step:
            alive.append({"name": t.name, "kind": "transient", "bytes": t.nbytes(a.sizes),
                          "phase": "backward", "op": t.producer.op_type if t.producer else "transient"})
    alive.sort(key=lambda e: (-(e["bytes"] or 0), e["name"]))
    return {"step": live.peak_step, "steps": len(live.schedule),
            "phase": None if node is None else node.phase, "node": None if node is None else node.name,
            "op": None if node is None else node.op_type, "resident_bytes": live.resident_bytes,
            "counted": peak_counting(a), "not_counted": peak_not_counted(a), "views": live.views,
            "never_allocated": live.never_allocated, "alive": alive}


def peak_counting(a: Analysis) -> str:
    """How the peak counts bytes: storages as the framework allocates them, or every tensor it names."""
    if a.liveness.views or a.liveness.never_allocated:
        return ("storages as eager PyTorch allocates them: a view shares its base's storage, a composite "
                "run as one kernel (sdpa under its chosen kernel, linear, GELU, LayerNorm, softmax) "
                "allocates no interior tensor, and an input the eager call drops (a causal mask passed as "
                "is_causal, K and V repeated for enable_gqa) is never made"
                + ("; the model's outputs are held until backward ends, as out = model(x); "
                   "loss_fn(out).backward() holds them" if a.profile and a.profile.outputs_held else ""))
    return "every tensor the graph names, from its producer to its last reader"


def peak_not_counted(a: Analysis) -> list[str]:
    """What the framework allocates in this model's step that the peak leaves out, said out loud."""
    out = []
    if a.liveness.views and any(n.kind == "conv" for n in a.graph.nodes):
        out.append("the scratchpad oneDNN takes in a convolution's backward on CPU (its size is the "
                   "library's choice: a tiny ConvNeXt's depthwise convolutions took 1.6 MiB beside 0.3 MiB "
                   "of everything else)")
    if cpu_low_precision_matmuls(a):
        out.append(LOW_PRECISION_MATMUL_WORK)
    per_thread = cpu_flash_work_bytes(a)
    if per_thread:
        out.append("the CPU flash attention kernel's work buffers in its backward, "
                   f"{format_bytes(per_thread)} per intra-op thread (torch.get_num_threads(), the cores by "
                   "default) at these sizes: "
                   "2 blocks of scores of query block x key block (32, 64 or 256 rows by query length, up "
                   "to 512 keys) in float32, and again in the lower dtype for bf16/fp16 (where it takes "
                   "up to 20% more)")
    return out


# measured with torch.profiler on torch 2.13's CPU mm, per call (one alive at a time), on two CPUs: bf16 takes
# one on both, fp16 only on the one with AVX512-FP16, fp32 none
LOW_PRECISION_MATMUL_WORK = (
    "the work buffer oneDNN takes inside each bfloat16 mm on CPU, and each float16 one on CPUs with "
    "AVX512-FP16 (its size is the library's choice, by CPU, operand layout and intra-op threads: 37-201 KiB "
    "for a bf16 (256 x 256) @ (256 x 64), 385-449 KiB in fp16, 1.7-24 MiB for a bf16 4096^3, as measured "
    "on two CPUs; GPT-2 at hidden 64 peaks 4-8% above fusecli's figure in one)")


def cpu_low_precision_matmuls(a: Analysis) -> int:
    """How many matmuls of the step compute in bfloat16 or float16 on CPU (each may take oneDNN's work
    buffer: LOW_PRECISION_MATMUL_WORK)."""
    if a.profile is None or a.profile.device != "cpu":
        return 0
    return sum(1 for n in a.joint.nodes if n.kind in ("matmul", "gemm") and n.outputs
               and n.outputs[0] is not None and n.outputs[0].dtype in ("bfloat16", "float16"))


def cpu_flash_work_bytes(a: Analysis) -> int:
    """Bytes per thread of the largest work buffer the CPU flash attention backward allocates in this
    step (grad.sdpa.flash_backward_work_bytes), 0 where no sdpa runs that kernel or its sizes are unknown."""
    if a.profile is None or a.profile.device != "cpu":
        return 0
    most = 0
    for node in a.joint.nodes:  # the sdpa calls' P @ V, marked by grad.sdpa with the output's layout
        out = node.outputs[0] if node.outputs else None
        if out is None or "sdpa_layout" not in out.meta or not node.inputs or node.inputs[0] is None:
            continue
        shape = a.sizes.shape(node.inputs[0])  # P: (..., queries, keys)
        if not shape or len(shape) < 2:
            continue
        most = max(most, flash_backward_work_bytes(shape[-2], shape[-1], out.dtype))
    return most

"""The rewrite command's flow: analyze, plan and emit pass by pass, prune, verify, (bench,) write."""

from __future__ import annotations

import functools
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import onnx
from onnx import helper

from ..core.errors import FuseError
from ..core.ir import Graph, gc_paused
from ..core.output import check_model_file, refuse_overwriting_input, scratch_dir, type_refusal
from ..core.progress import stage
from ..core.units import format_bytes
from ..load.onnx import dtype_name, graph_of_model, opset_of
from ..pipeline import Analysis, Options, analyze, analyze_graph
from .graph.edit import (
    apply,
    cast_likes_to_casts,
    import_used_domains,
    protos_by_ir_name,
    prune,
    sort_input,
    sort_nodes,
    sound_emissions,
    undefined_read,
)
from .graph.fold_scales import fold_conv_scales
from .graph.kit import Context
from .graph.proto import light_copy
from .graph.save import needs_external_data, payload_bytes, write_model
from .graph.shape_reads import reroute_shape_reads
from .graph.shapes import refine_shapes
from .graph.splice import write_spliced
from .graph.values import Names, Weights
from .kernels.cuda import CPU_STAND_INS, cpu_stand_ins
from .plan import is_safe, plan
from .source import load_weights, open_source, restore_weights
from .verify.benchverdict import slowdown
from .verify.regions import Case, Cutter

if TYPE_CHECKING:
    from .verify.outputs import Timing, Verification

TARGETS = ("cpu", "cuda")
MODES = ("inference", "training")
SCOPES = ("auto", "regions", "model")
MAX_ATTEMPTS = 3  # rewrites made again, each without the regions whose check failed in the one before
# --verify auto runs the whole model too below these (onnxruntime's session set-up grows with both)
AUTO_MODEL_NODES = 5_000
AUTO_MODEL_WEIGHT_BYTES = 256 << 20
_ELEM_TYPE = {dtype_name(v): v for v in onnx.TensorProto.DataType.values() if v}


@dataclass
class RewriteOptions:
    target: str = "cpu"
    mode: str = "inference"
    patterns: tuple[str, ...] = ()
    batch: int | None = None  # --batch: the model's batch dim (None: 1, with the analysis's warning)
    dims: dict[str, int] = field(default_factory=dict)
    verify: bool = True
    verify_scope: str = "auto"  # "regions", "model", or "auto": regions, and the model when it is small
    bench: bool = False
    threads: int | None = None
    bench_runs: int = 50
    max_passes: int = 4
    signature: str | None = None  # SavedModels: the signature tf2onnx converts (default: its first)
    keep_weights: bool = True  # False: the result's model leaves its payloads in the input file
    force: bool = False  # write even when --bench measures the rewritten model slower
    routing: str | None = None  # --routing balanced: MoE token counts under that assumption (load.routing)


@dataclass
class Applied:
    pattern: str
    kernel: str
    nodes: list[str]
    note: str = ""  # what the kernel computes otherwise than the nodes it replaced, said as a warning


@dataclass
class RewriteResult:
    path: str
    output: str | None
    options: RewriteOptions
    model: onnx.ModelProto
    applied: list[Applied]
    nodes_before: int
    nodes_after: int
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    folded_constants: int
    passes: int
    verification: Verification | None = None
    timings: list[Timing] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    data_file: str | None = None
    unchanged: bool = False  # nothing rewritten or pruned (then not verified: the graphs are the same)
    dims: dict[str, int] = field(default_factory=dict)  # the input dims' values it was analyzed and run at
    refused: str | None = None  # why nothing was written (a measured slowdown without force)
    left_out: int = 0  # regions matched and emitted but left unfused (their cut-out failed)

    def kernel_counts(self) -> dict[str, int]:
        return dict(Counter(a.kernel for a in self.applied))


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Node counts by op type ('com.microsoft.FusedConv' for contrib ops)."""
    return dict(Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
                        for n in model.graph.node))


def _value_infos(graph: Graph, known: dict[str, onnx.ValueInfoProto]) -> None:
    """Remember the type and shape of every activation the IR knows (contrib ops' outputs keep theirs)."""
    for t in graph.tensors.values():
        if t.kind == "activation" and t.shape is not None and t.dtype in _ELEM_TYPE:
            dims = [None if isinstance(d, int) and not 0 <= d < 2**63 else d  # a bad file's dims: unknown
                    for d in t.shape]
            known[t.name] = helper.make_tensor_value_info(t.name, _ELEM_TYPE[t.dtype], dims)


def analyze_model(model: onnx.ModelProto, options: Options, known: dict[str, onnx.ValueInfoProto],
                  label: str) -> Analysis:
    """Every analysis pass on an in-memory model (weights stubbed; shapes seeded from earlier passes)."""
    light = light_copy(model)
    have = {v.name for v in (*light.graph.value_info, *light.graph.output, *light.graph.input)}
    made = {o for n in light.graph.node for o in n.output}
    light.graph.value_info.extend(v for name, v in known.items() if name in made and name not in have)
    graph = graph_of_model(light, os.path.basename(label))
    graph.lint()
    return analyze_graph(label, graph, options)


def rewrite_passes(model: onnx.ModelProto, first: Analysis, options: RewriteOptions,
                   label: str, skipped: list[str] | None = None,
                   regions: list[list[Case | str]] | None = None,
                   left_out: list[str] | None = None,
                   excluded: set[str] = frozenset()) -> tuple[list[Applied], int, int]:
    """Plan and emit until a pass finds nothing more (BatchNorm folded in pass 1 makes Conv+Add+ReLU in 2);
    with ``regions``, each pass's emissions are cut out there for verification before they are applied."""
    analysis, known = first, {}
    applied: list[Applied] = []
    folded: set[str] = set()
    passes = rerouted = 0
    outputs = {o.name for o in model.graph.output}
    for _ in range(options.max_passes):
        if not analysis.matches:
            break  # nothing to emit: no pass (nor its shape refinement) needed
        refine_shapes(model, analysis.graph)
        _value_infos(analysis.graph, known)
        protos = protos_by_ir_name(model, analysis.graph)
        tensors = analysis.graph.tensors

        def dtype_of(name: str, tensors=tensors) -> str | None:  # this pass's tensors (before apply)
            return tensors[name].dtype if name in tensors else None

        weights = Weights(model, os.path.dirname(os.path.abspath(label)), dtype_of)
        ctx = Context(options.target, options.mode, opset_of(model), weights, Names(model), protos, outputs)
        ctx.excluded = set(excluded)
        ctx.sizes = analysis.sizes
        emissions = plan(analysis.matches, ctx)
        made = {o for e in emissions for name in e.remove for o in protos[name].output if o}
        cast_likes_to_casts(model, lambda name: _ELEM_TYPE.get(dtype_of(name)), made)
        rerouted += reroute_shape_reads(model, analysis.graph, emissions, protos)  # Shape(interior tensor)
        emissions, broken = sound_emissions(model, emissions, protos)
        if skipped is not None:
            said = {s.partition(":")[0] for s in skipped}  # a later pass meets the same regions again
            skipped += [s for s in ctx.skipped if s not in skipped]
            skipped += [f"{e.pattern} at {e.at}: {why}" for e, why in broken
                        if f"{e.pattern} at {e.at}" not in said]
        folded |= weights.folded
        if not emissions:
            break
        passes += 1
        stage(f"rewriting (pass {passes})")
        if regions is not None:
            cutter = Cutter(weights, analysis.graph, analysis.sizes, outputs)
            cases = [cutter.cut(f"{e.pattern} -> {e.kernel}", [protos[n] for n in e.remove], e.nodes,
                                e.initializers, e.remove) for e in emissions]
            for e, c in zip(emissions, cases, strict=True):
                if isinstance(c, Case):
                    c.at = f"{e.pattern} at {e.at}"
            emissions, cases = _drop_miswired(emissions, cases, skipped, left_out)
            if not emissions:
                passes -= 1  # every emission left out: no pass made
                break
            regions.append(cases)
        apply(model, emissions, protos)
        prune(model)  # what only the replaced nodes read goes before the next analysis
        applied += [Applied(e.pattern, e.kernel, list(e.remove), e.note) for e in emissions]
        try:
            analysis = analyze_model(model, first.options, known, label)
        except FuseError as e:  # the input was read whole before: what breaks now is the rewrite's
            raise FuseError(f"rewrite pass {passes} left a graph fusecli cannot read ({e}): a fusecli bug; "
                            "nothing written") from None
    if rerouted:  # a permuting Gather was appended after its readers where no emission went in
        sort_nodes(model)
    return applied, passes, len(folded)


def _drop_miswired(emissions: list, cases: list[Case | str], skipped: list[str] | None,
                   left_out: list[str] | None) -> tuple[list, list[Case | str]]:
    """Leave out the emissions whose cut-out says the rest of the graph would read a tensor nothing makes
    any more (said in ``skipped``, counted in ``left_out``); the others stay, with their cases."""
    kept: list = []
    kept_cases: list[Case | str] = []
    for e, c in zip(emissions, cases, strict=True):
        if isinstance(c, str) and c.startswith("wiring:"):
            line = f"{e.pattern} at {e.at}: {c.removeprefix('wiring: ')}"
            for sink in (skipped, left_out):
                if sink is not None and line not in sink:
                    sink.append(line)
            continue
        kept.append(e)
        kept_cases.append(c)
    return kept, kept_cases


def rewrite(path: str, options: RewriteOptions | None = None, output: str | None = None) -> RewriteResult:
    """Rewrite the model at ``path``; verify it (unless told not to), bench it if asked, write ``output``.

    A region whose check fails is left unfused and the rewrite made again without it (said, and counted
    in ``left_out``). Raises FuseError (nothing written) on bad input, or when a mismatch cannot be laid
    at a region's door (the whole model differs while every region agrees).
    """
    options = options or RewriteOptions()
    if options.target not in TARGETS or options.mode not in MODES or options.verify_scope not in SCOPES:
        raise FuseError(f"unknown target/mode/verification {options.target}/{options.mode}/"
                        f"{options.verify_scope}")
    if output is not None:
        refuse_overwriting_input(output, [path])
    with scratch_dir("rewrite") as work:
        source = open_source(path, work, options.signature)
        invalid = type_refusal(source.onnx_path)  # before any fold reads a weight of a type no op takes
        if invalid is not None:
            raise FuseError(f"{path}: not a valid model: onnxruntime refuses it ({invalid}); nothing written")
        pipeline_options = Options(batch=options.batch, dims=dict(options.dims), patterns=options.patterns,
                                   routing=options.routing)
        analysis = analyze(source.onnx_path, pipeline_options)
        failed: dict[str, str] = {}  # "pattern at root" -> why its region failed verification
        first_failure = None
        for _ in range(MAX_ATTEMPTS):
            result, model, rewritten, spliced, first = _attempt(path, output, source, work, analysis,
                                                                pipeline_options, options, failed)
            v = result.verification
            if v is None or v.ok:
                break
            first_failure = first_failure or v
            new = {k: why for k, why in v.failed_at.items() if k not in failed}
            if not new:
                break
            failed.update(new)  # left unfused; the rewrite is made again from the input without them
        if result.verification is not None and not result.verification.ok:
            _failed(result.verification)
        if failed and not [a for a in result.applied if a.pattern != "conv_mul"]:
            _failed(first_failure)  # every region failed its check: nothing verified is left to write
        base_dir = os.path.dirname(os.path.abspath(source.onnx_path))
        checked = functools.partial(check_model_file, original=source.onnx_path,
                                    session_source=_stand_in(model))
        if result.refused is None and options.bench:
            from .verify.outputs import bench  # onnxruntime, imported only when it runs

            stage(f"benchmarking ({options.bench_runs} runs of 4 sessions)")
            result.timings = bench([("original", source.onnx_path, "disabled"),
                                    ("rewritten", rewritten(), "disabled"),
                                    ("original, ORT default opts", source.onnx_path, "default"),
                                    ("rewritten, ORT default opts", rewritten(), "default")],
                                   first.sizes.batch or 1, dict(first.sizes), options.threads,
                                   runs=options.bench_runs)
            slower = slowdown(result.timings)
            if slower is not None and not options.force:
                result.refused = (f"the rewritten model is measurably slower ({slower.rewritten}: "
                                  f"{slower.ratio:.2f}x the original's speed, outside the spread); "
                                  "nothing written (--force writes it anyway)")
        if output is not None and result.refused is None and spliced:
            stage("writing")
            write_spliced(model, output, base_dir, source.protected, check=checked)
        elif output is not None and result.refused is None:
            stage("writing")
            result.data_file = write_model(model, output, source.protected, check=checked)
        if spliced and options.keep_weights:
            restore_weights(model, source.onnx_path)
    return result


def _stand_in(model: onnx.ModelProto) -> Callable[[str], bytes] | None:
    """What the written file's load check opens where it holds a kernel the CPU provider lacks: the file
    with CPU stand-ins (kernels.cuda.cpu_stand_ins); None where it holds none."""
    if not any(n.op_type in CPU_STAND_INS for n in model.graph.node):
        return None
    return lambda path: cpu_stand_ins(onnx.load(path)).SerializeToString()


def _failed(v: Verification) -> None:
    level, c = v.failures()[0]
    what = f"region {c.name}" if c in v.region_checks.get(level, []) else f"output {c.name!r}"
    opts = "ORT_DISABLE_ALL" if level == "disabled" else "default"
    why = "" if c.rounding is None else (
        f"; against the original computed in float64 the original is off by {c.rounding[0]:.3g} and the "
        f"rewritten model by {c.rounding[1]:.3g}: more than float32 rounding explains")
    raise FuseError(f"verification failed: {what} differs from the original (relative L2 error "
                    f"{c.error:.3g} > {c.tolerance:g}, onnxruntime {opts} optimizations{why}); "
                    "nothing written")


def _attempt(path: str, output: str | None, source, work: str, first: Analysis, pipeline_options: Options,
             options: RewriteOptions, failed: dict[str, str]) -> tuple:
    """One rewrite of the input, the matches in ``failed`` left unfused, verified where asked:
    (result, model, rewritten-model source, spliced, the analysis the passes started from)."""
    model, data_files = load_weights(source.onnx_path)
    imported = import_used_domains(model)
    sort_input(model)  # every edit below takes the node order for the data flow
    if not source.converted:
        source.protected += [f for f in data_files if f not in source.protected]
    nodes_before, ops_before = len(model.graph.node), op_counts(model)
    initializers_before = len(model.graph.initializer)
    base_dir = os.path.dirname(os.path.abspath(source.onnx_path))
    scales = fold_conv_scales(model, base_dir) if options.mode == "inference" else []
    said = [*first.warnings, *imported]  # about the user's model (the folded one's re-analysis sizes less)
    if scales:  # the graph changed under the analysis: analyze the folded model again
        first = analyze_model(model, pipeline_options, {}, source.onnx_path)
    with gc_paused():  # passes build and drop whole analyses: no collector walks meanwhile
        skipped: list[str] = []
        regions: list[list[Case | str]] | None = \
            [] if options.verify and options.verify_scope != "model" else None
        left_out: list[str] = [f"{at}: {why}" for at, why in failed.items()]
        skipped += left_out
        applied, passes, folded = rewrite_passes(model, first, options, source.onnx_path, skipped,
                                                 regions, left_out, set(failed))
        prune(model)
    problem = undefined_read(model) if applied or scales else None
    if problem:  # a bug of fusecli's, not the user's: said as what is wrong with the result
        raise FuseError(f"the rewritten graph is broken ({problem}); nothing written")
    applied = [Applied("conv_mul", "Conv(scale folded)", list(pair)) for pair in scales] + applied
    spliced = not needs_external_data(model)  # payloads copied file to file when written
    if not spliced:
        restore_weights(model, source.onnx_path)  # past 2 GB: written with its own data file
    result = RewriteResult(path, output, options, model, applied, nodes_before, len(model.graph.node),
                           ops_before, op_counts(model), folded, passes,
                           warnings=[*said, *dict.fromkeys(a.note for a in applied if a.note),
                                     *(f"not rewritten: {s}" for s in skipped)],
                           dims={n: first.sizes[n] for n in first.sizes.variables}, left_out=len(left_out))
    # nothing rewritten and nothing pruned: the output is the input's graph, there is nothing to compare
    # (onnxruntime's sessions would be most of the time on a big graph)
    result.unchanged = not applied and result.nodes_after == nodes_before \
        and len(model.graph.initializer) == initializers_before
    safe = sum(is_safe(m, options.mode) for m in first.matches)
    if source.converted and not applied and safe:  # a SavedModel converted for nothing
        result.refused = (f"none of the {safe} {options.mode}-safe matches has a kernel on target "
                          f"{options.target} in tf2onnx's conversion; nothing written")
    # written once, when a whole-model session needs it
    # the CPU provider's sessions run a CUDA-only kernel's stand-in (kernels.cuda.cpu_stand_ins); the file
    # keeps it
    rewritten = functools.cache(lambda: _session_source(cpu_stand_ins(model), work,
                                                        base_dir if spliced else None))
    stand_ins = sorted({n.op_type for n in model.graph.node if n.op_type in CPU_STAND_INS})
    if stand_ins and options.verify and not result.unchanged:
        result.warnings += [f"{op} has no CPU kernel in onnxruntime: verified through its CPU stand-in "
                            f"({CPU_STAND_INS[op]}, the same function); the CUDA kernel itself was not run"
                            for op in stand_ins]
    if result.refused is None and options.verify and not result.unchanged:
        result.verification = _verify(source.onnx_path, rewritten, model, first, options, regions or [],
                                      bool(scales))
        result.warnings += result.verification.warnings
    return result, model, rewritten, spliced, first


def _verify(original: str, rewritten: Callable[[], bytes | str], model: onnx.ModelProto, first: Analysis,
            options: RewriteOptions, regions: list[list[Case | str]], scales: bool) -> Verification:
    """Regions against the nodes they replaced, and the whole model where asked, where it is small, or
    where a region could not be cut out on its own."""
    from .verify.outputs import RunFailed, Verification, verify, verify_regions

    result, scope = Verification(), options.verify_scope
    whole = scope == "model"
    if scope != "model":
        uncut = [c for cases in regions for c in cases if isinstance(c, str)]
        if scope == "regions" and (uncut or scales):
            why = uncut[0] if uncut else "Conv scales were folded before the passes"
            raise FuseError(f"cannot verify region by region: {why} (--verify model runs the whole model)")
        stage("verifying fused regions with onnxruntime")
        cases = [[c for c in cs if not isinstance(c, str)] for cs in regions]
        try:
            verify_regions(cases, model.opset_import, model.ir_version, result, seed=0)
        except FuseError as e:
            if scope == "regions":
                raise
            uncut.append(str(e))
        result.uncut = uncut
        if result.failed_at:  # left unfused and made again without them: that model is the one to run
            return result
        if scope == "regions":
            result.model_skipped = "--verify regions"
        else:  # auto
            weights, nodes = payload_bytes(model), len(model.graph.node)
            small = nodes <= AUTO_MODEL_NODES and weights <= AUTO_MODEL_WEIGHT_BYTES
            whole = small or bool(uncut) or scales
            if not whole:
                result.model_skipped = (f"{nodes:,} nodes, {format_bytes(weights)} of weights: "
                                        "--verify model runs it")
    if whole:
        stage("verifying the whole model with onnxruntime")
        try:
            model_check = verify(original, rewritten(), first.sizes.batch or 1, dict(first.sizes),
                                 given=options.dims)
        except RunFailed as e:
            # auto ran the model only because it is small: where the user's own model cannot run on random
            # inputs (a MoE export that runs only when every expert is hit), the regions' checks stand
            if scope != "auto" or e.what != "original" or result.uncut or scales:
                raise
            result.model_skipped = f"the original model does not run on random inputs: {e.first}"
            result.warnings.append(f"onnxruntime cannot run the original model on random inputs ({e.first}): "
                                   "only the fused regions were verified, each against the nodes it replaced")
            return result
        result.checks = model_check.checks
        if not result.ok and scope == "auto":  # every region agrees: rounding the model amplifies?
            from .verify.outputs import explain_by_rounding

            stage("weighing the whole model's difference against float64")
            explain_by_rounding(original, rewritten(), result, first.sizes.batch or 1, dict(first.sizes))
    return result


def _session_source(model: onnx.ModelProto, work: str, base_dir: str | None = None) -> bytes | str:
    """A file in ``work`` for onnxruntime: payloads spliced from ``base_dir``'s files when given, else
    the model (with its data file past 2 GB)."""
    path = os.path.join(work, "rewritten.onnx")
    if base_dir is not None:
        write_spliced(model, path, base_dir)
        return path
    if not needs_external_data(model):
        return model.SerializeToString()
    write_model(model, path)
    return path

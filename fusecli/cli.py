"""click commands: parse options, call the library, print. No analysis logic lives here."""

from __future__ import annotations

import atexit
import functools
import gc
import os
import signal
import sys

import click

from . import __version__
from .core.errors import FuseError, UsageError, one_line
from .core.terminal import dims_line, printable

# At exit, freeze what is left: interpreter shutdown then skips a collection that would walk every
# object of a big graph (seconds on 100k nodes) only to free memory the process gives back anyway.
atexit.register(gc.freeze)


def _echo(text: str, err: bool = False) -> None:
    """Text for a person: a model's strings in it show their control characters as escapes."""
    click.echo(printable(text), err=err)


def _error(message: str) -> None:
    """The ``error:`` line on stderr: one line, whatever newlines the message holds."""
    _echo(f"error: {one_line(message)}", err=True)


def _warn(message: str, label: str = "") -> None:
    """A ``warning:`` line on stderr, one line as an error is."""
    _echo(f"warning: {label}{one_line(message)}", err=True)


def _fail(message: str) -> None:
    _error(message)
    sys.exit(1)


class Terminated(BaseException):
    """SIGTERM, raised where the program is so that temp files are removed as on Ctrl-C."""


def _on_sigterm(signum, frame):
    raise Terminated()


def _quiet_broken_pipe() -> None:
    """The reader went away (``| head``): exit quietly as Unix tools do (128 + SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes stdout at exit
    except (OSError, ValueError):
        pass
    sys.exit(141)


class _Group(click.Group):
    """Turns FuseError (and any unexpected error) into one ``error:`` line and exit 1; usage errors
    into one ``error:`` line and exit 2; SIGTERM cleans up like Ctrl-C; a broken pipe is quiet."""

    def invoke(self, ctx):
        previous = None
        try:
            previous = signal.signal(signal.SIGTERM, _on_sigterm)
        except ValueError:  # not the main thread
            pass
        try:
            return super().invoke(ctx)
        except UsageError as e:
            _error(str(e))
            sys.exit(2)
        except FuseError as e:
            _fail(str(e))
        except click.UsageError as e:
            hint = f" (fusecli {e.ctx.command.name} -h for help)" if e.ctx and e.ctx.command.name else ""
            _error(f"{e.format_message()}{hint}")
            sys.exit(2)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except BrokenPipeError:
            _quiet_broken_pipe()
        except KeyboardInterrupt:
            _echo("error: interrupted", err=True)
            sys.exit(130)
        except Terminated:
            _echo("error: terminated", err=True)
            sys.exit(143)
        except Exception as e:  # a bug of ours must still not print a traceback at the user
            if os.environ.get("FUSECLI_DEBUG"):
                raise
            _fail(f"internal error {type(e).__name__}: {one_line(e)[:300]} (set FUSECLI_DEBUG=1 for the "
                  "traceback)")
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)


def _echo_json(doc: dict) -> None:
    """The JSON document on stdout (indented at a terminal), written a piece at a time: a big model's
    document is never one string (nor the copies echo makes of it)."""
    from .core.output import write_json

    write_json(doc, sys.stdout, 2 if sys.stdout.isatty() else None)


def _parse_dims(values: tuple[str, ...]) -> dict[str, int]:
    dims = {}
    for v in values:
        name, _, size = v.partition("=")
        if not name or not size.isdigit() or int(size) < 1:
            raise click.BadParameter(f"{v!r}: expected NAME=VALUE with a positive integer",
                                     param_hint="--dim")
        if dims.get(name, int(size)) != int(size):
            raise click.BadParameter(f"{name} is given twice ({dims[name]} and {size})", param_hint="--dim")
        dims[name] = int(size)
    return dims


def _dims_text(result) -> str:
    """'batch=2, seq=128' (or 'its fixed sizes'): the sizes an analysis counted bytes at."""
    return dims_line({n: result.sizes[n] for n in result.sizes.variables}) or "its fixed sizes"


def _parse_patterns(ctx, param, value: str | None) -> tuple[str, ...]:
    """--patterns A,B: known names, at least one (a usage error otherwise)."""
    if value is None:
        return ()
    from .fusion.patterns import BY_NAME

    names = tuple(p.strip() for p in value.split(","))
    if not any(names) or not all(names):
        raise click.BadParameter("give pattern names separated by commas, e.g. conv_bn_act,bn_add_act "
                                 f"(known: {', '.join(BY_NAME)})")
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise click.BadParameter(f"unknown pattern {unknown[0]!r} (known: {', '.join(BY_NAME)})")
    return names


def _patterns_option(f):
    return click.option("--patterns", "patterns", default=None, metavar="A,B", callback=_parse_patterns,
                        help="Only these fusion patterns (comma-separated names).")(f)


def _constant_weights_option(f):
    return click.option("--constant-weights", type=click.Choice(["parameters", "constants"]),
                        default="parameters", show_default=True,
                        help="ONNX: float Constant nodes in a weight's role (conv/matmul weight, norm scale, "
                             "bias, embedding) are trainable parameters, or constants.")(f)


def _autodiff_option(f):
    return click.option("--autodiff", type=click.Choice(["tensorflow", "pytorch", "ops"]), default=None,
                        help="Whose autodiff habits backward follows (default: the framework that made the "
                             "model).")(f)


PLOT_FORMATS = ("png", "svg", "pdf")


def _check_plot(plot_path: str, model: str) -> None:
    """--plot: a writable image path, and matplotlib installed, before any analysis."""
    import importlib.util

    from .core.output import check_output

    check_output(plot_path, [model], PLOT_FORMATS, "--plot")
    if importlib.util.find_spec("matplotlib") is None:
        raise FuseError("--plot needs matplotlib: pip install 'fusecli[plot]'")


def _check_viewer_outputs(model: str, overlay: str | None, annotate: str | None) -> None:
    """--overlay / --annotate: ONNX input, writable outputs that are no file of the input, before any
    analysis."""
    from .core.output import check_output
    from .load import is_savedmodel

    if overlay:
        from .report.overlay import fusion_path

        if is_savedmodel(model):
            raise FuseError(f"--overlay: {model} is a SavedModel; --overlay keys its node data by the "
                            "node ids Model Explorer gives ONNX models, so it takes ONNX models only")
        check_output(overlay, [model], ("json",), "--overlay")
        check_output(fusion_path(overlay), [model], ("json",), "--overlay")
    if annotate:
        from .report.annotate import check_annotatable

        check_annotatable(model)
        check_output(annotate, [model], ("onnx",), "--annotate")


def _write_viewer_outputs(result, model: str, overlay: str | None, annotate: str | None) -> None:
    """Write what --overlay and --annotate ask for; a note each on stderr."""
    if overlay:
        from .load.onnx_wire import read_structure
        from .report.overlay import write_overlay

        _echo(write_overlay(result, read_structure(model)[0], overlay), err=True)
    if annotate:
        from .report.annotate import write_annotated

        _echo(write_annotated(result, model, annotate), err=True)


def _routing_option(f):
    return click.option("--routing", type=click.Choice(["balanced"]), default=None,
                        help="Mixture-of-experts: size the tokens each expert gets by assuming the routers "
                             "spread them evenly (tokens*k/E each); said in the warnings and the JSON.")(f)


def _precision_option(f):
    from .precision import PRECISIONS

    return click.option("--precision", type=click.Choice(PRECISIONS),
                        default=None,
                        help="Train at this precision (default: the export's dtypes): bf16/fp16 cast the "
                             "model (upcasts transformers keeps in float32 applied); amp-* model "
                             "torch.autocast on --device (its op lists, a bf16 copy of each weight per "
                             "forward). Said in the report and the JSON.")(f)


def _device_option(f):
    return click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
                        help="Where PyTorch trains: its scaled_dot_product_attention kernels (and so what "
                             "they keep for backward) and autocast's op lists differ.")(f)


SAC_PRESETS = ("none", "full", "attention", "matmul", "torchtitan", "megatron")  # plan.sac.PRESETS
# presets --emit-pytorch does not write as a policy function (plan.emit.SAC_POLICY), and why
UNEMITTED_SAC = {"megatron": "Megatron-LM's selective recompute is its own (--recompute-granularity "
                             "selective); fusecli evaluates it but writes no policy for it",
                 "none": "no checkpoint to write"}


def _sac_options(f):
    """A selective activation checkpointing policy on every block: the command receives ``sac``, a
    (preset, ops) pair, or None."""

    @functools.wraps(f)
    def with_sac(*args, **kwargs):
        preset, ops = kwargs.pop("sac_preset"), kwargs.pop("sac_save")
        if ops and preset:
            raise UsageError("--sac and --sac-save exclude each other: --sac-save is the policy")
        if ops:
            from .plan.sac import op_names

            save = sorted(op_names(_sac_ops(ops)))
        else:
            save = None
        return f(*args, sac=(preset, save) if preset or save else None, **kwargs)

    g = click.option("--sac-save", "sac_save", default=None, metavar="OPS",
                     help="Selective checkpointing saving these aten ops' outputs, recomputing the rest: "
                          "aten.mm,aten._scaled_dot_product_flash_attention_for_cpu (or @FILE, one a "
                          "line).")(with_sac)
    return click.option("--sac", "sac_preset", type=click.Choice(SAC_PRESETS), default=None,
                        help="Selective activation checkpointing (analyze: on every block; plan: on the "
                             "blocks it checkpoints), as "
                             "create_selective_checkpoint_contexts runs it: torchtitan's policy (every "
                             "second mm recomputed), attention (save sdpa), matmul, megatron (recompute "
                             "the attention core), full (plain checkpointing) or none.")(g)


def _sac_ops(text: str) -> list[str]:
    """--sac-save's ops: comma-separated, or @FILE with one per line (# comments)."""
    if text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as fh:
                lines = [line.split("#")[0].strip() for line in fh]
        except OSError as e:
            raise UsageError(f"--sac-save {text}: cannot read ({e.strerror or e})") from None
        except UnicodeDecodeError:
            raise UsageError(f"--sac-save {text}: not a text file of op names") from None
        ops = [x for line in lines for x in line.split(",") if x.strip()]
    else:
        ops = [x for x in text.split(",") if x.strip()]
    ops = [x.strip() for x in ops]
    bad = [x for x in ops if not x.replace(".", "").replace("_", "").isalnum()]
    if not ops or bad:
        raise UsageError(f"--sac-save: {'no ops given' if not ops else f'not an aten op name: {bad[0]!r}'}")
    return ops


LAYOUT_FLAGS = ("dp_replicate", "dp_shard", "zero", "reshard", "world", "tp", "sp", "pp", "microbatches",
                "pp_schedule", "virtual")


def _layout_options(f):
    """A parallel layout (torchtitan's words; docs/cli.md maps them to Megatron's and DeepSpeed's): the
    command receives ``layout``, checked, or None for one device with no parallel flag."""

    @functools.wraps(f)
    def with_layout(*args, **kwargs):
        return f(*args, layout=_layout(**{k: kwargs.pop(k) for k in LAYOUT_FLAGS}), **kwargs)

    g = click.option("--world", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Ranks in all, checked against the degrees' product.")(with_layout)
    g = click.option("--virtual-stages", "virtual", type=click.IntRange(min=1), default=2,
                     show_default=True, metavar="V",
                     help="Under --pp-schedule interleaved-1f1b: the stages each rank holds (the "
                          "blocks split into pp x V, stage g on rank g mod pp).")(g)
    g = click.option("--pp-schedule", type=click.Choice(["1f1b", "gpipe", "interleaved-1f1b"]),
                     default="1f1b", show_default=True,
                     help="Pipeline schedule: Schedule1F1B (stage s holds min(pp - s, m) microbatches), "
                          "ScheduleGPipe (every stage holds all m) or ScheduleInterleaved1F1B "
                          "(torchtitan's default; --virtual-stages per rank).")(g)
    g = click.option("--microbatches", type=click.IntRange(min=1), default=None, metavar="M",
                     help="Microbatches per step under --pp (default: pp; 1F1B takes at least pp); --batch "
                          "is cut into them.")(g)
    g = click.option("--pp", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
                     help="Pipeline parallel: the blocks split evenly into N stages, one per rank (the "
                          "embeddings on the first, the final norm and head on the last); with "
                          "--dp-replicate R, R replicas of the pipeline, DDP over each stage's.")(g)
    g = click.option("--sp", is_flag=True,
                     help="Sequence parallel with --tp: the norms and residuals split along the sequence "
                          "(SequenceParallel; the row-parallel outputs reduce-scattered).")(g)
    g = click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
                     help="Tensor parallel: each block's column/row-parallel pairs (q, k, v / o; gate, up / "
                          "down) split over N ranks, as torch's ColwiseParallel/RowwiseParallel.")(g)
    g = click.option("--reshard-after-forward/--no-reshard-after-forward", "reshard", default=True,
                     show_default=True,
                     help="FSDP2: free a block's gathered parameters after its forward (gather them again "
                          "for its backward), or keep them to its backward (ZeRO-2-like).")(g)
    g = click.option("--zero", type=click.IntRange(1, 3), default=None, metavar="1",
                     help="ZeRO-1 over the --dp-replicate ranks: ZeroRedundancyOptimizer shards the "
                          "optimizer state (ZeRO-2/3: use --dp-shard).")(g)
    g = click.option("--dp-shard", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
                     help="Ranks sharing one copy of the parameters, gradients and optimizer state "
                          "(FSDP2 fully_shard per block and the root; ZeRO-3).")(g)
    return click.option("--dp-replicate", type=click.IntRange(min=1), default=1, show_default=True,
                        metavar="N", help="Ranks each holding a whole replica (DDP); with --dp-shard: "
                                          "HSDP. --batch is each rank's own.")(g)


def _layout(dp_replicate: int, dp_shard: int, zero: int | None, reshard: bool, world: int | None,
            tp: int, sp: bool, pp: int, microbatches: int | None, pp_schedule: str, virtual: int):
    """The layout the flags say, checked; None for one device with no parallel flag."""
    from .parallel.layout import Layout

    layout = Layout(dp_replicate, dp_shard, zero, reshard, world, tp, sp, pp, microbatches, pp_schedule,
                    virtual)
    if layout == Layout():
        return None
    layout.check()
    return layout


def _common_options(f):
    """--batch, --dim and --signature, shared by the commands that load and size a model."""
    f = click.option("--signature", default=None, metavar="NAME",
                     help="SavedModels: the signature to analyze (default serving_default).")(f)
    f = click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE",
                     help="Value of a symbolic dim, e.g. --dim seq=128 (repeatable).")(f)
    return click.option("--batch", type=click.IntRange(min=1), default=None,
                        help="Size of the model's batch dim (its inputs' dynamic first dims; default 1, "
                             "with a warning).")(f)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fusecli")
def main() -> None:
    """Which ops of a model may be fused for inference and for training, and why not where not."""


@main.command()
@click.argument("model", type=click.Path(dir_okay=True, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON document on stdout.")
@_common_options
@click.option("--wrt", type=click.Choice(["parameters", "inputs"]), default="parameters",
              show_default=True,
              help="Differentiate w.r.t. the trainable parameters, or the float graph inputs too.")
@click.option("--plot", "plot_path", metavar="FILE.png", default=None,
              help="Draw live bytes along the forward+backward schedule to FILE (.png/.svg/.pdf).")
@_patterns_option
@_constant_weights_option
@_autodiff_option
@_device_option
@_routing_option
@_precision_option
@click.option("-v", "--verbose", is_flag=True, help="List every saved tensor and every match.")
@click.option("-q", "--quiet", is_flag=True, help="Print the summary only (verdicts per pattern, memory).")
@click.option("--all", "all_saved", is_flag=True, help="List every saved tensor (default: the largest 10).")
@click.option("--overlay", "overlay_path", metavar="FILE.json", default=None,
              help="ONNX: write Model Explorer node data, FILE.json (saved bytes per node) and "
                   "FILE.fusion.json (each matched node's pattern and verdict).")
@click.option("--annotate", "annotate_path", metavar="FILE.onnx", default=None,
              help="ONNX: write a copy of MODEL with saved bytes, pattern and verdict as node metadata "
                   "(shown by Netron) and totals as model metadata.")
@_layout_options
@_sac_options
def analyze(model: str, as_json: bool, batch: int | None, dims: tuple[str, ...], signature: str | None,
            wrt: str, plot_path: str | None, patterns: tuple[str, ...], constant_weights: str,
            autodiff: str | None, device: str, routing: str | None, precision: str | None, verbose: bool,
            quiet: bool, all_saved: bool, overlay_path: str | None, annotate_path: str | None,
            layout, sac) -> None:
    """Analyze MODEL (an .onnx file or a SavedModel folder)."""
    from .pipeline import Options
    from .pipeline import analyze as run_analysis
    from .report.document import to_json

    if verbose and quiet:
        raise click.BadParameter("-v and -q exclude each other", param_hint="-q")
    options = Options(batch=batch, dims=_parse_dims(dims), wrt_inputs=wrt == "inputs",
                      patterns=patterns, signature=signature,
                      constant_weights=constant_weights == "parameters", autodiff=autodiff,
                      device=device, routing=routing, precision=precision)
    if plot_path:
        _check_plot(plot_path, model)
    _check_viewer_outputs(model, overlay_path, annotate_path)
    result = run_analysis(model, options)
    policy = base = None
    if sac is not None:
        from .plan.sac import (
            evaluate,
            order_warning,
            pareto_front,
            preset_points,
            require_pytorch,
            topk_warning,
        )

        require_pytorch(result)
        policy, base = evaluate(result, *sac), evaluate(result, "none")
        points = preset_points(result, policy, base)
        front = pareto_front(points)
        for w in (order_warning(result), topk_warning(policy.calls.items())):
            if w is not None:
                result.warnings.append(w)
    ranks = None
    if layout is not None:
        from .parallel.ranks import rank_memory

        # AdamW, as plan's default; every block under the policy where one is given
        ranks = rank_memory(result, layout, chosen=policy.blocks if policy is not None else None)
    if as_json:
        for w in result.warnings:
            _warn(w)
    if plot_path:
        from .core import progress
        from .report.plot import plot_sac_presets, plot_timeline

        name = os.path.basename(os.path.normpath(model))
        with progress.stages() as stage:
            stage("plotting")
            if policy is not None:  # every policy's peak against its re-run FLOPs, this one circled
                title = f"{name}: selective checkpointing at {_dims_text(result)}"
                note = plot_sac_presets(points, front, policy.preset, plot_path, title)
            else:
                title = f"{name}: live memory at {_dims_text(result)}"
                note = plot_timeline(result.liveness, plot_path, title)
        _echo(f"wrote {plot_path} ({note})", err=True)
    _write_viewer_outputs(result, model, overlay_path, annotate_path)
    if as_json:
        doc = to_json(result)
        if policy is not None:
            from .plan.sac_report import sac_json

            doc["memory"]["sac"] = sac_json(policy, base, points, front)
            doc["memory"]["saved_activation_bytes"] = policy.saved_activation_bytes
            doc["memory"]["peak_bytes"] = policy.peak_bytes
        if ranks is not None:
            from .parallel.report import layout_json, ranks_json

            entry = layout_json(layout, device, result.sizes.batch)
            doc["memory"]["layout"] = {**entry, "optimizer": "adamw"}
            doc["memory"]["ranks"] = ranks_json(ranks, None)
        _echo_json(doc)
        return
    from .report.text import TextOptions, print_text_report

    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    print_text_report(result, TextOptions(verbose=verbose, quiet=quiet, all_saved=all_saved, color=color))
    if policy is not None:
        from .plan.sac_report import sac_lines

        _echo("\n".join(["", *sac_lines(policy, base, points, front)]))
    if ranks is not None:
        from .parallel.report import ranks_lines

        _echo("\n".join(["", *ranks_lines(ranks, layout, device, result.sizes.batch),
                         "(AdamW's state; fusecli plan --optimizer for another)"]))
    for w in result.warnings:  # after the report, where a reader at a terminal sees them last
        _warn(w)


@main.command()
@click.argument("model", type=click.Path(dir_okay=True, path_type=str))
@click.option("--view", default="after", show_default=True, metavar="VIEW",
              help="before (the forward graph), after (the fused graph), backward (forward+backward) or "
                   "fused-training (both fused for training, and the tensors that cross between them).")
@click.option("--dot", "as_dot", is_flag=True, help="Write DOT source (to stdout without -o).")
@click.option("-o", "--output", default=None, metavar="FILE",
              help="FILE.svg, .png, .pdf (drawn by Graphviz's dot) or .dot.")
@click.option("--mode", type=click.Choice(["inference", "training"]), default="inference",
              show_default=True, help="after view: draw fused what is safe for inference, or for training.")
@click.option("--focus", default=None, metavar="NODE|PATTERN[:K]",
              help="Draw only around a node, or the K-th match of a pattern.")
@click.option("--hops", type=click.IntRange(min=0), default=2, show_default=True,
              help="How far around --focus to draw.")
@click.option("--collapse", type=click.IntRange(min=0), default=0, metavar="DEPTH",
              help="Draw each '/'-separated name scope of this depth as one node (0: off).")
@click.option("--unfold", is_flag=True,
              help="Draw every repeated block (layers.0 ... layers.79); by default, past 100 ops, equal "
                   "blocks are drawn once as 'x80'.")
@click.option("--shape-ops", "shape_ops", is_flag=True,
              help="Draw the integer ops that only compute shapes (Shape, Gather, Concat ... feeding "
                   "Reshape/Expand/Slice targets); hidden by default.")
@click.option("--max-nodes", type=click.IntRange(min=1), default=1500, show_default=True,
              help="Refuse to lay out more nodes than this (use --focus, --collapse or --dot).")
@_common_options
@click.option("--wrt", type=click.Choice(["parameters", "inputs"]), default="parameters",
              show_default=True, help="What the backward view differentiates with respect to.")
@_patterns_option
@_constant_weights_option
@_autodiff_option
@_device_option
@_precision_option
def render(model: str, view: str, as_dot: bool, output: str | None, mode: str, focus: str | None,
           hops: int,
           collapse: int, unfold: bool, shape_ops: bool, max_nodes: int, batch: int | None,
           dims: tuple[str, ...], signature: str | None,
           wrt: str, patterns: tuple[str, ...], constant_weights: str, autodiff: str | None,
           device: str, precision: str | None) -> None:
    """Draw MODEL's before / after / backward view (Graphviz)."""
    from .core import progress
    from .core.output import atomic_write, check_output
    from .pipeline import Options
    from .pipeline import analyze as run_analysis
    from .render.views import (
        BIG_GRAPH_NODES,
        FORMATS,
        VIEWS,
        FocusError,
        RenderOptions,
        build_dot,
        count_nodes,
        run_dot,
    )

    if view not in VIEWS:  # one entry in render.VIEWS adds a view
        raise click.BadParameter(f"{view!r} is not one of {', '.join(VIEWS)}", param_hint="--view")
    if output is None and not as_dot:
        stem = os.path.splitext(os.path.basename(os.path.normpath(model)))[0]
        output = f"{stem}.{view}.svg"
    fmt = "dot" if output is None else check_output(output, [model], FORMATS, "-o")
    if as_dot and output is not None and fmt != "dot":
        raise click.BadParameter("--dot writes DOT source: give -o FILE.dot or no -o", param_hint="--dot")
    options = Options(batch=batch, dims=_parse_dims(dims), wrt_inputs=wrt == "inputs",
                      signature=signature, patterns=patterns,
                      constant_weights=constant_weights == "parameters", autodiff=autodiff,
                      device=device, precision=precision)
    with progress.stages() as stage:
        result = run_analysis(model, options)
        for w in result.warnings:
            _warn(w)
        render_options = RenderOptions(view, focus, hops, collapse, mode, fmt, unfold, shape_ops)
        try:
            count = count_nodes(result, render_options)
        except FocusError as e:
            raise click.BadParameter(str(e).removeprefix("--focus "), param_hint="--focus") from None
        if fmt != "dot" and count > max_nodes:
            raise FuseError(f"{count} nodes are too many to lay out (--max-nodes {max_nodes}); draw part "
                            "with --focus NODE --hops N, collapse scopes with --collapse DEPTH, or write "
                            "--dot and lay it out yourself")
        stage(f"drawing {count} nodes")
        source, count = build_dot(result, view, focus, hops, collapse, mode, fmt, unfold, shape_ops)
        if fmt == "dot":
            if output is None:  # at a terminal: indented with spaces, labels escaped (render/kit.escape)
                _echo(source.replace("\t", "    "))
                return
            data = source.encode()
        else:
            stage(f"laying out {count} nodes (Graphviz dot)")
            data = run_dot(source, fmt)
        stage("writing")
        with atomic_write(output) as f:
            f.write(data)
    big_png = fmt == "png" and count > BIG_GRAPH_NODES
    hint = "; PNG scaled to fit 14,400 px, .svg keeps every detail" if big_png else ""
    _echo(f"wrote {output} ({view} view, {count} nodes{hint})", err=True)


@main.command("rewrite")
@click.argument("model", type=click.Path(dir_okay=True, path_type=str))
@click.option("-o", "--output", required=True, metavar="OUT.onnx", help="Where to write the rewritten model.")
@click.option("--target", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Emit only kernels that ONNX Runtime's CPU or CUDA provider has.")
@click.option("--mode", type=click.Choice(["inference", "training"]), default="inference", show_default=True,
              help="Rewrite inference-safe matches (BatchNorm folded), or training-safe ones only.")
@_patterns_option
@_common_options
@click.option("--no-verify", "no_verify", is_flag=True,
              help="Skip the onnxruntime comparison of original and rewritten outputs.")
@click.option("--verify", "verify_scope", type=click.Choice(["auto", "regions", "model"]), default="auto",
              show_default=True, help="What onnxruntime compares: each fused region against the nodes it "
              "replaced, the whole model, or auto (regions; the whole model too when it is small or a "
              "region cannot be cut out).")
@click.option("--bench", is_flag=True, help="Time original and rewritten in onnxruntime (medians and "
              "spread); a measurable slowdown writes nothing and exits 1.")
@click.option("--force", is_flag=True, help="With --bench: write the model even when it measures slower.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="intra-op threads for --bench (default: the CPUs this process may use).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the summary.")
@_routing_option
def rewrite_command(model: str, output: str, target: str, mode: str, patterns: tuple[str, ...],
                    batch: int | None,
                    dims: tuple[str, ...], signature: str | None, no_verify: bool, verify_scope: str,
                    bench: bool,
                    threads: int | None, force: bool, as_json: bool, routing: str | None) -> None:
    """Rewrite MODEL's fusion matches as ONNX Runtime kernels, verify, and write OUT.onnx."""
    from .core.output import check_output
    from .rewrite import RewriteOptions
    from .rewrite import rewrite as run_rewrite
    from .rewrite.report import format_summary
    from .rewrite.report import to_json as rewrite_json

    check_output(output, [model], ("onnx",), "-o")
    options = RewriteOptions(target=target, mode=mode, batch=batch, dims=_parse_dims(dims),
                             patterns=patterns, verify=not no_verify, verify_scope=verify_scope,
                             bench=bench, threads=threads, signature=signature,
                             keep_weights=False, force=force, routing=routing)
    from .core import progress

    with progress.stages():
        result = run_rewrite(model, options, output)
    for w in result.warnings:
        _warn(w)
    if as_json:
        _echo_json(rewrite_json(result))
    else:
        _echo(format_summary(result))
    if result.refused:
        _fail(result.refused)


BAD_INPUT_EXIT = 3  # diff: 1 means a regression, so a model that cannot be read exits 3


@main.command("diff")
@click.argument("old", type=click.Path(dir_okay=True, path_type=str))
@click.argument("new", type=click.Path(dir_okay=True, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON document on stdout.")
@_common_options
@click.option("--fail-on", "fail_on", default="fusions,verdicts,memory", show_default=True, metavar="KINDS",
              help="Which regressions exit 1: fusions (a fusion lost), verdicts (a verdict got worse), "
                   "memory (a total grew more than --tolerance).")
@click.option("--tolerance", default="2%", show_default=True, metavar="PCT",
              help="Memory growth at the given dims that is not a regression.")
@click.option("--wrt", type=click.Choice(["parameters", "inputs"]), default="parameters",
              show_default=True,
              help="Differentiate w.r.t. the trainable parameters, or the float graph inputs too.")
@_device_option
@_precision_option
def diff_command(old: str, new: str, as_json: bool, batch: int | None, dims: tuple[str, ...],
                 signature: str | None, fail_on: str, tolerance: str, wrt: str, device: str,
                 precision: str | None) -> None:
    """Compare two exports of one model (OLD, NEW): fusions, verdicts, memory, ops. Exit 0: no
    regression; 1: a regression of a kind in --fail-on; 2: usage; 3: a model could not be read."""
    from .diff.compare import DiffOptions, analyze_pair, compare, parse_fail_on, parse_tolerance

    options = DiffOptions(tolerance=parse_tolerance(tolerance), fail_on=parse_fail_on(fail_on))
    parsed = _parse_dims(dims)
    try:
        a, b, options.notes, options.dim_rename = analyze_pair(old, new, batch, parsed, signature,
                                                               wrt == "inputs", precision, device)
        doc = compare(a, b, options)
    except UsageError:
        raise
    except FuseError as e:
        _error(str(e))
        sys.exit(BAD_INPUT_EXIT)
    except Exception as e:  # not exit 1, which CI would read as a regression
        if os.environ.get("FUSECLI_DEBUG"):
            raise
        _error(f"internal error {type(e).__name__}: {one_line(e)[:300]} (set FUSECLI_DEBUG=1 for the "
               "traceback)")
        sys.exit(BAD_INPUT_EXIT)
    for label, result in (("OLD", a), ("NEW", b)):
        for w in result.warnings:
            _warn(w, f"{label}: ")
    if as_json:
        _echo_json(doc)
    else:
        from .core.terminal import terminal_report
        from .diff.text import report_lines

        color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        click.echo(terminal_report(lambda style: "\n".join(report_lines(doc, style=style)), color))
    sys.exit(doc["summary"]["exit"])


def _parse_budget(ctx, param, value: str) -> int:
    """--budget: '24GiB', '500MB' or plain bytes (a usage error otherwise)."""
    from .core.units import parse_bytes

    n = parse_bytes(value)
    if n is None:
        raise click.BadParameter(f"{value!r}: expected a positive size such as 24GiB, 500MB or 1048576 "
                                 "(bytes)")
    return n


@main.command("plan")
@click.argument("model", type=click.Path(dir_okay=True, path_type=str))
@click.option("--budget", required=True, callback=_parse_budget, metavar="SIZE",
              help="Memory for the whole training step: 24GiB (binary), 500MB (decimal) or plain bytes.")
@_common_options
@click.option("--optimizer", type=click.Choice(["adamw", "adam", "sgd", "sgd-momentum", "none"]),
              default="adamw", show_default=True,
              help="Optimizer state: Adam(W) two moments, sgd none (sgd-momentum one buffer).")
@_device_option
@_precision_option
@click.option("--solve", type=click.Choice(["batch", "seq"]), default="batch", show_default=True,
              help="Which dim the largest-that-fits answer solves for.")
@click.option("--recompute", type=click.Choice(["all", "blocks", "ops"]), default=None,
              help="What the plan may recompute: fused kernels and checkpointed blocks, blocks only "
                   "(what a framework's activation checkpointing applies), or ops: the blocks' plan with "
                   "each matmul and attention call saved where the budget allows (a selective "
                   "checkpointing policy chosen op by op). Default: all; blocks with --emit-pytorch.")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON document on stdout.")
@click.option("--plot", "plot_path", default=None, metavar="FILE",
              help="Draw the step peak against the FLOPs recomputation adds (.png, .svg or .pdf).")
@click.option("--emit-pytorch", "emit_path", default=None, metavar="FILE.py",
              help="Write a helper module whose apply(model) checkpoints the planned submodules.")
@_routing_option
@_layout_options
@_sac_options
def plan_command(model: str, budget: int, batch: int | None, dims: tuple[str, ...], signature: str | None,
                 optimizer: str, device: str, precision: str | None, solve: str, recompute: str,
                 as_json: bool, plot_path: str | None, emit_path: str | None, routing: str | None, layout,
                 sac) -> None:
    """Fit MODEL's training step into --budget: its memory as formulas, the largest batch that fits,
    and what to recompute (checkpoint) when it does not. Exit 1 when it cannot fit."""
    from .core import progress
    from .core.output import check_output
    from .pipeline import Options
    from .pipeline import analyze as run_analysis
    from .plan.planner import PlanOptions, make_plan
    from .plan.text import curve, plan_json, plan_lines

    if plot_path:
        _check_plot(plot_path, model)
    if emit_path:
        check_output(emit_path, [model], ("py",), "--emit-pytorch")
        if recompute == "all":
            raise UsageError("--emit-pytorch writes torch.utils.checkpoint calls, which recompute blocks "
                             "only: use --recompute blocks (the default with --emit-pytorch)")
    if sac is not None and recompute == "ops":
        raise UsageError("--recompute ops chooses the policy itself: drop --sac/--sac-save")
    if sac is not None:
        if recompute == "all":
            raise UsageError("--sac checkpoints blocks under the policy, not fused kernels: drop --recompute "
                             "all (--recompute blocks is implied)")
        if emit_path and sac[0] in UNEMITTED_SAC:
            raise UsageError(f"--emit-pytorch --sac {sac[0]}: {UNEMITTED_SAC[sac[0]]}")
    recompute = recompute or ("blocks" if emit_path or sac is not None else "all")
    if layout is not None and emit_path:
        raise UsageError("--emit-pytorch writes one device's plan and its predictions; with a layout, "
                         "checkpoint the modules the per-rank plan lists")
    options = Options(batch=batch, dims=_parse_dims(dims), signature=signature, device=device,
                      precision=precision, routing=routing)
    with progress.stages() as stage:
        result = run_analysis(model, options)
        stage("planning")
        blocks = None
        if sac is not None or recompute == "ops":
            from .plan.sac import order_warning, policy_of, require_pytorch, sac_candidates

            require_pytorch(result)
            if (w := order_warning(result)) is not None:
                result.warnings.append(w)
        forced = []  # torchtitan's router mm shapes, for --emit-pytorch
        if sac is not None:
            from .plan.sac import forced_mm_shapes, topk_warning

            policy = policy_of(*sac)
            planned = sac_candidates(result, policy) if policy is not None else []
            blocks = [c for c, _ in planned]
            forced = forced_mm_shapes(sac[0], planned)
            if (w := topk_warning(planned)) is not None:
                result.warnings.append(w)
        options = PlanOptions(budget, optimizer, precision, solve, recompute,
                              floor_check=layout is None)
        if recompute == "ops":
            from .plan.sac_choose import plan_ops

            plan = plan_ops(result, options)
        else:
            plan = make_plan(result, options, blocks)
            plan.sac = sac
            plan.sac_forced_mm_shapes = forced
        ranks = None
        if layout is not None:
            from .parallel.plan import plan_ranks

            stage("ranks")
            ranks = plan_ranks(result, plan, layout, optimizer)
    for w in result.warnings:
        _warn(w)
    name = os.path.basename(os.path.normpath(model))
    if plot_path:
        from .report.plot import plot_plan_curve

        note = plot_plan_curve(curve(plan), budget, plan.chosen, plot_path, f"{name}: step peak vs recompute")
        _echo(f"wrote {plot_path} ({note})", err=True)
    if emit_path:
        from .plan.emit import write_pytorch_helper

        note = write_pytorch_helper(emit_path, plan, name)
        _echo(f"wrote {emit_path} ({note})", err=True)
    doc = plan_json(plan)
    lines = plan_lines(plan, name)

    fits = plan.fits
    if ranks is not None:
        from .parallel.report import rank_plan_json, rank_plan_lines

        doc.update(rank_plan_json(ranks))
        fits = ranks.fits
        lines += ["", *rank_plan_lines(ranks, plan.solve_dim)]
    if as_json:
        _echo_json(doc)
    else:
        _echo("\n".join(lines))
    if not fits:
        sys.exit(1)

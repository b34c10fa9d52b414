"""click commands: parse options, call the library, print. No analysis logic lives here."""

from __future__ import annotations

import atexit
import gc
import json
import os
import sys

import click

from . import __version__
from .errors import FuseError

# At exit, freeze what is left: interpreter shutdown then skips a collection that would walk every
# object of a big graph (seconds on 100k nodes) only to free memory the process gives back anyway.
atexit.register(gc.freeze)


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


class _Group(click.Group):
    """Turns FuseError (and any unexpected error) into one ``error:`` line and exit 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except FuseError as e:
            _fail(" ".join(str(e).split()))
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            sys.exit(130)
        except Exception as e:  # a bug of ours must still not print a traceback at the user
            if os.environ.get("FUSECLI_DEBUG"):
                raise
            _fail(f"internal error {type(e).__name__}: {' '.join(str(e).split())[:300]} "
                  "(set FUSECLI_DEBUG=1 for the traceback)")


def _dump_json(doc: dict) -> str:
    """Indented for a person at a terminal; compact (json's C encoder, several times faster on big
    graphs) when piped to a program."""
    return json.dumps(doc, indent=2 if sys.stdout.isatty() else None)


def _parse_dims(values: tuple[str, ...]) -> dict[str, int]:
    dims = {}
    for v in values:
        name, _, size = v.partition("=")
        if not name or not size.isdigit() or int(size) < 1:
            raise click.BadParameter(f"{v!r}: expected NAME=VALUE with a positive integer",
                                     param_hint="--dim")
        dims[name] = int(size)
    return dims


def _common_options(f):
    """--batch, --dim and --signature, shared by the commands that load and size a model."""
    f = click.option("--signature", default=None, metavar="NAME",
                     help="SavedModels: the signature to analyze (default serving_default).")(f)
    f = click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE",
                     help="Value of a symbolic dim, e.g. --dim seq=128 (repeatable).")(f)
    return click.option("--batch", type=click.IntRange(min=1), default=None,
                        help="Batch size for dynamic first dims (default 1).")(f)


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
@click.option("--patterns", "patterns", default="", metavar="A,B",
              help="Only these fusion patterns (comma-separated names).")
def analyze(model: str, as_json: bool, batch: int | None, dims: tuple[str, ...], signature: str | None,
            wrt: str, plot_path: str | None, patterns: str) -> None:
    """Analyze MODEL (an .onnx file or a SavedModel folder)."""
    from .pipeline import Options
    from .pipeline import analyze as run_analysis
    from .report import print_report, to_json

    options = Options(batch=batch or 1, dims=_parse_dims(dims), wrt_inputs=wrt == "inputs",
                      patterns=tuple(p.strip() for p in patterns.split(",") if p.strip()),
                      signature=signature)
    if plot_path:
        from .output import refuse_overwriting_input

        refuse_overwriting_input(plot_path, [model])
    result = run_analysis(model, options, batch_given=batch is not None)
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    if plot_path:
        from .plot import plot_timeline

        plot_timeline(result.liveness, plot_path,
                      f"{os.path.basename(model)}: live memory, batch {options.batch}")
    if as_json:
        click.echo(_dump_json(to_json(result)))
        return
    from rich.console import Console

    print_report(result, Console())


@main.command()
@click.argument("model", type=click.Path(dir_okay=True, path_type=str))
@click.option("--view", type=click.Choice(["before", "after", "backward", "fused-training"]), default="after",
              show_default=True, help="The forward graph, the fused graph, forward+backward, or both fused "
              "for training with the tensors that cross between them.")
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
@click.option("--max-nodes", type=click.IntRange(min=1), default=1500, show_default=True,
              help="Refuse to lay out more nodes than this (use --focus, --collapse or --dot).")
@_common_options
@click.option("--wrt", type=click.Choice(["parameters", "inputs"]), default="parameters",
              show_default=True, help="What the backward view differentiates with respect to.")
def render(model: str, view: str, as_dot: bool, output: str | None, mode: str, focus: str | None,
           hops: int,
           collapse: int, max_nodes: int, batch: int | None, dims: tuple[str, ...], signature: str | None,
           wrt: str) -> None:
    """Draw MODEL's before / after / backward view (Graphviz)."""
    from .output import atomic_write, refuse_overwriting_input
    from .pipeline import Options
    from .pipeline import analyze as run_analysis
    from .render import build_dot, output_format, run_dot

    if output is None and not as_dot:
        stem = os.path.splitext(os.path.basename(os.path.normpath(model)))[0]
        output = f"{stem}.{view}.svg"
    if output is not None:
        refuse_overwriting_input(output, [model])
    fmt = "dot" if output is None else output_format(output)
    if as_dot and output is not None and fmt != "dot":
        raise click.BadParameter("--dot writes DOT source: give -o FILE.dot or no -o", param_hint="--dot")
    options = Options(batch=batch or 1, dims=_parse_dims(dims), wrt_inputs=wrt == "inputs",
                      signature=signature)
    result = run_analysis(model, options, batch_given=batch is not None)
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    if view == "fused-training":
        from .render_training import build_training_dot

        source, count = build_training_dot(result)
    else:
        source, count = build_dot(result, view, focus, hops, collapse, mode)
    if fmt == "dot":
        if output is None:
            click.echo(source)
            return
        data = source.encode()
    else:
        if count > max_nodes:
            raise FuseError(f"{count} nodes are too many to lay out (--max-nodes {max_nodes}); draw part "
                            "with --focus NODE --hops N, collapse scopes with --collapse DEPTH, or write "
                            "--dot and lay it out yourself")
        data = run_dot(source, fmt)
    with atomic_write(output) as f:
        f.write(data)
    click.echo(f"wrote {output} ({view} view, {count} nodes)", err=True)


@main.command("rewrite")
@click.argument("model", type=click.Path(dir_okay=True, path_type=str))
@click.option("-o", "--output", required=True, metavar="OUT.onnx", help="Where to write the rewritten model.")
@click.option("--target", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Emit only kernels that ONNX Runtime's CPU or CUDA provider has.")
@click.option("--mode", type=click.Choice(["inference", "training"]), default="inference", show_default=True,
              help="Rewrite inference-safe matches (BatchNorm folded), or training-safe ones only.")
@click.option("--patterns", "patterns", default="", metavar="A,B",
              help="Only these fusion patterns (comma-separated names).")
@_common_options
@click.option("--no-verify", "no_verify", is_flag=True,
              help="Skip the onnxruntime comparison of original and rewritten outputs.")
@click.option("--bench", is_flag=True, help="Time original and rewritten in onnxruntime (medians and "
              "spread); a measurable slowdown writes nothing and exits 1.")
@click.option("--force", is_flag=True, help="With --bench: write the model even when it measures slower.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="intra-op threads for --bench (default: the CPUs this process may use).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the summary.")
def rewrite_command(model: str, output: str, target: str, mode: str, patterns: str, batch: int | None,
                    dims: tuple[str, ...], signature: str | None, no_verify: bool, bench: bool,
                    threads: int | None, force: bool, as_json: bool) -> None:
    """Rewrite MODEL's fusion matches as ONNX Runtime kernels, verify, and write OUT.onnx."""
    from .rewrite import RewriteOptions
    from .rewrite import rewrite as run_rewrite
    from .rewrite.report import format_summary
    from .rewrite.report import to_json as rewrite_json

    options = RewriteOptions(target=target, mode=mode, batch=batch or 1, dims=_parse_dims(dims),
                             patterns=tuple(p.strip() for p in patterns.split(",") if p.strip()),
                             verify=not no_verify, bench=bench, threads=threads, signature=signature,
                             force=force)
    result = run_rewrite(model, options, output)
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    click.echo(_dump_json(rewrite_json(result)) if as_json else format_summary(result))
    if result.refused:
        _fail(result.refused)

"""Checking a rewrite with ONNX Runtime: same outputs on seeded random inputs, and --bench latencies."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from ...core import budgets
from ...core.dims import dim_value
from ...core.errors import FuseError, error_text
from ..kernels.cuda import cpu_stand_ins
from .regions import Case, merged_models, random_feeds

Source = bytes | str  # a serialized model or a path (a path reads external data beside it)

TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2, "float64": 1e-7}  # relative L2 error
LEVELS = {"disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
          "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
          "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
          "default": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
QUIET = 4  # onnxruntime's FATAL: its own (coloured) error lines stay off the terminal; fusecli says why
ort.set_default_logger_severity(QUIET)  # load-time messages go through the default logger
_NP = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
       "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16,
       "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}


@dataclass
class OutputCheck:
    name: str
    dtype: str
    error: float  # relative L2 error (exact match: 0, else inf, for non-float outputs)
    tolerance: float
    # a whole-model output over tolerance while every region agrees: its and the original's relative L2
    # errors against the original computed in float64, and whether rounding explains the difference
    rounding: tuple[float, float] | None = None
    explained: bool = False

    @property
    def ok(self) -> bool:
        return self.error <= self.tolerance or self.explained


@dataclass
class Verification:
    """Per optimization level ('disabled', 'default'), one check per output: of the whole model
    (``checks``) and of every distinct fused region against the nodes it replaced (``region_checks``)."""

    checks: dict[str, list[OutputCheck]] = field(default_factory=dict)
    region_checks: dict[str, list[OutputCheck]] = field(default_factory=dict)
    regions: int = 0  # fused regions checked (identical ones once: ``distinct``)
    distinct: int = 0
    model_skipped: str | None = None  # why the whole model was not run
    uncut: list[str] = field(default_factory=list)  # regions not checked on their own, and why
    warnings: list[str] = field(default_factory=list)  # what the user must hear about how it was checked
    failed_at: dict[str, str] = field(default_factory=dict)  # "pattern at root" -> why its region failed

    @property
    def ok(self) -> bool:
        return all(c.ok for cs in (*self.checks.values(), *self.region_checks.values()) for c in cs)

    def worst(self, level: str, regions: bool = False) -> float:
        checks = (self.region_checks if regions else self.checks).get(level, [])
        return max((c.error for c in checks), default=0.0)

    def failures(self) -> list[tuple[str, OutputCheck]]:
        return [(lvl, c) for checks in (self.region_checks, self.checks)
                for lvl, cs in checks.items() for c in cs if not c.ok]


def session_options(level: str = "disabled", threads: int | None = None,
                    spinning: bool = True) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.graph_optimization_level = LEVELS[level]
    so.log_severity_level = QUIET
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    if not spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return so


def open_session(src: Source, so: ort.SessionOptions, what: str) -> ort.InferenceSession:
    try:
        return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    except Exception as e:
        first = error_text(e)
        raise FuseError(f"onnxruntime cannot load the {what} model: {first}") from None


def make_feeds(sess: ort.InferenceSession, batch: int = 1, dims: Mapping[str, int] | None = None,
               seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs: named dims from ``dims``, other symbolic dims the batch on axis 0 and 1 elsewhere.

    Floats are standard normal; integers are 0 or 1 (valid ids and masks for any vocabulary).
    """
    rng, dims = np.random.default_rng(seed), dims or {}
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else dim_value(d, dims) if dim_value(d, dims) is not None
                 else (batch if axis == 0 else 1) for axis, d in enumerate(i.shape)]
        dtype = _NP.get(i.type)
        if any(not isinstance(d, int) or d < 0 for d in shape):
            raise FuseError(f"cannot make a random value for input {i.name!r} of shape {i.shape}")
        numel = 1
        for d in shape:
            numel *= d
        budgets.check("FEED_ELEMENTS", numel, f"verification input {i.name!r} of shape {shape}")
        if dtype is None:
            raise FuseError(f"cannot make a random value for input {i.name!r} of type {i.type}")
        if np.issubdtype(dtype, np.floating):
            feeds[i.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype is np.bool_:
            feeds[i.name] = rng.random(shape) < 0.5
        else:
            feeds[i.name] = rng.integers(0, 2, shape).astype(dtype)
    return feeds


def quiet_run() -> ort.RunOptions:
    """Run options that keep onnxruntime's own error lines off the terminal (fusecli says what failed)."""
    options = ort.RunOptions()
    options.log_severity_level = QUIET
    return options


class RunFailed(FuseError):
    """onnxruntime could not run a model on the random inputs; ``what`` names which model."""

    def __init__(self, what: str, first: str, why: str | None = None):
        # the sizes are the user's to set only where the input itself fails: a rewritten model that fails
        # where the original ran on the same inputs wrote a kernel whose inputs do not fit
        why = why or ("set sizes with --batch N and --dim NAME=VALUE" if "original" in what else
                      "the original ran on the same inputs: a kernel's inputs do not fit it, a fusecli bug")
        super().__init__(f"onnxruntime failed to run the {what} model: {first} ({why})")
        self.what, self.first = what, first


def guessed_dims(sess: ort.InferenceSession, dims: Mapping[str, int] | None) -> list[str]:
    """The inputs' named dims not in ``dims`` (the user's --dim: the rest were guessed), axis 0 aside
    (--batch's)."""
    dims = dims or {}
    out = []
    for i in sess.get_inputs():
        for axis, d in enumerate(i.shape):
            if axis and not isinstance(d, int) and dim_value(d, dims) is None and str(d) not in out:
                out.append(str(d))
    return out


def run_original(sess: ort.InferenceSession, feeds: dict, given: Mapping[str, int] | None,
                 what: str = "original") -> dict[str, np.ndarray]:
    """run() of the user's model; where it fails, the sizes hint only for dims the user did not give
    (``given``: the --dim values)."""
    try:
        return run(sess, feeds, what)
    except RunFailed as e:
        guessed = guessed_dims(sess, given)
        why = (f"{', '.join(guessed)} guessed as 1: set sizes with --dim NAME=VALUE" if guessed else
               "at the sizes given: the model itself does not run on these random inputs")
        raise RunFailed(what, e.first, why) from None


def run(sess: ort.InferenceSession, feeds: dict, what: str) -> dict[str, np.ndarray]:
    names = {i.name for i in sess.get_inputs()}
    try:
        outs = sess.run(None, {k: v for k, v in feeds.items() if k in names}, quiet_run())
    except Exception as e:
        first = error_text(e)
        raise RunFailed(what, first) from None
    return {o.name: v for o, v in zip(sess.get_outputs(), outs, strict=True)}


def relative_error(ref: np.ndarray, got: np.ndarray) -> float:
    """||got - ref|| / ||ref|| (absolute when ref is all zeros); NaN and inf must sit in the same places."""
    if ref.shape != got.shape:
        return float("inf")
    if not np.issubdtype(ref.dtype, np.floating):
        return 0.0 if np.array_equal(ref, got) else float("inf")
    a, b = ref.astype(np.float64), got.astype(np.float64)
    odd_a, odd_b = ~np.isfinite(a), ~np.isfinite(b)
    if not np.array_equal(odd_a, odd_b) or not np.array_equal(a[odd_a], b[odd_b], equal_nan=True):
        return float("inf")
    a, b = np.where(odd_a, 0.0, a), np.where(odd_b, 0.0, b)
    diff, norm = float(np.linalg.norm(a - b)), float(np.linalg.norm(a))
    return diff / norm if norm > 0 else diff


def verify(original: Source, rewritten: Source, batch: int = 1, dims: Mapping[str, int] | None = None,
           seed: int = 0, levels: tuple[str, ...] = ("disabled", "default"),
           given: Mapping[str, int] | None = None) -> Verification:
    """Run both models at each level on the same inputs; every output compared by relative L2 error
    (``given``: the dims the user set, for the message where the original does not run)."""
    result = Verification()
    feeds = None
    for level in levels:
        so = session_options(level)
        ref_sess = open_session(original, so, "original")
        new_sess = open_session(rewritten, so, "rewritten")
        feeds = feeds or make_feeds(ref_sess, batch, dims, seed)
        ref = run_original(ref_sess, feeds, dims if given is None else given)
        got = run(new_sess, feeds, "rewritten")
        result.checks[level] = compare(ref, got)
    return result


# the rewritten model's float64 error may be this multiple of the original's: two float32 computations
# of an ill-conditioned output are off by errors of one size (measured ratios 1.2-2.4 on the tests' GPT-2
# layer), where a kernel that computes something else is off by orders of magnitude more
ROUNDING_FACTOR = 4.0


def explain_by_rounding(original: Source, rewritten: Source, result: Verification, batch: int = 1,
                        dims: Mapping[str, int] | None = None, seed: int = 0) -> None:
    """Where the whole model differs over tolerance while every region agrees: both float32 models against
    the original run in float64 on the same inputs. An output the rewritten model computes within
    ROUNDING_FACTOR x the original's own float64 error differs from the original by accumulated float32
    rounding (the model amplifies the last bits its kernels round differently), not by what a kernel
    computes: marked ``explained`` and said in ``warnings``, with the figures."""
    regions = [c for cs in result.region_checks.values() for c in cs]
    failing = {lvl: [c for c in cs if not c.ok] for lvl, cs in result.checks.items()}
    if not regions or not all(c.ok for c in regions) or not any(failing.values()):
        return
    try:
        double = float64_model(original)
        ref_sess = open_session(double, session_options("disabled"), "original (float64)")
    except FuseError as e:
        result.warnings.append(f"no float64 reference to weigh the whole model's difference against: {e}")
        return
    feeds = None
    for level, checks in failing.items():
        if not checks:
            continue
        so = session_options(level)
        old_sess, new_sess = open_session(original, so, "original"), open_session(rewritten, so, "rewritten")
        feeds = feeds or make_feeds(old_sess, batch, dims, seed)  # verify's inputs: same sizes and seed
        wide = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in feeds.items()}
        ref = run(ref_sess, wide, "original (float64)")
        old, new = run(old_sess, feeds, "original"), run(new_sess, feeds, "rewritten")
        for c in checks:
            if c.dtype != "float32" or c.name not in ref:
                continue
            e_old, e_new = relative_error(ref[c.name], old[c.name]), relative_error(ref[c.name], new[c.name])
            c.rounding = (e_old, e_new)
            c.explained = e_new <= ROUNDING_FACTOR * e_old
            if c.explained:
                worst = max(x.error for x in regions)
                opts = "ORT_DISABLE_ALL" if level == "disabled" else f"onnxruntime's {level}"
                result.warnings.append(
                    f"output {c.name!r} differs from the original's by {c.error:.3g} (> {c.tolerance:g}, "
                    f"{opts} optimizations) "
                    f"while every fused region agrees (largest {worst:.2g}): against the original computed "
                    f"in float64 the original is off by {e_old:.3g} and the rewritten model by {e_new:.3g}, "
                    "so the difference is accumulated float32 rounding; accepted")


def float64_model(src: Source) -> bytes:
    """The model with every float32 tensor as float64 (inputs, outputs, initializers, constants, Cast
    targets), for a reference run; FuseError where it holds what has no float64 form here."""
    import onnx
    from onnx import AttributeProto, TensorProto, helper, numpy_helper

    model = onnx.load_model_from_string(src) if isinstance(src, bytes) else onnx.load(src)
    f32, f64 = TensorProto.FLOAT, TensorProto.DOUBLE

    def wide(t: onnx.TensorProto) -> onnx.TensorProto:
        return numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name)

    g = model.graph
    del g.value_info[:]  # onnxruntime infers them again
    for vi in (*g.input, *g.output):
        if vi.type.tensor_type.elem_type == f32:
            vi.type.tensor_type.elem_type = f64
    for i, t in enumerate(g.initializer):
        if t.data_type == f32:
            g.initializer[i].CopyFrom(wide(t))
    for n in g.node:
        if n.domain not in ("", "ai.onnx"):
            raise FuseError(f"{n.op_type} ({n.domain}) has no float64 form here")
        for i, a in enumerate(n.attribute):
            if a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
                raise FuseError(f"{n.op_type} {n.name} holds a subgraph")
            if a.type == AttributeProto.TENSOR and a.t.data_type == f32:
                a.t.CopyFrom(wide(a.t))
            elif a.name in ("to", "dtype") and a.type == AttributeProto.INT and a.i == f32:
                a.i = f64
            elif n.op_type == "Constant" and a.name in ("value_float", "value_floats"):
                value = np.asarray(helper.get_attribute_value(a), np.float64)
                n.attribute[i].CopyFrom(helper.make_attribute("value", numpy_helper.from_array(value)))
    try:
        return model.SerializeToString()
    except ValueError as e:  # past protobuf's 2 GB
        raise FuseError(f"the float64 copy cannot be serialized ({e})") from None


def compare(ref: dict[str, np.ndarray], got: dict[str, np.ndarray],
            label: Callable[[str], str] = str) -> list[OutputCheck]:
    """One check per output of ``ref``: its relative L2 error in ``got`` against its dtype's tolerance."""
    checks = []
    for name, value in ref.items():
        dtype = str(value.dtype)
        err = relative_error(value, got[name]) if name in got else float("inf")
        checks.append(OutputCheck(label(name), dtype, err, TOLERANCE.get(dtype, 0.0)))
    return checks


def verify_regions(passes: list[list[Case]], opsets, ir_version: int, result: Verification,
                   seed: int = 0, levels: tuple[str, ...] = ("disabled", "default")) -> None:
    """Each pass's distinct regions side by side in one pair of models, run at each level on the same
    seeded inputs; every region output compared by relative L2 error (into ``result.region_checks``)."""
    for cases in passes:
        distinct: dict[str, Case] = {}
        for case in cases:
            if case.signature in distinct:
                distinct[case.signature].copies += 1
            else:
                distinct[case.signature] = case
        chosen = list(distinct.values())
        result.regions += len(cases)
        result.distinct += len(chosen)
        if not chosen:
            continue
        before, after, origin = merged_models(chosen, opsets, ir_version)
        feeds = random_feeds(chosen, seed)
        labels = {name: _region_label(chosen[k], output) for name, (k, output) in origin.items()}
        for level in levels:
            so = session_options(level)
            ref = run(open_session(before.SerializeToString(), so, "regions' original"), feeds,
                      "regions' original")
            try:
                got = run(open_session(cpu_stand_ins(after).SerializeToString(), so, "regions' rewritten"),
                          feeds, "regions' rewritten")
            except FuseError:  # the regions one by one: those whose kernel does not run are left unfused
                got = _one_by_one(chosen, cases, opsets, ir_version, so, seed, origin, ref, result)
            checks = compare(ref, got, labels.__getitem__)
            result.region_checks.setdefault(level, []).extend(checks)
            for name, c in zip(ref, checks, strict=True):
                if not c.ok:  # every copy of a failing region: the same emitter wrote them all
                    sig = chosen[origin[name][0]].signature
                    opts = "ORT_DISABLE_ALL" if level == "disabled" else "default"
                    why = (f"its region differs from the nodes it replaced (relative L2 error {c.error:.3g} "
                           f"> {c.tolerance:g}, onnxruntime {opts} optimizations): left unfused")
                    for case in cases:
                        if case.signature == sig and case.at:
                            result.failed_at.setdefault(case.at, why)


def _one_by_one(chosen: list[Case], cases: list[Case], opsets, ir_version: int, so: ort.SessionOptions,
                seed: int, origin: dict[str, tuple[int, str]], ref: dict[str, np.ndarray],
                result: Verification) -> dict[str, np.ndarray]:
    """The rewritten regions' outputs, each region run alone (on the merged run's inputs); a region
    onnxruntime cannot load or run has no outputs (its checks fail) and its reason in ``failed_at``."""
    got: dict[str, np.ndarray] = {}
    feeds = random_feeds(chosen, seed)
    for k, case in enumerate(chosen):
        _, after, mine = merged_models([case], opsets, ir_version)
        prefix = f"r{k}/"
        own = {f"r0/{n.removeprefix(prefix)}": v for n, v in feeds.items() if n.startswith(prefix)}
        try:
            outs = run(open_session(cpu_stand_ins(after).SerializeToString(), so, "region's rewritten"),
                       own, "region's rewritten")
        except FuseError as e:
            first = e.first if isinstance(e, RunFailed) else str(e)
            why = f"onnxruntime cannot run its kernel ({first}; a fusecli bug): left unfused"
            for c in cases:
                if c.signature == case.signature and c.at:
                    result.failed_at.setdefault(c.at, why)
            continue
        back = {out: name for name, (j, out) in origin.items() if j == k}  # the region's own output names
        got.update({back[mine[n][1]]: v for n, v in outs.items() if mine[n][1] in back})
    return got


def _region_label(case: Case, output: str) -> str:
    """'attention -> MultiHeadAttention ('y', 12 identical regions)'."""
    copies = f", {case.copies} identical regions" if case.copies > 1 else ""
    return f"{case.label} ({output!r}{copies})"


@dataclass
class Timing:
    label: str
    median_ms: float
    runs: int
    times_ms: list[float] = field(default_factory=list)  # every timed run, for the spread


def bench(sources: list[tuple[str, Source, str]], batch: int = 1, dims: Mapping[str, int] | None = None,
          threads: int | None = None, warmup: int = 10, runs: int = 50, seed: int = 0) -> list[Timing]:
    """Median latency of each (label, model, level); runs interleaved (order rotated), spinning off."""
    threads = threads or default_threads()
    sessions = [open_session(src, session_options(level, threads, spinning=False), label)
                for label, src, level in sources]
    feeds = make_feeds(sessions[0], batch, dims, seed)
    per = [{i.name for i in s.get_inputs()} for s in sessions]
    feeds_of = [{k: v for k, v in feeds.items() if k in names} for names in per]
    quiet = quiet_run()
    for (label, _, _), s, f in zip(sources, sessions, feeds_of, strict=True):  # warm-up; a failure is named
        for _ in range(warmup):
            run(s, f, label)
    times: list[list[float]] = [[] for _ in sessions]
    n = len(sessions)
    for r in range(runs):
        for k in range(n):
            i = (r + k) % n
            t0 = time.perf_counter()
            sessions[i].run(None, feeds_of[i], quiet)
            times[i].append(time.perf_counter() - t0)
    return [Timing(label, statistics.median(ts) * 1e3, runs, [x * 1e3 for x in ts])
            for (label, _, _), ts in zip(sources, times, strict=True)]


def default_threads() -> int:
    """The thread count both sessions get: the CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def ort_optimized(src: Source, out_path: str, level: str = "extended") -> str:
    """ONNX Runtime's own offline optimization of ``src`` (CPU provider) written to ``out_path``."""
    so = session_options(level)
    so.optimized_model_filepath = out_path
    # weights go to a data file beside it, so a model that had external data stays loadable from there
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                os.path.basename(out_path) + ".data")
    so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    open_session(src, so, "original")
    return out_path

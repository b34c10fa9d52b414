"""Output rules for every command: where fusecli may write, and writing atomically.

``check_output`` runs before any work: the target must be a regular file (or not exist yet) in an
existing, writable folder, end in an extension the command writes, and be no file of an input (the
model, a SavedModel folder's files, an ONNX model's external data; symlinks and hard links resolved).
``atomic_write`` writes to ``.fusecli-<pid>-<random>.part`` beside the target and renames it into
place; an error or a signal leaves the old file as it was, and a later run removes parts whose process
is gone (SIGKILL). ``scratch_dir`` does the same for temporary folders.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from typing import TextIO

from .errors import FuseError, error_text

PART_PREFIX = ".fusecli-"
SCRATCH_PREFIX = "fusecli-scratch-"
_PID = re.compile(r"-(\d+)-")
MAX_INPUT_FILES = 100_000  # files of a SavedModel folder compared with the target (hard links)
JSON_SLICE = 1000  # list items encoded at once: json's C encoder does the work, a slice stays small
# json.dumps's own encoder without its check for circular references (a document is a tree): the same
# text, a tenth faster on a 100k-node model's document
_ENCODE = json.JSONEncoder(check_circular=False).encode


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, someone else's
        return True
    return True


def _stale(name: str, prefix: str) -> bool:
    """A temp name of ours (``<prefix><pid>-...``) whose process no longer runs."""
    if not name.startswith(prefix):
        return False
    m = _PID.match(name[len(prefix) - 1:])
    return m is not None and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1)))


def remove_stale(folder: str, prefix: str = PART_PREFIX) -> list[str]:
    """Remove temp files/folders left in ``folder`` by a killed fusecli; the names removed."""
    removed = []
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            if _stale(name, prefix):
                path = os.path.join(folder, name)
                with contextlib.suppress(OSError):
                    if os.path.isdir(path) and not os.path.islink(path):
                        shutil.rmtree(path)
                    else:
                        os.unlink(path)
                    removed.append(name)
    return removed


def os_error(path: str, e: OSError) -> FuseError:
    """One line for an OSError while writing ``path`` (permission, disk full, read-only, ...)."""
    why = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
           errno.EACCES: "permission denied", errno.EPERM: "permission denied",
           errno.EROFS: "read-only file system"}.get(e.errno, e.strerror or type(e).__name__)
    return FuseError(f"{path}: cannot write ({why}); nothing written")


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "wb", check: Callable[[str, str], None] | None = None):
    """Yield a file object; on success it replaces ``path`` whole, on any error nothing is left behind.
    ``check(written, path)``, when given, reads the written part (beside ``path``) before it replaces
    ``path``; what it raises leaves ``path`` as it was."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FuseError(f"{path}: the folder {folder} does not exist")
    remove_stale(folder)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f"{PART_PREFIX}{os.getpid()}-", suffix=".part", dir=folder)
    except OSError as e:
        raise os_error(path, e) from None
    try:
        with os.fdopen(fd, mode) as f:
            yield f
        if check is not None:
            check(tmp, path)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; outputs get the usual permissions
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and not isinstance(e, BrokenPipeError):
            raise os_error(path, e) from None
        raise


def check_model_file(written: str, path: str, original: str | None = None,
                     session_source: Callable[[str], str | bytes] | None = None) -> None:
    """Refuse (FuseError, one line) the ONNX model file ``written``, to be ``path``, when onnx's full
    checker or, where onnxruntime is installed, an onnxruntime session does not take it. Read by path:
    its external data (past 2 GiB) is found beside it. A complaint the ``original`` model (the input)
    has as well is the user's file, not fusecli's doing (a graph output of unknown rank, a custom op):
    it stands. So does the checker's about an op onnx has no schema for at all (onnxruntime's
    SimplifiedLayerNormalization, which it registers in the ONNX domain): onnxruntime judges that one.
    ``session_source`` (the written file's path -> what the session loads): rewrite's CPU stand-ins for a
    kernel onnxruntime has on CUDA only."""
    def session_failure(p: str) -> str | None:
        return _session_failure(p, None if session_source is None or p != written else session_source(p))

    checks = (("the model fails onnx's checker", _checker_failure),
              ("onnxruntime cannot load the model", session_failure))
    for what, failure_of in checks:
        failure = failure_of(written)
        if failure is None or (failure_of is _checker_failure and _unknown_op(failure)):
            continue
        if original is None or failure_of(original) != failure:
            raise FuseError(f"{path}: {what} ({failure}); nothing written")


def _unknown_op(failure: str) -> bool:
    """Whether the checker's complaint is an op of the ONNX domain that onnx has no schema for in any
    version (one onnxruntime registers there); an op onnx has, at another opset, is a real complaint."""
    import onnx

    m = re.match(r"No Op registered for (\w+) with domain_version", failure)
    return m is not None and not onnx.defs.has(m.group(1))


def _checker_failure(path: str) -> str | None:
    """onnx's full check of the model file at ``path``: its complaint as one line, or None."""
    import onnx

    try:
        onnx.checker.check_model(path, full_check=True)
    except Exception as e:  # onnx's checker raises C++-mapped types
        return _without_path(error_text(e), path)
    return None


def _session_failure(path: str, source: str | bytes | None = None) -> str | None:
    """Why onnxruntime (CPU, optimizations off) cannot load the model file at ``path`` (or ``source``, what
    stands in for it), as one line; None when it loads it or is not installed."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    ort.set_default_logger_severity(4)  # its own log lines stay off the terminal: fusecli says why
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    try:
        ort.InferenceSession(path if source is None else source, so, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime's own error types
        return _without_path(error_text(e), path)
    return None


def type_refusal(path: str) -> str | None:
    """onnxruntime's complaint when it refuses the model at ``path`` for a type no op takes (a complex64
    Conv bias): the model is invalid, whatever fusecli would make of it. None when it loads, or refuses it
    for another reason (an op or domain it has no kernel for: fusecli still reads those)."""
    failure = _session_failure(path)
    return failure if failure is not None and "Type Error" in failure else None


def _without_path(text: str, path: str) -> str:
    """A message about the file at ``path`` with the file called 'the model' (a part file's name means
    nothing to the user, and two files' complaints compare equal)."""
    return text.replace(path, "the model").replace(os.path.basename(path), "the model")


@contextlib.contextmanager
def scratch_dir(what: str):
    """A temporary folder named ``fusecli-scratch-<pid>-<what>-...``, removed on exit (and by a later
    run when a killed process left it)."""
    base = tempfile.gettempdir()
    remove_stale(base, SCRATCH_PREFIX)
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-{what}-", dir=base) as d:
        yield d


def input_files(path: str) -> list[str]:
    """Files a model input consists of: the file itself, a SavedModel folder's files, an ONNX model's
    external data files (read from its structure only when asked, see ``check_output``)."""
    if os.path.isdir(path):
        files = []
        for root, _, names in os.walk(path):
            files += [os.path.join(root, n) for n in names]
            if len(files) > MAX_INPUT_FILES:
                break
        return files
    return [path] if os.path.exists(path) else []


def _external_data(path: str) -> list[str]:
    """External data files named by the ONNX model at ``path`` (an unreadable model names none: the
    loader reports it)."""
    try:
        import onnx

        from ..load.onnx_wire import read_structure

        model, _ = read_structure(path)
    except Exception:
        return []
    folder = os.path.dirname(os.path.abspath(path))
    out = []
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            loc = next((e.value for e in t.external_data if e.key == "location"), "")
            if loc:
                out.append(os.path.join(folder, loc))
    return out


def _inside(child: str, folder: str) -> bool:
    child, folder = os.path.realpath(child), os.path.realpath(folder)
    return child == folder or child.startswith(folder.rstrip(os.sep) + os.sep)


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # ValueError: a NUL byte in a name the model holds (the loader refuses it)
        return False


def check_output(path: str, inputs: list[str], formats: tuple[str, ...], option: str = "-o") -> str:
    """Refuse, before any work, an output that fusecli must not or cannot write; its format (extension).

    FuseError (exit 1) for a folder, a device or other non-regular file, a file of an input, a missing
    or unwritable folder; click.BadParameter (usage, exit 2) for an extension ``formats`` lacks.
    """
    import click

    fmt = os.path.splitext(path)[1].lower().lstrip(".")
    if path.endswith(("/", os.sep)) or os.path.isdir(path):
        raise FuseError(f"{option} {path}: is a folder; give a file name")
    if os.path.lexists(path):
        try:
            st = os.stat(path)
        except OSError:
            st = None  # a dangling symlink: replaced by the new file
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise FuseError(f"{option} {path}: not a regular file (a device, pipe or socket); refused")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FuseError(f"{option} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise FuseError(f"{option} {path}: cannot write in {folder} (permission denied)")
    for i in inputs:
        if not os.path.exists(i):
            continue
        if os.path.isdir(i) and _inside(path, i):
            raise FuseError(f"{option} {path}: inside the input SavedModel folder {i}; refusing to write "
                            "into an input")
        if os.path.basename(i) == "saved_model.pb" and _inside(path, os.path.dirname(os.path.abspath(i))):
            raise FuseError(f"{option} {path}: inside the input SavedModel folder; refusing to write into "
                            "an input")
        if not os.path.exists(path):
            continue
        files = input_files(i)
        if os.path.isfile(i) and os.path.basename(i) != "saved_model.pb":
            files += _external_data(i)
        if any(_same(path, f) for f in files):
            raise FuseError(f"{option} {path}: refusing to overwrite the input model (a file of {i})")
    if fmt not in formats:
        raise click.BadParameter(f"{path!r}: the file name must end in "
                                 f"{', '.join('.' + f for f in formats)}", param_hint=option)
    return fmt


def refuse_overwriting_input(output: str, inputs: list[str]) -> None:
    """Never write over the model being read (or a file it consists of)."""
    for i in inputs:
        if os.path.exists(output) and any(_same(output, f) for f in input_files(i)):
            raise FuseError(f"{output}: refusing to overwrite the input model")


def write_json(doc, stream: TextIO, indent: int | None = None) -> None:
    """``json.dumps(doc, indent=indent)`` and a newline written to ``stream`` (what ``click.echo`` writes);
    compact, a piece at a time (``json_pieces``), so that a big model's document is never one string."""
    if indent is not None:  # for a person at a terminal: json's Python encoder, one string
        stream.write(json.dumps(doc, indent=indent) + "\n")
    else:
        for piece in json_pieces(doc):
            stream.write(piece)
        stream.write("\n")
    stream.flush()


def json_pieces(doc, depth: int = 2) -> Iterator[str]:
    """``json.dumps(doc)`` (compact, the default separators) in pieces: the dicts and long lists of the
    top ``depth`` levels are opened here, long lists a slice at a time; the rest by json's C encoder."""
    if depth and type(doc) is dict and doc and all(type(k) is str for k in doc):
        sep = "{"
        for key, value in doc.items():
            yield sep + _ENCODE(key) + ": "
            yield from json_pieces(value, depth - 1)
            sep = ", "
        yield "}"
    elif depth and type(doc) is list and len(doc) > JSON_SLICE:
        sep = "["
        for start in range(0, len(doc), JSON_SLICE):
            yield sep + _ENCODE(doc[start:start + JSON_SLICE])[1:-1]  # the items, without [ ]
            sep = ", "
        yield "]"
    else:
        yield _ENCODE(doc)

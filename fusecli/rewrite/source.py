"""The model to rewrite, with its weights: an ONNX file, or a SavedModel folder converted by tf2onnx."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import onnx
from onnx import external_data_helper

from ..core.errors import FuseError, error_text
from ..core.progress import stage
from ..load import load_model
from ..load.onnx import external_location, tensors_of
from ..load.onnx_wire import read_structure
from ..memory.sizes import model_variables
from .graph.converted import fix_conversion

SAVEDMODEL_OPSET = 17


@dataclass
class Source:
    """``onnx_path``: an ONNX file of the model (the input, or the converted SavedModel in a temp folder)."""

    path: str
    onnx_path: str
    converted: bool = False
    protected: list[str] = field(default_factory=list)  # files an output must never replace


def is_savedmodel(path: str) -> bool:
    return os.path.isdir(path) or (os.path.basename(path) == "saved_model.pb" and os.path.isfile(path))


def external_files(model: onnx.ModelProto, path: str) -> list[str]:
    """The external data files the model at ``path`` reads (from any tensor: attributes and subgraphs too)."""
    folder = os.path.dirname(os.path.abspath(path))
    files = set()
    for _, t in tensors_of(model):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            loc = external_location(t)
            if loc:
                files.add(os.path.join(folder, loc))
    return sorted(files)


def open_source(path: str, workdir: str, signature: str | None = None) -> Source:
    """An ONNX file as it is; a SavedModel folder converted to ``workdir``/model.onnx."""
    if not is_savedmodel(path):
        if signature is not None:
            raise FuseError(f"{path}: --signature applies to SavedModel folders only")
        return Source(path, path, protected=[path])
    folder = os.path.dirname(path) if os.path.isfile(path) else path
    # fusecli's own reader first: a bad folder, file or signature is one clear line, before TensorFlow
    # is imported (and prints its start-up logs) for the conversion
    signature = signature or "serving_default"  # the signature analyze reads, not tf2onnx's first
    graph = load_model(folder, signature)
    model_variables(graph)  # names the inputs' open dims as analyze does: batch, <input>_dim<k>
    input_dims = {t.name: t.shape for t in graph.inputs if t.shape is not None}
    del graph
    out = os.path.join(workdir, "model.onnx")
    stage("converting the SavedModel with tf2onnx")
    model = convert_savedmodel(folder, signature)
    fix_conversion(model, input_dims, folder)
    save_plain(model, out)
    del model
    gc.collect()  # the ModelProto and TensorFlow's graph of it, before verification opens sessions
    return Source(path, out, converted=True)


@contextlib.contextmanager
def quiet() -> Iterator[list[str]]:
    """TensorFlow's C++ logs, absl, tf2onnx's logging and Python warnings kept off the terminal: file
    descriptors 1 and 2 point at a scratch file meanwhile; the yielded list gets its lines."""
    lines: list[str] = []
    loggers = [logging.getLogger(n) for n in ("tf2onnx", "tensorflow", "absl")]
    levels = [lg.level for lg in loggers]
    with tempfile.TemporaryFile(mode="w+b") as sink, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        saved = []
        for fd in (1, 2):
            try:
                saved.append((fd, os.dup(fd)))
            except OSError:
                continue
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for fd, _ in saved:
            os.dup2(sink.fileno(), fd)
        try:
            yield lines
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            for fd, copy in saved:
                os.dup2(copy, fd)
                os.close(copy)
            for lg, level in zip(loggers, levels, strict=True):
                lg.setLevel(level)
            sink.seek(0)
            lines += sink.read().decode(errors="replace").splitlines()


def convert_savedmodel(folder: str, signature: str | None = None,
                       opset: int = SAVEDMODEL_OPSET) -> onnx.ModelProto:
    """SavedModel folder -> ModelProto with tf2onnx (its serving signature, TensorFlow imported here only)."""
    if not os.path.isfile(os.path.join(folder, "saved_model.pb")):
        raise FuseError(f"{folder}: a folder without saved_model.pb is not a SavedModel")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with quiet():
        try:
            import tensorflow as tf
            from tf2onnx import tf_loader
            from tf2onnx.convert import _convert_common
        except ImportError as e:
            missing = e.name or str(e)
        else:
            missing = None
    if missing is not None:
        raise FuseError(f"rewriting a SavedModel needs TensorFlow and tf2onnx ({missing} is missing); "
                        "install the tf extra: pip install 'fusecli[tf]'")
    error = None
    with quiet():
        try:
            graph_def, inputs, outputs, tables, renames = tf_loader.from_saved_model(
                folder, None, None, signatures=[signature] if signature else None,
                return_initialized_tables=True, return_tensors_to_rename=True)
            with tf.device("/cpu:0"):
                model, _ = _convert_common(graph_def, name=os.path.basename(os.path.normpath(folder)),
                                           opset=opset, input_names=inputs, output_names=outputs,
                                           tensors_to_rename=renames, initialized_tables=tables,
                                           optimizers=_optimizers())
            del graph_def
        except Exception as e:  # tf2onnx raises anything; the user gets one line
            error = error_text(e)
        finally:
            gc.collect()  # TensorFlow's loaded SavedModel object goes with the call's frames
    if error is not None:
        raise FuseError(f"{folder}: tf2onnx could not convert the SavedModel: {error}")
    return model


def _optimizers() -> dict:
    """tf2onnx's graph optimizers but its einsum lowering: Keras's attention einsums stay Einsum ops
    (MultiHeadAttention's emitter reads their equations; lowered, they are 5-D reshapes and transposes)."""
    from tf2onnx import optimizer

    return {name: o for name, o in optimizer._optimizers.items() if name != "einsum_optimizer"}


def load_weights(path: str) -> tuple[onnx.ModelProto, list[str]]:
    """The model with its weights left where they are: large raw payloads (initializers and Constant
    nodes) become external data references to the model file itself, read only when a fold asks for
    them (``Weights``) or when the model is written (``restore_weights``); and the external data files
    it reads (the analysis checked where they point)."""
    try:
        model, _ = read_structure(path, external=True)
    except Exception as e:
        first = error_text(e)
        raise FuseError(f"{path}: cannot read the model's weights: {first}") from None
    own = os.path.abspath(path)
    return model, [f for f in external_files(model, path) if os.path.abspath(f) != own]


def restore_weights(model: onnx.ModelProto, path: str) -> None:
    """Read every payload still left in a file (``load_weights``) into the model, for writing it out."""
    try:
        external_data_helper.load_external_data_for_model(model, os.path.dirname(os.path.abspath(path)))
    except Exception as e:
        first = error_text(e)
        raise FuseError(f"{path}: cannot read the model's weights: {first}") from None


def save_plain(model: onnx.ModelProto, path: str) -> None:
    """Save to a scratch path; external data beside it when the weights pass 2 GB."""
    from .graph.save import needs_external_data

    if needs_external_data(model):
        onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=os.path.basename(path) + ".data", size_threshold=1024)
    else:
        onnx.save_model(model, path)

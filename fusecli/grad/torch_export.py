"""Which float initializers of a dynamo export PyTorch differentiates: what torch.export says about them.

The dynamo exporter writes the ExportedProgram's graph signature into the graph's metadata (one line per
input: ``name: KIND target='module.path'``, KIND one of PARAMETER, BUFFER, CONSTANT_TENSOR, ...), marks
each initializer it keeps with its ``InputSpec.kind``, and onnxscript's optimizer marks each initializer
it made by constant folding with ``folded_from`` (the values and nodes it folded). A folded initializer
is a parameter when it was folded from one (a transposed weight, an expanded class token), else a value
computed at export time from buffers and constants (rotary cos/sin from ``inv_freq``), which PyTorch
never differentiates. The loader keeps these notes in ``graph.meta["export"]`` and ``tensor.meta["export"]``.
Without a signature (TorchScript exports) a float initializer stays a parameter, but for these rules: an
RMSNorm's weight, or a conv's weight (its bias not folded), TorchScript folded is made each step
(``torchscript_norm_weights``, ``torchscript_conv_weights``); and, as the TorchScript
exporter writes a buffer as it writes a parameter (both are in the state_dict; a value it folds from either
is named ``onnx::Op_N``), so only what the model does with it can tell, a float initializer that reaches the
model's data only through Cos or Sin of values computed from shapes and constants (``frequency_tables``:
rotary ``inv_freq`` times the positions, ESM's persistent ``nn.Buffer``) is taken for a buffer; a learned
frequency would be misread so, and the analysis says it assumed this.
"""

from __future__ import annotations

import ast
import re

from ..core.casts import Rewrite, noop_float32_cast
from ..core.ir import FLOAT_DTYPES, LOWER_FLOAT_DTYPES, Graph, Node, Tensor, redirect, unique_name
from ..core.kinds import DATA_DEPENDENT_KINDS, value_inputs

SIGNATURE = "pkg.torch.export.ExportedProgram.graph_signature"
KIND = "pkg.torch.export.graph_signature.InputSpec.kind"
FOLDED = "pkg.onnxscript.optimizer.folded_from"
_INPUT = re.compile(r"^(\w+): (\w+) target='([^']*)'", re.M)


def frozen_parameters(graph: Graph) -> set[str]:
    """Names of the graph's parameters that torch.export says are not PyTorch parameters."""
    signature = (graph.meta.get("export") or {}).get(SIGNATURE)
    if not signature:
        return frequency_tables(graph) | sinusoidal_tables(graph)
    params = {n for name, kind, target in _INPUT.findall(signature) if kind == "PARAMETER"
              for n in (name, target)}
    verdict: dict[str, bool] = {}

    def trainable(t: Tensor, depth: int = 0) -> bool:
        if t.name not in verdict:
            notes = t.meta.get("export") or {}
            kind, folded = notes.get(KIND), _sources(notes.get(FOLDED))
            base = graph.tensors.get(t.meta.get("view_of", ""))
            if base is not None and base is not t:  # a view of a parameter (load.common.mark_parameter_views)
                verdict[t.name] = trainable(base, depth + 1)
            elif kind is not None:
                verdict[t.name] = kind == "PARAMETER"
            elif folded is None or depth > 16:
                verdict[t.name] = True  # no note: as the loader says
            else:
                verdict[t.name] = any(s in params or (s in graph.tensors and s != t.name
                                                      and graph.tensors[s].kind == "parameter"
                                                      and trainable(graph.tensors[s], depth + 1))
                                      for s in folded)
        return verdict[t.name]

    return {t.name for t in graph.tensors.values() if t.kind == "parameter" and not trainable(t)} \
        | sinusoidal_tables(graph)


def sinusoidal_tables(graph: Graph) -> set[str]:
    """Names of the sinusoidal position tables the loader found by their values (load.position_tables):
    ``nn.Embedding(..., _freeze=True)`` (RoFormer, Marian) has ``requires_grad=False``, which no export
    records, so a signature's PARAMETER does not make them trained."""
    return {t.name for t in graph.tensors.values() if t.meta.get("sinusoidal") and t.kind == "parameter"}


def sinusoidal_note(graph: Graph) -> str | None:
    """What ``sinusoidal_tables`` assumed, said out loud (None where it found none)."""
    found = sorted(sinusoidal_tables(graph))
    if not found:
        return None
    names = ", ".join(repr(n) for n in found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    many = len(found) > 1
    return (f"assumed: {len(found)} position table{'s' if many else ''} ({names}) taken for fixed, not "
            f"trained: {'their' if many else 'its'} values are sin/cos of position / 10000^(2i/d), as "
            "nn.Embedding(..., _freeze=True) writes them, and no export says requires_grad")


def made_each_step(graph: Graph) -> set[str]:
    """Names of the initializers of a dynamo export that eager PyTorch computes from a trainable
    parameter at every step, by an op that is no view: autocast's bf16 copy of a weight (``_to_copy``),
    Gemma's ``1 + w`` (``add``), which onnxscript's optimizer folded into initializers. Read from the
    torch.export node names the initializer and what it was folded from carry (``add_589``,
    ``_to_copy_1``); a weight's transpose, view or slice (``t``, ``view``, ``slice``) stays a weight."""
    signature = (graph.meta.get("export") or {}).get(SIGNATURE)
    if not signature:
        return torchscript_norm_weights(graph) | torchscript_conv_weights(graph)
    params = {n for name, kind, target in _INPUT.findall(signature) if kind == "PARAMETER"
              for n in (name, target)}
    frozen = frozen_parameters(graph)
    out = set()
    for t in graph.tensors.values():
        if t.kind != "parameter" or t.producer is not None or t.name in params or t.name in frozen:
            continue
        folded = _sources((t.meta.get("export") or {}).get(FOLDED)) or []
        computed = any(_computes(s) for s in (t.name, *folded) if s not in params)
        if computed and any(s in params for s in folded):
            out.add(t.name)
    return out


def folded_away(graph: Graph, name: str) -> bool:
    """Whether the parameters initializer ``name`` was folded from are gone from the export, where eager
    PyTorch holds them for the whole step: TorchScript keeps no parameter it folded (``g`` and ``v`` of a
    weight norm, Gemma's ``w``); onnxscript's ``folded_from`` names what it folded, some maybe still read."""
    t = graph.tensors[name]
    folded = _sources((t.meta.get("export") or {}).get(FOLDED))
    return folded is None or not any(s != name and s in graph.tensors and graph.tensors[s].kind == "parameter"
                                     for s in folded)


def torchscript_norm_weights(graph: Graph) -> set[str]:
    """Names of the RMSNorm weights of a TorchScript export that eager PyTorch computes from a parameter at
    every step: TorchScript keeps a parameter read as it is under its own name and names a value it folded
    for its reader (``onnx::Mul_569``), so a norm weight so named was computed (Gemma's ``1 + w``); a
    matmul's folded weight is its transpose, a view."""
    if graph.meta.get("producer") != "pytorch":
        return set()
    from .composites import PYTORCH_COMPOSITES, find_regions

    out = set()
    for r in find_regions(graph, tuple(c for c in PYTORCH_COMPOSITES if c.name == "rms_norm")):
        root = r.nodes[-1]
        normed = r.reads[2] if len(r.reads) > 2 else root.outputs[0]
        if normed is root.outputs[0]:  # no weight
            continue
        w = root.inputs[1] if root.inputs[0] is normed else root.inputs[0]
        if w is not None and w.producer is None and w.kind == "parameter" and w.name.startswith("onnx::"):
            out.add(w.name)
    return out


def torchscript_conv_weights(graph: Graph) -> set[str]:
    """Names of the conv weights of a TorchScript export that eager PyTorch computes from parameters at every
    step: TorchScript folds a weight-normalised conv's ``g * v / ||v||`` (its arithmetic, not the op that
    runs it) into one initializer named for its reader (``onnx::Conv_25``), where a conv reading its weight
    as it is reads it by its own name. Folding BatchNorm into the conv (an eval export) renames the bias
    too, and eager runs that conv on the parameter itself: a conv whose bias was folded is left alone."""
    if graph.meta.get("producer") != "pytorch":
        return set()
    out = set()
    for node in graph.nodes:
        w = node.input(1) if node.op_type in ("Conv", "ConvTranspose") else None
        b = node.input(2)
        if w is not None and w.producer is None and w.kind == "parameter" and w.name.startswith("onnx::") \
                and (b is None or not b.name.startswith("onnx::")):
            out.add(w.name)
    return out


_STATE_KEY = re.compile(r"^\w+(\.\w+)*$")  # a state_dict key: "1.weight", "alpha", "encoder.layer.0.scale"
_PARAMETER_NAME = re.compile(r"\.(weight|bias)$")


def scalar_parameters(graph: Graph) -> tuple[list[Tensor], list[Tensor], list[str]]:
    """One-element float initializers the loader took for constants (an epsilon, 1/sqrt(d)) that PyTorch
    trains (nn.PReLU()'s one slope, a ReZero alpha, a learned temperature), made parameters here, in place:
    (those the export says are parameters, those assumed so). Dynamo's signature says it (PARAMETER, or a
    value onnxscript folded from one: PReLU's slope reshaped to (1, 1), ``folded_from`` '1.weight'); a
    TorchScript export names parameters and buffers alike by their state_dict key, so a scalar named
    ``<module>.weight`` or ``<module>.bias``, or PRelu's slope (nn.PReLU's weight, which it folds to
    ``onnx::PRelu_N``), is assumed a parameter (said); another state_dict key stays a constant (said too:
    a trained one would be missed)."""
    if graph.meta.get("producer") != "pytorch":
        return [], [], []
    scalars = [t for t in graph.tensors.values() if t.kind == "constant" and t.producer is None
               and t.dtype in FLOAT_DTYPES and t.shape is not None
               and all(d == 1 for d in t.shape) and "value" in t.meta]
    signature = (graph.meta.get("export") or {}).get(SIGNATURE)
    said, assumed = [], []
    if signature:
        params = {n for name, kind, target in _INPUT.findall(signature) if kind == "PARAMETER"
                  for n in (name, target)}
        for t in scalars:
            notes = t.meta.get("export") or {}
            folded = _sources(notes.get(FOLDED)) or []
            if notes.get(KIND) == "PARAMETER" or any(s in params for s in folded):
                said.append(t)
    else:
        assumed = [t for t in scalars if (_STATE_KEY.match(t.name) and _PARAMETER_NAME.search(t.name))
                   or any(c.op_type == "PRelu" and c.input(1) is t for c in t.consumers)]
    for t in (*said, *assumed):
        t.kind = "parameter"
    kept = [t.name for t in scalars if not signature and _STATE_KEY.match(t.name) and t not in assumed]
    return said, assumed, kept


def scalar_parameter_note(assumed: list[Tensor], kept: list[str]) -> str | None:
    """What ``scalar_parameters`` assumed of a TorchScript export, said out loud (None where nothing)."""
    if not assumed and not kept:
        return None
    parts = []
    if assumed:
        parts.append(f"{len(assumed)} one-element weight{'s' if len(assumed) > 1 else ''} "
                     f"({', '.join(repr(t.name) for t in assumed[:3])}{', ...' if len(assumed) > 3 else ''}) "
                     "taken for trained parameters, by their names or as PRelu's slope")
    if kept:
        parts.append(f"{len(kept)} other one-element state_dict value{'s' if len(kept) > 1 else ''} "
                     f"({', '.join(repr(n) for n in kept[:3])}{', ...' if len(kept) > 3 else ''}) taken for "
                     "constants (buffers); if trained, their gradients and what they read are not counted")
    return ("assumed: " + "; ".join(parts) + ": a TorchScript export names parameters and buffers alike "
            "(a dynamo export's signature tells them apart)")


def softmax_dtypes(graph: Graph) -> int:
    """``softmax(x, dim, dtype=torch.float32)`` on a lower-precision x (Gemma's eager attention under
    ``model.to(bfloat16)``) computes in float32 and keeps its float32 output for backward, and the model's
    ``.to(x.dtype)`` makes the copy the next matmul reads; the dynamo export drops both casts (its Softmax
    reads and writes bfloat16; the FX node, ``softmax_dtype``, still says float32). Both put back, in
    place: a Cast up before the Softmax, its output in that dtype, a Cast down for its readers. Returns
    how many softmaxes. A TorchScript export's softmax(x, dtype=float32).to(q.dtype) of an fp32 model
    (traced_softmax_dtypes) is marked so too, for --precision's model cast."""
    traced_softmax_dtypes(graph)
    rw = Rewrite(graph)
    fixed = 0
    for node in list(graph.nodes):
        want = node.meta.get("softmax_dtype")
        x = node.inputs[0] if node.inputs else None
        y = node.outputs[0] if node.outputs else None
        if want is None or x is None or y is None or x.dtype == want or x.dtype not in LOWER_FLOAT_DTYPES:
            continue
        rw.around(node, want, y.dtype)
        y.dtype = want
        fixed += 1
    rw.finish()
    return fixed



_FX_INDEX = re.compile(r"_\d+$")


def unmerge_subexpressions(graph: Graph, views: frozenset[str]) -> int:
    """An op eager runs twice on the same inputs (CohereLayerNorm's ``x - mean``, once for the variance
    and once for the normalisation, each kept by its reader's backward) that the dynamo export's
    common-subexpression pass merged into one: a reader whose FX node names one argument no tensor of
    the graph has (``sub_41``) and reads, in its place, the output of an FX op of the same kind
    (``sub_34``, FX names being the op's and a count) that another reader names, gets its own copy made
    right before it, as eager made it. Views (``views``, slices) cost nothing and are left merged.
    Returns how many copies."""
    copied = 0
    for node in list(graph.nodes):
        call = node.meta.get("fx_call")
        if call is None or node.phase != "forward":
            continue
        missing = [a for a in dict.fromkeys(call[1]) if a not in graph.tensors]
        strangers = [t for t in dict.fromkeys(node.inputs) if t is not None and t.name not in call[1]]
        if len(missing) != 1 or len(strangers) != 1:
            continue
        t, name = strangers[0], missing[0]
        p = t.producer
        if p is None or len(p.outputs) != 1 or p.kind in views or p.kind == "slice" \
                or p.meta.get("fx_call", ("",))[0] != t.name \
                or _FX_INDEX.sub("", name) != _FX_INDEX.sub("", t.name) \
                or not any(t.name in c.meta.get("fx_call", ("", ()))[1] for c in t.consumers
                           if c is not node):
            continue
        copy = graph.tensor(unique_name(name, graph.tensors), dtype=t.dtype, shape=t.shape, kind=t.kind)
        copy.meta.update(t.meta)
        made = graph.add_node(Node(graph.unique_node_name(f"{p.name}.{name}"), p.op_type, p.kind,
                                   list(p.inputs), [copy], dict(p.attrs), p.domain, p.phase,
                                   {**p.meta, "fx_call": (name, p.meta["fx_call"][1])}))
        redirect([node], t, copy)
        graph.nodes.remove(made)
        graph.nodes.insert(graph.nodes.index(node), made)
        copied += 1
    return copied


def traced_softmax_dtypes(graph: Graph) -> int:
    """Marks ``softmax_dtype`` float32 on the TorchScript forms of a softmax computed in float32 and
    cast back, in an fp32 export: ``softmax(x, dim, dtype=torch.float32).to(q.dtype)`` (transformers'
    eager attention: the exporter writes softmax's dtype as a Cast after the Softmax, and the trace's
    ``.to`` another: two float32 to float32 casts in a row) and ``softmax(x.float(), dim).to(v.dtype)``
    (MPT's: a cast before, one after); ``softmax(x).type(v.dtype)`` (GPT-2's, computed in the model's
    dtype) leaves one cast after and none before. The model cast of --precision then computes it in
    float32, as PyTorch does. Returns how many."""
    marked = 0
    for node in graph.nodes:
        if node.op_type != "Softmax" or "softmax_dtype" in node.meta or not node.inputs or not node.outputs:
            continue
        x, y = node.inputs[0], node.outputs[0]
        if x is None or y is None or x.dtype != "float32" or len(y.consumers) != 1:
            continue
        first = y.consumers[0]
        up = x.producer is not None and noop_float32_cast(x.producer)
        if noop_float32_cast(first) and first.outputs[0] is not None \
                and (up or any(noop_float32_cast(c) for c in first.outputs[0].consumers)):
            node.meta["softmax_dtype"] = "float32"
            marked += 1
    return marked


def folded_batch_norms(graph: Graph) -> list[str]:
    """The convolutions of a PyTorch export a BatchNorm was folded into (an eval-mode export): dynamo's,
    which onnxscript's FuseBatchNormIntoConv made (named for the BatchNorm's module; among the node's
    rules, as a bias-free conv's 'FuseBatchNormIntoConv, RemoveOptionalBiasFromConv'), and TorchScript's,
    whose weight and bias are both values the exporter computed (``onnx::Conv_25``, ``onnx::Conv_26``:
    its eval peephole folds the BatchNorm's scale into the weight and its shift into the bias; a bias
    equal to another's is read through an Identity of it)."""
    if graph.meta.get("producer") != "pytorch":
        return []
    found = []
    for node in graph.nodes:
        if node.op_type not in ("Conv", "ConvTranspose"):
            continue
        if "FuseBatchNormIntoConv" in node.meta.get("rewritten_by", ()):
            found.append(node.meta.get("module") or node.name)
            continue
        if all(_computed_initializer(t) for t in (node.input(1), node.input(2))):
            found.append(node.name)
    return found


def _computed_initializer(t) -> bool:
    """``t`` is a weight the TorchScript exporter computed (``onnx::Conv_N``), directly or through the
    Identity its deduplication of equal initializers leaves."""
    while t is not None and t.producer is not None and t.producer.op_type == "Identity":
        t = t.producer.input(0)
    return t is not None and t.producer is None and t.kind == "parameter" and t.name.startswith("onnx::")


def folded_batch_norm_note(found: list[str]) -> str | None:
    """What an export that folded the BatchNorms ``found`` (folded_batch_norms) lost, said out loud (None
    where it folded none)."""
    if not found:
        return None
    many = len(found) > 1
    return (f"an inference export: {len(found)} BatchNorm{'s were' if many else ' was'} folded into the "
            f"convolution{'s' if many else ''} before {'them' if many else 'it'} ({found[0]}"
            f"{', ...' if many else ''}); training keeps each such convolution's output for the BatchNorm's "
            "backward, and its batch statistics, which the saved bytes and the peak leave out; export in "
            "training mode to keep them (torch.onnx.export(..., training=torch.onnx.TrainingMode.TRAINING) "
            "with dynamo=False, or optimize=False with dynamo=True)")


_FX_NAME = re.compile(r"^([a-z_][a-z_0-9]*?)(_\d+)?$")
# torch.export names of aten ops whose result is a view of (or is) their input
_VIEW_OPS = frozenset({"t", "transpose", "permute", "view", "_unsafe_view", "reshape", "expand", "unsqueeze",
                       "squeeze", "slice", "select", "alias", "detach", "unbind", "split", "narrow",
                       "as_strided", "view_as", "expand_as", "flatten", "unflatten", "movedim"})
_NOT_FX = re.compile(r"^(val|scalar_tensor_default)(_\d+)?$")  # onnxscript's and constants' names


def _computes(name: str) -> bool:
    """``name`` is a torch.export node name of an op that computes a new tensor (not a view)."""
    m = _FX_NAME.match(name)
    return m is not None and not _NOT_FX.match(name) and m.group(1) not in _VIEW_OPS


def _sources(folded: str | None) -> list[str] | None:
    if folded is None:
        return None
    try:
        value = ast.literal_eval(folded)
    except (ValueError, SyntaxError):
        return None
    return [str(s) for s in value] if isinstance(value, list | tuple) else None


_TRIG = frozenset({"Cos", "Sin"})
_MAX_CONE = 256  # nodes followed from one initializer; past that it is taken as a parameter


def frequency_tables(graph: Graph) -> set[str]:
    """Names of the float initializers (no producer) every path of which to the model's data passes
    through a Cos or Sin before meeting a value computed from the inputs' values (sin/cos(pos * f), pos
    from shapes: rotary and sinusoidal frequencies), with at least one such path: buffers, not parameters,
    where no graph signature says (TorchScript)."""
    values = _reads_values(graph)
    outputs = {id(t) for t in graph.outputs}
    return {t.name for t in graph.tensors.values() if t.kind == "parameter" and t.is_float
            and t.producer is None and _through_trig(t, values, outputs)}


def frequency_note(graph: Graph) -> str | None:
    """What ``frequency_tables`` assumed, said out loud (None where a signature says, or it found none)."""
    if (graph.meta.get("export") or {}).get(SIGNATURE):
        return None
    found = sorted(frequency_tables(graph))
    if not found:
        return None
    names = ", ".join(repr(n) for n in found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    many = len(found) > 1
    what, reach = ("buffers", "they reach") if many else ("a buffer", "it reaches")
    return (f"assumed: {len(found)} float initializer{'s' if many else ''} ({names}) taken for {what}, "
            f"not trained: {reach} the model only through Cos/Sin of positions (rotary frequencies), and a "
            "TorchScript export does not say which initializers are buffers")


def _through_trig(t: Tensor, values: set[int], outputs: set[int]) -> bool:
    """Whether every path from ``t`` meets a Cos or Sin before a node that reads ``values`` (and one does)."""
    stack, seen, trig = [t], set(), False
    while stack:
        u = stack.pop()
        if id(u) in outputs or len(seen) > _MAX_CONE:
            return False
        for c in u.consumers:
            if id(c) in seen:
                continue
            seen.add(id(c))
            if c.op_type in _TRIG:
                trig = True
            elif c.kind not in ("shape", "size"):
                if any(x is not None and id(x) in values for x in c.inputs):
                    return False  # meets the data without a Cos or Sin: a weight
                stack.extend(o for o in c.outputs if o is not None)
    return trig


def _reads_values(graph: Graph) -> set[int]:
    """ids of the tensors computed from the graph inputs' values (not only from their shapes), in one
    pass over the nodes in topological order (core.kinds.reads_values, forward)."""
    out = {id(t) for t in graph.inputs}
    for node in graph.nodes:
        if node.kind in ("shape", "size"):
            continue
        ins = node.inputs if node.kind in DATA_DEPENDENT_KINDS else value_inputs(node.op_type, node.inputs)
        if any(x is not None and id(x) in out for x in ins):
            out.update(id(o) for o in node.outputs if o is not None)
    return out

"""A precision applied to a forward graph: each float tensor's dtype as the framework computes it, and
the casts it makes as Cast nodes (so that backward keeps them where the framework's backward does).

- ``fp32`` / ``bf16`` / ``fp16``: the model cast (``model.to(dtype)``; DeepSpeed and Megatron bf16, FSDP's
  param_dtype): parameters, float inputs and every op in that dtype, except where transformers' code
  computes in float32, which an fp32 export cannot show: RMSNorm (x cast up, its statistics and
  x * rstd in float32, cast down before the weight), LayerNorm run on ``x.to(float32)`` (OLMo) and
  LayerNorm's saved statistics (float32, as PyTorch's CPU kernel and ONNX's stash_type keep them).
- ``amp-bf16`` / ``amp-fp16``: ``torch.autocast`` on ``--device`` (precision.autocast's lists): float32
  parameters; a lower-precision op casts its float32 inputs (a weight once per forward, any other
  tensor at each call), an fp32-list op casts lower-precision inputs up, every other op runs in its
  inputs' widest dtype (0-d tensors do not promote); ``linear``'s bias add (MatMul + Add in exports) is
  part of addmm; sdpa gets q, k and v cast and its float mask converted inside the kernel.
An export already in the lower dtype, or traced under autocast, carries its casts: leave ``--precision``
out (as exported).
A TensorFlow graph (the TensorFlow profile) gets Keras's dtype policies instead (precision.keras).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.casts import noop_float32_cast
from ..core.ir import FLOAT_DTYPES, Graph, Node, Tensor, redirect
from ..grad.storage import linear_bias_add
from . import PRECISIONS
from .autocast import LISTS
from .keras import apply_keras_policy
from .rewrite import ONNX_DTYPES, Precision, Rewrite

_LOWER = {"bf16": "bfloat16", "fp16": "float16"}
_MATMULS = frozenset({"matmul", "gemm"})


def precision_entry(graph: Graph, applied: Precision | None) -> dict:
    """The JSON entry: what --precision applied, or the parameters' float dtypes as exported."""
    if applied is not None:
        return applied.to_json()
    dtypes = sorted({t.dtype for t in graph.tensors.values() if t.kind == "parameter" and t.is_float})
    return {"precision": "as exported", "parameter_dtypes": dtypes}


def apply_precision(graph: Graph, name: str, device: str = "cpu", keras: bool = False) -> Precision:
    """Rewrite ``graph`` (a forward graph, in place) to run at precision ``name`` on ``device``; ``keras``:
    a TensorFlow graph, run under Keras's dtype policy of that name (precision.keras)."""
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}")
    amp = name.startswith("amp-")
    low = "float32" if name == "fp32" else _LOWER[name.removeprefix("amp-")]
    p = Precision(name, device, low)
    rewrite = Rewrite(graph)
    if keras:
        apply_keras_policy(graph, name, low, rewrite, p)
    elif amp:
        _autocast(graph, rewrite, low, device, p)
    else:
        _model_cast(graph, rewrite, low, p)
    p.casts = rewrite.finish()
    return p


def _floats(ts) -> list[Tensor]:
    return [t for t in ts if t is not None and t.dtype in FLOAT_DTYPES]


def _promotes(t: Tensor) -> bool:
    """0-d tensors (a scale, an epsilon) do not decide a result's dtype (PyTorch's type promotion)."""
    return not (t.shape is not None and len(t.shape) == 0 and t.kind in ("parameter", "constant"))


def _widest(ins: list[Tensor]) -> str | None:
    deciding = [t for t in ins if _promotes(t)] or ins
    if not deciding:
        return None
    return "float32" if any(t.dtype == "float32" for t in deciding) else deciding[0].dtype


def _set_outputs(node: Node, dtype: str | None) -> None:
    if dtype is None:
        return
    for t in node.outputs:
        if t is not None and t.dtype in FLOAT_DTYPES:
            t.dtype = dtype


def _layer_norm_stats(node: Node) -> None:
    """LayerNorm's mean and inverse std stay float32 (stash_type; PyTorch's CPU kernel)."""
    for t in node.outputs[1:]:
        if t is not None and t.dtype in FLOAT_DTYPES:
            t.dtype = "float32"


def _sdpa_forms(graph: Graph):
    from ..spellings.attention import AttentionForm, read_attention

    out = []
    for node in graph.nodes:
        if node.kind in _MATMULS and not node.meta.get("constant"):
            form = read_attention(node)
            if isinstance(form, AttentionForm) and form.sdpa:
                out.append(form)
    return out


def _autocast(graph: Graph, rw: Rewrite, low: str, device: str, p: Precision) -> None:
    lower, fp32 = LISTS[device]
    forms = _sdpa_forms(graph)
    interior = {id(n): f for f in forms for n in f.nodes}
    for f in forms:  # the kernel is on the lower-precision list: q, k and v are cast as it is called
        inside = {id(n) for n in f.nodes}
        for t in (f.q, f.k_kv or f.k, f.v_kv or f.v):  # grouped K and V: as sdpa gets them (enable_gqa)
            if t.dtype == "float32":
                readers = [c for c in dict.fromkeys(t.consumers) if id(c) in inside]
                rw.cast(t, low, readers)
    weight_copies: dict[int, Tensor] = {}
    linear_adds: set[int] = set()

    def cast_in(node: Node, dtype: str) -> None:
        for x in dict.fromkeys(_floats(node.inputs)):
            if x.dtype == dtype or not _promotes(x):
                continue
            if x.kind in ("parameter", "constant") and dtype == low:  # the autocast cache: one per forward
                y = weight_copies.get(id(x))
                if y is None:
                    y = weight_copies[id(x)] = rw.cast(x, dtype, [node])
                else:
                    redirect([node], x, y)
            else:
                rw.cast(x, dtype, [node])

    order = {id(n): i for i, n in enumerate(graph.nodes)}
    first_of = {}  # the first node of each RMSNorm -> the norm: x.to(float32) where x is lower
    for norm in _rms_norms(graph):
        inside_ids = {id(n) for n in norm.nodes}
        first_of[id(min(norm.nodes, key=lambda n: order.get(id(n), len(order))))] = (norm, inside_ids)
    upcast = 0
    for node in list(graph.nodes):
        if node.meta.get("constant") or node.meta.get("precision_cast"):
            continue
        entry = first_of.get(id(node))
        low_in = None if entry is None else _norm_input_dtype(entry[0].x)
        if low_in is not None and low_in != "float32":  # transformers' RMSNorm: x.to(float32), then
            norm, inside_ids = entry  # hidden.to(input_dtype) before the weight (q_norm / k_norm on a bf16 q)
            if norm.x.dtype != "float32":  # the export dropped x.to(float32) (dynamo): put back
                inner = [c for c in dict.fromkeys(norm.x.consumers) if id(c) in inside_ids]
                rw.cast(norm.x, "float32", inner)
            readers = [c for c in dict.fromkeys(norm.out.consumers) if id(c) not in inside_ids
                       and not (c.kind == "cast" and c.outputs and c.outputs[0].dtype == "float32")]
            if readers:
                rw.cast(norm.out, low_in, readers)
            upcast += 1
        if id(node) in interior:  # one lower-precision kernel; its interior is never allocated
            _set_outputs(node, low)
            continue
        if node.kind in lower or id(node) in linear_adds:
            cast_in(node, low)
            _set_outputs(node, low)
            y = node.outputs[0] if node.kind in _MATMULS and node.outputs else None
            add = linear_bias_add(y) if y is not None else None
            if add is not None:
                linear_adds.add(id(add))
        elif node.kind in fp32:
            cast_in(node, "float32")
            _set_outputs(node, "float32")
        elif node.kind == "cast":
            continue
        else:
            _set_outputs(node, _widest(_floats(_value_inputs(node))))
            if node.kind == "layer_norm":
                _layer_norm_stats(node)
    p.assumed.append(f"torch.autocast({device!r}, {low}): parameters float32; a copy of each weight a "
                     "lower-precision op reads, once per forward; other casts at each call")
    if upcast:
        p.assumed.append(f"{upcast} RMSNorm(s) on a {low} input (a per-head q / k norm after a {low} "
                         "projection) compute in float32 as transformers' RMSNorm does, cast back before "
                         "the weight")


def _norm_input_dtype(x: Tensor) -> str | None:
    """The dtype an RMSNorm's input had before its x.to(float32): x's own, or, where the export kept that
    cast (TorchScript), what the cast reads."""
    p = x.producer
    if x.dtype == "float32" and p is not None and p.kind == "cast" and p.inputs and p.inputs[0] is not None:
        return p.inputs[0].dtype
    return x.dtype


def _value_inputs(node: Node) -> list[Tensor | None]:
    """The inputs whose dtype is the output's: a Gather's or LayerNorm's data, a Where's two values."""
    if node.kind in ("gather", "layer_norm", "reshape", "expand", "slice", "pad", "tile", "split",
                     "transpose", "squeeze", "unsqueeze", "flatten", "identity", "dropout", "gather_elements",
                     "gather_nd", "resize", "scatter_nd", "scatter_elements"):
        return node.inputs[:1]
    if node.kind == "where":
        return node.inputs[1:]
    return node.inputs


def _model_cast(graph: Graph, rw: Rewrite, low: str, p: Precision) -> None:
    for t in graph.tensors.values():  # model.to(dtype) and inputs in that dtype
        if t.dtype in FLOAT_DTYPES and t.producer is None and t.kind in ("parameter", "constant", "input"):
            t.dtype = low
    if low == "float32":
        for node in graph.nodes:
            _set_outputs(node, "float32")
        return
    rms = _rms_norms(graph)
    modules = _float32_modules(graph, {id(n) for norm in rms for n in norm.nodes})
    norms = [*rms, *modules]
    inside = {id(n) for norm in norms for n in norm.nodes}
    upcast_norms = _upcast_layer_norms(graph)
    kept_up = {id(c) for _, c in upcast_norms if c is not None}
    for ln, up in upcast_norms:  # F.layer_norm(x.to(float32), ...).to(x.dtype)
        if up is None:  # the export dropped the no-op cast: the module's class says it
            rw.cast(ln.inputs[0], "float32", [ln])
        else:  # x.to(float32) of an fp32 x is x itself, which a trace then reads for x everywhere
            redirect([c for c in up.outputs[0].consumers if c is not ln], up.outputs[0], up.inputs[0])
        readers = [c for c in dict.fromkeys(ln.outputs[0].consumers) if c.kind != "cast"]
        if readers:
            rw.cast(ln.outputs[0], low, readers)
    softmaxes = [n for n in graph.nodes if n.meta.get("softmax_dtype") == "float32" and n.inputs
                 and n.outputs]  # softmax(x, dtype=torch.float32).to(x.dtype): Gemma's eager attention
    for sm in softmaxes:
        rw.around(sm, "float32", low)
    for norm in norms:  # x.to(float32) ... (weight *) hidden.to(input_dtype)
        rw.cast(norm.x, "float32", [c for c in dict.fromkeys(norm.x.consumers) if id(c) in inside])
        if norm.weight_param is not None and norm.weight_param_reader is not None:  # Gemma: 1 + w.float()
            rw.cast(norm.weight_param, "float32", [norm.weight_param_reader])
        elif norm.weight_param is not None:  # the same, folded by the exporter into one initializer
            norm.weight_param.dtype = "float32"
        readers = [c for c in dict.fromkeys(norm.out.consumers) if id(c) not in inside]
        if readers:
            rw.cast(norm.out, low, readers)
    for node in list(graph.nodes):
        if node.meta.get("precision_cast"):
            continue
        if id(node) in inside:
            _set_outputs(node, "float32")
        elif node.kind == "cast":
            src = node.inputs[0] if node.inputs else None
            if src is not None:  # an int or bool made float is made in the model's dtype
                _set_outputs(node, "float32" if id(node) in kept_up else low)
        else:
            _set_outputs(node, _widest(_floats(_value_inputs(node))) or low)
            if node.kind == "layer_norm":
                _layer_norm_stats(node)
    if rms:
        after = sum(n.after_weight for n in rms)
        p.assumed.append(f"{len(rms)} RMSNorm(s) compute in float32 as transformers' RMSNorm does "
                         "(x cast up; cast down before the weight" +
                         (f", or after it where the weight is 1 + w or multiplied in float32: {after})"
                          if after else ")"))
    if modules:
        p.assumed.append(f"{len(modules)} call(s) of {', '.join(sorted(FLOAT32_MODULES))} compute in "
                         "float32 op by op (x cast up, the weight cast up, the result cast down), as their "
                         "forward does")
    if softmaxes:
        p.assumed.append(f"{len(softmaxes)} softmax(es) compute in float32, as softmax(x, "
                         "dtype=torch.float32) asks (the dynamo export's FX nodes, or the TorchScript "
                         "export's casts, say it), their output cast back for the next op")
    if upcast_norms:
        p.assumed.append(f"{len(upcast_norms)} LayerNorm(s) compute in float32: their input is cast to "
                         "float32 in the export, or their module is one of transformers' float32 LayerNorms "
                         f"({', '.join(sorted(UPCASTING_LAYER_NORMS))})")
    p.assumed.append(f"model.to({low}): parameters, float inputs and ops in {low}; the export's own casts "
                     f"to float32 are taken as casts to {low}")


# transformers' LayerNorm modules whose forward runs F.layer_norm on x.to(float32) and casts the result
# back (transformers 5.x source; Cohere's float32 LayerNorm is written out op by op, no layer_norm node)
UPCASTING_LAYER_NORMS = frozenset({"OlmoLayerNorm", "ChameleonLayerNorm"})


def _upcast_layer_norms(graph: Graph) -> list[tuple[Node, Node | None]]:
    """Each LayerNorm that computes in float32 under a model cast, with the export's Cast to float32 of
    its input where the export kept that (a float-to-float Cast in an fp32 export: ``x.to(float32)``,
    TorchScript), or None where the module's class says it (dynamo drops the no-op cast)."""
    out = []
    for node in graph.nodes:
        if node.kind != "layer_norm" or not node.inputs or node.inputs[0] is None:
            continue
        x = node.inputs[0]
        up = x.producer
        if up is not None and up.kind == "cast" and up.attrs.get("to") == ONNX_DTYPES["float32"] \
                and up.inputs and up.inputs[0] is not None and up.inputs[0].dtype in FLOAT_DTYPES:
            out.append((node, up))
        elif node.meta.get("torch_classes", ("",))[-1] in UPCASTING_LAYER_NORMS:
            out.append((node, None))
    return out


@dataclass
class _Norm:
    x: Tensor
    nodes: list[Node]  # what runs in float32
    out: Tensor  # cast down to the model's dtype for what reads it
    weight_param: Tensor | None = None  # a weight computed from a parameter (Gemma's 1 + w), cast up
    weight_param_reader: Node | None = None
    after_weight: bool = False  # cast down after the weight's product (Gemma's 1 + w, OLMo2's)


def _rms_norms(graph: Graph) -> list[_Norm]:
    """Each RMSNorm (PyTorch's rms_norm composite): transformers computes x * rstd in float32 and casts
    it down before the weight (Llama, Qwen, Mistral); where the weight is computed from a parameter
    (Gemma's ``1 + w``) the weight's product is in float32 too, cast down after it."""
    from ..grad.composites import PYTORCH_COMPOSITES, find_regions
    from ..grad.torch_export import made_each_step

    folded = made_each_step(graph)
    rms = tuple(c for c in PYTORCH_COMPOSITES if c.name == "rms_norm")
    out = []
    for r in find_regions(graph, rms):
        root = r.nodes[-1]
        x, normed = r.reads[0], (r.reads[2] if len(r.reads) > 2 else root.outputs[0])
        if normed is root.outputs[0]:  # no weight
            out.append(_Norm(x, list(r.nodes), normed))
            continue
        w = root.inputs[1] if root.inputs[0] is normed else root.inputs[0]
        if w is not None and w.name in folded:
            out.append(_Norm(x, list(r.nodes), root.outputs[0], w, after_weight=True))
            continue
        p = w.producer if w is not None else None
        param = None if p is None else next((t for t in p.inputs if t is not None and t.kind == "parameter"
                                             and t.producer is None), None)
        if param is not None:
            out.append(_Norm(x, [*r.nodes, p], root.outputs[0], param, p, after_weight=True))
        elif _weight_product_in_float32(root, normed):
            out.append(_Norm(x, list(r.nodes), root.outputs[0], after_weight=True))
        else:
            out.append(_Norm(x, [n for n in r.nodes if n is not root], normed))
    return out


# transformers' modules whose forward computes op by op in float32 (x.to(float32), ...,
# self.weight.to(float32) * x, .to(input_dtype)): Cohere's LayerNorm (transformers 5.x source)
FLOAT32_MODULES = frozenset({"CohereLayerNorm", "Cohere2LayerNorm"})


def _float32_modules(graph: Graph, taken: set[int]) -> list[_Norm]:
    """Each call of a FLOAT32_MODULES module, by the dynamo export's module path and class (its
    consecutive forward nodes, none of ``taken``), as a _Norm: its one float input from outside cast up,
    its parameter cast up for the node reading it, its output cast down for the readers outside."""
    calls: list[list[Node]] = []
    last = None
    for node in graph.nodes:
        classes = node.meta.get("torch_classes") or ("",)
        module = node.meta.get("module") if classes[-1] in FLOAT32_MODULES and id(node) not in taken else None
        if module is not None and module == last:
            calls[-1].append(node)
        elif module is not None:
            calls.append([node])
        last = module
    out = []
    for nodes in calls:
        ids = {id(n) for n in nodes}
        made = {id(t) for n in nodes for t in n.outputs if t is not None}
        xs = list({id(t): t for n in nodes for t in n.inputs if t is not None and id(t) not in made
                   and t.kind == "activation" and t.dtype in FLOAT_DTYPES}.values())
        ends = [t for n in nodes for t in n.outputs if t is not None
                and (t in graph.outputs or any(id(c) not in ids for c in t.consumers))]
        if len(xs) != 1 or len(ends) != 1:
            continue  # not one tensor in and one out: not this form
        weights = [(t, n) for n in nodes for t in n.inputs if t is not None and t.kind == "parameter"
                   and t.producer is None]
        w, reader = weights[0] if len(weights) == 1 else (None, None)
        out.append(_Norm(xs[0], nodes, ends[0], w, reader))
    return out


# transformers' RMSNorms whose forward returns (self.weight * hidden_states).to(input_dtype): the weight's
# product in float32, cast down after it (transformers 5.x source)
FLOAT32_WEIGHT_RMS_NORMS = frozenset({
    "Olmo2RMSNorm", "Olmo3RMSNorm", "OlmoHybridRMSNorm", "FlexOlmoRMSNorm", "GptOssRMSNorm", "AfmoeRMSNorm",
    "DeepseekV4RMSNorm", "BeamRMSNorm", "FlintRMSNorm", "Inkling2RMSNorm", "Inkling2LoopRMSNorm",
    "OpenAIPrivacyFilterRMSNorm"})


def _weight_product_in_float32(root: Node, normed: Tensor) -> bool:
    """The RMSNorm multiplies its weight in float32 and casts the product down (OLMo2's, GPT-OSS's):
    the module's class says it (dynamo), or the fp32 export's casts do (TorchScript: the trace's
    ``.to(input_dtype)`` is a float32 Cast after the weight's Mul, where Llama's comes before it)."""
    classes = root.meta.get("torch_classes")
    if classes:
        return classes[-1] in FLOAT32_WEIGHT_RMS_NORMS
    before = normed.producer
    return not (before is not None and noop_float32_cast(before)) \
        and any(noop_float32_cast(c) for c in root.outputs[0].consumers)

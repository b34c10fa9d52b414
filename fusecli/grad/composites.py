"""Composite ops: a decomposed forward region that a framework differentiates as ONE backward node.

PyTorch's ``F.gelu`` is one autograd node that saves x, but its ONNX export spells it as five ops that,
differentiated one by one, keep five tensors. A ``Composite`` names the op trees the torch exporters
write for one aten op (matched with fusion.match's ``Op``/``Var`` trees, walking producers from the
root) and what its derivative formula saves (``derivatives.yaml``). Only the exporters' own spellings
are listed: the same math written by hand in Python (GPT-2's ``0.5 * x * (1 + tanh(...))``, an
``x * 0.5 * (1 + erf(...))``) runs op by op in eager PyTorch and saves op by op, and its export has a
different shape (``0.5 * x`` first, or ``pow(x, 3)`` under TorchScript), so it is not matched.

Where the exporter's spelling and a hand-written one coincide (``x * torch.sigmoid(x)`` is exported as
F.silu is), the composite wins: fusecli cannot tell them apart.

A region is one backward node only when nothing outside it reads its interior tensors; its gradient
goes to every tensor it reads from outside that needs one (x, gamma, beta).

TensorFlow's ``tf.custom_gradient`` regions (Keras swish and GELU) use the same ``Region`` but come from
the SavedModel (``graph.meta["custom_gradients"]``, recorded by the loader), not from trees.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ..core.ir import Graph, Node, Tensor
from ..core.kinds import reads_values
from ..core.trees import Op, match_at
from ..spellings import acts, gelu, norms, softmax
from ..spellings.common import TORCH, select
from . import sdpa

SHAPE_READERS = frozenset({"shape", "size"})  # read only a tensor's shape: no gradient flows through them
Reads = Callable[[dict[str, Node], dict[str, Tensor], Node], list[Tensor]]


@dataclass(frozen=True)
class Composite:
    """One aten op as its exporters decompose it, and the forward values its backward reads."""

    name: str
    forms: tuple[Op, ...]
    op: str  # the backward node's op type (PyTorch's autograd node name)
    reads: Reads | None  # (roles, bound, root) -> the tensors its derivative formula saves
    doc: str
    find: Callable | None = None  # (root, requires-grad names, memo, device, dims) -> (form, kernel) | None
    roots: frozenset[str] = frozenset()  # root kinds of a ``find`` or ``match`` composite
    match: Callable | None = None  # root -> (nodes, root last; the tensors its formula saves) | None
    fused: bool = True  # eager runs its forward as one kernel: no tensor inside it is ever allocated


@dataclass
class Region:
    """A matched composite: its nodes (root last), the tensors it reads from outside, what backward reads."""

    name: str
    op: str
    nodes: list[Node]
    inputs: list[Tensor]
    reads: list[Tensor]
    passthrough: list[Tensor] = field(default_factory=list)  # custom gradient: IdentityN's copies of inputs
    new: list[tuple[str, str, tuple | None]] = field(default_factory=list)  # saved tensors the export lacks
    kernel: dict | None = None  # sdpa: the kernel PyTorch runs and why
    unread: list[Tensor] = field(default_factory=list)  # inputs the eager call never gets (sdpa.KernelChoice)
    fused: bool = False  # its forward is one kernel in eager (Composite.fused): its interior never exists
    converted: list[tuple[Tensor, Tensor]] = field(default_factory=list)  # sdpa.KernelChoice.converted

    @property
    def root(self) -> Node:
        return self.nodes[-1]


def _x(roles, bound, root) -> list[Tensor]:
    return [bound["x"]]


def _y(roles, bound, root) -> list[Tensor]:
    return [root.outputs[0]]


# each composite's trees: the spellings its own exporters write (spellings/, selected by writer tag)
GELU_ERF_TORCH = select(gelu.ERF, TORCH)  # F.gelu
GELU_TANH_TORCH = select(gelu.TANH, TORCH)  # F.gelu(approximate="tanh")
GELU_BLOOM = select(gelu.BLOOM, TORCH)  # transformers' BloomGelu: GeLUFunction, a custom Function saving x
SILU = select(acts.SILU_OP, TORCH)
HARDSWISH = select(acts.HARDSWISH_OP, TORCH)
RMS_NORM = select(norms.RMS_NORM_OP, TORCH)
SOFTMAX, LOG_SOFTMAX = select(softmax.SOFTMAX, TORCH), select(softmax.LOG_SOFTMAX, TORCH)
LAYER_NORM_TORCH = select(norms.LAYER_NORM, TORCH)  # F.layer_norm below opset 17


def _layer_norm_reads(roles, bound, root) -> list[Tensor]:
    """x and the statistics mean and std (PyTorch keeps rstd, the same size); w and b are parameters."""
    return [bound["x"], bound["d"].producer.inputs[1], roles["normalize"].inputs[1]]


def _zeros(t: Tensor) -> bool:
    """A tensor of zeros the export makes: ConstantOfShape of 0 (zeros_like), or a constant all zeros."""
    p = t.producer
    if p is not None and p.op_type == "ConstantOfShape":
        v = p.attrs.get("value")  # a TensorProto (only ONNX has ConstantOfShape)
        if v is None:
            return True
        from onnx import numpy_helper
        return not np.any(numpy_helper.to_array(v))
    v = t.meta.get("value") if t.kind == "constant" else None
    return v is not None and not np.any(v)


def index_add_match(root: Node):
    """``self.index_add_(dim, index, source)`` as the TorchScript exporter writes it (symbolic_opset9's
    index_add, through its scatter_add): Add(self, ScatterElements(zeros, Expand(index), Expand(source)))
    with no reduction, index and source expanded to self's shape but along dim. PyTorch's
    IndexAddBackward0 saves index and source (its formula's ``expand_as(source)``), where scatter_add
    saves the index only; ScatterElements' own rule reads the index alone. (Above opset 15 scatter_add is
    ScatterElements(reduction='add'), so this spelling is index_add's; below, the expanded index is.)"""
    if len(root.inputs) != 2:
        return None
    for j in (0, 1):
        s = root.inputs[j]
        p = s.producer if s is not None else None
        if p is None or p.kind != "scatter_elements" or p.op_type != "ScatterElements" \
                or p.attrs.get("reduction", "none") != "none" or len(p.inputs) != 3 \
                or any(t is None for t in p.inputs) or not _zeros(p.inputs[0]):
            continue
        index, source = p.inputs[1], p.inputs[2]
        if index.producer is None or index.producer.kind != "expand" \
                or source.producer is None or source.producer.kind != "expand":
            continue
        return [p, root], [index, source]
    return None


def rsqrt_match(root: Node):
    """``torch.rsqrt(x)`` as the dynamo exporter writes it: Reciprocal(Sqrt(x)), both nodes of one FX call
    (their ``fx_call``). RsqrtBackward0 saves its result alone (-0.5 * grad * result^3), where Sqrt's rule
    and Reciprocal's would each keep their output. Without the FX node (TorchScript) a Reciprocal of a
    Sqrt may be two eager ops (``1 / torch.sqrt(x)``): not read as one."""
    x = root.inputs[0] if len(root.inputs) == 1 else None
    p = x.producer if x is not None else None
    call = root.meta.get("fx_call")
    if p is None or p.op_type != "Sqrt" or call is None or p.meta.get("fx_call", ("",))[0] != call[0] \
            or root.op_type != "Reciprocal" or root.outputs[0] is None:
        return None
    return [p, root], [root.outputs[0]]


def slice_copy_match(root: Node):
    """``x[..., a:b] = y`` or ``x[:, i] = v`` (``copy_`` into a slice or select view of x) as both torch
    exporters write it: ScatterND(x, index, y) with an index computed from shapes and constants alone (a
    Range grid of the slice's positions). PyTorch runs it as CopySlices over the view's geometry, whose
    backward (dx: dy with the slice zeroed; dy: dy's slice) keeps no tensor, the index least of all. An
    index read from values (``x[idx] = v``: index_put_, which saves idx) is not this spelling."""
    if root.op_type != "ScatterND" or len(root.inputs) != 3 or any(t is None for t in root.inputs) \
            or root.attrs.get("reduction", "none") != "none" or reads_values(root.inputs[1]):
        return None
    return [root], []


def _index_leaves(t: Tensor, out: list[Tensor], depth: int = 0) -> bool:
    """The index tensors of a linearised multi-tensor index ``i0 * stride + i1 (+ ...)``, into ``out``;
    False where ``t`` is not spelled so."""
    p = t.producer
    if depth > 8 or p is None or p.op_type not in ("Add", "Mul") or len(p.inputs) != 2 \
            or any(x is None for x in p.inputs):
        return False
    if p.op_type == "Mul":  # i * stride: the stride a scalar read from a shape
        idx, stride = sorted(p.inputs, key=lambda x: x.shape is not None and len(x.shape) <= 1 and
                             (len(x.shape) == 0 or x.shape[0] == 1))
        if not (stride.shape is not None and (len(stride.shape) == 0 or list(stride.shape) == [1])):
            return False
        out.append(idx)
        return True
    for x in p.inputs:
        if _index_leaves(x, out, depth + 1):
            continue
        if x.dtype not in ("int64", "int32"):
            return False
        out.append(x)  # the last index: added unscaled
    return True


def multi_index_match(root: Node):
    """``x[i0, i1]`` (aten::index with several index tensors) as the TorchScript exporter writes it:
    Gather(Flatten(x), i0 * x.shape[1] + i1) (transformers' MoE: ``top_k_weights[token_idx, top_k_pos]``).
    PyTorch's IndexBackward0 saves the index tensors (and x's sizes), not the linear index the export
    computes from them."""
    if root.op_type != "Gather" or root.attrs.get("axis", 0) != 0 or len(root.inputs) != 2 \
            or any(t is None for t in root.inputs):
        return None
    data, index = root.inputs
    if data.producer is None or data.producer.op_type not in ("Flatten", "Reshape") \
            or index.producer is None or index.producer.op_type != "Add" \
            or index.dtype not in ("int64", "int32"):
        return None
    leaves: list[Tensor] = []
    if not _index_leaves(index, leaves) or len(leaves) < 2:
        return None
    nodes, stack, leaf_ids = [], [index.producer], {id(x) for x in leaves}
    while stack:  # the Add/Mul tree between the indices and the Gather (its interior)
        n = stack.pop()
        if all(n is not m for m in nodes):
            nodes.append(n)
            stack.extend(x.producer for x in n.inputs if id(x) not in leaf_ids and x.producer is not None
                         and x.producer.op_type in ("Add", "Mul"))
    return [*reversed(nodes), root], leaves


def _rms_norm_reads(roles, bound, root) -> list[Tensor]:
    """CPU's rms_norm is CompositeImplicitAutograd: pow saves x, rsqrt and mul save rstd, w * normed
    saves normed (and w, where it is an activation: Gemma's ``1 + w``)."""
    normed = bound.get("normed")  # unbound when it is the root (no weight)
    if normed is None:
        return [bound["x"], bound["rstd"]]
    w = root.inputs[1] if root.inputs[0] is normed else root.inputs[0]
    computed = w is not None and w.kind not in ("parameter", "constant")  # Gemma's 1 + w, made each step
    return [bound["x"], bound["rstd"], normed] + ([w] if computed else [])


GROUP_NORM = select(norms.GROUP_NORM, TORCH)


def group_norm_match(root: Node):
    """``F.group_norm`` spelled out (Reshape, InstanceNormalization, Reshape, * w + b): ``native_group_norm``
    is one kernel whose backward reads x and the mean and rstd of each (sample, group), (N, G) tensors the
    export does not name; never the normalised groups, nor w * them."""
    for form in GROUP_NORM:
        found = match_at(form, root)
        if found is None:
            continue
        nodes, roles, bound = found
        x, groups = bound["x"], roles["groups"]
        scale = groups.input(1)
        if x.shape is None or not x.shape or scale is None or scale.shape is None or len(scale.shape) != 1:
            continue
        shape = (x.shape[0], scale.shape[0])
        return nodes, [x], [(f"{groups.name}.mean", x.dtype, shape), (f"{groups.name}.rstd", x.dtype, shape)]
    return None


WEIGHT_NORM = select(norms.WEIGHT_NORM, TORCH)


def weight_norm_match(root: Node):
    """``torch._weight_norm(v, g, dim)`` (nn.utils.parametrizations.weight_norm) spelled out. On CPU, with dim
    the first or last axis, it runs ``_weight_norm_interface``, one node whose backward reads v, g and the
    norms it returns; another dim runs ``v * (g / norm_except_dim(v, 2, dim))`` op by op (not this)."""
    for form in WEIGHT_NORM:
        found = match_at(form, root)
        if found is None:
            continue
        nodes, roles, bound = found
        norm, v = roles["norm"].outputs[0], bound["v"]
        if norm is not None and v.shape is not None and norm.shape is not None and len(v.shape) >= 2 \
                and any(tuple(norm.shape) == tuple(d if i == keep else 1 for i, d in enumerate(v.shape))
                        for keep in (0, len(v.shape) - 1)):
            return nodes, [v, bound["g"], norm]
    return None


PYTORCH_COMPOSITES: tuple[Composite, ...] = (
    Composite("gelu_erf", GELU_ERF_TORCH, "GeluBackward0", _x, "gelu_backward(grad, self): saves x"),
    Composite("gelu_tanh", GELU_TANH_TORCH, "GeluBackward0", _x,
              "gelu_backward(grad, self, 'tanh'): saves x"),
    Composite("gelu_bloom", GELU_BLOOM, "GeLUFunctionBackward", _x,
              "BLOOM's GeLUFunction.backward(ctx, g) reads the x it saved", fused=False),  # Python, op by op
    Composite("silu", SILU, "SiluBackward0", _x, "silu_backward(grad, self): saves x"),
    Composite("hardswish", HARDSWISH, "HardswishBackward0", _x, "hardswish_backward(grad, self): saves x"),
    Composite("layer_norm", LAYER_NORM_TORCH, "NativeLayerNormBackward0", _layer_norm_reads,
              "native_layer_norm_backward: saves x, weight, bias, mean, rstd"),
    Composite("rms_norm", RMS_NORM, "RmsNormBackward", _rms_norm_reads,
              "rms_norm on CPU runs as pow, mean, rsqrt, mul: saves x, rstd and x * rstd", fused=False),
    Composite("rsqrt", (), "RsqrtBackward0", None, "rsqrt(self): saves the result", match=rsqrt_match,
              roots=frozenset({"reciprocal"})),
    Composite("softmax", SOFTMAX, "SoftmaxBackward0", _y, "_softmax_backward_data(grad, result): saves y"),
    Composite("log_softmax", LOG_SOFTMAX, "LogSoftmaxBackward0", _y,
              "_log_softmax_backward_data(grad, result): saves y"),
    Composite("sdpa", (), sdpa.FLASH_OP, None,
              "F.scaled_dot_product_attention read by its form (spellings.attention); what it saves depends "
              "on the kernel PyTorch picks (grad/sdpa.py)", find=sdpa.sdpa_region,
              roots=frozenset({"matmul", "einsum"})),
    Composite("index_add", (), "IndexAddBackward0", None,
              "index_add(self, dim, index, source): saves index and source (transformers' eager MoE experts "
              "sum their outputs with index_add_)", match=index_add_match, roots=frozenset({"add"})),
    Composite("index", (), "IndexBackward0", None,
              "x[i0, i1] (aten::index with several index tensors): saves the indices, not the linear index "
              "the export computes", match=multi_index_match, roots=frozenset({"gather"})),
    Composite("slice_copy", (), "CopySlices", None,
              "x[..., a:b] = y (copy_ into a view): keeps nothing, the ScatterND's index grid least of all "
              "(DeepSeek-V3's key built by new_empty and two slice copies)", match=slice_copy_match,
              roots=frozenset({"scatter_nd"})),
    Composite("group_norm", (), "NativeGroupNormBackward0", None,
              "native_group_norm_backward: saves x, weight, mean and rstd (N, G)", match=group_norm_match,
              roots=frozenset({"add", "bias_add", "reshape"})),
    Composite("weight_norm", (), "WeightNormInterfaceBackward0", None,
              "_weight_norm_interface(v, g, dim): saves v, g and the norms (a weight-normalised conv's "
              "weight, made each step, the conv saves)", match=weight_norm_match, roots=frozenset({"mul"})),
)


def _found(composite: Composite, node: Node, rg: set[str], memo: dict, device: str, dims: Mapping[str, int]):
    """Each reading of ``composite`` at ``node``: (nodes, reads, op, new tensors, kernel)."""
    if composite.match is not None:
        got = composite.match(node)
        if got is not None:  # (nodes, reads) or (nodes, reads, saved tensors the export lacks)
            yield got[0], got[1], composite.op, (got[2] if len(got) > 2 else []), None, [], []
        return
    if composite.find is not None:
        got = composite.find(node, rg, memo, device, dims)
        if got is not None:
            form, choice = got
            op = sdpa.BACKWARD_OPS[choice.kernel]
            yield form.nodes, choice.reads, op, choice.new, choice.to_json(), choice.dropped, choice.converted
        return
    for form in composite.forms:
        found = match_at(form, node)
        if found is not None:
            nodes, roles, bound = found
            yield nodes, composite.reads(roles, bound, node), composite.op, [], None, [], []


def _region(composite: Composite, node: Node, rg: set[str], memo: dict, device: str,
            dims: Mapping[str, int]) -> Region | None:
    for nodes, reads, backward_op, new, kernel, unread, converted in _found(composite, node, rg, memo, device,
                                                                           dims):
        inside = {id(n) for n in nodes}
        if any(c is None or (id(c) not in inside and c.kind not in SHAPE_READERS) for n in nodes[:-1]
               for t in n.outputs if t is not None for c in t.consumers):
            continue  # an interior value read outside: gradients flow through it, no single node
        made = {id(t) for n in nodes for t in n.outputs if t is not None}
        inputs, seen = [], set()
        for n in nodes:
            for t in n.inputs:
                if t is not None and id(t) not in made and id(t) not in seen:
                    seen.add(id(t))
                    inputs.append(t)
        return Region(composite.name, backward_op, nodes, inputs, [t for t in reads if t is not None],
                      new=new, kernel=kernel, unread=unread, fused=composite.fused, converted=converted)
    return None


def find_regions(graph: Graph, composites: tuple[Composite, ...], rg: set[str] = frozenset(),
                 device: str = "cpu", dims: Mapping[str, int] | None = None) -> list[Region]:
    """Every composite region of the forward graph, none overlapping (the first root in order wins);
    ``rg``: names of the tensors that need a gradient, ``device`` and the analysis sizes ``dims`` decide
    PyTorch's attention kernel."""
    by_kind: dict[str, list[Composite]] = {}
    for c in composites:
        for kind in frozenset().union(c.roots, *(f.kinds for f in c.forms)):
            by_kind.setdefault(kind, []).append(c)
    memo: dict = {}
    regions, claimed = [], set()
    for node in reversed(graph.forward_nodes()):  # outermost roots first
        if id(node) in claimed or node.meta.get("constant"):
            continue
        for c in by_kind.get(node.kind, ()):
            r = _region(c, node, rg, memo, device, dims or {})
            if r is not None and not any(id(n) in claimed for n in r.nodes):
                claimed.update(id(n) for n in r.nodes)
                regions.append(r)
                break
    return regions


_MAX_CUSTOM_NODES = 64  # a region that walks further has escaped its inputs: not a custom gradient


def custom_gradient_regions(graph: Graph) -> list[Region]:
    """TensorFlow custom gradients the SavedModel loader recorded: the ops from the inputs of the
    ``IdentityN`` to its results, differentiated by the registered gradient function, which reads the
    forward tensors it captured. The IdentityN also passes its inputs through: outputs without a
    gradient, which TensorFlow's ``ZerosLike`` reads."""
    regions = []
    for cg in graph.meta.get("custom_gradients", ()):
        results = [graph.tensors.get(n) for n in cg["results"]]
        if not results or any(t is None or t.producer is None for t in results):
            continue
        stop = {n for n in cg["inputs"]}
        nodes, seen, stack = [], set(), [t.producer for t in results]
        while stack and len(nodes) <= _MAX_CUSTOM_NODES:
            n = stack.pop()
            if n is None or id(n) in seen or n.meta.get("constant"):
                continue
            seen.add(id(n))
            nodes.append(n)
            stack.extend(t.producer for t in n.inputs if t is not None and t.name not in stop)
        if len(results) != 1 or len(nodes) > _MAX_CUSTOM_NODES:
            continue  # one result: one root (Keras swish, GELU)
        order = {id(n): i for i, n in enumerate(graph.nodes)}
        nodes.sort(key=lambda n: order[id(n)])
        if nodes[-1] is not results[0].producer:
            continue
        inputs = [graph.tensors[n] for n in cg["inputs"] if n in graph.tensors]
        reads = [graph.tensors[n] for n in cg["reads"] if n in graph.tensors]
        regions.append(Region("custom_gradient", cg["gradient"], nodes, inputs, reads, inputs))
    return regions

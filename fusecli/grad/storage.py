"""Which storage each tensor of the joint graph lives in, as the framework allocates it: the peak counts
storages, not the export's tensors.

An export spells out what PyTorch runs as one kernel, and names every view it takes. Eager PyTorch:
- a view (reshape that does not copy, transpose, squeeze, expand, split, a same-dtype cast) shares its
  base's storage, which stays allocated while any of its views is read (``Profile.storage_of``);
- a composite it runs as one aten op (GELU, LayerNorm, softmax, SiLU; sdpa under the flash or
  memory-efficient kernel, whose probabilities never exist) allocates its outputs only, never the
  tensors the export spells between its inputs and its root;
- ``linear`` with a bias (MatMul + bias Add in the export) is one addmm, or a matmul whose output the
  bias is added to in place: the MatMul's own output is never a second storage;
- in backward, the gradient of a view is a view of the incoming gradient (reshape's, transpose's), and
  autograd accumulates a tensor's partial gradients into the first one's buffer (InputBuffer, in place);
- some backward formulas hold more buffers of their output's size while they run (``transients``);
- a value the model's forward hands to every block (the attention mask, the position embeddings) is a
  local of the loop over its blocks: it lives until forward returns (``held_to_boundary``);
- a module's ``forward`` holds its arguments in its frame until it returns: an activation a module call
  reads from outside it lives to the call's last step (``held_by_calls``).

``storages(joint, profile)`` maps each tensor with no storage of its own to the tensor whose storage holds
it (a view's base), or to None (never allocated); a tensor not in the map is its own storage.
"""

from __future__ import annotations

from ..core.ir import LOWER_FLOAT_DTYPES, Graph, Node, Tensor, redirect, unique_name
from ..core.kinds import GRADIENT_SUM
from ..core.scopes import node_scope
from .layout import Layouts
from .torch_export import folded_away
from .torch_export import made_each_step as folded_each_step

# backward ops whose output is a view of their first input (the incoming gradient): d/dx reshape(x) is
# dy.reshape(x.shape), d/dx x^T is dy^T; a sum of partials accumulates into the first partial's buffer
_BACKWARD_VIEWS = frozenset({"ReshapeGrad", "ReshapeToInput", "Transpose"})
_BIAS_KINDS = frozenset({"add", "bias_add"})
# backward op -> the buffers of its output's size its eager formula holds beyond the output while it runs
# (CPU), each from the formula's own order of evaluation
TRANSIENT_COPIES = {
    # pow_backward: grad * (e * x.pow(e - 1)): x.pow(e - 1) and e * it live to the end of the expression
    "PowGradBase": 2,
    "ConvBackpropFilter": 1,  # oneDNN's weight gradient, which AccumulateGrad copies into the parameter's
    # BLOOM's GeLUFunction: 0.5*x, 1 - tanh^2, 0.107*x, *x and tanh itself are alive at once before ff * g
    "GeLUFunctionBackward": 4,
    # rms_norm's backward op by op (CompositeImplicitAutograd on CPU): at pow's, mean's expanded gradient,
    # x.pow(1) and 2 * it are alive beside the output (the gradient through x * rstd, which it joins)
    "RmsNormBackward": 3,
}
# the loss's gradient: sum's backward is a stride-0 expand of one value, a view of nothing; a matmul's
# backward that reads it copies it to a dense buffer for that one step
_LOSS_GRAD = "OnesLike"
_COPIES_STRIDE_0 = frozenset({"MatMulGradA", "MatMulGradB"})
_RESIDENT = frozenset({"parameter", "constant"})


def storages(joint: Graph, profile) -> dict[Tensor, Tensor | None]:
    """Tensor -> the tensor whose storage holds it (None: never allocated), for the tensors that have no
    storage of their own under ``profile``'s framework; empty for a framework without these habits."""
    if not profile.views:
        return {}
    layouts = Layouts(profile.dims)
    saved = _read_by_backward(joint)
    outputs = set(joint.outputs)
    out: dict[Tensor, Tensor | None] = {}
    for name in joint.meta.get("kernel_interiors", ()):
        t = joint.tensors.get(name)
        if t is not None and t not in saved and t not in outputs:
            out[t] = None
    out.update({n.outputs[0]: None for n in joint.nodes if n.op_type == _LOSS_GRAD and n.phase == "backward"
                and len(n.outputs) == 1 and n.outputs[0] is not None})
    for name, bool_name in joint.meta.get("converted_masks", {}).items():
        t = joint.tensors.get(name)
        if t is not None and t not in saved and t not in outputs:  # the bool mask is what eager holds
            out[t] = joint.tensors[bool_name]
    for node in joint.nodes:
        if node.phase == "forward":
            for t in node.outputs:
                if t is None or t in out:
                    continue
                if t.kind in _RESIDENT:  # a weight's view (an expert's w[e], its transpose): no bytes
                    x = node.inputs[0] if node.inputs else None
                    if x is not None and x.kind in _RESIDENT and _weight_view(node, profile.views):
                        out[t] = out.get(x) or x
                    continue
                if t in saved:  # a view backward reads is a copy it keeps
                    continue
                base = profile.storage_of(t, layouts)
                if base is not t:
                    out[t] = base
            if node.kind == "matmul" and node.outputs and node.outputs[0] is not None:
                y = node.outputs[0]
                if y not in saved and y not in outputs and linear_bias_add(y) is not None:
                    out[y] = None
        elif node.op_type in _BACKWARD_VIEWS or node.op_type == GRADIENT_SUM:
            x = node.inputs[0] if node.inputs else None
            y = node.outputs[0] if len(node.outputs) == 1 else None
            if x is not None and y is not None and x.dtype == y.dtype and x.kind == "activation":
                base = out.get(x, x)
                out[y] = x if base is None else base
    return out


def transients(joint: Graph, profile) -> list[tuple[Tensor, int]]:
    """(tensor, step): one more buffer of the tensor's size alive at that step of the joint schedule only
    (``TRANSIENT_COPIES``, listed once per buffer), for a framework with these habits."""
    if not profile.views:
        return []
    out = []
    for i, n in enumerate(joint.nodes):
        if n.op_type in TRANSIENT_COPIES and n.phase == "backward" and n.outputs and n.outputs[0] is not None:
            out += [(n.outputs[0], i)] * TRANSIENT_COPIES[n.op_type]
        elif n.op_type in _COPIES_STRIDE_0:
            out += [(t, i) for t in n.inputs[:1] if t is not None and t.producer is not None
                    and t.producer.op_type == _LOSS_GRAD]
    return out


def held_to_boundary(joint: Graph, profile) -> list[Tensor]:
    """The forward activations read inside two or more list-indexed blocks (``layer.0``, ``layer.1``): a
    value the exported module's forward passes to each block it loops over, so a Python local that holds
    it until forward returns; for a framework with these habits."""
    if not profile.views:
        return []
    out = []
    for t in joint.tensors.values():
        if t.kind != "activation" or t.producer is None or t.producer.phase != "forward":
            continue
        blocks = {b for c in t.consumers if c.phase == "forward" and (b := _block(c)) is not None}
        if len(blocks) > 1:
            out.append(t)
    return out


def held_by_calls(joint: Graph, profile) -> dict[Tensor, int]:
    """Forward activation -> the last step of the outermost module call that reads it from outside (its
    argument, alive in the call's frame until the call returns; module docstring), where that is later than
    its last read; for a framework with these habits. A call is a run of consecutive forward steps under one
    module path; a scope-less node inside a run does not end it (a Constant, or an op the dynamo exporter
    left without a module: GPT-NeoX's chunk of q, k, v as a Split)."""
    if not profile.views:
        return {}
    step_of = {id(n): i for i, n in enumerate(joint.nodes)}
    open_calls: list[list] = []  # [prefix, first step, last step], outermost first
    reads: list[tuple[Tensor, list]] = []  # (tensor, the outermost call reading it that began after it)
    last_read: dict[Tensor, int] = {}
    for i, n in enumerate(joint.nodes):
        if n.phase != "forward":
            continue
        scope = node_scope(n)
        if not scope and n.op_type == "Constant":
            continue
        if not scope:  # in the open calls, whatever they are
            scope = tuple(c[0] for c in open_calls)
        depth = 0
        while depth < len(open_calls) and depth < len(scope) and open_calls[depth][0] == scope[depth]:
            open_calls[depth][2] = i
            depth += 1
        del open_calls[depth:]
        open_calls += [[seg, i, i] for seg in scope[depth:]]
        for t in n.inputs:
            if t is None or t.kind != "activation" or t.producer is None or t.producer.phase != "forward":
                continue
            last_read[t] = i
            born = step_of[id(t.producer)]
            call = next((c for c in open_calls if c[1] > born), None)
            if call is not None:
                reads.append((t, call))
    out: dict[Tensor, int] = {}
    for t, call in reads:
        if call[2] > last_read[t] and call[2] > out.get(t, -1):
            out[t] = call[2]
    return out


def _block(node: Node) -> tuple[str, ...] | None:
    """The node's scope up to its first list-indexed segment (``encoder.layer.3``), or None outside one."""
    scope = node_scope(node)
    for i, seg in enumerate(scope):
        if "." in seg and seg.rsplit(".", 1)[1].isdigit():
            return scope[:i + 1]
    return None


def made_each_step(graph: Graph, profile) -> list[str]:
    """Eager PyTorch runs every forward op at each step, so a float tensor an op computes from parameters
    (a weight's bf16 copy under autocast, Gemma's ``1 + w``, a weight-normalised conv weight) is a new
    storage: an activation, which backward may keep and through which the gradient reaches its
    parameters. A view of a weight (its transpose, ``w[e]``) stays a weight. TensorFlow's graph runs its
    weight-only ops at each step too (``profile.weight_views``: its ops that forward a buffer): a Keras
    mixed policy's ``Cast`` of a float32 variable to float16, which the layer's matmul keeps for
    backward, is an activation. Re-kinds those tensors of ``graph`` (the joint's copy of forward, before
    differentiation) and lets backward differentiate their nodes; returns their names (none for a
    framework without these habits)."""
    views = profile.views or profile.weight_views
    if not views:
        return []
    made: set[int] = set()
    for name in folded_each_step(graph):  # folded at export time, made at each step: a leaf of its own
        t = graph.tensors[name]
        t.kind, t.meta["from_parameter"], t.meta["weight_copy"] = "activation", True, True
        if folded_away(graph, name):  # its parameters, resident in eager, are in no tensor: it stands in
            t.meta["stands_for_parameters"] = True
        made.add(id(t))
    # TensorFlow differentiates every variable a function reads (``function_inputs``): a tensor computed
    # from a non-trainable one (BatchNorm's rsqrt(moving_variance + eps)), or from a view of one, is made
    # at each step as well
    every = profile.function_inputs and not profile.views
    variables = {id(t) for t in graph.tensors.values() if every and "variable" in t.meta}
    for node in graph.nodes:
        if not node.meta.get("constant"):
            continue
        ins = [t for t in node.inputs if t is not None]
        if not any(id(t) in made for t in ins):
            if _weight_view(node, views, bool(profile.views)):
                if ins and id(ins[0]) in variables:  # a variable's buffer under another name
                    variables.update(id(t) for t in node.outputs if t is not None)
                continue
            if not any(t.kind == "parameter" or id(t) in variables for t in ins):
                continue
        outs = [t for t in node.outputs if t is not None
                and (t.kind == "parameter" or (every and t.kind == "constant" and t.is_float))]
        if not outs:
            continue
        del node.meta["constant"]
        for t in outs:
            t.kind = "activation"
            if node.kind == "cast":
                t.meta["weight_copy"] = True
            made.add(id(t))
    return [t.name for t in graph.tensors.values() if id(t) in made]


_MATMULS = frozenset({"matmul", "gemm"})


def per_call_casts(graph: Graph, profile) -> list[str]:
    """Autocast casts a float32 activation to the lower dtype in every lower-precision op that reads it
    (only weights are cached), where an export writes one Cast for all of them (the exporter merges the
    calls' identical casts): one more Cast per further matmul that runs under autocast (its weight is a
    per-step copy of an fp32 parameter), right after the first. A model cast to bf16 casts once, and its
    matmuls read bf16 parameters. Returns the new tensors' names."""
    if not profile.views:
        return []
    copies: dict[int, list[Node]] = {}
    for node in list(graph.nodes):
        if node.kind != "cast" or node.meta.get("constant") or len(node.inputs) != 1 \
                or len(node.outputs) != 1:
            continue
        x, y = node.inputs[0], node.outputs[0]
        if x is None or y is None or x.dtype != "float32" or y.dtype not in LOWER_FLOAT_DTYPES:
            continue
        readers = [c for c in dict.fromkeys(y.consumers) if c.kind in _MATMULS and _under_autocast(c, y)]
        for i, reader in enumerate(readers[1:], 1):
            t = graph.tensor(unique_name(f"{y.name}.call{i}", graph.tensors), dtype=y.dtype, shape=y.shape,
                             kind="activation")
            copy = graph.add_node(Node(graph.unique_node_name(f"{node.name}.call{i}"), node.op_type,
                                       node.kind, [x], [t], dict(node.attrs), node.domain, "forward",
                                       {"per_call_of": node.name}))
            redirect([reader], y, t)
            copies.setdefault(id(node), []).append(copy)
    if copies:
        made = {id(c) for cs in copies.values() for c in cs}
        graph.nodes = [m for n in graph.nodes if id(n) not in made for m in (n, *copies.get(id(n), ()))]
    return [c.outputs[0].name for cs in copies.values() for c in cs]


def _under_autocast(matmul: Node, x: Tensor) -> bool:
    """The matmul's other operand is a per-step copy of a parameter (through views): autocast's weight."""
    for w in matmul.inputs[:2]:
        while w is not None and w is not x and "weight_copy" not in w.meta and w.producer is not None \
                and w.producer.kind in ("transpose", "reshape", "identity") and w.producer.inputs:
            w = w.producer.inputs[0]
        if w is not None and w is not x and "weight_copy" in w.meta:
            return True
    return False


def _weight_view(node, views: frozenset[str], selects: bool = True) -> bool:
    """``node`` views its first input: a view kind (a cast to another dtype copies), or, with ``selects``
    (PyTorch's), a slice or a gather of one index (``w[e]``: select)."""
    if node.kind == "cast":
        x, y = (node.inputs[0] if node.inputs else None), (node.outputs[0] if node.outputs else None)
        return x is not None and y is not None and x.dtype == y.dtype
    if node.kind in views:
        return True
    if not selects:
        return False
    if node.kind == "slice":
        return True
    index = node.inputs[1] if node.kind == "gather" and len(node.inputs) == 2 else None
    return index is not None and index.shape == ()


def linear_bias_add(y: Tensor) -> Node | None:
    """The Add of a parameter vector that is linear's bias, when it reads ``y`` (a matmul's output) and
    nothing else does: addmm writes y + b at once."""
    if len(y.consumers) != 1:
        return None
    add = y.consumers[0]
    if add.kind not in _BIAS_KINDS or len(add.inputs) != 2:
        return None
    other = add.inputs[1] if add.inputs[0] is y else add.inputs[0]
    ok = other is not None and other.kind in _RESIDENT and other.shape is not None and len(other.shape) == 1
    return add if ok else None


def _read_by_backward(joint: Graph) -> set[Tensor]:
    """The forward tensors a backward op reads: the framework keeps them, whatever the export calls them."""
    out: set[Tensor] = set()
    for node in joint.nodes:
        if node.phase == "backward":
            out.update(t for t in node.inputs if t is not None and t.producer is not None
                       and t.producer.phase == "forward")
    return out

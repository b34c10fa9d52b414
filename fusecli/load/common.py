"""What every loader does once its nodes are in: weight-only subgraphs, and per-channel bias Adds."""

from __future__ import annotations

from collections.abc import Callable

from ..core.ir import Graph, Node, Tensor
from ..core.kinds import is_channel_vector, reads_values, value_inputs

# kinds whose output is a view of their first input in PyTorch (a select, slice, view, permute, squeeze,
# split) or, for a cast to its own type, the input itself. Not Expand: a parameter expanded to the batch
# would count batch-sized resident bytes where PyTorch's expand allocates none.
VIEW_KINDS = frozenset({"gather", "slice", "reshape", "flatten", "transpose", "squeeze", "unsqueeze", "cast",
                        "identity", "split"})


def mark_constant_subgraphs(graph: Graph, sources: tuple[str, ...] = (),
                            weight_ops: tuple[str, ...] = ()) -> list[Node]:
    """Nodes fed only by parameters and constants (and ``sources`` ops, inputs or not) compute weights:
    mark them constant; float outputs are parameters when fed by one (or made by ``weight_ops``), else
    constants. Returns the marked nodes."""
    marked = []
    for node in graph.nodes:
        ins = [t for t in value_inputs(node.op_type, node.inputs) if t is not None]
        if node.op_type not in sources and (not ins or node.kind == "random"):
            continue
        if any(t.kind in ("input", "activation") for t in ins):
            continue
        node.meta["constant"] = True
        weight = node.op_type in weight_ops or any(t.kind == "parameter" for t in ins)
        for t in node.outputs:
            if t is not None:
                t.kind = "parameter" if weight and t.is_float else "constant"
        marked.append(node)
    return marked


def refine_bias_adds(graph: Graph, channel_axis: Callable[[Tensor], int | None],
                     grad_kind: str | None = None) -> None:
    """An ``add`` of an activation and a per-channel parameter or constant (on ``channel_axis(x)`` of x,
    when that names one) is a ``bias_add``; ``grad_kind`` keeps another kind's gradient for it."""
    for node in graph.nodes:
        if node.kind != "add" or len(node.inputs) != 2 or None in node.inputs:
            continue
        a, b = node.inputs
        for x, bias in ((a, b), (b, a)):
            if x.kind in ("input", "activation") and bias.kind in ("parameter", "constant") \
                    and is_channel_vector(bias, x, channel_axis(x)):
                node.kind = "bias_add"
                node.meta["bias_input"] = node.inputs.index(bias)
                if grad_kind is not None:
                    node.meta["grad_kind"] = grad_kind
                break


def mark_parameter_views(graph: Graph) -> list[Node]:
    """A view of a parameter (VIEW_KINDS: ``w[:, :seq]``, its reshape or transpose) by operands computed
    from shapes and constants alone (no input's values), or its select ``w[e]`` (a Gather by a scalar
    index, computed from anything) is the
    parameter, as PyTorch's views share its storage: the node is marked constant (it computes a weight)
    and its outputs are parameters, ``meta["view_of"]`` naming the viewed parameter. Views by constants
    alone are ``mark_constant_subgraphs``' already; this adds those whose bounds come from the inputs'
    shapes. Returns the marked nodes."""
    marked = []
    for node in graph.nodes:  # topological order: a view of a view is one too
        base = node.input(0)
        if node.meta.get("constant") or node.kind not in VIEW_KINDS or base is None \
                or base.kind != "parameter" \
                or not all(t is not None and t.is_float for t in node.outputs) \
                or (node.kind == "gather" and (node.input(1) is None or node.input(1).shape != ())) \
                or (node.kind != "gather" and any(reads_values(t)
                                                  for t in value_inputs(node.op_type, node.inputs)[1:])):
            continue  # a Gather by an index vector is index_select, a copy; by a scalar, a select (view),
            # whatever computes the scalar (a MoE expert's weight w[e], e read from the routing)
        node.meta["constant"] = True
        for t in node.outputs:
            t.kind = "parameter"
            t.meta["view_of"] = base.meta.get("view_of", base.name)
        marked.append(node)
    return marked

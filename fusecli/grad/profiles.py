"""How a framework's autodiff differentiates: one Profile per framework, chosen per model.

A profile holds what the plain per-op rules (``rules.RULES``) do not say: its rule overrides (PyTorch's
relu6 reads x where TensorFlow's reads y), its composite ops (PyTorch's gelu is one autograd node that
saves x, not the five tensors of its ONNX spelling), and its graph-building and shape-read habits
(TensorFlow's ``ZerosLike`` of unused outputs, its gradients of constant operands, the tensors it keeps
only to read their shape). docs/profiles.md's table of habits lists the same facts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..core.ir import Graph, Node, Tensor
from .layout import Layouts
from .rules import RULES, G, Grad


def tensorflow_keeps_for_shape(t: Tensor, reader: Node) -> bool:
    """TensorFlow captures a tensor to take its shape in backward when a dim is unknown in its graph;
    its Reshape gradient needs none with one unknown dim (it reshapes to a -1 wildcard). The gradient of
    a layout op a converter added (tf2onnx's Squeeze after a Mean, load.tf2onnx) is none TensorFlow runs."""
    if reader.meta.get("converter_made"):
        return False
    shape = t.meta.get("graph_shape", t.shape)  # as TensorFlow's graph has it, before fusecli sized it
    if shape is None:
        return True
    unknown = sum(d is None for d in shape)
    return unknown > (1 if reader.op_type == "ReshapeGrad" and 0 not in shape else 0)


@dataclass(frozen=True)
class Profile:
    """One framework's autodiff habits; ``ops`` (no habits) is the plain per-op rules table."""

    name: str
    doc: str
    overrides: Mapping[str, dict[int | str, Grad]] = field(default_factory=dict)
    zeros_like_unused: bool = False  # several float outputs, some without a gradient: ZerosLike(those)
    constant_operands: bool = False  # a gradient function differentiates every float input
    custom_gradients: bool = False  # honour TensorFlow's _gradient_op_type (registered gradients)
    function_inputs: bool = False  # a called function's gradient covers all its float inputs and variables
    composites: tuple = ()  # grad.composites.Composite: decomposed ops judged as one backward node
    keeps_for_shape: Callable[[Tensor, Node], bool] | None = None  # liveness: a shape read keeps t
    views: frozenset[str] = frozenset()  # kinds whose output shares its input's storage (PyTorch views)
    # a framework that runs its weight-only ops at every step (TensorFlow's graph), without PyTorch's
    # storage habits: the kinds whose output is its input's buffer under a new name (grad.storage)
    weight_views: frozenset[str] = frozenset()
    frozen: Callable[[Graph], set[str]] | None = None  # parameters the framework does not differentiate
    device: str = "cpu"  # where the framework runs: its fused attention kernels differ (grad/sdpa.py)
    dims: Mapping[str, int] = field(default_factory=dict)  # the analysis sizes (a sliding-window mask's fate)
    # the model's outputs stay alive through backward: ``out = model(x); loss_fn(out).backward()`` holds out
    outputs_held: bool = False

    def rule_for(self, kind: str) -> dict[int | str, Grad] | None:
        """The rule of a kind under this profile, or None when there is none (unsupported)."""
        rule = self.overrides.get(kind)
        return rule if rule is not None else RULES.get(kind)

    def storage_of(self, t: Tensor, layouts: Layouts | None = None) -> Tensor:
        """The tensor whose storage ``t`` shares: a view's base (PyTorch saves the view, which keeps
        its base's storage alive: one storage, counted once), else ``t``. ``layouts``: the strides
        PyTorch gives each tensor (grad.layout), which tell a reshape that copies from one that views."""
        while self.views and t.producer is not None \
                and (t.producer.kind in self.views or _select(t.producer)) and t.producer.inputs \
                and t.producer.inputs[0] is not None \
                and t.producer.inputs[0].dtype == t.dtype \
                and (t.producer.outputs[0] is t or t.producer.kind in _EVERY_OUTPUT_VIEWS):
            x = t.producer.inputs[0]
            if layouts is not None and t.producer.kind in ("reshape", "flatten"):
                if layouts.reshape_copies(t):  # no strides for it (computeStride): a copy, its own storage
                    break  # (transpose(1, 2).contiguous(); repeat_kv's expand over several K/V heads)
            elif x.producer is not None and x.producer.kind == "expand" and t.producer.kind != "expand":
                break  # without layouts: reshaping a broadcast view is taken as a copy (repeat_kv's K, V)
            t = x
        return t


def _select(node) -> bool:
    """``x[..., i, :]`` (aten::select, a view): a Gather of one constant index, a 0-d index (Persimmon's
    q, k and v picked from one fused projection viewed as (b, s, h, 3, d))."""
    index = node.inputs[1] if node.kind == "gather" and len(node.inputs) == 2 else None
    return index is not None and index.shape == () and index.kind == "constant"


# kinds each of whose outputs is a view of input 0: torch.split / chunk / unbind return narrow()s, which
# keep the whole input's storage alive (GPT-2's q, k, v split from c_attn's one output)
_EVERY_OUTPUT_VIEWS = frozenset({"split"})

OPS = Profile("ops", "the plain per-op rules table, each ONNX op differentiated on its own")

TENSORFLOW = Profile(
    "tensorflow", "TensorFlow's graph-mode gradient functions (tf.GradientTape in a tf.function)",
    zeros_like_unused=True, constant_operands=True, custom_gradients=True, function_inputs=True,
    keeps_for_shape=tensorflow_keeps_for_shape,
    # Reshape, Squeeze, ExpandDims, Identity forward their input's buffer (Tensor::CopyFrom); a Cast to
    # another dtype, Mul, Transpose... allocate: a Keras policy's float16 copy of a float32 variable
    weight_views=frozenset({"reshape", "squeeze", "unsqueeze", "identity"}))


def _pytorch() -> Profile:
    from .composites import PYTORCH_COMPOSITES
    from .torch_export import frozen_parameters

    return Profile(
        "pytorch", "PyTorch's eager autograd (derivatives.yaml), composite ops as one autograd node",
        overrides={
            "relu6": {0: G("HardtanhBackward", "x0")},  # hardtanh_backward(grad, self, 0, 6)
            "elu": {0: G("EluBackward", "x0")},  # elu_backward(..., is_result=false, self)
            "selu": {0: G("EluBackward", "x0")},  # selu is an elu: saves self
            "max_pool": {0: G("MaxPoolWithIndicesBackward", "x0", "y0")},  # x and the indices (as y)
            "global_max_pool": {0: G("MaxPoolWithIndicesBackward", "x0", "y0")},
            "gather_elements": {0: G("GatherBackward", "x0", "x1")},  # saves self and index
            "tan": {0: G("TanBackward", "y0")},  # grad * (1 + result^2)
            "asinh": {0: G("AsinhBackward", "x0")},  # grad * rsqrt(self^2 + 1)
            "acosh": {0: G("AcoshBackward", "x0")},  # grad * rsqrt(self^2 - 1)
            # ConvolutionBackward0 saves input and weight whichever gradients it computes (a weight's
            # autocast copy is kept even for the first conv, whose input needs none)
            "conv": {0: G("ConvBackpropInput", "x1", "x0.shape"), 1: G("ConvBackpropFilter", "x0", "x1"),
                     2: G("BiasAddGrad")},
        },
        composites=PYTORCH_COMPOSITES,
        # reshape/view/permute/squeeze/expand/split and x[a:b] (narrow, unbind as slices) return views;
        # .to(its own dtype) returns the tensor itself
        views=frozenset({"reshape", "flatten", "squeeze", "unsqueeze", "transpose", "identity", "cast",
                         "expand", "split", "slice"}),
        frozen=frozen_parameters,  # dynamo: buffers and values folded from them are no parameters
        outputs_held=True)


PROFILES: dict[str, Callable[[], Profile]] = {
    "ops": lambda: OPS, "tensorflow": lambda: TENSORFLOW, "pytorch": _pytorch}
_TENSORFLOW_PRODUCERS = ("tf2onnx", "keras2onnx")


def get_profile(name: str) -> Profile:
    """The profile called ``name`` (``ops``, ``tensorflow``, ``pytorch``)."""
    return PROFILES[name]()


def choose_profile(graph: Graph, override: str | None = None) -> tuple[Profile, str]:
    """The profile for ``graph`` and why: the user's choice, else the framework that made the model."""
    if override is not None:
        return get_profile(override), "--autodiff"
    if graph.format == "savedmodel":
        return TENSORFLOW, "a TensorFlow SavedModel"
    producer = graph.meta.get("producer") or ""
    if producer == "pytorch":
        return get_profile("pytorch"), "ONNX producer_name 'pytorch'"
    if producer in _TENSORFLOW_PRODUCERS:
        return TENSORFLOW, f"ONNX producer_name {producer!r}"
    why = f"ONNX producer_name {producer!r}" if producer else "ONNX without producer_name"
    return OPS, f"{why}: no framework's habits known, plain per-op rules"

"""What torch's dynamo exporter records about each node (``metadata_props``), read into ``node.meta``.

- ``module``: the dotted module path ('encoder.layer.0.attention', from ``name_scopes``); the node names
  ('node_linear_4') say nothing of the module, which ``fusecli diff`` pairs blocks by;
- ``torch_classes``: the `transformers` model classes of the modules it runs in ('FalconModel', from
  ``class_hierarchy``): which model's habits made it (grad/sdpa.py: whether transformers hands sdpa its
  causal mask);
- ``fx_args``: for the nodes of an ``aten.scaled_dot_product_attention`` call, the FX names of its
  arguments ('transpose_2', 'cat', 'cat_1', 'expand': q, k, v, mask, from ``fx_node``): an argument the
  ONNX graph reads under another name was made by an op the exporter dropped (grad/sdpa.py);
- ``fx_call``: the FX node's own name and its arguments' names ('sub_34', ('embedding', 'mean'), from
  ``fx_node``): a reader naming an argument no tensor of the graph has read one the exporter's
  common-subexpression pass merged into another (grad/torch_export.py);
- ``softmax_dtype``: the dtype ``aten.softmax.int`` was asked to compute in (``softmax(x, dim,
  dtype=torch.float32)``, Gemma's eager attention), which the dynamo export drops on a bf16 model: its
  Softmax node then reads and writes bf16 (grad/torch_export.py restores the casts);
- ``rewritten_by``: the onnxscript rewrite rules that made the node, in the order they ran
  (('FuseBatchNormIntoConv', 'RemoveOptionalBiasFromConv'), from ``pkg.onnxscript.rewriter.rule_name``,
  comma-separated): what the export's optimizer folded into it (grad/torch_export.py).
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache

SCOPES = "pkg.torch.onnx.name_scopes"
CLASSES = "pkg.torch.onnx.class_hierarchy"
FX_NODE = "pkg.torch.onnx.fx_node"
RULE = "pkg.onnxscript.rewriter.rule_name"
_LONGEST = 4096  # characters of a value read; longer ones are no exporter's
_FX_ARGS = re.compile(r"\]\(args = \((.*?)\), kwargs = ")
_FX_NAME = re.compile(r"%(\w+) : ")
_FX_REF = re.compile(r"%(\w+)")
_TRANSFORMERS_CLASS = re.compile(r"transformers\.models\.\w+\.modeling_\w+\.(\w+)")


def torch_node_meta(props) -> dict:
    """The meta entries of one node's ``metadata_props`` (those it has)."""
    meta: dict = {}
    for p in props:
        key = p.key
        if key == SCOPES:
            module = _module(p.value)
            if module:
                meta["module"] = module
        elif key == CLASSES:
            classes = _classes(p.value)
            if classes:
                meta["torch_classes"] = classes
        elif key == RULE and len(p.value) < _LONGEST:
            meta["rewritten_by"] = tuple(r.strip() for r in p.value.split(",") if r.strip())
        elif key == FX_NODE:
            call = _fx_call(p.value)
            if call is not None:
                meta["fx_call"] = call
            if "aten.softmax.int" in p.value:
                dtype = _softmax_dtype(p.value)
                if dtype:
                    meta["softmax_dtype"] = dtype
            elif "aten.scaled_dot_product_attention" in p.value:
                args = _fx_call_args(p.value)
                if args:
                    meta["fx_args"] = args
    return meta


def _module(scopes_text: str) -> str | None:
    """The module path: the next-to-last name scope (the last is the node's own name)."""
    if len(scopes_text) >= _LONGEST:
        return None
    try:
        scopes = ast.literal_eval(scopes_text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(scopes, list) and len(scopes) >= 2 and isinstance(scopes[-2], str) \
            and not scopes[-2].startswith("_"):  # '_empty_nn_module_stack...': no module
        return scopes[-2]
    return None


@lru_cache(maxsize=1024)  # the nodes of one module share one hierarchy
def _classes(hierarchy: str) -> tuple[str, ...]:
    if "transformers.models." not in hierarchy:
        return ()
    return tuple(dict.fromkeys(_TRANSFORMERS_CLASS.findall(hierarchy)))


@lru_cache(maxsize=1024)  # the nodes of one sdpa call share its FX node
def _fx_call_args(fx_node: str) -> tuple[str, ...]:
    if len(fx_node) >= _LONGEST:
        return ()
    m = _FX_ARGS.search(fx_node)
    return tuple(a.strip().removeprefix("%") for a in m.group(1).split(",")) if m else ()


def _fx_call(fx_node: str) -> tuple[str, tuple[str, ...]] | None:
    """'%sub_34 : [num_users=1] = call_function[...](args = (%embedding, %mean), ...)' -> ('sub_34',
    ('embedding', 'mean')): the node's name and the names of the FX nodes it reads (lists flattened)."""
    m = _FX_NAME.match(fx_node)
    if m is None or len(fx_node) >= _LONGEST:
        return None
    found = _FX_ARGS.search(fx_node)
    args = tuple(_FX_REF.findall(found.group(1))) if found else ()
    return m.group(1), args


_TORCH_FLOATS = {"torch.float32": "float32", "torch.float16": "float16", "torch.bfloat16": "bfloat16",
                 "torch.float64": "float64"}


def _softmax_dtype(fx_node: str) -> str | None:
    """softmax(x, dim, dtype)'s dtype argument, as ONNX names it ('float32'), or None without one."""
    args = _fx_call_args(fx_node)  # the call's arguments: (%x, -1, torch.float32)
    return _TORCH_FLOATS.get(args[2]) if len(args) == 3 else None

"""Model builders and checks for the rewrite tests, independent of fusecli.rewrite's own verify code."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

MS = "com.microsoft"
FUSED_KERNELS = ("FusedConv", "FusedGemm", "FusedMatMul", "Gelu", "BiasGelu", "FastGelu",
                 "LayerNormalization", "SkipLayerNormalization", "MultiHeadAttention", "QuickGelu",
                 "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization",
                 "EmbedLayerNormalization")


def ops(model: onnx.ModelProto) -> Counter:
    """Op types, 'com.microsoft.' in front of contrib ops."""
    return Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
                   for n in model.graph.node)


def left_unfused(warnings: list[str]) -> list[str]:
    """The 'not rewritten' lines of regions left out (a check failed, a tensor still read, a broken graph),
    not those of matches no kernel takes (rewrite.plan.NO_KERNEL: said, never emitted)."""
    from fusecli.rewrite.plan import NO_KERNEL

    return [w for w in warnings if w.startswith("not rewritten") and f": {NO_KERNEL}" not in w]


def nodes(model: onnx.ModelProto, op_type: str) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == op_type]


def attr(node: onnx.NodeProto, name: str, default=None):
    a = next((a for a in node.attribute if a.name == name), None)
    v = default if a is None else helper.get_attribute_value(a)
    return v.decode() if isinstance(v, bytes) else v


def init(model: onnx.ModelProto, name: str) -> np.ndarray:
    return numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == name))


def fused_kernel_count(model: onnx.ModelProto) -> int:
    """Nodes of the fused-kernel op types (FusedConv, FusedGemm, Gelu, LayerNormalization, ...)."""
    return sum(1 for n in model.graph.node if n.op_type in FUSED_KERNELS)


def assert_cuda_kernels_only(model: onnx.ModelProto) -> None:
    """What ONNX Runtime's CUDA provider has: FusedConv with Relu (float32) only, no FusedGemm."""
    for n in model.graph.node:
        assert n.op_type != "FusedGemm", "FusedGemm has no CUDA kernel"
        if n.op_type == "FusedConv":
            assert attr(n, "activation") == "Relu", f"CUDA FusedConv: Relu only, not {attr(n, 'activation')}"


def _feeds(sess: ort.InferenceSession, batch: int, dims: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else dims.get(d, batch if k == 0 else 1)
                 for k, d in enumerate(i.shape)]
        if i.type == "tensor(float)":
            out[i.name] = rng.standard_normal(shape).astype(np.float32)
        else:
            out[i.name] = rng.integers(0, 2, shape).astype(np.int64)
    return out


def ort_run(model, feeds: dict | None = None, batch: int = 2, dims: dict | None = None, seed: int = 1):
    """(feeds, outputs by name) of ``model`` (a ModelProto or a path) with optimizations off."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    sess = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    feeds = feeds if feeds is not None else _feeds(sess, batch, dims or {}, seed)
    names = {i.name for i in sess.get_inputs()}
    outs = sess.run(None, {k: v for k, v in feeds.items() if k in names})
    return feeds, {o.name: v for o, v in zip(sess.get_outputs(), outs, strict=True)}


def assert_same_outputs(original, rewritten, batch: int = 2, dims: dict | None = None,
                        rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """Original and rewritten agree on fresh inputs (another seed than fusecli's verify uses)."""
    feeds, ref = ort_run(original, batch=batch, dims=dims, seed=12345)
    _, got = ort_run(rewritten, feeds)
    assert set(ref) == set(got)
    for name, value in ref.items():
        assert np.all(np.isfinite(value)), f"{name}: the original itself is not finite"
        np.testing.assert_allclose(got[name], value, rtol=rtol, atol=atol, err_msg=name)

"""The "training-safe if recomputed" verdict: can a fused backward rebuild what blocks a fusion?

A blocked match (backward reads a tensor made inside the fused kernel) becomes training-safe when every
blocking tensor can be recomputed inside the fused backward from tensors backward keeps anyway (the
match's inputs that some backward op reads, parameters, constants) plus small statistics the forward
writes out. Recomputing must not re-run a contraction (conv, matmul), with one exception that
FlashAttention made standard: attention's scores q k^T, recomputed from q and k with the softmax row
statistics (logsumexp, one float32 per row) kept instead of P.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..core.dims import dim_value
from ..core.ir import Node, Tensor, dtype_size
from ..core.trees import is_noop
from ..memory.liveness import Liveness
from .match import Match

CONTRACTIONS = frozenset({"conv", "conv_transpose", "matmul", "gemm", "einsum", "fused_conv", "fused_gemm"})
# FLOPs per output element of each op re-run in backward (exp, erf, tanh, sigmoid: ~4 as in roofline models)
PER_ELEMENT = {"sigmoid": 4, "tanh": 4, "exp": 4, "erf": 4, "erfc": 4, "gelu": 8, "softmax": 5,
               "batch_norm": 2, "layer_norm": 8, "hard_sigmoid": 2, "hard_swish": 3, "relu6": 1, "clip": 1,
               "rsqrt": 4, "sqrt": 4, "pow": 1, "reduce_mean": 1}
# views: the fused kernel reads the viewed tensor (a GQA kernel reads K and V before repeat_kv's expand)
VIEWS = frozenset({"identity", "reshape", "transpose", "squeeze", "unsqueeze", "expand", "tile"})
FREE = VIEWS | {"cast", "dropout"}
# a pattern's recompute rule (Pattern.recompute) -> the role of the contraction it may re-run:
# "flash": q k^T from q and k, the softmax row statistics kept instead of P (FlashAttention)
RULES = {"flash": "qk"}


@dataclass
class Recompute:
    """What the fused backward recomputes and its price, per training step."""

    tensors: list[str]  # the interior tensors no longer kept for backward
    flops: int | None  # FLOPs added to backward (None: a size is unknown)
    bytes_freed: int | None  # bytes of those tensors (aliases counted once)
    bytes_kept: int | None  # extra bytes kept instead: row statistics, inputs nothing else keeps
    kept: list[str] = field(default_factory=list)  # names of what is kept instead
    recipe: str = ""  # one line: how (e.g. FlashAttention)
    kept_sizes: dict[str, int | None] = field(default_factory=dict)  # bytes of each kept name

    @property
    def net_bytes_freed(self) -> int | None:
        """What recomputing frees once what it keeps instead is counted (None: a size is unknown)."""
        if self.bytes_freed is None or self.bytes_kept is None:
            return None
        return self.bytes_freed - self.bytes_kept

    @property
    def frees_nothing(self) -> bool:
        """It keeps at least as many bytes as it frees (at the dims the bytes were counted at)."""
        return self.net_bytes_freed is not None and self.net_bytes_freed <= 0

    def to_json(self) -> dict:
        return {"tensors": self.tensors, "flops": self.flops, "bytes_freed": self.bytes_freed,
                "bytes_kept": self.bytes_kept, "net_bytes_freed": self.net_bytes_freed}


def _numel(t: Tensor, sizes: Mapping[str, int] | None) -> int | None:
    n = t.nbytes(sizes)
    return None if n is None else n // max(dtype_size(t.dtype), 1)


def _dim(d, dims: Mapping[str, int] | None) -> int | None:
    return dim_value(d, dims or {})


def _prod(ds, dims) -> int | None:
    n = 1
    for d in ds:
        d = _dim(d, dims)
        if d is None:
            return None
        n *= d
    return n


def _contracted(node: Node, dims: Mapping[str, int] | None) -> int | None:
    """Multiply-adds per output element: a matmul's inner dim, a conv's (Cin / groups) * kernel area
    (ONNX OIHW; TensorFlow HWIO, depthwise HW1M), an einsum's summed letters; None when unknown."""
    a, w = node.input(0), node.input(1)
    if node.kind in ("conv", "fused_conv", "conv_transpose"):
        if w is None or not w.shape:
            return None
        if node.op_type == "DepthwiseConv2dNative":
            return _prod(w.shape[:-2], dims)
        return _prod(w.shape[:-1] if node.op_type in ("Conv2D", "Conv3D") else w.shape[1:], dims)
    if node.kind == "einsum":
        eq = str(node.attrs.get("equation", ""))
        ins, _, out = eq.replace(" ", "").partition("->")
        first = ins.split(",")[0]
        summed = [c for c in dict.fromkeys(first) if c not in out and c.isalpha()]
        if not out or a is None or a.shape is None or len(first) != len(a.shape):
            return None
        return _prod([a.shape[first.index(c)] for c in summed], dims)
    k = _dim(a.shape[-1], dims) if a is not None and a.shape else None
    if k is None and node.kind == "matmul" and w is not None and w.shape and len(w.shape) >= 2:
        k = _dim(w.shape[-2], dims)  # x @ w: x's last dim is w's second to last (TF's Tensordot hides x's)
    return k


def node_flops(node: Node, dims: Mapping[str, int] | None) -> int | None:
    """FLOPs of one forward run of ``node`` at ``dims`` (None when a size is unknown)."""
    if node.kind in FREE:
        return 0
    out = node.outputs[0]
    n = _numel(out, dims)
    if n is None:
        return None
    if node.kind in CONTRACTIONS:
        k = _contracted(node, dims)
        return None if k is None else 2 * n * k  # a multiply-add per output element per k
    if node.kind in FREE:
        return 0
    return n * PER_ELEMENT.get(node.kind, 1)


def storage(t: Tensor, inside: set[int]) -> Tensor:
    """The tensor whose memory ``t`` views, walking views inside the match (PyTorch's view semantics)."""
    while t.producer is not None and id(t.producer) in inside and t.producer.outputs[0] is t and (
            t.producer.kind in VIEWS or is_noop(t.producer)) and t.producer.inputs:
        t = t.producer.inputs[0]
    return t


def _add(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


def plan(m: Match, blocking: list, live: Liveness, dims: Mapping[str, int] | None = None,
         flops_of: Callable[[Node], int | None] | None = None) -> Recompute | str:
    """A Recompute for the blocked match ``m``, or the reason it cannot be recomputed (``flops_of``: the
    caller's ``node_flops`` at ``dims``, when it keeps them for many matches)."""
    if flops_of is None:
        def flops_of(n: Node) -> int | None:
            return node_flops(n, dims)
    inside = {id(n) for n in m.nodes}
    attention_qk = m.roles.get(RULES[m.pattern.recompute]) if m.pattern.recompute else None
    rerun: dict[int, Node] = {}
    leaves: dict[int, Tensor] = {}

    def need(t: Tensor) -> str | None:
        p = t.producer
        if p is None or id(p) not in inside:
            leaves[id(t)] = t
            return None
        if id(p) in rerun:
            return None
        if p.kind in CONTRACTIONS and p is not attention_qk:
            f = flops_of(p)
            cost = f"{f:,} FLOPs" if f is not None else "a size fusecli does not know"
            return (f"recomputing {t.name} would re-run {p.op_type} {p.name} in backward ({cost}), "
                    "so no fused backward recomputes it")
        rerun[id(p)] = p
        for i in p.inputs:
            if i is not None:
                why = need(i)
                if why:
                    return why
        return None

    for b in blocking:
        why = need(b.tensor)
        if why:
            return why
    flops: int | None = 0
    for n in rerun.values():
        flops = _add(flops, flops_of(n))
    # a view (reshape, transpose, no-op cast) is the storage it views: keeping k instead of k^T frees nothing
    before = {id(storage(b.tensor, inside)): storage(b.tensor, inside) for b in blocking}
    after: dict[int, Tensor] = {}
    for t in leaves.values():
        s = live.saved_by_name.get(t.name)
        if t.kind in ("parameter", "constant") or (s is not None and s.reads == "value"):
            continue  # backward keeps it anyway
        after[id(t)] = t
    freed: int | None = 0
    for k, t in before.items():
        if k not in after:
            freed = _add(freed, t.nbytes(dims))
    tensors = [b.tensor.name for b in blocking if id(storage(b.tensor, inside)) not in after]
    kept = {t.name: t.nbytes(dims) for k, t in after.items() if k not in before}
    for n in rerun.values():
        if n.kind == "softmax":  # logsumexp per row, float32 (FlashAttention's L)
            y = n.outputs[0]
            shape = None if y.shape is None else (*y.shape[:-1], 1)
            stats = Tensor(f"{y.name}.row_stats", "float32", shape)
            kept[stats.name] = stats.nbytes(dims)
    kept_bytes: int | None = 0
    for b in kept.values():
        kept_bytes = _add(kept_bytes, b)
    recipe = ("FlashAttention: keep the softmax row statistics, recompute q k^T and P per tile"
              if attention_qk is not None else
              "recompute " + ", ".join(sorted({n.op_type for n in rerun.values()})) + " from kept inputs")
    return Recompute(tensors, flops, freed, kept_bytes, list(kept), recipe, kept)


@dataclass
class RecomputeAll:
    """Backward's saved bytes once every recomputable fusion that frees memory is taken."""

    saved_bytes: int | None  # never above the saved bytes today (None: a size is unknown)
    taken: int  # fusions that free memory, taken
    recomputable: int  # matches whose verdict is "training-safe if recomputed"


class _Ledger:
    """Saved bytes while recompute plans are taken and dropped: a name freed by a plan leaves the saved
    set unless a taken plan keeps it, a name kept joins it once (counts, so each step costs one plan)."""

    def __init__(self, live: Liveness) -> None:
        self.live = live
        self.freed: dict[str, int] = {}
        self.kept: dict[str, int] = {}
        self.total: int | None = live.saved_bytes

    def _bytes(self, name: str, rc: Recompute) -> int | None:
        s = self.live.saved_by_name.get(name)
        return (s.bytes or 0) if s is not None else rc.kept_sizes.get(name)

    def _state(self, name: str) -> bool:
        """Is ``name`` in the saved set (as far as the plans change it)?"""
        today = name in self.live.saved_by_name
        return self.kept.get(name, 0) > 0 or (today and not self.freed.get(name, 0))

    def _change(self, names, counts: dict[str, int], step: int, rc: Recompute) -> None:
        for name in names:
            before = self._state(name)
            counts[name] = counts.get(name, 0) + step
            after = self._state(name)
            if before != after:
                b = self._bytes(name, rc)
                if b is None or self.total is None:
                    self.total = None
                else:
                    self.total += b if after else -b

    def apply(self, rc: Recompute, step: int) -> None:
        """Take (step 1) or drop (step -1) one plan."""
        self._change(rc.tensors, self.freed, step, rc)
        self._change(rc.kept_sizes, self.kept, step, rc)


def _search(live: Liveness, plans: list[Recompute], start: bool) -> tuple[int, int | None]:
    """From none or all of ``plans`` taken, take or drop one at a time (largest net saving first) while that
    lowers the saved bytes: a kept input several matches share (a mask) pays off only together."""
    ledger = _Ledger(live)
    taken = dict.fromkeys((id(rc) for rc in plans), start)
    if start:
        for rc in plans:
            ledger.apply(rc, 1)
    changed = True
    while changed and ledger.total is not None:
        changed = False
        for rc in sorted(plans, key=lambda rc: -(rc.net_bytes_freed or 0)):
            best = ledger.total
            step = -1 if taken[id(rc)] else 1
            ledger.apply(rc, step)
            if ledger.total is None:
                break
            if ledger.total < best:
                taken[id(rc)], changed = not taken[id(rc)], True
            else:
                ledger.apply(rc, -step)
    return sum(taken.values()), ledger.total


def recompute_all(matches: list[Match], live: Liveness) -> RecomputeAll:
    """The recomputable fusions that together free the most, and the saved bytes then: never above
    today's (a fusion that keeps as much as it frees is left out)."""
    plans = [m.verdict.recompute for m in matches if getattr(m.verdict, "recompute", None) is not None]
    best = (0, live.saved_bytes)
    for start in (False, True):
        taken, total = _search(live, plans, start)
        if total is None:
            return RecomputeAll(None, 0, len(plans))
        if total < best[1]:
            best = (taken, total)
    return RecomputeAll(best[1], best[0], len(plans))


def saved_if_recomputed(matches: list[Match], live: Liveness) -> int | None:
    """Saved bytes if every recomputable fusion that frees memory is taken (None when a size is unknown)."""
    return recompute_all(matches, live).saved_bytes

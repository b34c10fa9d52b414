"""Tensor parallelism found in the graph: Megatron's column/row pairs in each block, and the tensors they
split across the ``t`` ranks.

In a block, each matmul with a weight operand has a depth: how many such matmuls precede it on the block's
activation paths (q, k, v: 0; o: 1; gate, up: 2; down: 3; a parallel attention-and-MLP block: 0 and 1).
Even depths are column-parallel (``ColwiseParallel``: the weight's output columns split, each rank
computing its heads or its slice of the MLP), odd depths row-parallel (``RowwiseParallel``: the input
rows split, the partial outputs summed by an all-reduce). Everything on a path from a column-parallel
output to a row-parallel input is split (q, k and v by heads, the attention inside, the MLP's
activations); the rest, norms and residuals, is whole on every rank without sequence parallelism.

Sequence parallelism (Megatron's, torch's ``SequenceParallel`` on the norms with the row-parallel outputs
reduce-scattered, ``RowwiseParallel(output_layouts=Shard(1))``) splits that rest along the sequence: each
tensor of the block's (batch, seq, ...) residual stream outside the column/row region is a 1/t share,
the row-parallel outputs included; a column-parallel matmul's input is the all-gathered whole, which it
saves (and so are the views of its storage). The blocks' input arrives whole and their output is gathered
whole for what follows them (the final norm), as ``PrepareModuleInput``/``PrepareModuleOutput`` on the
first and last block do.
A backward tensor is split where the tensor it is the gradient of is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.errors import UsageError
from ..core.ir import Graph, Node, Tensor
from ..core.weights import made_of_weights
from ..plan.candidates import block_scopes
from ..spellings.attention import AttentionForm, read_attention

MATMULS = ("matmul", "gemm")
SHAPE_READS = ("shape", "size")  # read a tensor's shape, not its data: whole or split alike


@dataclass
class Split:
    """What ``t``-way tensor parallelism splits: tensor names (forward, joint and backward alike) and the
    parameters it shards, and the all-reduces it adds (the tensors they sum, forward and backward)."""

    t: int
    tensors: set[str] = field(default_factory=set)
    parameters: set[str] = field(default_factory=set)
    reduced: list[str] = field(default_factory=list)  # each all-reduce's tensor (its size is the buffer)
    pairs: int = 0  # column/row pairs found
    sequence: bool = False  # sequence parallel: the norm and residual regions split along the sequence
    chunked: list[str] = field(default_factory=list)  # whole when made, then split (the first block's input)


def find_split(graph: Graph, joint: Graph, t: int, sequence: bool = False,
               storage: dict[str, str] | None = None) -> Split:
    """The split of ``t``-way tensor parallelism (UsageError where the graph has no pair, or t does not
    divide a split dim: heads, K/V heads, a column-parallel weight's output); with ``sequence``, sequence
    parallelism's too (``storage``: tensor name -> the name of the tensor whose storage holds it)."""
    weighted = made_of_weights(graph)
    storage = storage or {}
    blocks = block_scopes(graph)
    in_block = {id(n) for nodes in blocks.values() for n in nodes}
    backward_of: dict[str, list[Node]] = {}  # forward node name -> the backward nodes of it
    for b in joint.nodes:
        if b.phase == "backward" and b.meta.get("forward") is not None:
            backward_of.setdefault(b.meta["forward"], []).append(b)
    split = Split(t, sequence=sequence)
    for scope, nodes in blocks.items():
        name = ".".join(scope)
        inside = {id(n) for n in nodes}
        depth: dict[str, int] = {}  # tensor -> the deepest weight matmul on a path into it (-1: none)
        cols, rows = [], []
        for n in nodes:
            acts = [i for i in n.inputs if i is not None and i.name not in weighted]
            before = max((depth.get(i.name, -1) for i in acts), default=-1)
            weights = [i for i in n.inputs if i is not None and i.name in weighted]
            if n.kind in MATMULS and weights and acts:
                d = before + 1
                (cols if d % 2 == 0 else rows).append(n)
            else:
                d = before
            for o in n.outputs:
                if o is not None:
                    depth[o.name] = d
        if not cols or not rows:
            continue
        split.pairs += len(rows)
        row_ids = {id(n) for n in rows}
        reach = _forward(cols, inside, row_ids)
        feeds = _backward([i for n in rows for i in n.inputs if i is not None and i.name not in weighted],
                          inside)
        region = reach & feeds
        _check(name, nodes, cols, weighted, t)
        split.tensors |= region
        for n in nodes:  # the joint graph's copy: the outputs backward adds (an sdpa's logsumexp)
            if n.kind in MATMULS and id(n) in row_ids:
                continue
            if any(i is not None and i.name in region for i in n.inputs) and joint.has_node(n.name):
                split.tensors |= {o.name for o in joint.node(n.name).outputs
                                  if o is not None and _by_heads(o)}
        split.tensors -= {o.name for n in rows for o in n.outputs if o is not None}
        inner = {_cols_out(n) for n in cols}
        for n in [*cols, *rows]:
            split.parameters |= {p.name for i in n.inputs if i is not None for p in weighted.get(i.name, ())}
        for n in nodes:  # a column-parallel bias: read beside a split tensor, as long as the split dim
            if any(i is not None and i.name in split.tensors for i in n.inputs):
                for i in n.inputs:
                    for p in weighted.get(i.name, ()) if i is not None else ():
                        if p.shape and p.shape[-1] in inner:
                            split.parameters.add(p.name)
        split.reduced += [n.outputs[0].name for n in rows if n.outputs and n.outputs[0] is not None]
        split.reduced += [_input_grad(backward_of.get(n.name, ()), n, weighted) for n in cols]
        if sequence:
            split.tensors |= _sequence_split(nodes, cols, region, weighted, in_block, storage, split.chunked)
    if not split.pairs:
        raise UsageError("--tp: no column/row-parallel pair of weight matmuls found in the model's blocks")
    # what is made of split weights alone is split too (autocast's bf16 copy of a weight, its transpose)
    split.tensors |= {name for name, made in weighted.items() if name not in split.parameters
                      and made and all(p.name in split.parameters for p in made)}
    for b in joint.nodes:  # backward: a gradient is split where what it is the gradient of is
        if b.phase == "backward":
            for o in b.outputs:
                if o is not None and o.meta.get("like") in split.tensors | split.parameters:
                    split.tensors.add(o.name)
    split.reduced = [r for r in split.reduced if r]
    return split


def _sequence_split(nodes: list[Node], cols: list[Node], region: set[str], weighted, in_block: set[int],
                    storage: dict[str, str], chunked: list[str]) -> set[str]:
    """The block's tensors sequence parallelism splits: those shaped like a column-parallel matmul's
    input in (batch, seq), outside the column/row region; not the gathered inputs themselves, the
    storages they are views of, nor a tensor read after the blocks (gathered whole for it). An input
    from before the blocks (the embeddings) is split as it enters (``chunked``: whole when made)."""
    inputs = [i for n in cols for i in n.inputs if i is not None and i.name not in weighted]
    whole = {storage.get(i.name, i.name) for i in inputs}
    leads = {tuple(i.shape[:2]) for i in inputs if i.shape and len(i.shape) >= 2}
    inside = {id(n) for n in nodes}
    out = set()

    def splits(x: Tensor, within: set[int]) -> bool:
        return (x.name not in region and storage.get(x.name, x.name) not in whole and x.name not in weighted
                and bool(x.shape) and len(x.shape) >= 2 and tuple(x.shape[:2]) in leads
                and all(id(c) in within or c.kind in SHAPE_READS for c in x.consumers))

    for n in nodes:
        for i in n.inputs:
            if i is not None and i.kind == "activation" and (i.producer is None or id(i.producer) not in
                                                             in_block) and splits(i, inside):
                if i.name not in out:
                    chunked.append(i.name)
                out.add(i.name)
        out |= {o.name for o in n.outputs if o is not None and splits(o, in_block)}
    return out


def _by_heads(x: Tensor) -> bool:
    """Whether a kept output of a split node is split too: a logsumexp per head is, an attention mask
    broadcast over the heads (its head dim 1) is whole on every rank."""
    return not (x.shape and len(x.shape) >= 3 and x.shape[1] == 1)


def _forward(cols: list[Node], inside: set[int], rows: set[int]) -> set[str]:
    seen: set[str] = set()
    stack = [o for n in cols for o in n.outputs if o is not None]
    while stack:
        x = stack.pop()
        if x.name in seen:
            continue
        seen.add(x.name)
        for c in x.consumers:
            if id(c) in inside and id(c) not in rows:
                stack.extend(o for o in c.outputs if o is not None)
    return seen


def _backward(starts: list[Tensor], inside: set[int]) -> set[str]:
    seen: set[str] = set()
    stack = list(starts)
    while stack:
        x = stack.pop()
        if x.name in seen:
            continue
        seen.add(x.name)
        p = x.producer
        if p is not None and id(p) in inside:
            stack.extend(i for i in p.inputs if i is not None)
    return seen


def _cols_out(n: Node) -> object:
    """A column-parallel matmul's split dim: its output's last dim."""
    out = n.outputs[0] if n.outputs else None
    return out.shape[-1] if out is not None and out.shape else None


def _input_grad(backward: list[Node], n: Node, weighted) -> str | None:
    """The gradient of a column-parallel matmul's activation input (among ``backward``, the backward
    nodes of ``n``), which backward sums across ranks."""
    x = next((i for i in n.inputs if i is not None and i.name not in weighted), None)
    for b in backward:
        for o in b.outputs:
            if o is not None and x is not None and o.meta.get("like") == x.name:
                return o.name
    return None


def _check(block: str, nodes: list[Node], cols: list[Node], weighted, t: int) -> None:
    """t divides each split dim: the column-parallel outputs, the attention's heads and K/V heads."""
    for n in cols:
        d = _cols_out(n)
        if isinstance(d, int) and d % t:
            raise UsageError(f"--tp {t}: {n.name}'s {d} output columns ({block}) do not divide over {t} "
                             "ranks")
    for n in nodes:
        form = read_attention(n) if n.kind in MATMULS else None
        if isinstance(form, AttentionForm):
            for what, x in (("query heads", form.q), ("K/V heads", form.k_kv or form.k)):
                h = x.shape[1] if x.shape and len(x.shape) == 4 else None
                if isinstance(h, int) and h % t:
                    raise UsageError(f"--tp {t}: {block}'s attention has {h} {what if h > 1 else what[:-1]}, "
                                     f"which do not divide over {t} ranks (ColwiseParallel would split a "
                                     "head)")

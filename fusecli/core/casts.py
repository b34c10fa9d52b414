"""Cast nodes added to a forward graph where eager PyTorch casts (``--precision``'s autocast and model casts,
a dynamo export's dropped ``softmax(x, dtype=float32)`` casts), each placed right before its first reader."""

from __future__ import annotations

from .ir import Graph, Node, Tensor, redirect, unique_name
from .scopes import node_scope

ONNX_DTYPES = {"float32": 1, "float16": 10, "bfloat16": 16}


def noop_float32_cast(node: Node) -> bool:
    """A Cast of a float32 tensor to float32: a no-op in an fp32 export, a trace's ``.to(float32)``."""
    x = node.inputs[0] if node.inputs else None
    return node.kind == "cast" and node.attrs.get("to") == 1 and x is not None and x.dtype == "float32" \
        and bool(node.outputs)


class Rewrite:
    """New Cast nodes, each placed right before the first node that reads it (eager casts on the call)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.position = {id(n): i for i, n in enumerate(graph.nodes)}
        self.before: dict[int, list[Node]] = {}
        self.count = 0

    def cast(self, x: Tensor, dtype: str, readers: list[Node]) -> Tensor:
        """A new tensor, ``x`` cast to ``dtype``, that ``readers`` read instead of ``x``."""
        g = self.graph
        base = f"{x.name}.{dtype}"
        y = g.tensor(unique_name(base, g.tensors), dtype=dtype, shape=x.shape, kind="activation")
        first = min(readers, key=lambda r: self.position.get(id(r), len(self.position)))
        # eager casts inside the module of the op that reads the cast: its scope, so a checkpointed block
        # holds (and frees) the casts its own ops make
        scope = ".".join(node_scope(first))
        meta = {"precision_cast": True, **({"module": scope} if scope else {})}
        node = g.add_node(Node(g.unique_node_name(f"precision/{base}"), "Cast", "cast", [x], [y],
                               {"to": ONNX_DTYPES[dtype]}, meta=meta))
        redirect(readers, x, y)
        self.before.setdefault(id(first), []).append(node)
        self.count += 1
        return y

    def around(self, node: Node, dtype: str, back: str) -> None:
        """``node`` computes in ``dtype``: it reads its first input cast to ``dtype``, and the readers of its
        first output read that cast back to ``back`` (softmax(x, dtype=torch.float32).to(x.dtype))."""
        readers = list(dict.fromkeys(node.outputs[0].consumers))
        self.cast(node.inputs[0], dtype, [node])
        if readers:
            self.cast(node.outputs[0], back, readers)

    def finish(self) -> int:
        added = {id(n) for ns in self.before.values() for n in ns}
        if added:
            nodes = [n for n in self.graph.nodes if id(n) not in added]
            self.graph.nodes = [m for n in nodes for m in (*self.before.get(id(n), ()), n)]
        return self.count

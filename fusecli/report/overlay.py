"""``analyze --overlay``: fusecli's results as Model Explorer node data (its per-node data overlay).

The format is ``model_explorer.node_data_builder.GraphNodeData`` as JSON (``{"results": {node id:
{"value": ..., "bgColor": ...}}, "name": ..., "gradient": [...]}``), built here with plain dicts.
One file carries one value per node, so the overlay is two files, each loaded in Model Explorer's
"node data" panel: ``FILE.json`` the bytes backward keeps of each node's outputs (numbers, coloured
on a white-to-red gradient, summed over layers in its stats tables) and ``FILE.fusion.json`` each
matched node's "pattern: verdict" (text, coloured by verdict).

Node ids: Model Explorer's ONNX adapter (``model-explorer-onnx``) makes one graph node per ONNX node
with ``id = node.name``, after onnx_ir's ``NameFixPass`` has named unnamed nodes ``node``,
``node_1``, ... and renamed duplicates ``name_1``, ... (one counter per base name, shared with
subgraphs, which get their own name scope). Output tensor names do not work as keys there: Model
Explorer matches them to a node's ``tensor_name`` output attribute, which that adapter does not set.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING

from .node_facts import facts_per_proto_node

if TYPE_CHECKING:
    import onnx

    from ..pipeline import Analysis

VERDICT_COLORS = {"training-safe": "#81c995", "training-safe if recomputed": "#fde293",
                  "inference only": "#fcad70", "not fusable": "#dadce0"}
SAVED_GRADIENT = [{"stop": 0, "bgColor": "#ffffff"}, {"stop": 1, "bgColor": "#d93025"}]


def fusion_path(path: str) -> str:
    """``out.json`` -> ``out.fusion.json``: where the pattern/verdict overlay goes beside ``path``."""
    stem = path[:-5] if path.lower().endswith(".json") else path
    return f"{stem}.fusion.json"


def model_explorer_ids(graph: onnx.GraphProto) -> list[str]:
    """The id Model Explorer's ONNX adapter gives each node of ``graph`` (in file order)."""
    counter: Counter[str] = Counter()
    ids: list[str] = []

    def walk(g: onnx.GraphProto, top: bool) -> None:
        used: set[str] = set()
        for node in g.node:
            name = node.name or "node"
            if name in used:  # onnx_ir's _find_and_record_next_unique_name
                base = name
                while name in used:
                    counter[base] += 1
                    name = f"{base}_{counter[base]}"
            used.add(name)
            if top:
                ids.append(name)
            for attr in node.attribute:
                for sub in [attr.g] if attr.HasField("g") else attr.graphs:
                    walk(sub, False)

    walk(graph, True)
    return ids


def overlay_documents(a: Analysis, model: onnx.ModelProto) -> tuple[dict, dict]:
    """(saved bytes node data, fusion node data) for the analysis ``a`` of ``model``."""
    graph = model.graph
    saved: dict[str, dict] = {}
    fusion: dict[str, dict] = {}
    for node_id, facts in zip(model_explorer_ids(graph), facts_per_proto_node(a, graph), strict=True):
        if facts is None:
            continue
        saved[node_id] = {"value": facts.saved_bytes}
        if facts.fusions:
            text = "; ".join(f"{p}: {v}" for p, v in facts.fusions)
            fusion[node_id] = {"value": text, "bgColor": VERDICT_COLORS[facts.best_verdict()]}
    return ({"results": saved, "name": "fusecli saved bytes", "gradient": SAVED_GRADIENT},
            {"results": fusion, "name": "fusecli fusion", "showExpandedSummaryOnGroupNode": True,
             "showLabelCountColumnsInChildrenStatsTable": True})


def write_overlay(a: Analysis, model: onnx.ModelProto, path: str) -> str:
    """Write both overlay files (each whole or not at all); a one-line note for the user."""
    from ..core.output import atomic_write

    saved, fusion = overlay_documents(a, model)
    with atomic_write(path, "w") as f, atomic_write(fusion_path(path), "w") as g:
        json.dump(saved, f)
        json.dump(fusion, g)
    return (f"wrote {path} (saved bytes of {len(saved['results'])} nodes) and {fusion_path(path)} "
            f"({len(fusion['results'])} matched nodes): Model Explorer node data")

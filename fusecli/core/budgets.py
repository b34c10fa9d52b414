"""Budgets for the sizes a file can claim: each one a default, raised with an environment variable.

A file over a budget is refused with one line that names the budget and the variable that raises it,
before anything of that size is allocated or read.
"""

from __future__ import annotations

import os

from .errors import FuseError

# name -> (default, what it bounds); FUSECLI_MAX_<NAME> raises it
DEFAULTS = {
    "OUTPUTS": (65_536, "outputs one SavedModel op may claim"),
    "CALL_DEPTH": (256, "levels of nested SavedModel function calls"),
    "SAVED_MODEL_BYTES": (2 * 1024**3, "bytes of saved_model.pb"),  # protobuf's own 2 GiB message limit
    "FEED_ELEMENTS": (1 << 28, "elements of one random verification input"),  # 1 GiB of float32
    "SUBGRAPH_DEPTH": (64, "levels of nested ONNX subgraphs (If/Loop/Scan bodies)"),
}


def limit(name: str) -> int:
    """The budget ``name`` (FUSECLI_MAX_<NAME> when set to a positive integer, else its default)."""
    default = DEFAULTS[name][0]
    raw = os.environ.get(f"FUSECLI_MAX_{name}", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    return default


def check(name: str, value: int, where: str) -> None:
    """FuseError naming the budget when ``value`` exceeds it (negative values are refused too)."""
    cap = limit(name)
    if value < 0:
        raise FuseError(f"{where}: {value} is not a valid count")
    if value > cap:
        raise FuseError(f"{where}: over fusecli's budget of {cap:,} {DEFAULTS[name][1]} "
                        f"(raise it with FUSECLI_MAX_{name}=N)")

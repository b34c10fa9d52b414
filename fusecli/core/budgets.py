"""Budgets for the sizes a file can claim: each one a default, raised with an environment variable.

A file over a budget is refused with one line that names the budget and the variable that raises it,
before anything of that size is allocated or read.
"""

from __future__ import annotations

import os

from .errors import OverBudget

# name -> (default, what it bounds); FUSECLI_MAX_<NAME> raises it
DEFAULTS = {
    "OUTPUTS": (65_536, "outputs one SavedModel op may claim"),
    "CALL_DEPTH": (256, "levels of nested SavedModel function calls"),
    "SAVED_MODEL_BYTES": (2 * 1024**3, "bytes of saved_model.pb"),  # protobuf's own 2 GiB message limit
    "FEED_ELEMENTS": (1 << 28, "elements of one random verification input"),  # 1 GiB of float32
    "SUBGRAPH_DEPTH": (64, "levels of nested ONNX subgraphs (If/Loop/Scan bodies)"),
    # a scale, bias, mask or folded constant a rewrite makes from a shape the file declares
    "ARRAY_ELEMENTS": (1 << 28, "elements of one array a rewrite makes from a declared shape"),
    # numpy's own limit on dims (NPY_MAXDIMS); a tensor read as a shape has one element per dim it makes
    "RANK": (64, "dims of one tensor"),
    # a name, dim name or string attribute the reports, pictures and kernels carry (metadata is read apart)
    "STRING": (65_536, "characters of one name or string"),
    "FIELD_ENTRIES": (1 << 20, "entries of one node's list (its inputs, outputs or an attribute's values)"),
}


def limit(name: str) -> int:
    """The budget ``name`` (FUSECLI_MAX_<NAME> when set to a positive integer, else its default)."""
    default = DEFAULTS[name][0]
    raw = os.environ.get(f"FUSECLI_MAX_{name}", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    return default


def check(name: str, value: int, where: str) -> None:
    """OverBudget (a FuseError) naming the budget when ``value`` exceeds it (negative values too)."""
    cap = limit(name)
    if value < 0:
        raise OverBudget(f"{where}: {value} is not a valid count")
    if value > cap:
        raise OverBudget(f"{where}: over fusecli's budget of {cap:,} {DEFAULTS[name][1]} "
                        f"(raise it with FUSECLI_MAX_{name}=N)")


def check_elements(shape, where: str) -> None:
    """The ARRAY_ELEMENTS budget for an array of ``shape`` (ints), before it is allocated."""
    n = 1
    for d in shape:
        n = -1 if int(d) < 0 or n < 0 else n * int(d)
    check("ARRAY_ELEMENTS", n, f"{where} of shape {list(shape)}")

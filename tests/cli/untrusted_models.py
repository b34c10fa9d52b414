"""Model files built to probe what fusecli does with a model's strings: hostile dim names, node names
and module paths (newlines, quotes, backslashes, triple quotes, NUL, ESC sequences, Unicode line
separators). Each is a valid model: onnx's full checker accepts it and onnxruntime loads it."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# each would run code, end a comment or a string, or drive a terminal if fusecli wrote it raw
HOSTILE = [
    "N\nprint('INJECTED CODE RAN')\n#",
    'q"""\nopen("PWNED", "w").write("x")\n"""',
    "q'''\nopen('PWNED', 'w').write('x')\n'''",
    "quote'double\"back\\",
    "\\N{",
    "nul\x00byte",
    "sep\u2028open('PWNED', 'w')\u2029#",
    "\x1b]0;PWNED-TITLE\x07\x1b[31mred",
    "cr\rback\x08del\x7fcsi\x9b2J",
    "\u202eRTL override",
]
INJECTED_DIM = HOSTILE[0]  # issue 61's first file: its batch dim
INJECTED_NODE = "mm\x1b]0;PWNED-TITLE\x07\x1b[31m..."  # issue 61's second file: a node name


def stack(scopes: list[str], dim: str = "batch", node: str | None = None, width: int = 8) -> onnx.ModelProto:
    """x -> [x + relu(x W1 + b1) W2] per block, each block under the TorchScript-style scope
    ``/<scope>/``, the first dim named ``dim``; ``node`` names the first block's first MatMul."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i, scope in enumerate(scopes):
        p = f"/{scope}"
        w1, b1, w2 = f"{scope}.w1", f"{scope}.b1", f"{scope}.w2"
        inits += [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
                  for n, s in ((w1, (width, 4 * width)), (b1, (4 * width,)), (w2, (4 * width, width)))]
        first = node if node is not None and i == 0 else f"{p}/fc1/MatMul"
        nodes += [helper.make_node("MatMul", [x, w1], [f"{p}/h0"], name=first),
                  helper.make_node("Add", [f"{p}/h0", b1], [f"{p}/h1"], name=f"{p}/fc1/Add"),
                  helper.make_node("Relu", [f"{p}/h1"], [f"{p}/h2"], name=f"{p}/act/Relu"),
                  helper.make_node("MatMul", [f"{p}/h2", w2], [f"{p}/h3"], name=f"{p}/fc2/MatMul"),
                  helper.make_node("Add", [x, f"{p}/h3"], [f"{p}/out"], name=f"{p}/Add")]
        x = f"{p}/out"
    nodes.append(helper.make_node("Identity", [x], ["y"], name="out"))
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [dim, "seq", width]) for n in "xy"]
    model = helper.make_model(helper.make_graph(nodes, "stack", io[:1], io[1:], inits),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    model.producer_name = "pytorch"
    onnx.checker.check_model(model, full_check=True)
    return model

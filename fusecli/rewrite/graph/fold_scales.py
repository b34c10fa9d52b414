"""Conv -> Mul by a per-output-channel constant (tf2onnx's depthwise convs with BatchNorm's scale left
over) folded into the Conv's weights, inference only: conv(x, w, b) * s = conv(x, w * s, b * s).

The catalogue has no conv_mul pattern on this branch, so this fold runs on the graph before the analysis
passes; the Conv it leaves then meets its activation as an ordinary conv_bias_act match (FusedConv).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from .fold import channel_vector, scaled_weight
from .values import Names, Weights


def fold_conv_scales(model: onnx.ModelProto, base_dir: str = "") -> list[tuple[str, str]]:
    """Fold every eligible Conv -> Mul pair in place; (conv, mul) node names of each fold (weights left
    in the input file are read from ``base_dir``)."""
    g = model.graph
    weights, names = Weights(model, base_dir), Names(model)
    readers: dict[str, int] = {}
    for n in g.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    outputs = {o.name for o in g.output}
    producer = {o: n for n in g.node for o in n.output if o}
    done, drop = [], set()
    for mul in list(g.node):
        if mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx") or len(mul.input) != 2:
            continue
        for k in (0, 1):
            conv = producer.get(mul.input[k])
            if conv is None or conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx") \
                    or readers.get(conv.output[0], 0) != 1 or conv.output[0] in outputs \
                    or not weights.is_constant(mul.input[1 - k]):
                continue
            w = weights.value(conv.input[1])
            b = weights.value(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None
            s = weights.value(mul.input[1 - k])
            if w is None or s is None or w.dtype != np.float32 or (len(conv.input) > 2 and conv.input[2]
                                                                  and b is None):
                continue
            vec = channel_vector(s, w.ndim, w.shape[0], axis=1)
            if vec is None or np.result_type(w, vec) != np.float32:
                continue
            w_name = names.new(f"{conv.input[1]}_scaled")
            g.initializer.append(numpy_helper.from_array(scaled_weight(w, vec.astype(np.float64)), w_name))
            inputs = [conv.input[0], w_name]
            if b is not None:
                b_name = names.new(f"{conv.input[2]}_scaled")
                g.initializer.append(numpy_helper.from_array((b.astype(np.float64) * vec).astype(np.float32),
                                                             b_name))
                inputs.append(b_name)
            del conv.input[:]
            conv.input.extend(inputs)
            conv.output[0] = mul.output[0]
            drop.add(id(mul))
            done.append((conv.name, mul.name))
            break
    if drop:
        kept = [n for n in g.node if id(n) not in drop]
        del g.node[:]
        g.node.extend(kept)
    return done

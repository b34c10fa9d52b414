"""Grappler's remapper asked directly: the fused ops it writes on CPU for a small TensorFlow function.

``remapped_ops(build, shapes)`` traces ``build`` as a tf.function placed on the CPU, runs Grappler with the
remapper alone (``tf_optimizer.OptimizeGraph``, as a session would before running it) and returns each
``_Fused*`` node's op and ``fused_ops``. The GPU remapper cannot be asked on a machine without a GPU."""

from __future__ import annotations

import os


def remapped_ops(build, shapes: list[list[int]]) -> list[tuple[str, list[str]]]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.framework import meta_graph
    from tensorflow.python.grappler import tf_optimizer

    @tf.function
    def f(*args):
        with tf.device("/device:CPU:0"):  # the remapper fuses only what is placed on a CPU
            return build(tf, *args)

    concrete = f.get_concrete_function(*(tf.TensorSpec(s) for s in shapes))
    graph = meta_graph.create_meta_graph_def(graph=concrete.graph)
    graph.collection_def["train_op"].node_list.value.extend(t.op.name for t in concrete.graph.outputs)
    config = config_pb2.ConfigProto()
    config.graph_options.rewrite_options.optimizers[:] = ["remap"]
    config.graph_options.rewrite_options.min_graph_nodes = -1  # small graphs too
    optimized = tf_optimizer.OptimizeGraph(config, graph)
    return [(n.op, [s.decode() for s in n.attr["fused_ops"].list.s]) for n in optimized.node
            if n.op.startswith("_Fused")]

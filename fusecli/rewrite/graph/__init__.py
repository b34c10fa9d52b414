"""Editing and saving the ModelProto: the emitter kit (Context, Emission), graph surgery and the check of
each pass (edit, sound), weights and constant subgraphs (values, shape_values), folding math (fold,
fold_scales), shapes (shapes, shape_reads), copies (proto), tf2onnx fixes (converted) and writing (save,
splice). Imports neither kernels/ nor verify/."""

"""Kernel emitters, one module per kernel family: a match -> the ONNX Runtime nodes that replace it (an
Emission), or why no kernel fits. ``registry`` maps each kernel key the fusion families name to its
emitter; ``mask_band`` and ``merged_heads`` are attention's readings; ``cuda`` the kernels the CUDA
provider has and the CPU stand-ins verification runs. Imports graph/ (the kit, folds, values), never
verify/."""

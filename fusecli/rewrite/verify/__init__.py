"""The numerical checks: rewritten against original in onnxruntime (outputs: whole model and --bench),
each fused region cut out on its own (regions), --bench in words (benchverdict). Imports graph/, and
kernels/'s cuda for the CPU stand-ins; never the command's modules above."""

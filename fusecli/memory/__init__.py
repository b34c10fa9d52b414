"""A training step's memory: tensor sizes (sizes), the schedule and lifetimes (liveness), and the saved
and peak bytes as formulas in the model's dims (formulas)."""

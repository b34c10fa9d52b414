"""``plan``: a training step's memory and what to recompute to fit a budget (planner), its candidates, its
report and the PyTorch / Keras form it emits."""

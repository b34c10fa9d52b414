"""``render``: DOT for the before / after / backward / fused-training views, the drawing kit, repeated
blocks folded, shape plumbing hidden."""

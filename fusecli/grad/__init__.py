"""Gradient rules (one table) and the backward builder."""

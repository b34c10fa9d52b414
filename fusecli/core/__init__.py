"""The shared bottom every command stands on: the IR, dims, op kinds, the pattern language, names and
scopes, units, errors, budgets, progress and output rules. Imports nothing above it."""

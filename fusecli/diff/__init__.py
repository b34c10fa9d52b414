"""``diff``: two exports compared (fusions, verdicts, memory) and the report of what changed."""

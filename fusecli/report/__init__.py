"""What ``analyze`` says: the JSON document, the text report, and the viewer exports (overlay, annotate,
plot) built from per-node facts."""

"""lexgraph's ``hybrid``: BM25 fused with a dense system, the fusion chosen on dev."""

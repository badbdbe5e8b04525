"""lexgraph: reproducible statutory article retrieval (BM25, DSR, G-DSR, QABISAR)."""

__version__ = "0.1.0"

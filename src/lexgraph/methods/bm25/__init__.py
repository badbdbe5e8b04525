"""BM25 over the analysed article texts: its two stages (``bm25_tune``, ``bm25``) and its system."""

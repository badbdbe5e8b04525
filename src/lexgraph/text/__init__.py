"""Text analysis: the French analyzer (BM25 and display), legal element patterns, result display."""

"""Encoding caches written by stages: article chunks, article and question embeddings, re-ranker token states."""

"""Evaluation: TREC runs and metrics per system, per-question tables, the regression check."""

"""Ranking metrics (checked against trec_eval) and paired significance tests."""

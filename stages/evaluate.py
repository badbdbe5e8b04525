"""evaluate: every system on every split -> TREC runs and each split's qrels (data/runs/<split>.qrels),
metrics/<system>.json, metrics/results.md, paired significance tests on the test split ->
metrics/significance.json, per-question results -> metrics/per_query/<split>.csv and the test
recall@k curve -> metrics/recall_curve_test.csv."""

from __future__ import annotations

import sys

from lexgraph.core.stage import Stage, run_stage
from lexgraph.evaluation.evaluate import EvaluateConfig, EvaluatePaths, run_evaluate

STAGE = Stage("evaluate", "evaluate", EvaluatePaths, EvaluateConfig.from_params, run_evaluate)

if __name__ == "__main__":
    sys.exit(run_stage(STAGE))

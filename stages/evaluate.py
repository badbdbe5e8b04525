"""evaluate: every system on every split -> TREC runs and each split's qrels (data/runs/<split>.qrels),
metrics/<system>.json, metrics/results.md, paired significance tests on the test split ->
metrics/significance.json, per-question results -> metrics/per_query/<split>.csv and the test
recall@k curve -> metrics/recall_curve_test.csv."""

from __future__ import annotations

import sys

from lexgraph.core.config import resolve_device
from lexgraph.core.stage import add_paths, paths_from
from lexgraph.evaluation.evaluate import EvaluateConfig, EvaluatePaths, run_evaluate


def configure(parser):
    add_paths(parser, EvaluatePaths)


def main(args, base, config):
    run_evaluate(paths_from(EvaluatePaths, args), config, str(resolve_device(base.device)), base.seed)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("evaluate", main, configure, config=EvaluateConfig.from_params))

"""evaluate: every system on every split -> TREC runs, metrics/<system>.json, metrics/results.md,
paired significance tests on the test split -> metrics/significance.json, per-question results
-> metrics/per_query/<split>.csv and the test recall@k curve -> metrics/recall_curve_test.csv."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import polars as pl

from lexgraph.core.config import resolve_device
from lexgraph.core.io import atomic_path, read_parquet, write_json, write_text
from lexgraph.core.layout import RERANKERS
from lexgraph.evaluation.evaluate import (
    EvaluateConfig,
    evaluate_systems,
    read_trec,
    results_markdown,
    significance_report,
    split_questions,
)
from lexgraph.evaluation.per_query import write_per_query_reports
from lexgraph.systems.rerank import first_stage_of, is_switched_off

log = logging.getLogger("lexgraph.evaluate")


def configure(parser):
    parser.add_argument("--questions", required=True)
    parser.add_argument("--runs", required=True, help="TREC runs: <runs>/<system>/<split>.trec")
    parser.add_argument("--metrics-dir", required=True)
    parser.add_argument("--workspace", required=True, help="where the systems' artefacts are (models/, data/)")


def main(args, base, config):
    device = str(resolve_device(base.device))
    questions = read_parquet(args.questions, ["id", "question", "article_ids", "split"])
    splits, split = config.splits, config.significance_split
    systems = list(config.systems)
    for variant in RERANKERS:
        if variant in systems and is_switched_off(args.workspace, variant):  # rerank.<variant>.enabled: false
            log.warning("%s skipped: the re-ranker is switched off (rerank.%s.enabled: false)", variant, variant)
            systems.remove(variant)
            write_json({"enabled": False}, Path(args.metrics_dir) / f"{variant}.json")
    with atomic_path(args.runs, directory=True) as runs:
        results = evaluate_systems(
            systems, questions, splits, config.k, runs, args.workspace, device, index=config.index
        )
        _, _, qrels = split_questions(questions, split)
        split_runs = {system: read_trec(Path(runs) / system / f"{split}.trec") for system in results}
        # a re-ranker is also compared with the first stage it re-ranks
        firsts = [first_stage_of(args.workspace, v) for v in RERANKERS if v in results]
        baselines = list(dict.fromkeys([*config.baselines, *(f for f in firsts if f in results)]))
        comparisons, markers, legend = significance_report(
            split_runs,
            qrels,
            baselines,
            config.significance_metrics,
            seed=base.seed,
        )
    for system, by_split in results.items():
        write_json(by_split, Path(args.metrics_dir) / f"{system}.json")
    write_json(
        {
            "split": split,
            "adjustment": "holm over every test of the split's table (p_holm; p_value raw)",
            "tests": comparisons,
        },
        Path(args.metrics_dir) / "significance.json",
    )
    counts = dict(questions.filter(pl.col("split").is_in(splits)).group_by("split").len().iter_rows())
    write_text(
        results_markdown(results, splits, counts, {split: markers}, {split: legend}),
        Path(args.metrics_dir) / "results.md",
    )
    write_per_query_reports(
        questions,
        args.runs,
        list(results),
        splits,
        config.k,
        Path(args.metrics_dir) / "per_query",
        Path(args.metrics_dir) / "recall_curve_test.csv",
    )


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("evaluate", main, configure, config=EvaluateConfig.from_params))

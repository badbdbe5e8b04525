"""bm25_tune: grid search of BM25's k1 x b on the dev split (grid written as a DVC plot)."""

from __future__ import annotations

import sys

import polars as pl

from lexgraph.core.io import atomic_path, read_parquet, write_json
from lexgraph.systems.bm25_pipeline import Bm25TuneConfig, tune_grid


def configure(parser):
    parser.add_argument("--articles", required=True)
    parser.add_argument("--questions", required=True)
    parser.add_argument("--best", required=True, help="best pair (metrics JSON)")
    parser.add_argument("--grid", required=True, help="whole grid (plot data)")


def main(args, base, config):
    articles = read_parquet(args.articles, ["id", "article"])
    questions = read_parquet(args.questions, ["id", "question", "article_ids", "split"])
    grid, best = tune_grid(articles, questions, config)
    write_json(best, args.best)
    with atomic_path(args.grid) as tmp:
        pl.DataFrame(grid).write_csv(tmp, float_precision=6)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("bm25_tune", main, configure, config=Bm25TuneConfig.from_params))

"""mine_negatives: BM25 hard negatives for the training (and synthetic) questions.

    python stages/mine_negatives.py --articles data/clean/articles.parquet \
        --questions data/clean/questions.parquet --synthetic data/queries/synthetic.parquet \
        --hub-negatives data/raw/negatives.parquet --out data/negatives/negatives.parquet

Parameters: ``negatives`` section of params.yaml (k1, b, depth, k, splits).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lexgraph.core.config import Base
from lexgraph.core.io import write_parquet
from lexgraph.core.stage import run_stage
from lexgraph.training.negatives import NegativesConfig, run


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--articles", type=Path, required=True, help="clean articles (Parquet)")
    parser.add_argument("--questions", type=Path, required=True, help="clean questions (Parquet)")
    parser.add_argument(
        "--synthetic",
        type=Path,
        required=True,
        help="synthetic questions (Parquet, questions schema); skipped with a warning when the file is absent",
    )
    parser.add_argument(
        "--hub-negatives",
        type=Path,
        required=True,
        help="the fetched hub negatives (data/raw/negatives.parquet; empty unless fetch.negatives): used where a "
        "question has a list",
    )
    parser.add_argument("--out", type=Path, required=True, help="output negatives (Parquet)")


def main(args: argparse.Namespace, base: Base, config: NegativesConfig) -> None:
    """Mine BM25 hard negatives (top-depth BM25 articles minus gold, best k kept)."""
    write_parquet(run(config, args.articles, args.questions, args.synthetic, args.hub_negatives), args.out)


if __name__ == "__main__":
    raise SystemExit(run_stage("negatives", main, configure, name="mine_negatives", config=NegativesConfig.from_params))

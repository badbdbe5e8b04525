"""Mine BM25 hard negatives for the training (and synthetic) questions.

    python stages/mine_negatives.py --articles data/clean/articles.parquet \
        --questions data/clean/questions.parquet [--synthetic data/queries/synthetic.parquet] \
        --out data/negatives/negatives.parquet

Parameters: ``negatives`` section of params.yaml (k1, b, depth, k, splits).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import polars as pl

from lexgraph.config import Base, require
from lexgraph.errors import ConfigError, DataError
from lexgraph.io import read_parquet, write_parquet
from lexgraph.negatives import ARTICLE_COLUMNS, load_questions, mine_negatives
from lexgraph.stage import run_stage

log = logging.getLogger("lexgraph.stages.mine_negatives")
SECTION = "negatives"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--articles", type=Path, required=True, help="clean articles (Parquet)")
    parser.add_argument("--questions", type=Path, required=True, help="clean questions (Parquet)")
    parser.add_argument(
        "--synthetic", type=Path, default=None,
        help="synthetic questions (Parquet, questions schema); skipped with a warning when the file is absent",
    )
    parser.add_argument("--out", type=Path, required=True, help="output negatives (Parquet)")


def main(args: argparse.Namespace, base: Base, params: dict) -> None:
    """Mine BM25 hard negatives (top-depth BM25 articles minus gold, best k kept)."""
    k1 = float(require(params, "k1", SECTION, (int, float)))
    b = float(require(params, "b", SECTION, (int, float)))
    depth = require(params, "depth", SECTION, int)
    k = require(params, "k", SECTION, int)
    splits = require(params, "splits", SECTION, list)
    if depth < 1 or k < 1:
        raise ConfigError(f"params.yaml: '{SECTION}.depth' = {depth} and '{SECTION}.k' = {k} must be positive")
    if not splits or not all(isinstance(s, str) for s in splits):
        raise ConfigError(f"params.yaml: '{SECTION}.splits' = {splits!r}, expected a non-empty list of split names")

    articles = read_parquet(args.articles, ARTICLE_COLUMNS)
    frames = [load_questions(args.questions, splits)]
    if args.synthetic is not None:
        if args.synthetic.is_file():
            frames.append(load_questions(args.synthetic, splits))
        else:
            log.warning("%s not found: no synthetic questions mined", args.synthetic)
    questions = pl.concat(frames, how="vertical")
    dup = questions.filter(pl.struct("id", "split").is_duplicated())
    if dup.height:
        qid, split = dup.row(0, named=True)["id"], dup.row(0, named=True)["split"]
        raise DataError(
            args.synthetic if len(frames) > 1 else args.questions,
            f"question id {qid} occurs more than once in split '{split}' (ids must be unique per split)",
            column="id",
        )
    log.info("mining negatives for %d questions (splits %s) over %d articles", questions.height, splits, articles.height)
    if questions.height == 0:
        log.warning("no question has a split in %s: writing an empty negatives file", splits)
    negatives = mine_negatives(articles, questions, k1=k1, b=b, depth=depth, k=k)
    write_parquet(negatives, args.out)
    log.info("wrote %d rows to %s", negatives.height, args.out)


if __name__ == "__main__":
    raise SystemExit(run_stage(SECTION, main, configure))

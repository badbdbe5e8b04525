"""fetch: BSARD (hub or local copy) or the embedded sample -> data/raw (BSARD schema, Parquet)."""

from __future__ import annotations

import sys

from lexgraph.core.io import atomic_path
from lexgraph.data.fetch import FetchConfig, fetch


def configure(parser):
    parser.add_argument("--out", required=True, help="output directory")


def main(args, base, config):
    articles, questions, negatives = fetch(config, base.seed)
    with atomic_path(args.out, directory=True) as tmp:
        articles.write_parquet(tmp / "articles.parquet", statistics=False)
        questions.write_parquet(tmp / "questions.parquet", statistics=False)
        negatives.write_parquet(tmp / "negatives.parquet", statistics=False)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("fetch", main, configure, config=FetchConfig.from_params))

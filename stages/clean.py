"""clean: data/raw -> data/clean (articles, headings, questions) + metrics/data.json."""

from __future__ import annotations

import sys
from pathlib import Path

from lexgraph.core.io import atomic_path, read_parquet, write_json
from lexgraph.data.clean import CleanConfig, clean


def configure(parser):
    parser.add_argument("--raw", required=True, help="fetch's output directory")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--metrics", required=True)


def main(args, base, config):
    raw = Path(args.raw)
    articles_path, questions_path = raw / "articles.parquet", raw / "questions.parquet"
    raw_articles = read_parquet(articles_path, ["id", "article"])
    raw_questions = read_parquet(questions_path, ["id", "question", "article_ids", "split"])
    articles, headings, questions, stats = clean(raw_articles, raw_questions, config, (articles_path, questions_path))
    with atomic_path(args.out, directory=True) as tmp:
        articles.write_parquet(tmp / "articles.parquet", statistics=False)
        headings.write_parquet(tmp / "headings.parquet", statistics=False)
        questions.write_parquet(tmp / "questions.parquet", statistics=False)
    write_json(stats, args.metrics)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("clean", main, configure, config=CleanConfig.from_params))

"""hprior: choose on dev how far DSR's article vectors are propagated through the hierarchy
(the parameter-free `hprior` system) -> models/hprior/, metrics/hprior_tune.json."""

from __future__ import annotations

import sys
from pathlib import Path

from lexgraph.systems.hprior import HpriorConfig, save, tune, tune_metrics


def configure(parser):
    parser.add_argument("--graph", required=True, help="build_graph output directory")
    parser.add_argument("--embed", required=True, help="embed output directory (DSR vectors)")
    parser.add_argument("--questions", required=True, help="clean questions (parquet)")
    parser.add_argument("--out", required=True, help="model directory (hprior.json, article_embeddings.safetensors)")
    parser.add_argument("--metrics", required=True, help="metrics JSON")


def main(args, base, config):
    from lexgraph.core.io import read_parquet, write_json
    from lexgraph.encoding.embed import load_embeddings
    from lexgraph.graph.build import load_graph

    embed = Path(args.embed)
    paths = {
        "articles": embed / "articles.safetensors",
        "questions_embeddings": embed / "questions.safetensors",
        "questions": args.questions,
    }
    embeddings = {
        "articles": load_embeddings(paths["articles"]),
        "questions": load_embeddings(paths["questions_embeddings"]),
    }
    questions = read_parquet(args.questions, ["id", "question", "article_ids", "split"])
    result = tune(load_graph(args.graph), embeddings, questions, config, paths)
    save(result, args.out)
    write_json(tune_metrics(result.report), args.metrics)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("hprior", main, configure, config=HpriorConfig.from_params))

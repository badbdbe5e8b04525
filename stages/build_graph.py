"""build_graph: cleaned articles, headings and train questions -> typed legislative graph."""

from __future__ import annotations

import sys

from lexgraph.core.io import read_parquet, write_json
from lexgraph.graph.build import GraphConfig, build_graph, graph_stats, save_graph


def configure(parser):
    parser.add_argument("--articles", required=True)
    parser.add_argument("--headings", required=True)
    parser.add_argument("--questions", required=True)
    parser.add_argument("--out", required=True, help="output directory (graph.pt, nodes.parquet)")
    parser.add_argument("--metrics", required=True)


def main(args, base, config):
    articles = read_parquet(args.articles, ["id", "article", "heading_id"])
    headings = read_parquet(args.headings, ["heading_id", "parent_id", "label", "text"])
    questions = read_parquet(args.questions, ["id", "question", "article_ids", "split"])
    data, nodes = build_graph(
        articles, headings, questions, config, paths=(args.articles, args.headings, args.questions)
    )
    save_graph(data, nodes, args.out, config)
    write_json(graph_stats(data), args.metrics)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("graph", main, configure, name="build_graph", config=GraphConfig.from_params))

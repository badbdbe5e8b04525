"""hybrid: choose, on the dev split, the dense system and the fusion (RRF or weighted score sum)
with which the `hybrid` system fuses BM25 with it -> models/hybrid/hybrid.json, metrics/hybrid_tune.json."""

from __future__ import annotations

import sys
from pathlib import Path

from lexgraph.core.config import resolve_device
from lexgraph.core.io import atomic_path, read_parquet, write_json
from lexgraph.systems.dense import shared_query_encoders
from lexgraph.systems.hybrid import SETTINGS, SPARSE, HybridConfig
from lexgraph.systems.hybrid_tune import dense_systems_needed, tune, tune_metrics
from lexgraph.systems.registry import load_retriever


def configure(parser):
    parser.add_argument("--questions", required=True)
    parser.add_argument("--workspace", required=True, help="where the systems' artefacts are (models/, data/)")
    parser.add_argument("--out", required=True, help="directory of hybrid.json (the chosen fusion)")
    parser.add_argument("--metrics", required=True)


def main(args, base, config):
    device = str(resolve_device(base.device))
    questions = read_parquet(args.questions, ["id", "question", "article_ids", "split"])
    with shared_query_encoders():  # dsr, hprior and gdsr: one DSR query encoder, the questions encoded once
        sparse = load_retriever(SPARSE, args.workspace, device)
        dense = {name: load_retriever(name, args.workspace, device) for name in dense_systems_needed(config)}
        report = tune(questions, sparse, dense, config)
    with atomic_path(args.out, directory=True) as tmp:
        write_json(report, Path(tmp) / SETTINGS, sort_keys=True)
    write_json(tune_metrics(report), args.metrics, sort_keys=True)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("hybrid", main, configure, config=HybridConfig.from_params))

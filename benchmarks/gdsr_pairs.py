"""Benchmark: G-DSR's graph encoder as published, against the number of training pairs.

    python benchmarks/gdsr_pairs.py [--workspace .] [--params params.yaml]
        [--fractions 0.25 0.5 1] [--synthetic 1000] [--json OUT.json]

Why: on the sample, ``gdsr`` (the LGE of Louis et al., EACL 2023, as published: a randomly
initialised GATv2 stack, ``gnn.gdsr`` in params.yaml) ranks below DSR, the very embeddings it
reads. A trained model below its own input is a defect to explain, not a result. The
published recipe starts from PyG's random initialisation (maastrichtlawtech/gdsr,
``src/models/gnn.py``), so the encoder must learn the whole query-article alignment from the
training pairs that DSR's embeddings already carry. If that is the cause, dev recall rises
with the number of pairs and has not levelled off at the sample's 607; a code defect would
not care how many pairs there are.

What it does, on a finished workspace (``dvc repro``: the graph, the DSR embeddings, the clean
questions, the BM25 negatives, the DSR query encoder and the synthetic queries):

* for each ``--fractions`` f: a seeded subset of f of the train questions (dev untouched),
  the gdsr recipe of ``--params`` trained as ``train_gnn@gdsr`` trains it (same epochs,
  learning rate, schedule, negatives), dev R@200 after every epoch;
* for each ``--synthetic`` n: all train questions plus n seeded synthetic questions of
  ``generate_queries`` (encoded by the DSR query encoder, with their mined negatives): the
  public code's data module adds synthetic queries to the graph encoder's training set when
  given (``src/data/bsard_module.py``), though its GNN sweep passes none.

Prints one line per run (pairs, dev R@200 per epoch) beside the input (DSR) embeddings' dev
R@200. Choices are made on dev only; test is never read.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import torch

from lexgraph.core import layout
from lexgraph.core.config import load_params, seed_everything
from lexgraph.core.io import read_parquet, write_json

log = logging.getLogger("gdsr_pairs")


def train_subset(questions: pl.DataFrame, fraction: float, seed: int) -> pl.DataFrame:
    """``questions`` with a seeded ``fraction`` of its train rows (rounded, at least one) and
    every other row as it was."""
    train_ids = np.sort(questions.filter(pl.col("split") == "train")["id"].to_numpy())
    size = max(1, int(round(fraction * len(train_ids))))
    keep = np.random.default_rng(seed).choice(train_ids, size=size, replace=False)
    return questions.filter((pl.col("split") != "train") | pl.col("id").is_in(keep.tolist()))


def with_synthetic(questions, negatives, embeddings, synthetic, synthetic_vectors, count: int, seed: int):
    """``(questions, negatives, question embeddings)`` with ``count`` seeded rows of
    ``synthetic`` added as train questions (their negatives relabelled ``train``, their
    vectors merged into the id-sorted question table)."""
    pick = np.sort(np.random.default_rng(seed).choice(synthetic.height, size=count, replace=False))
    extra = synthetic[pick].with_columns(pl.lit("train").alias("split")).select(questions.columns)
    extra_ids = extra["id"].to_numpy()
    negatives = pl.concat(
        [
            negatives.filter(pl.col("split") != "synthetic"),
            negatives.filter(pl.col("question_id").is_in(extra_ids.tolist())).with_columns(
                pl.lit("train").alias("split")
            ),
        ]
    )
    ids, vectors = embeddings
    all_ids = np.concatenate([ids, extra_ids])
    all_vectors = torch.cat([vectors, synthetic_vectors[pick]])  # (n + count, dim)
    order = np.argsort(all_ids, kind="stable")
    return pl.concat([questions, extra]), negatives, (all_ids[order], all_vectors[order])


def run(label: str, questions, negatives, tables, graph, settings, seed: int) -> dict:
    from lexgraph.methods.gnn.data import prepare_training_set
    from lexgraph.methods.gnn.train import train_graph_encoder

    ts = prepare_training_set(graph, questions, negatives, tables, settings)
    seed_everything(seed)  # as the stage: the encoder's random start is drawn from the seeded global RNG
    result = train_graph_encoder(ts, settings, seed=seed, show_progress=False)
    curve = [round(h["dev_recall@200"], 4) for h in result.history if "dev_recall@200" in h]
    row = {
        "run": label,
        "pairs": int(ts.pairs.size(0)),
        "dev_recall@200": curve,
        "input_dev_recall@200": round(result.input_dev_metrics["recall@200"], 4),
    }
    log.info(
        "%-16s %6d pairs  dev R@200 by epoch %s (DSR input %.4f)",
        label,
        row["pairs"],
        curve,
        row["input_dev_recall@200"],
    )
    return row


def main(argv=None) -> int:
    from lexgraph.core.arguments import OneLineParser, fraction, positive_int

    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("."))
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--fractions", type=fraction, nargs="*", default=[0.25, 0.5, 1.0])
    parser.add_argument("--synthetic", type=positive_int, nargs="*", default=[1000])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from lexgraph.core.errors import LexgraphError

    try:  # a missing table, column or params key is one line naming it, as in the stages
        return measure(args)
    except LexgraphError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")


def measure(args) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("lexgraph", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    from lexgraph.encoding.embed import load_embeddings
    from lexgraph.graph.build import load_graph
    from lexgraph.methods.gnn.config import GNNSettings
    from lexgraph.models.encoders import QueryEncoder

    base, gnn = load_params("gnn", args.params)
    seed = base.seed
    # dev scored every epoch; the synthetic queries are added here as train rows, --synthetic n at a time
    settings = replace(GNNSettings.per_variant(gnn)["gdsr"], selection="dev", synthetic=False)
    ws = args.workspace
    graph = load_graph(layout.GRAPH.under(ws))
    q_columns, n_columns = ["id", "question", "article_ids", "split"], ["question_id", "split", "negative_ids"]
    # the project's reader: a missing file or column is one line naming it, as in the stage
    questions = read_parquet(layout.CLEAN.under(ws, "questions.parquet"), q_columns).select(q_columns)
    negatives = read_parquet(layout.NEGATIVES.under(ws), n_columns).select(n_columns)
    tables = {
        n: load_embeddings(layout.EMBED.under(ws, f"{n}.safetensors")) for n in ("articles", "headings", "questions")
    }
    rows = [
        run(f"train x{f:g}", train_subset(questions, f, seed), negatives, tables, graph, settings, seed)
        for f in args.fractions
    ]
    if args.synthetic:
        synthetic = read_parquet(layout.SYNTHETIC.under(ws), q_columns)
        vectors = QueryEncoder.from_pretrained(layout.DSR.under(ws, "query_encoder")).encode(
            synthetic["question"].to_list(), batch_size=128, show_progress=False
        )  # (S, dim)
        for n in args.synthetic:
            q, neg, qtable = with_synthetic(questions, negatives, tables["questions"], synthetic, vectors, n, seed)
            rows.append(run(f"train+{n} syn", q, neg, dict(tables, questions=qtable), graph, settings, seed))
    if args.json:
        write_json({"variant": "gdsr", "epochs": settings.epochs, "runs": rows}, args.json)
    else:
        sys.stdout.write(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""train_gnn: train the graph encoder of G-DSR (--variant lge) or QABISAR (--variant qabisar)."""

from __future__ import annotations

import sys

from lexgraph.training.gnn_config import VARIANTS


def configure(parser):
    parser.add_argument("--variant", required=True, choices=VARIANTS)
    parser.add_argument("--graph", default="data/graph", help="build_graph output directory")
    parser.add_argument("--embed", default="data/embed", help="embed output directory")
    parser.add_argument("--questions", default="data/clean/questions.parquet")
    parser.add_argument("--negatives", default="data/negatives/negatives.parquet")
    parser.add_argument("--dsr", default="models/dsr", help="trained DSR (its query encoder starts QABISAR's)")
    parser.add_argument("--hprior", default="models/hprior", help="hprior stage output (the prior the GNN starts from)")
    parser.add_argument("--out", default=None, help="model directory (default: models/gnn_<variant>)")
    parser.add_argument("--metrics", default=None, help="metrics JSON (default: metrics/train_gnn_<variant>.json)")


def main(args, base, params):
    """Train the graph encoder of one variant."""
    from lexgraph.config import resolve_device
    from lexgraph.training.gnn import run_train_gnn

    run_train_gnn(
        args.variant,
        graph=args.graph,
        embed=args.embed,
        questions=args.questions,
        negatives=args.negatives,
        dsr=args.dsr,
        hprior=args.hprior,
        out=args.out or f"models/gnn_{args.variant}",
        metrics=args.metrics or f"metrics/train_gnn_{args.variant}.json",
        params=params,
        device=resolve_device(base.device),
        seed=base.seed,
    )


if __name__ == "__main__":
    from lexgraph.stage import run_stage

    sys.exit(run_stage("gnn", main, configure, name="train_gnn"))

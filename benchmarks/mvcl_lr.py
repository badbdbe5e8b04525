"""Benchmark: why MVCL as published ranks below its own first stage on the sample.

    python benchmarks/mvcl_lr.py [--workspace .] [--params params.yaml]
        [--runs 2e-5:5 3e-4:5 2e-5:40] [--json OUT.json]

Why: ``dvc exp run -S rerank.mvcl.enabled=true`` (MVCL of Wang, IJCNN 2022, as published:
the PLM fine-tuned, one Adam learning rate of 2e-5 for the whole model, §IV-C) keeps a
triple loss near ln 2 for its 190 steps and a dev mAP of 7-8, against the hybrid's 31 that
it re-ranks. The interaction network (projection, BiLSTM, MLP) starts from PyTorch's random
initialisation; the hypothesis is that 2e-5 moves it too little in the sample's 190 steps
to learn anything, a budget of updates and not a defect of the code.

What it does, on a finished workspace (``dvc repro``: the first stage's lists and
``encode_rerank``'s cache of the frozen PLM's token states): for each run ``LR:EPOCHS`` and
each share of the train questions (``--fractions``), the interaction network of
``rerank.mvcl`` (its alignment, pooling, losses, no fusion) is trained over the *frozen*
cached states (the PLM is held fixed, so that only the head's learning rate, its number of
updates and of pairs vary, at a few minutes a run). Per epoch it reports the mAP of the
re-ranked lists alone (``map``: of the dev lists, or with ``--scored train`` of the train
lists: does the network fit its own data?) and the mean triple loss; at the end, how far the
weights moved, ``||W - W0|| / ||W0||`` over the whole network. The first stage's mAP and a
random order of its top-k (the chance level) are reported beside them. Choices are made on
dev only; test is never read.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np
import torch

from lexgraph.core import layout
from lexgraph.core.config import load_params

log = logging.getLogger("mvcl_lr")


def parse_run(text: str) -> tuple[float, int]:
    """``"LR:EPOCHS"`` -> ``(lr, epochs)``."""
    lr, _, epochs = text.partition(":")
    try:
        value, count = float(lr), int(epochs)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LR:EPOCHS (e.g. 2e-5:5), got {text!r}") from None
    if value <= 0 or count < 1:
        raise argparse.ArgumentTypeError(f"expected a learning rate > 0 and epochs >= 1, got {text!r}")
    return value, count


def train_subset(lists, fraction: float, seed: int):
    """``lists`` (a :class:`~lexgraph.methods.rerank.train.Lists`) cut to a seeded ``fraction`` of its
    questions (rounded, at least one), in their original order."""
    from lexgraph.methods.rerank.train import Lists

    size = max(1, int(round(fraction * len(lists.qids))))
    keep = np.sort(np.random.default_rng(seed).choice(len(lists.qids), size=size, replace=False))
    qids = [lists.qids[i] for i in keep]
    return Lists(qids, {q: lists.qrels[q] for q in qids}, lists.ids[keep], lists.scores[keep])


def merged(path: Path, out: dict) -> dict:
    """``out`` merged into the results already in ``path`` (if any): a run of ``out`` replaces
    the earlier run of the same (scored split, fraction, lr, epochs), the others are kept."""
    from lexgraph.core.inputs import read_json_object

    if not path.exists():
        return out
    old = read_json_object(path, what="the results of benchmarks/mvcl_lr.py", fix="delete it to start afresh")
    key = ("scored", "fraction", "lr", "epochs")
    new_keys = {tuple(r[k] for k in key) for r in out["runs"]}
    runs = [r for r in old.get("runs", []) if tuple(r.get(k) for k in key) not in new_keys] + out["runs"]
    return {**old, **out, "runs": sorted(runs, key=lambda r: tuple(str(r[k]) if k == "scored" else r[k] for k in key))}


def relative_shift(before: dict[str, torch.Tensor], model: torch.nn.Module) -> float:
    """``||W - W0|| / ||W0||`` over every parameter of ``model`` (one vector)."""
    after = {k: v.detach() for k, v in model.state_dict().items() if k in before}
    moved = torch.sqrt(sum(((after[k] - before[k]).float() ** 2).sum() for k in before))
    start = torch.sqrt(sum((before[k].float() ** 2).sum() for k in before))
    return float(moved / start)


def chance_map(trainer, seed: int, draws: int = 20) -> float:
    """The mean dev mAP of ``draws`` seeded random orders of the first stage's top-k."""
    rng = np.random.default_rng(seed)
    sizes = [len([a for a in row[: trainer.config.k] if a >= 0]) for row in trainer.dev_lists.ids]
    return float(np.mean([trainer.metrics_at([rng.random(n) for n in sizes], None)["map"] for _ in range(draws)]))


def run(config, stores, lists, device, seed: int, fraction: float) -> dict:
    from lexgraph.methods.rerank import train as rerank
    from lexgraph.methods.rerank.io import build_model

    torch.manual_seed(seed)  # train() draws the same initial weights: keep a copy of them
    start = {k: v.detach().clone() for k, v in build_model(stores[0].dim, config).state_dict().items()}
    model, report = rerank.train(config, *stores, *lists, device, seed)
    row = {
        "fraction": fraction,
        "pairs": report["pairs"],
        "lr": config.lr,
        "epochs": config.epochs,
        "steps": report["steps"],
        "map": [round(h["dev_map"], 4) for h in report["history"]],
        "triple_loss": [round(h["train_triple"], 4) for h in report["history"]],
        "weight_shift": round(relative_shift(start, model), 4),
    }
    log.info(
        "train x%g (%d pairs) lr %-8g epochs %-3d steps %-5d shift %.4f  mAP %s  triple loss %s",
        fraction,
        row["pairs"],
        config.lr,
        config.epochs,
        row["steps"],
        row["weight_shift"],
        row["map"],
        row["triple_loss"],
    )
    return row


def main(argv=None) -> int:
    from lexgraph.core.arguments import OneLineParser, fraction

    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("."))
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--runs", type=parse_run, nargs="+", default=[(2e-5, 5), (3e-4, 5)])
    parser.add_argument(
        "--fractions",
        type=fraction,
        nargs="+",
        default=[1.0],
        help="train on a seeded subset of the train questions (1 = all); every run at each fraction",
    )
    parser.add_argument(
        "--scored",
        choices=("dev", "train"),
        default="dev",
        help="the lists scored after every epoch: dev, or train (does the network fit its own data?)",
    )
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

    from lexgraph.core.config import resolve_device
    from lexgraph.core.io import read_parquet, write_json
    from lexgraph.methods.rerank.config import RerankConfig
    from lexgraph.methods.rerank.features import StoreSource, frozen_stores
    from lexgraph.methods.rerank.train import RerankTrainer, first_stage_lists
    from lexgraph.metrics.ir import DEEPEST
    from lexgraph.systems.registry import load_retriever

    base, section = load_params("rerank", args.params)
    device, ws = resolve_device(base.device), args.workspace
    frozen = RerankConfig.per_variant(section)["xrerank"]  # whose cache encode_rerank wrote
    published = RerankConfig.per_variant(section)["mvcl"]
    head = published.model_copy(
        update={
            "plm": "frozen",
            "plm_lr": None,
            "max_query_length": frozen.max_query_length,
            "max_article_length": frozen.max_article_length,
        }
    )
    questions = read_parquet(layout.CLEAN.under(ws, "questions.parquet"), ["id", "question", "article_ids", "split"])
    articles = read_parquet(layout.CLEAN.under(ws, "articles.parquet"), ["id", "article"])
    first = load_retriever(head.first_stage, ws, str(device))
    lists = (
        first_stage_lists(first, questions, "train", head.k),
        first_stage_lists(first, questions, head.split if args.scored == "dev" else "train", max(head.k, DEEPEST)),
    )
    source = StoreSource(articles, questions, frozen, layout.PRETRAIN.under(ws), base.seed)
    stores = frozen_stores(source, layout.RERANK_FEATURES.under(ws), device)
    probe = RerankTrainer(torch.nn.Identity(), head, *stores, *lists, device, base.seed)
    first_map = probe.metrics_at([-np.arange(len(r), dtype=np.float64) for r in probe.dev_lists.ids], None)["map"]
    chance = chance_map(probe, base.seed)
    log.info(
        "first stage %s: %s mAP %.4f; a random order of its top-%d: %.4f",
        head.first_stage,
        args.scored,
        first_map,
        head.k,
        chance,
    )
    rows = [
        run(
            head.model_copy(update={"lr": lr, "epochs": epochs}),
            stores,
            (train_subset(lists[0], f, base.seed), lists[1]),
            device,
            base.seed,
            f,
        )
        for f in args.fractions
        for lr, epochs in args.runs
    ]
    # the thread count changes the order of float sums: after many epochs at a high rate the
    # curves drift in the third digit, so each run records it
    rows = [{"scored": args.scored, "threads": torch.get_num_threads(), **row} for row in rows]
    out = {
        "first_stage": head.first_stage,
        f"{args.scored}_map_first_stage": round(first_map, 4),
        f"{args.scored}_map_random_order": round(chance, 4),
        "plm": "frozen (encode_rerank's cache)",
        "runs": rows,
    }
    if args.json:
        write_json(merged(args.json, out), args.json)
    else:
        sys.stdout.write(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

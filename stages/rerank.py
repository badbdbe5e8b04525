"""rerank: train MVCL's interaction network on triples from the first stage's train top-k,
choose the epoch and the interpolation with the first stage on dev -> models/mvcl/,
metrics/rerank.json."""

from __future__ import annotations

import sys
from pathlib import Path

from lexgraph.config import resolve_device
from lexgraph.io import read_parquet, write_json
from lexgraph.retrieval.systems import load_retriever
from lexgraph.metrics import DEEPEST
from lexgraph.models.mvcl import save_model
from lexgraph.models.mvcl_config import RerankConfig
from lexgraph.models.mvcl_features import DISABLED, TokenStore, write_disabled
from lexgraph.training.rerank import first_stage_lists, train


def configure(parser):
    parser.add_argument("--questions", required=True)
    parser.add_argument("--features", required=True)
    parser.add_argument("--workspace", required=True, help="where the first-stage system's artefacts are")
    parser.add_argument("--out", required=True)
    parser.add_argument("--metrics", required=True)


def main(args, base, config):
    if not config.enabled:
        write_disabled(args.out)
        write_json(dict(DISABLED), args.metrics)
        return
    device = resolve_device(base.device)
    questions = read_parquet(args.questions, ["id", "question", "article_ids", "split"])
    features = Path(args.features)
    articles = TokenStore.load(features / "articles.safetensors")
    queries = TokenStore.load(features / "questions.safetensors")
    views = TokenStore.load(features / "element_views.safetensors")
    first = load_retriever(config.first_stage, args.workspace, str(device))
    train_lists = first_stage_lists(first, questions, "train", config.k)
    dev_lists = first_stage_lists(first, questions, config.split, max(config.k, DEEPEST))
    model, report = train(config, articles, queries, views, train_lists, dev_lists, device, base.seed)
    save_model(model, config, report, args.out)
    write_json(report, args.metrics)


if __name__ == "__main__":
    from lexgraph.stage import run_stage

    sys.exit(run_stage("rerank", main, configure, config=RerankConfig.from_params))

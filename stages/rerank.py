"""rerank: train one re-ranker (--variant mvcl: MVCL as published, the PLM fine-tuned; --variant
xrerank: lexgraph's recipe over the frozen PLM's cached states) on triples from the first
stage's train top-k, choose the epoch (and, with fusion, the interpolation with the first stage)
on dev -> models/<variant>/, metrics/rerank_<variant>.json."""

from __future__ import annotations

import sys

from lexgraph.core.stage import add_paths, paths_from
from lexgraph.training.rerank_config import VARIANTS
from lexgraph.training.rerank_stage import RerankPaths


def configure(parser):
    parser.add_argument("--variant", required=True, choices=VARIANTS)
    add_paths(parser, RerankPaths)


def main(args, base, config):
    """Train one re-ranker (``config``: both re-rankers' settings, checked up front)."""
    from lexgraph.core.config import resolve_device
    from lexgraph.systems.registry import load_retriever
    from lexgraph.training.rerank_stage import run_rerank

    settings, device, paths = config[args.variant], resolve_device(base.device), paths_from(RerankPaths, args)
    run_rerank(
        paths, settings, device, base.seed, lambda: load_retriever(settings.first_stage, paths.workspace, str(device))
    )


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage
    from lexgraph.systems.rerank import stage_settings

    sys.exit(run_stage("rerank", main, configure, config=stage_settings))

"""rerank: train one re-ranker (--variant mvcl: MVCL as published, the PLM fine-tuned; --variant
xrerank: lexgraph's recipe over the frozen PLM's cached states) on triples from the first
stage's train top-k, choose the epoch (and, with fusion, the interpolation with the first stage)
on dev -> models/<variant>/, metrics/rerank_<variant>.json."""

from __future__ import annotations

import sys

from lexgraph.core.stage import Stage, StageContext, run_stage
from lexgraph.methods.rerank.config import VARIANTS, RerankConfig
from lexgraph.methods.rerank.stage import RerankPaths
from lexgraph.methods.rerank.system import stage_settings


def run(paths: RerankPaths, config: RerankConfig, context: StageContext) -> None:
    """Train one re-ranker (each re-ranker's settings, and its first stage, checked up front)."""
    from lexgraph.methods.rerank.stage import run_rerank
    from lexgraph.systems.registry import load_retriever

    device = str(context.torch_device())
    run_rerank(paths, config, context, lambda: load_retriever(config.first_stage, paths.workspace, device))


STAGE = Stage("rerank", "rerank", RerankPaths, stage_settings, run, variants=VARIANTS)

if __name__ == "__main__":
    sys.exit(run_stage(STAGE))

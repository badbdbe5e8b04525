"""embed: encode articles, heading nodes and questions with the trained DSR
(raw, un-normalised float32 vectors in safetensors files)."""

from __future__ import annotations

import sys
from dataclasses import asdict

from lexgraph.config import resolve_device
from lexgraph.embed import EmbedConfig, run_embed


def configure(parser):
    parser.add_argument("--dsr", default="models/dsr")
    parser.add_argument("--chunks", default="data/chunks", help="encode_chunks cache (frozen chunk encoder)")
    parser.add_argument("--articles", default="data/clean/articles.parquet")
    parser.add_argument("--headings", default="data/clean/headings.parquet")
    parser.add_argument("--questions", default="data/clean/questions.parquet")
    parser.add_argument("--out", default="data/embed")


def main(args, base, params):
    config = EmbedConfig.from_params(params)
    run_embed(args.dsr, args.chunks, args.articles, args.headings, args.questions, args.out, asdict(config),
              resolve_device(base.device))


if __name__ == "__main__":
    from lexgraph.stage import run_stage

    sys.exit(run_stage("embed", main, configure, config=EmbedConfig.from_params))

"""zeroshot: embed every article with the base model as it is (E5 prefixes and windowed
mean pooling), for the `zeroshot` retrieval system."""

from __future__ import annotations

import sys

from lexgraph.core.config import resolve_device
from lexgraph.systems.zeroshot import ZeroshotConfig, run_zeroshot


def configure(parser):
    parser.add_argument("--pretrained", required=True, help="base checkpoint (pretrain stage)")
    parser.add_argument("--articles", required=True)
    parser.add_argument("--chunks", required=True, help="encode_chunks cache, reused when chunked alike")
    parser.add_argument("--out", required=True)


def main(args, base, config):
    run_zeroshot(args.pretrained, args.articles, args.out, config, resolve_device(base.device), args.chunks)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("zeroshot", main, configure, config=ZeroshotConfig.from_params))

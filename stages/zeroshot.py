"""zeroshot: embed every article with the base model as it is (E5 prefixes and windowed
mean pooling), for the `zeroshot` retrieval system."""

from __future__ import annotations

import sys

from lexgraph.core.config import resolve_device
from lexgraph.core.stage import add_paths, paths_from
from lexgraph.systems.zeroshot import ZeroshotConfig, ZeroshotPaths, run_zeroshot


def configure(parser):
    add_paths(parser, ZeroshotPaths)


def main(args, base, config):
    paths = paths_from(ZeroshotPaths, args)
    run_zeroshot(paths.pretrained, paths.articles, paths.out, config, resolve_device(base.device), paths.chunks)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("zeroshot", main, configure, config=ZeroshotConfig.from_params))

"""embed: encode articles, heading nodes and questions with the trained DSR
(raw, un-normalised float32 vectors in safetensors files)."""

from __future__ import annotations

import sys

from lexgraph.core.config import resolve_device
from lexgraph.core.stage import add_paths, paths_from
from lexgraph.encoding.embed import EmbedConfig, EmbedPaths, run_embed


def configure(parser):
    add_paths(parser, EmbedPaths)


def main(args, base, config):
    run_embed(paths_from(EmbedPaths, args), config, resolve_device(base.device))


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("embed", main, configure, config=EmbedConfig.from_params))

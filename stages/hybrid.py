"""hybrid: choose, on the dev split, the dense system and the fusion (RRF or weighted score sum)
with which the `hybrid` system fuses BM25 with it -> models/hybrid/hybrid.json, metrics/hybrid_tune.json."""

from __future__ import annotations

import sys

from lexgraph.core.config import resolve_device
from lexgraph.core.stage import add_paths, paths_from
from lexgraph.systems.hybrid import HybridConfig
from lexgraph.systems.hybrid_tune import HybridPaths, run_hybrid


def configure(parser):
    add_paths(parser, HybridPaths)


def main(args, base, config):
    run_hybrid(paths_from(HybridPaths, args), config, str(resolve_device(base.device)))


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("hybrid", main, configure, config=HybridConfig.from_params))

"""fetch: BSARD (hub or local copy) or the embedded sample -> data/raw (BSARD schema, Parquet)."""

from __future__ import annotations

import sys

from lexgraph.core.stage import add_paths, paths_from
from lexgraph.data.fetch import FetchConfig, FetchPaths, run_fetch


def configure(parser):
    add_paths(parser, FetchPaths)


def main(args, base, config):
    run_fetch(paths_from(FetchPaths, args), config, base.seed)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("fetch", main, configure, config=FetchConfig.from_params, uses_torch=False))

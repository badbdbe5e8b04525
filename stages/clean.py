"""clean: data/raw -> data/clean (articles, headings, questions) + metrics/data.json."""

from __future__ import annotations

import sys

from lexgraph.core.stage import add_paths, paths_from
from lexgraph.data.clean import CleanConfig, CleanPaths, run_clean


def configure(parser):
    add_paths(parser, CleanPaths)


def main(args, base, config):
    run_clean(paths_from(CleanPaths, args), config)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("clean", main, configure, config=CleanConfig.from_params, uses_torch=False))

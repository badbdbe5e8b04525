"""hprior: choose on dev how far DSR's article vectors are propagated through the hierarchy
(the parameter-free `hprior` system) -> models/hprior/, metrics/hprior_tune.json."""

from __future__ import annotations

import sys

from lexgraph.core.stage import add_paths, paths_from
from lexgraph.systems.hprior import HpriorConfig, HpriorPaths, run_hprior


def configure(parser):
    add_paths(parser, HpriorPaths)


def main(args, base, config):
    run_hprior(paths_from(HpriorPaths, args), config)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("hprior", main, configure, config=HpriorConfig.from_params))

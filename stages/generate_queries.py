"""Synthetic queries per article: the fetched ones kept, the rest random crops, doc2query or none (params section
`queries`)."""

from __future__ import annotations

import sys

from lexgraph.core.stage import add_paths, paths_from
from lexgraph.data.queries import QueriesConfig, QueriesPaths


def configure(parser):
    add_paths(parser, QueriesPaths)


def main(args, base, config):
    """Synthetic queries per article: random crops, doc2query or none."""
    from lexgraph.data.queries import run

    paths = paths_from(QueriesPaths, args)
    run(paths.articles, paths.out, config, seed=base.seed, device=base.device, questions=paths.questions)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("queries", main, configure, name="generate_queries", config=QueriesConfig.from_params))

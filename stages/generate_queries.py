"""Synthetic queries per article: random crops, doc2query or none (params section `queries`)."""

from lexgraph.core.stage import run_stage
from lexgraph.data.queries import QueriesConfig


def configure(parser):
    parser.add_argument("--articles", required=True, help="clean articles (Parquet)")
    parser.add_argument("--out", required=True, help="output synthetic questions (Parquet)")


def main(args, base, config):
    """Synthetic queries per article: random crops, doc2query or none."""
    from lexgraph.data.queries import run

    run(args.articles, args.out, config, seed=base.seed, device=base.device)


if __name__ == "__main__":
    raise SystemExit(run_stage("queries", main, configure, name="generate_queries", config=QueriesConfig.from_params))

"""Domain-adaptive MLM pre-training on the cleaned articles (params section `pretrain`)."""

from lexgraph.models.pretrain import PretrainConfig
from lexgraph.stage import run_stage


def configure(parser):
    parser.add_argument("--articles", default="data/clean/articles.parquet", help="clean articles (Parquet)")
    parser.add_argument("--out", default="models/pretrain", help="output checkpoint directory (model + tokenizer)")
    parser.add_argument("--metrics", default="metrics/pretrain.json", help="output metrics (JSON)")


def main(args, base, params):
    """Domain-adaptive MLM pre-training on the cleaned articles."""
    from lexgraph.training.mlm import run

    run(args.articles, args.out, args.metrics, params, seed=base.seed, device=base.device)


if __name__ == "__main__":
    raise SystemExit(run_stage("pretrain", main, configure, config=PretrainConfig.from_params))

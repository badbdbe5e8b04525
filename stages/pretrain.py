"""Domain-adaptive MLM pre-training on the cleaned articles (params section `pretrain`)."""

from lexgraph.core.stage import run_stage
from lexgraph.training.pretrain_model import PretrainConfig


def configure(parser):
    parser.add_argument("--articles", required=True, help="clean articles (Parquet)")
    parser.add_argument("--out", required=True, help="output checkpoint directory (model + tokenizer)")
    parser.add_argument("--metrics", required=True, help="output metrics (JSON)")
    parser.add_argument("--plot", required=True, help="output training curve (CSV: step, loss, eval_loss)")


def main(args, base, config):
    """Domain-adaptive MLM pre-training on the cleaned articles."""
    from lexgraph.training.pretrain import run

    run(args.articles, args.out, args.metrics, config, seed=base.seed, device=base.device, plot=args.plot)


if __name__ == "__main__":
    raise SystemExit(run_stage("pretrain", main, configure, config=PretrainConfig.from_params))

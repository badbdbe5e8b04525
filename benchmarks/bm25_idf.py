"""Benchmark: BM25's idf, Robertson's or Lucene's, each at its own dev-best k1 x b (issue 41, item 4).

    .venv/bin/python benchmarks/bm25_idf.py [--articles data/clean/articles.parquet]
        [--questions data/clean/questions.parquet] [--params params.yaml] [--resamples 10000] [--seed 0]
        [--out benchmarks/bm25_idf.json]
    .venv/bin/python benchmarks/bm25_idf.py --table benchmarks/bm25_idf.json   # docs/scale.md's table

The two idf formulas of :mod:`lexgraph.search.bm25_kernels`, each with the default floor
``"lucene-min"`` (``idf = max(idf, ln(1 + 0.5 / (N + 0.5)))``):

* ``robertson``: ``ln((N - df + 0.5) / (df + 0.5))`` (lexgraph's default);
* ``lucene``: ``ln(1 + (N - df + 0.5) / (df + 0.5))`` (Lucene's ``BM25Similarity``).

For each, k1 x b is tuned over params.yaml's ``bm25_tune`` grid on its split and metric exactly as the
``bm25_tune`` stage does (:func:`lexgraph.methods.bm25.system.tune_grid`: ties go to the first pair in
grid order), the index is built at the best pair as the ``bm25`` stage builds it, and the dev and test
questions are searched to ``evaluate.k`` as the ``evaluate`` stage does (:meth:`BM25.search`) and
scored by :func:`lexgraph.metrics.ir.evaluate_run`: recall@100, map, ndcg@10. Lucene against Robertson
on test: :func:`lexgraph.metrics.significance.compare_systems` (paired Fisher randomisation test,
``--resamples`` sign flips, ``--seed``; Holm over the three metrics; bootstrap 95 % CI of the mean
difference).

``unchanged``: on these articles, what the new default floor changes against the floor 0.0 that was
the default before issue 41, Robertson's idf both: the largest df against N/2, the smallest
Robertson idf against ``eps(N)``, and whether the idf, the weights (at the tuned pair and at the
``negatives`` section's pair, the BM25 that mines hard negatives), the dev and test top-``evaluate.k``
(ids and float32 scores) and the mined negatives of the ``negatives`` splits are identical byte for byte.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from lexgraph.core.arguments import OneLineParser, non_negative_int, positive_int
from lexgraph.core.config import load_params
from lexgraph.core.errors import LexgraphError
from lexgraph.core.io import read_parquet, write_json
from lexgraph.core.machine import describe
from lexgraph.data.schema import split_questions
from lexgraph.evaluation.evaluate import EvaluateConfig
from lexgraph.methods.bm25.system import Bm25TuneConfig, build_index, tune_grid
from lexgraph.methods.dsr.negatives import NegativesConfig, mine_from_index
from lexgraph.metrics.ir import evaluate_run
from lexgraph.metrics.significance import compare_systems
from lexgraph.search.bm25 import BM25
from lexgraph.search.bm25_kernels import DEFAULT_IDF_FLOOR, IDF_VARIANTS, ROBERTSON, idf_values, lucene_min
from lexgraph.text.analyzer import FrenchAnalyzer

log = logging.getLogger("bm25_idf")

METRICS = ("recall@100", "map", "ndcg@10")
SPLITS = ("dev", "test")
OLD_FLOOR = 0.0  # the default floor before issue 41


def measure_variant(articles, questions, config: Bm25TuneConfig, k: int, idf: str) -> tuple[dict, dict]:
    """``idf``'s dev-best pair (``tune_grid``), the pairs tied with it, and its dev and test metrics
    there; with its runs ``{split: {qid: ids}}``."""
    grid, best = tune_grid(articles, questions, config, idf=idf)
    index = build_index(articles, best["k1"], best["b"], idf)
    row: dict[str, Any] = {
        "k1": best["k1"],
        "b": best["b"],
        "tuned": round(best["score"], 4),
        "tied": [[r["k1"], r["b"]] for r in grid if r["score"] == best["score"]],
    }
    runs = {}
    for split in SPLITS:
        qids, texts, qrels = split_questions(questions, split)
        ids, _ = index.search(texts, k)
        runs[split] = {q: r.tolist() for q, r in zip(qids, ids)}
        scores = evaluate_run(runs[split], qrels)
        row[split] = {m: round(scores[m], 4) for m in METRICS}
    log.info("%s: k1=%.2f b=%.2f dev %s test %s", idf, row["k1"], row["b"], row["dev"], row["test"])
    return row, runs


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def unchanged(articles, questions, k: int, tuned: tuple[float, float], mining: NegativesConfig) -> dict:
    """What the default floor changes against :data:`OLD_FLOOR` on ``articles`` (module docstring)."""
    analyzer = FrenchAnalyzer()
    tokens = analyzer.analyze_many(articles["article"].to_list(), desc="analyze articles")
    ids = articles["id"].to_numpy()
    new, old = (BM25(*tuned, idf_floor=floor).fit(tokens, ids) for floor in (DEFAULT_IDF_FLOOR, OLD_FLOOR))
    n, df = new.n_docs, new.doc_freq
    out: dict[str, Any] = {
        "articles": n,
        "max_df": int(df.max()),
        "terms_df_over_half": int(np.count_nonzero(2 * df > n)),
        "min_robertson_idf": round(float(idf_values(df, n, ROBERTSON, None).min()), 6),
        "lucene_min": round(lucene_min(n), 6),
        "idf": _same(new.idf, old.idf),
        "weights_tuned": _same(new._weights.data, old._weights.data),
    }
    for split in SPLITS:
        _, texts, _ = split_questions(questions, split)
        (a_ids, a_scores), (b_ids, b_scores) = new.search(texts, k), old.search(texts, k)
        out[f"{split}_top{k}"] = _same(a_ids, b_ids) and _same(a_scores, b_scores)
    for index in (new, old):
        index.reweight(mining.k1, mining.b)
    out["negatives_k1_b"] = [mining.k1, mining.b]
    out["weights_negatives"] = _same(new._weights.data, old._weights.data)
    mined = questions.filter(questions["split"].is_in(list(mining.splits)))
    q_tokens = analyzer.analyze_many(mined["question"].to_list(), desc="analyze questions")
    gold = [g if g is not None else [] for g in mined["article_ids"].to_list()]
    a, b = (mine_from_index(index, q_tokens, gold, k=mining.k, depth=mining.depth) for index in (new, old))
    out["negatives_questions"] = mined.height
    out["negatives"] = len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    log.info("unchanged: %s", out)
    return out


def run(args) -> dict:
    started = time.perf_counter()
    articles = read_parquet(args.articles, ["id", "article"])
    questions = read_parquet(args.questions, ["id", "question", "article_ids", "split"])
    config = Bm25TuneConfig.from_params(load_params("bm25_tune", args.params)[1])
    k = EvaluateConfig.from_params(load_params("evaluate", args.params)[1]).k
    mining = NegativesConfig.from_params(load_params("negatives", args.params)[1])
    variants, runs = {}, {}
    for idf in IDF_VARIANTS:
        variants[idf], runs[idf] = measure_variant(articles, questions, config, k, idf)
    _, _, qrels = split_questions(questions, "test")
    test = {name: runs[name]["test"] for name in IDF_VARIANTS}
    compared = compare_systems(test, qrels, [ROBERTSON], METRICS, n_resamples=args.resamples, seed=args.seed)
    tuned = (variants[ROBERTSON]["k1"], variants[ROBERTSON]["b"])
    return {
        "articles": articles.height,
        "questions": {split: len(split_questions(questions, split)[0]) for split in SPLITS},
        "grid": {"split": config.split, "metric": config.metric, "k1": config.k1, "b": config.b},
        "depth": k,
        "idf_floor": DEFAULT_IDF_FLOOR,
        "variants": variants,
        "lucene_vs_robertson": {
            "split": "test",
            "resamples": args.resamples,
            "seed": args.seed,
            **compared["lucene"]["vs_robertson"],
        },
        "unchanged": unchanged(articles, questions, k, tuned, mining),
        "seconds": round(time.perf_counter() - started, 1),
        "machine": describe(),
    }


def table(result: dict) -> str:
    """docs/scale.md's table: each variant's dev-best pair and its dev and test metrics, then the
    test difference lucene - robertson with its Holm-adjusted p-value."""
    head = " | ".join(f"{split} {m}" for split in SPLITS for m in METRICS)
    rows = [f"| idf | k1 | b | {head} |", "|:---|---:|---:|" + "---:|" * (len(SPLITS) * len(METRICS))]
    for name, row in result["variants"].items():
        cells = " | ".join(f"{row[split][m]:.4f}" for split in SPLITS for m in METRICS)
        rows.append(f"| {name} | {row['k1']} | {row['b']} | {cells} |")
    versus = result["lucene_vs_robertson"]
    diffs = " | ".join(f"{versus[m]['diff']:+.4f} (p {versus[m]['p_holm']:.3f})" for m in METRICS)
    rows.append(f"| lucene − robertson, test (Holm) | | | {' | '.join('' for _ in METRICS)} | {diffs} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = OneLineParser(prog="bm25_idf.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--articles", type=Path, default=Path("data/clean/articles.parquet"))
    parser.add_argument("--questions", type=Path, default=Path("data/clean/questions.parquet"))
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--resamples", type=positive_int, default=10000, help="sign flips of the randomisation test")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--out", type=Path, help="the JSON to write (default: standard output)")
    parser.add_argument("--table", type=Path, help="print the Markdown table of a saved result")
    args = parser.parse_args(argv)
    if args.table:
        from lexgraph.core.inputs import read_json_object

        sys.stdout.write(table(read_json_object(args.table, what="a bm25_idf.py result", fix="rerun it")) + "\n")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("lexgraph").setLevel(logging.WARNING)
    try:
        result = run(args)
    except LexgraphError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    if args.out is None:
        from lexgraph.core.io import json_text

        sys.stdout.write(json_text(result, indent=1))
    else:
        write_json(result, args.out, indent=1)
        log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: lexgraph's systems through clients nobody on the project wrote (issue 41).

    .venv/bin/python benchmarks/export_clients.py [--workspace .] [--systems dsr zeroshot] [--split test]
        [--out benchmarks/export_clients.json]

For each text-encoder system of a reproduced workspace (``dsr``, ``zeroshot``):

* ``lexgraph export`` to a scratch folder, twice (the two folders compared byte for byte);
* ``SentenceTransformer(OUT, trust_remote_code=True)``: ``encode_document`` of every article of
  ``data/clean`` (the lowest cosine with the export's own ``article_vectors.safetensors``), then
  sentence-transformers' ``InformationRetrievalEvaluator`` on ``--split`` with those vectors
  (``encode_query`` for the questions);
* ``mteb.evaluate`` of :class:`lexgraph.systems.mteb_adapter.MTEBEncoder` on the workspace's split
  as a custom retrieval task (MTEB encodes both sides through the adapter and scores with its own code);

and writes recall@100, MAP@100 and nDCG@10 of each client beside ``metrics/<system>.json``'s, their
largest absolute difference, and the seconds each step took, to ``--out`` (atomically).
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np

log = logging.getLogger("export_clients")

COMPARED = ("recall@100", "map@100", "ndcg@10")
MTEB_NAMES = {"recall@100": "recall_at_100", "map@100": "map_at_100", "ndcg@10": "ndcg_at_10"}


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _split(workspace: Path, split: str):
    import polars as pl

    articles = pl.read_parquet(workspace / "data" / "clean" / "articles.parquet", columns=["id", "article"])
    questions = pl.read_parquet(workspace / "data" / "clean" / "questions.parquet").filter(pl.col("split") == split)
    corpus = {str(i): text for i, text in zip(articles["id"], articles["article"])}
    queries = {str(q): text for q, text in zip(questions["id"], questions["question"])}
    relevant = {str(q): {str(a) for a in gold} for q, gold in zip(questions["id"], questions["article_ids"])}
    return queries, corpus, relevant


def sentence_transformers_run(out: Path, workspace: Path, split: str) -> dict:
    """The export in sentence-transformers: articles encoded by it, scored by its evaluator."""
    import torch
    from safetensors.numpy import load_file
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    start = time.perf_counter()
    model = SentenceTransformer(str(out), trust_remote_code=True, device="cpu")
    loaded = time.perf_counter()
    queries, corpus, relevant = _split(workspace, split)
    documents = model.encode_document(
        list(corpus.values()), batch_size=16, convert_to_numpy=True, show_progress_bar=False
    )  # (n, dim)
    encoded = time.perf_counter()
    shipped = load_file(str(out / "article_vectors.safetensors"))
    rows = {str(i): r for r, i in enumerate(shipped["ids"].tolist())}
    mine = shipped["vectors"][[rows[i] for i in corpus]]  # (n, dim), the corpus's order
    cosines = (documents * mine).sum(1) / np.linalg.norm(documents, axis=1) / np.linalg.norm(mine, axis=1)
    evaluator = InformationRetrievalEvaluator(
        queries,
        corpus,
        relevant,
        mrr_at_k=[10],
        ndcg_at_k=[10],
        accuracy_at_k=[10],
        precision_recall_at_k=[100],
        map_at_k=[100],
        batch_size=16,
        show_progress_bar=False,
    )
    scores = evaluator(model, corpus_embeddings=torch.from_numpy(documents))
    return {
        "metrics": {name: round(float(scores[f"{model.similarity_fn_name}_{name}"]), 4) for name in COMPARED},
        "min_cosine_with_lexgraphs_vectors": round(float(cosines.min()), 6),
        "load_s": round(loaded - start, 1),
        "encode_articles_s": round(encoded - loaded, 1),
    }


def mteb_run(system: str, workspace: Path, split: str) -> dict:
    import mteb

    from lexgraph.systems.mteb_adapter import MTEBEncoder, workspace_task

    start = time.perf_counter()
    result = mteb.evaluate(
        MTEBEncoder.load(system, workspace), workspace_task(workspace, split), cache=None, show_progress_bar=False
    )
    scores = result.task_results[0].scores[split][0]
    return {
        "mteb": mteb.__version__,
        "metrics": {name: round(float(scores[MTEB_NAMES[name]]), 4) for name in COMPARED},
        "seconds": round(time.perf_counter() - start, 1),
    }


def measure(system: str, workspace: Path, split: str) -> dict:
    from lexgraph.systems.export import export_system

    want = json.loads((workspace / "metrics" / f"{system}.json").read_text(encoding="utf-8"))[split]
    lexgraph = {name: want[name] for name in COMPARED}
    with tempfile.TemporaryDirectory() as scratch:
        start = time.perf_counter()
        out = export_system(system, workspace, Path(scratch) / "a")
        seconds = time.perf_counter() - start
        again = export_system(system, workspace, Path(scratch) / "b")
        identical = _tree(out) == _tree(again)
        size = sum(len(b) for b in _tree(out).values())
        st = sentence_transformers_run(out, workspace, split)
    mt = mteb_run(system, workspace, split)
    differences = [abs(run["metrics"][n] - lexgraph[n]) for run in (st, mt) for n in COMPARED]
    return {
        "lexgraph": lexgraph,
        "sentence_transformers": st,
        "mteb": mt,
        "largest_difference": round(max(differences), 4),
        "export_s": round(seconds, 1),
        "export_mb": round(size / 1e6, 1),
        "exports_byte_identical": identical,
    }


def table(result: dict) -> str:
    """The markdown table docs/cli.md shows of ``result`` (tests/test_docs.py keeps them equal)."""
    lines = [
        f"On the sample's workspace ({result['split']} split; {result['machine']}; sentence-transformers "
        f"{result['sentence_transformers']}), recall@100 / MAP@100 / nDCG@10 in %, as lexgraph's `evaluate` "
        "stage, sentence-transformers' evaluator over the export's own article encoding and `mteb.evaluate` "
        "of the adapter score them (`benchmarks/export_clients.py` -> `benchmarks/export_clients.json`):",
        "",
        "| system | lexgraph | sentence-transformers | mteb | lowest cosine with lexgraph's | export | "
        "encode_document, every article |",
        "|---|---|---|---|---|---|---|",
    ]
    for system, row in result["systems"].items():
        cells = [
            " / ".join(f"{100 * run['metrics'][n]:.2f}" for n in COMPARED)
            if "metrics" in run
            else " / ".join(f"{100 * run[n]:.2f}" for n in COMPARED)
            for run in (row["lexgraph"], row["sentence_transformers"], row["mteb"])
        ]
        st = row["sentence_transformers"]
        lines.append(
            f"| {system} | {' | '.join(cells)} | {st['min_cosine_with_lexgraphs_vectors']:.6f} | "
            f"{row['export_s']:.0f} s, {row['export_mb']:.0f} MB, byte-identical twice: "
            f"{'yes' if row['exports_byte_identical'] else 'no'} | {st['encode_articles_s']:.0f} s |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import sentence_transformers

    from lexgraph.core.io import write_json
    from lexgraph.core.machine import describe

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("."))
    parser.add_argument("--systems", nargs="+", default=["dsr", "zeroshot"])
    parser.add_argument("--split", default="test")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/export_clients.json"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    result = {
        "machine": describe(),
        "split": args.split,
        "sentence_transformers": sentence_transformers.__version__,
        "systems": {},
    }
    for system in args.systems:
        result["systems"][system] = measure(system, args.workspace, args.split)
        log.info("%s: %s", system, result["systems"][system])
    write_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The ``lexgraph`` command.

``lexgraph search --system bm25 --questions FILE.jsonl --run OUT.trec [--k 500]``
    batch mode: each line of FILE has ``id`` and ``question``; writes a TREC run.
``lexgraph search --system bm25 "Qui paie la réparation du mur mitoyen ?"``
    one question: prints the top articles with reference, heading path and a snippet.
``lexgraph search --system bm25``
    interactive: asks for questions until an empty line or end of input.
``lexgraph regress [--expected regression/sample.yaml]``
    checks that metrics/<system>.json reproduce the expected scores within tolerance.

Systems are loaded from the artefacts ``dvc repro`` wrote in the workspace (``--workspace``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import textwrap
from pathlib import Path

from lexgraph.errors import DataError, LexgraphError

log = logging.getLogger("lexgraph")


def read_questions_jsonl(path: Path) -> tuple[list[str], list[str]]:
    """``(ids, questions)`` from a JSON-lines file whose lines have ``id`` and ``question``."""
    if not path.is_file():
        raise DataError(path, "file not found")
    ids, questions = [], []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise DataError(path, f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from exc
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(path, f"not valid JSON ({exc.msg})", row=n) from exc
        if not isinstance(rec, dict) or "id" not in rec or "question" not in rec:
            raise DataError(path, "expected an object with keys 'id' and 'question'", row=n)
        qid = str(rec["id"])
        if not qid or any(ch.isspace() for ch in qid):
            raise DataError(path, f"id {rec['id']!r} must be non-empty without spaces", row=n, column="id")
        if not str(rec["question"]).strip():
            raise DataError(path, "empty question", row=n, column="question")
        ids.append(qid)
        questions.append(str(rec["question"]))
    if not ids:
        raise DataError(path, "no questions; expected one JSON object per line with 'id' and 'question'")
    if len(set(ids)) != len(ids):
        raise DataError(path, "question ids must be unique")
    return ids, questions


def _articles(workspace: Path):
    from lexgraph.io import read_parquet

    return read_parquet(workspace / "data" / "clean" / "articles.parquet", ["id", "article", "reference", "path"])


def print_results(question: str, ids, scores, articles, snippet: int = 240, out=None) -> None:
    out = out or sys.stdout
    by_id = {row["id"]: row for row in articles.iter_rows(named=True)}
    out.write(f"\n{question}\n")
    for rank, (aid, score) in enumerate(zip(ids.tolist(), scores.tolist()), 1):
        if aid < 0:
            break
        art = by_id[aid]
        out.write(f"\n{rank:>3}. {art['reference']}   (score {score:.4f}, id {aid})\n")
        if art["path"]:
            out.write(f"     {' > '.join(art['path'])}\n")
        text = " ".join(art["article"].split())
        out.write(textwrap.indent(textwrap.fill(textwrap.shorten(text, snippet, placeholder=" …"), 92), "     ") + "\n")


def cmd_search(args) -> int:
    from lexgraph.config import resolve_device
    from lexgraph.evaluation import write_trec
    from lexgraph.retrieval import load_retriever

    workspace = Path(args.workspace)
    if args.questions and args.question:
        raise LexgraphError("give either --questions FILE or a question, not both")
    if args.questions and not args.run:
        raise LexgraphError("--questions needs --run OUT.trec")
    retriever = load_retriever(args.system, workspace, str(resolve_device(args.device)))
    if args.questions:
        ids, questions = read_questions_jsonl(Path(args.questions))
        top, scores = retriever.search(questions, args.k)
        write_trec(args.run, ids, top, scores, args.system)
        log.info("wrote %d rankings of depth %d to %s", len(ids), args.k, args.run)
        return 0
    articles = _articles(workspace)
    if args.question:
        top, scores = retriever.search([args.question], args.top)
        print_results(args.question, top[0], scores[0], articles)
        return 0
    while True:  # interactive
        try:
            question = input("\nquestion (empty line to quit)> ").strip()
        except EOFError:
            return 0
        if not question:
            return 0
        top, scores = retriever.search([question], args.top)
        print_results(question, top[0], scores[0], articles)


def cmd_regress(args) -> int:
    from lexgraph.io import write_text
    from lexgraph.regression import check, expected_from_metrics

    if args.update:
        write_text(expected_from_metrics(args.metrics_dir, args.expected), args.expected)
        print(f"wrote {args.expected} from {args.metrics_dir}/ (review the diff before committing)")
        return 0
    failures = check(args.metrics_dir, args.expected)
    for line in failures:
        print(f"REGRESSION {line}", file=sys.stderr)
    if failures:
        return 1
    print(f"all metrics in {args.expected} reproduce")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lexgraph", description="Statutory article retrieval (BM25, zero-shot e5, DSR, G-DSR, QABISAR).")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("search", help="retrieve articles for questions with a trained system")
    s.add_argument("question", nargs="?", help="one question (interactive mode when neither it nor --questions is given)")
    s.add_argument("--system", default="bm25", help="bm25 | zeroshot | dsr | gdsr | qabisar")
    s.add_argument("--questions", help="JSON-lines file, one {'id', 'question'} per line (batch mode)")
    s.add_argument("--run", help="output TREC run file (batch mode)")
    s.add_argument("--k", type=int, default=500, help="ranking depth in batch mode (default 500)")
    s.add_argument("--top", type=int, default=10, help="articles shown per question (default 10)")
    s.add_argument("--workspace", default=".", help="directory where `dvc repro` wrote models/ and data/")
    s.add_argument("--device", default="auto", help="auto | cpu | cuda")
    s.set_defaults(func=cmd_search)
    r = sub.add_parser("regress", help="compare metrics/<system>.json with expected scores")
    r.add_argument("--expected", default="regression/sample.yaml")
    r.add_argument("--metrics-dir", default="metrics")
    r.add_argument("--update", action="store_true", help="rewrite the expected file from the current metrics "
                   "(keeps its comments and tolerances)")
    r.set_defaults(func=cmd_regress)
    return parser


def main(argv: list[str] | None = None) -> int:
    from lexgraph.stage import setup_logging

    args = build_parser().parse_args(argv)
    setup_logging("INFO")
    try:
        return args.func(args)
    except LexgraphError as exc:
        print(f"lexgraph: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

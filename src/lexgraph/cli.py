"""The ``lexgraph`` command.

``lexgraph search --system bm25 --questions FILE.jsonl --run OUT.trec [--k 500]``
    batch mode: each line of FILE has ``id`` (a string without spaces or an integer,
    unique) and ``question`` (a non-empty string); writes a TREC run. ``--run`` must be a
    new file or an earlier run: never the questions file, a directory, a file that is not
    a TREC run, or a path under the workspace's ``data/`` or ``models/``. A question that
    no article matches (BM25: none of its terms is in the corpus) gets no ranking, with a
    warning naming its id.
``lexgraph search --system bm25 --questions FILE.jsonl --json [--top 10]``
    batch mode to stdout: one JSON object per question (with ``--run`` too: both).
``lexgraph search --system bm25 "Qui paie la réparation du mur mitoyen ?" [--json]``
    one question: prints the top articles, each with its rank, article number and
    reference, heading path, score and a snippet with the question's terms marked
    (:mod:`lexgraph.display`); ``--json``: one JSON object instead.
``lexgraph search --system bm25 [--json]``
    interactive: asks for questions until an empty line or end of input (``--json``: one
    JSON line per question, the prompt on stderr and only on a terminal).
``lexgraph regress [--expected regression/sample.yaml]``
    checks that metrics/<system>.json reproduce the expected scores within tolerance.

Systems are loaded from the artefacts ``dvc repro`` wrote in the workspace (``--workspace``),
after every argument has been checked. Errors a user can act on print one line,
``lexgraph <command>: error: ...``, and exit with status 2; ``regress`` exits with 1 when
a metric is out of tolerance.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from lexgraph import layout
from lexgraph.errors import DataError, LexgraphError
from lexgraph.retrieval.systems import SYSTEMS

log = logging.getLogger("lexgraph")


def _show(value) -> str:
    return json.dumps(value, ensure_ascii=False)[:60]


def read_questions_jsonl(path: Path) -> tuple[list[str], list[str]]:
    """``(ids, questions)`` from a JSON-lines file whose lines have ``id`` and ``question``.

    ``id``: a string without spaces or an integer, unique in the file; ``question``: a
    non-empty string. Errors name the file, its row (line) and the key.
    """
    if not path.is_file():
        raise DataError(path, "file not found; expected the --questions JSON-lines file" if not path.exists()
                        else "not a file; expected the --questions JSON-lines file")
    ids, questions, first_row = [], [], {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise DataError(path, f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(path, f"not valid JSON ({exc.msg})", row=n) from None
        if not isinstance(rec, dict) or "id" not in rec or "question" not in rec:
            missing = [k for k in ("id", "question") if not isinstance(rec, dict) or k not in rec]
            raise DataError(path, f"expected an object with keys 'id' and 'question' (missing {missing})", row=n)
        raw_id, question = rec["id"], rec["question"]
        if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)):
            raise DataError(path, f"got {_show(raw_id)}, expected a string or an integer", row=n, column="id")
        qid = str(raw_id)
        if not qid or any(ch.isspace() for ch in qid):
            raise DataError(path, f"id {_show(raw_id)} must be non-empty without spaces", row=n, column="id")
        if qid in first_row:
            raise DataError(path, f"id {_show(qid)} already used on row {first_row[qid]}; expected unique ids",
                            row=n, column="id")
        if not isinstance(question, str) or not question.strip():
            raise DataError(path, f"got {_show(question)}, expected a non-empty string", row=n,
                            column="question")
        first_row[qid] = n
        ids.append(qid)
        questions.append(question)
    if not ids:
        raise DataError(path, "no questions; expected one JSON object per line with 'id' and 'question'")
    return ids, questions


def _looks_like_trec_run(path: Path) -> bool:
    """True for an empty file or one whose first line is ``qid Q0 docid rank score tag``."""
    with open(path, "rb") as fh:
        head = fh.read(4096)
    if not head.strip():
        return True
    if b"\0" in head:
        return False
    try:
        first = head.decode("utf-8").splitlines()[0].split()
    except (UnicodeDecodeError, IndexError):
        return False
    if len(first) != 6 or first[1] != "Q0":
        return False
    try:
        int(first[3]), float(first[4])
    except ValueError:
        return False
    return True


def check_run_path(run: str, questions: str | None, workspace: Path) -> Path:
    """Refuse a ``--run`` target that is not a writable new file or earlier TREC run: a
    directory, an unwritable place, the questions file, a file under the workspace's
    DVC-managed ``data/`` or ``models/``, or any existing file that is not a TREC run."""
    path = Path(run)
    if path.is_dir():
        raise LexgraphError(f"--run {run} is a directory; expected the path of the TREC run file to write")
    resolved = path.resolve()
    if questions is not None:
        qpath = Path(questions)
        if resolved == qpath.resolve() or (path.exists() and qpath.exists() and path.samefile(qpath)):
            raise LexgraphError(f"--run {run} is the --questions file; refusing to overwrite an input, "
                                "expected a separate output path")
    for managed in layout.MANAGED_ROOTS:
        root = (workspace / managed).resolve()
        if resolved == root or root in resolved.parents:
            raise LexgraphError(f"--run {run} is inside {workspace / managed}, which `dvc repro` manages; "
                                "expected a path outside data/ and models/")
    parent = resolved.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise LexgraphError(f"--run {run}: {parent} is not a directory; expected a writable path for the TREC run")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise LexgraphError(f"--run {run}: directory {parent} is not writable; expected a writable path")
    if path.exists():
        if not path.is_file():
            raise LexgraphError(f"--run {run} is not a regular file; expected the path of the TREC run file to write")
        if not os.access(path, os.W_OK):
            raise LexgraphError(f"--run {run} is read-only; refusing to overwrite it, expected a writable path")
        if not _looks_like_trec_run(path):
            raise LexgraphError(f"--run {run} exists and is not a TREC run; refusing to overwrite it, "
                                "expected a new path or an earlier run")
    return path


def _articles(workspace: Path):
    from lexgraph.io import read_parquet

    return read_parquet(layout.articles(workspace), ["id", "article", "reference", "path"])


def _display(retriever, workspace: Path):
    """A :class:`lexgraph.display.Display` over the workspace's articles that marks terms with
    the retriever's own analyzer (BM25) or the project's default one."""
    from lexgraph.display import Display
    from lexgraph.text import FrenchAnalyzer

    analyzer = getattr(retriever, "analyzer", None)
    return Display(_articles(workspace), analyzer if isinstance(analyzer, FrenchAnalyzer) else None)


def _show_results(display, question: str, ids, scores, args, qid: str | None = None, out=None) -> None:
    """Write one question's results to stdout: text for a person, or one JSON line (``--json``)."""
    from lexgraph.display import render_json, render_text, use_ansi

    out = out or sys.stdout
    hits = display.hits(question, ids, scores)
    if args.json:
        out.write(render_json(question, hits, qid=qid, system=args.system) + "\n")
    else:
        out.write(render_text(question, hits, style="ansi" if use_ansi(out) else "plain"))
    out.flush()


def _index_config(workspace: Path):
    """``evaluate.index`` of the workspace's params.yaml (the settings ``evaluate`` searched
    with), or the defaults when the workspace has no params.yaml."""
    from lexgraph.config import load_params
    from lexgraph.evaluation import EvaluateConfig
    from lexgraph.retrieval.index import IndexConfig

    path = workspace / "params.yaml"
    if not path.exists():  # a directory or an unreadable file is an error (load_params says which), not defaults
        return IndexConfig()
    _, raw = load_params("evaluate", path)
    return EvaluateConfig.from_params(raw).index


def _check_depth(name: str, value: int) -> None:
    if value < 1:
        raise LexgraphError(f"{name} must be ≥ 1 (got {value}); expected the number of articles to return")


def cmd_search(args) -> int:
    import numpy as np

    from lexgraph.config import resolve_device
    from lexgraph.evaluation import write_trec
    from lexgraph.retrieval.systems import load_retriever

    workspace = Path(args.workspace)
    # every check on the arguments comes before loading a system (seconds to minutes)
    if args.questions and args.question is not None:
        raise LexgraphError("give either --questions FILE or a question, not both")
    if args.questions and not (args.run or args.json):
        raise LexgraphError("--questions needs --run OUT.trec, --json or both")
    if args.run and not args.questions:
        raise LexgraphError("--run is for batch mode; give --questions FILE.jsonl too")
    if args.question is not None and not args.question.strip():
        raise LexgraphError("the question argument is empty; expected a non-empty question "
                            "(or none, for interactive mode)")
    _check_depth("--k", args.k)
    _check_depth("--top", args.top)
    ids = questions = None
    if args.questions:
        if args.run:
            check_run_path(args.run, args.questions, workspace)
        ids, questions = read_questions_jsonl(Path(args.questions))
    device = str(resolve_device(args.device, where="--device"))
    retriever = load_retriever(args.system, workspace, device, index=_index_config(workspace))
    display = _display(retriever, workspace) if args.json or not args.questions else None
    if args.questions:
        top, scores = retriever.search(questions, max(args.k if args.run else 1, args.top if args.json else 1))
        matched = np.array([row.size > 0 and row[0] >= 0 for row in top], dtype=bool)  # (n,)
        if not matched.all():
            unmatched = [qid for qid, ok in zip(ids, matched) if not ok]
            log.warning("no article matches any term of %d question(s) of %s (ids: %s%s)%s", len(unmatched),
                        args.questions, ", ".join(unmatched[:10]), ", …" if len(unmatched) > 10 else "",
                        "; the run has nothing for them" if args.run else "")
        if args.run:
            write_trec(args.run, [q for q, ok in zip(ids, matched) if ok], top[matched, : args.k],
                       scores[matched, : args.k], args.system)
            log.info("wrote %d rankings of depth %d to %s", int(matched.sum()), args.k, args.run)
        if args.json:
            for qid, question, row_ids, row_scores in zip(ids, questions, top, scores):
                _show_results(display, question, row_ids[: args.top], row_scores[: args.top], args, qid=qid)
        return 0
    if args.question is not None:
        top, scores = retriever.search([args.question], args.top)
        _show_results(display, args.question, top[0], scores[0], args)
        return 0
    prompt = "\nquestion (empty line to quit)> "
    while True:  # interactive
        try:
            if args.json:  # stdout carries only JSON lines: the prompt goes to stderr, on a terminal only
                if sys.stdin.isatty() and sys.stderr.isatty():
                    sys.stderr.write(prompt.lstrip("\n"))
                    sys.stderr.flush()
                line = sys.stdin.readline()
                if not line:
                    return 0
                question = line.strip()
            else:
                question = input(prompt).strip()
        except EOFError:
            return 0
        if not question:
            return 0
        top, scores = retriever.search([question], args.top)
        _show_results(display, question, top[0], scores[0], args)


def cmd_regress(args) -> int:
    from lexgraph.io import write_text
    from lexgraph.regression import check, expected_from_metrics

    if args.update:
        write_text(expected_from_metrics(args.metrics_dir, args.expected), args.expected)
        log.info("wrote %s from %s/ (review the diff before committing)", args.expected, args.metrics_dir)
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
    s.add_argument("--system", default="bm25", help=" | ".join(SYSTEMS))
    s.add_argument("--questions", help="JSON-lines file, one {'id', 'question'} per line (batch mode)")
    s.add_argument("--run", help="output TREC run file (batch mode)")
    s.add_argument("--json", action="store_true",
                   help="print one JSON object per question (id, question, system, hits with rank, id, article, "
                        "reference, path, score, snippet, highlights, matched_terms) instead of text")
    s.add_argument("--k", type=int, default=500, help="ranking depth of the --run file (default 500)")
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
        print(f"lexgraph {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"lexgraph {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The ``lexgraph`` command.

``lexgraph search --system bm25 --questions FILE.jsonl --run OUT.trec [--k 500]``
    batch mode: each line of FILE (lines end at ``\n`` only) is a JSON object with ``id``
    (a string or an integer, unique, without whitespace or control characters) and
    ``question`` (a non-empty string of valid Unicode text), each key once; writes a TREC
    run, ranked to depth ``--k`` as the ``evaluate`` stage writes its runs. ``--run`` must
    be a new file or an earlier run: never the questions file, a directory, a file that is
    not a TREC run, a read-only file or one with several hard links, a path under the
    workspace's ``data/`` or ``models/``, or a path DVC owns (its cache, a ``.dvc``
    directory, an output of ``dvc.yaml``, ``dvc.lock`` or a ``*.dvc`` file:
    :mod:`lexgraph.core.tracked`). A symbolic link is written through, the link kept, and a
    rewritten run keeps its mode (:mod:`lexgraph.core.io`). A question that no article matches (BM25: none of its terms
    is in the corpus, or, in an index with an ``idf_floor`` of 0, each of them is in half of its articles or more)
    gets no ranking, with a warning naming its id and why.
``lexgraph search --system bm25 --questions FILE.jsonl --json [--top 10]``
    batch mode to stdout: one JSON object per question (with ``--run`` too: both).
``lexgraph search --system bm25 "Qui paie la réparation du mur mitoyen ?" [--json]``
    one question: prints the top articles, each with its rank, article number and
    reference, heading path, score and a snippet with the question's terms marked
    (:mod:`lexgraph.text.display`); ``--json``: one JSON object instead.
``lexgraph search --system bm25 [--json]``
    interactive: asks for questions until an empty line or end of input (``--json``: one
    JSON line per question, the prompt on stderr and only on a terminal).
``lexgraph systems``
    lists the retrieval systems of the registry (:mod:`lexgraph.systems.registry`): name, kind,
    the stage that builds it, what it is.
``lexgraph regress [--expected regression/sample.yaml]``
    checks that metrics/<system>.json reproduce the expected scores within tolerance, and ends
    with the line "N of M checks pass" (one check per system, split and metric).
``lexgraph export --system dsr [--workspace .] OUT``
    writes a dense system as a folder that sentence-transformers loads (the query encoder,
    ``article_vectors.safetensors``, a model card): :mod:`lexgraph.cli.export`.
``lexgraph index --corpus FILE --out DIR [--workspace .]``
    encodes a corpus of one's own with the workspace's trained models; ``lexgraph search --index DIR``
    then searches it with them (:mod:`lexgraph.cli.index`).
``lexgraph serve [--workspace .] [--host 127.0.0.1] [--port 8000]``
    the workspace's systems behind an HTTP API and a web page (:mod:`lexgraph.cli.serve`).
``lexgraph plots-offline [--workspace .]``
    makes ``dvc plots show`` work offline: writes an HTML template with Vega, Vega-Lite and
    Vega-Embed inlined (from the vl-convert-python wheel) and sets ``plots.html_template`` in
    ``.dvc/config.local`` (:mod:`lexgraph.cli.plots`).

Shown hits (text or ``--json``) are real results only (:func:`lexgraph.text.display.ranked_entries`):
with BM25 a question's hits stop at the last article that matches one of its terms, even
when ``--top`` asks for more, and a log line says how many match.

Systems are loaded from the artefacts ``dvc repro`` wrote in the workspace (``--workspace``),
after every argument has been checked. Errors a user can act on print one line,
``lexgraph <command>: error: ...``, and exit with status 2; ``regress`` exits with 1 when
a metric is out of tolerance. A path the file system refuses (a name over 255 bytes, a path
over ``PATH_MAX``), a closed stdin or stdout and stdout on a full disk are one such line too;
characters the output encoding lacks are written as ``\\uXXXX`` (:mod:`lexgraph.cli.streams`).
When the reader of stdout goes away (``--json | head -1``) the command stops quietly with
status 141 (128 + SIGPIPE, as a shell reports for a Unix tool that SIGPIPE ended).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from lexgraph.cli.commands import add_command, device_option, workspace_option
from lexgraph.cli.export import add_export
from lexgraph.cli.files import check_run_path, read_questions_jsonl
from lexgraph.cli.index import add_index, add_index_option
from lexgraph.cli.mteb import add_mteb
from lexgraph.cli.plots import add_plots_offline
from lexgraph.cli.serve import add_serve
from lexgraph.cli.streams import guard_streams, utf8_argument

# only light modules here (no torch, transformers or polars: `lexgraph --help` answers at once);
# a command imports the systems and tables it needs when it runs
from lexgraph.core import layout
from lexgraph.core.errors import LexgraphError, reported
from lexgraph.core.inputs import require_directory, shown_path, text_problem

log = logging.getLogger("lexgraph")


def _no_match_reason(retriever, question: str) -> str:
    """Why ``retriever`` has no results for ``question``: BM25 says when the articles hold its terms
    but all have idf 0 (:meth:`lexgraph.search.bm25.BM25.no_match_reason`); else no term of it matches."""
    from lexgraph.search.bm25 import BM25
    from lexgraph.text.display import NO_MATCH

    return (retriever.no_match_reason(question) if isinstance(retriever, BM25) else None) or NO_MATCH


def _show_results(display, question: str, ids, scores, args, qid: str | None = None, out=None, retriever=None) -> None:
    """Write one question's results to stdout: text for a person, or one JSON line (``--json``); a
    question without results says why (:func:`_no_match_reason`)."""
    from lexgraph.text.display import render_json, render_text, use_ansi

    out = out or sys.stdout
    hits = display.hits(question, ids, scores)
    if args.json:
        out.write(render_json(question, hits, qid=qid, system=args.system) + "\n")
    else:
        why = _no_match_reason(retriever, question) if not hits else ""
        out.write(render_text(question, hits, style="ansi" if use_ansi(out) else "plain", why=why))
    out.flush()


#: what a lexgraph workspace holds, one of at least: the pipeline's files, or the clean articles
#: that every system ranks (a workspace that `dvc repro` filled and that was copied without them)
WORKSPACE_MARKERS: tuple[str, ...] = ("dvc.yaml", "params.yaml", str(layout.CLEAN.path))


def _check_workspace(workspace: Path) -> None:
    """Refuse a ``--workspace`` that is no lexgraph workspace (none of :data:`WORKSPACE_MARKERS`
    there), naming the directory and ``--workspace``: not a missing artefact of some stage."""
    require_directory(
        workspace,
        label="--workspace",
        expected="a lexgraph workspace, the directory with dvc.yaml and params.yaml",
    )
    if not any((workspace / marker).exists() for marker in WORKSPACE_MARKERS):
        raise LexgraphError(
            f"--workspace {shown_path(workspace)} ({shown_path(workspace.resolve())}) is not a lexgraph workspace: "
            f"none of {', '.join(WORKSPACE_MARKERS)} there; expected the project's directory, where `dvc repro` "
            "writes data/ and models/ (run lexgraph there, or pass --workspace DIR; in a fresh clone run "
            "`dvc repro` first)"
        )


def _check_depth(name: str, value: int) -> None:
    if value < 1:
        raise LexgraphError(f"{name} must be ≥ 1 (got {value}); expected the number of articles to return")


def _show_many(retriever, display, questions, qids, top, scores, args, source: str) -> None:
    """Show each question's hits, up to ``--top`` and only real ones (:func:`lexgraph.serve.searcher.real_results`): a
    question that fewer articles match stops at the last one that does, and a log line
    says so (with ``--top`` beyond what the question matches, BM25 would otherwise fill it
    with articles scoring 0, in article-id order)."""
    from lexgraph.serve.searcher import real_results

    real = real_results(retriever, top[:, : args.top], scores[:, : args.top])  # (n, top)
    short = []
    for i, question in enumerate(questions):
        keep = real[i]
        if keep.any() and not keep.all():
            short.append((qids[i] if qids is not None else None, int(keep.sum())))
        _show_results(
            display,
            question,
            top[i, : args.top][keep],
            scores[i, : args.top][keep],
            args,
            qid=qids[i] if qids is not None else None,
            retriever=retriever,
        )
    from lexgraph.search.bm25 import BM25

    # why a question has fewer hits than --top: BM25's articles without its terms, or the law of a date
    terms = isinstance(retriever, BM25)
    why, note = ("match any term of", "; the others score 0") if terms else ("in force answer", "")
    if short and qids is None:
        log.info(
            "only %d article(s) %s the question%s; shown: those, not --top %d",
            short[0][1],
            why,
            " (the others score 0)" if terms else "",
            args.top,
        )
    elif short:
        log.info(
            "fewer than --top %d articles %s %d question(s) of %s (ids: %s%s%s); their hits stop at the last one",
            args.top,
            why,
            len(short),
            source,
            ", ".join(str(q) for q, _ in short[:10]),
            ", …" if len(short) > 10 else "",
            note,
        )


def _warn_unmatched(retriever, questions, qids, matched, args) -> None:
    """A warning per reason (:func:`_no_match_reason`) naming the questions of ``--questions`` without results."""
    by_reason: dict[str, list[str]] = {}
    for qid, question, ok in zip(qids, questions, matched):
        if not ok:
            by_reason.setdefault(_no_match_reason(retriever, question), []).append(qid)
    for reason, unmatched in by_reason.items():
        log.warning(
            "no results for %d question(s) of %s (ids: %s%s): %s%s",
            len(unmatched),
            args.questions,
            ", ".join(unmatched[:10]),
            ", …" if len(unmatched) > 10 else "",
            reason,
            "; the run has nothing for them" if args.run else "",
        )


def _question_argument(question: str) -> None:
    if not question.strip():
        raise LexgraphError(
            "the question argument is empty; expected a non-empty question (or none, for interactive mode)"
        )
    problem = text_problem(question)
    if problem:
        raise LexgraphError(
            f"the question argument {problem} (bytes that are not UTF-8?); expected a question in valid UTF-8 text"
        )


def _read_interactive(args, prompt: str, lineno: int) -> str | None:
    """The next question typed on standard input (stripped), or None at its end. On a
    terminal in text mode, ``input`` (line editing); elsewhere one line of the binary stream,
    decoded here so that an error names its own line (a text stream decodes ahead)."""
    try:
        if sys.stdin.isatty() and not args.json:
            question = input(prompt)
        else:
            out = sys.stdout if not args.json else sys.stderr if sys.stdin.isatty() and sys.stderr.isatty() else None
            if out is not None:  # with --json, stdout carries only JSON lines: the prompt goes to a terminal's stderr
                out.write(prompt.lstrip("\n") if args.json else prompt)
                out.flush()
            stream = getattr(sys.stdin, "buffer", None)
            line = sys.stdin.readline() if stream is None else stream.readline().decode("utf-8")
            if not line:
                return None
            question = line
    except EOFError:
        return None
    except UnicodeDecodeError as exc:
        raise LexgraphError(
            f"standard input, line {lineno}: not valid UTF-8 ({exc.reason}); expected one "
            "question per line in UTF-8 text"
        ) from None
    problem = text_problem(question)
    if problem:
        raise LexgraphError(
            f"standard input, line {lineno}: the question {problem}; expected one question per line in UTF-8 text"
        )
    return question.strip()


def _check_search_arguments(args, workspace: Path) -> tuple[Path, str | None]:
    """Check ``lexgraph search``'s arguments; return where the searched corpus lies (the workspace,
    or the ``--index`` directory) and its snapshot date (None: none)."""
    if args.questions and args.question is not None:
        raise LexgraphError("give either --questions FILE or a question, not both")
    if args.questions and not (args.run or args.json):
        raise LexgraphError("--questions needs --run OUT.trec, --json or both")
    if args.run and not args.questions:
        raise LexgraphError("--run is for batch mode; give --questions FILE.jsonl too")
    if args.question is not None:
        args.question = utf8_argument(args.question)
        _question_argument(args.question)
    _check_depth("--k", args.k)
    _check_depth("--top", args.top)
    _check_workspace(workspace)
    if args.index is None:
        return workspace, None
    from lexgraph.systems.index_record import read_index

    require_directory(Path(args.index), label="--index", expected="a directory written by `lexgraph index`")
    return Path(args.index), read_index(args.index).snapshot


def cmd_search(args) -> int:
    from lexgraph.core.config import resolve_device
    from lexgraph.data.keys import KEYS_FILE
    from lexgraph.data.versions import read_versions
    from lexgraph.evaluation.trec import write_trec
    from lexgraph.serve.searcher import Corpus, corpus_search, index_config, make_display, real_results
    from lexgraph.systems.registry import load_retriever

    workspace = Path(args.workspace)
    root, snapshot = _check_search_arguments(args, workspace)  # all before loading a system (seconds to minutes)
    versions = read_versions(root / layout.CLEAN.path / KEYS_FILE, snapshot)  # the date, before loading
    problem = versions.check_date(args.as_of, "--as-of") if versions is not None and args.as_of else None
    if problem or (args.as_of is not None and versions is None):
        raise LexgraphError(
            problem
            or f"--as-of: {shown_path(root)} holds no versions of articles (its corpus has no dates); "
            "expected an index of a corpus with valid_from/valid_to"
        )
    ids = questions = None
    if args.questions:
        if args.run:
            check_run_path(args.run, args.questions, workspace)
        ids, questions = read_questions_jsonl(Path(args.questions))
    device = str(resolve_device(args.device, where="--device"))
    retriever = load_retriever(args.system, workspace, device, index=index_config(workspace), corpus=args.index)
    corpus = Corpus.read(root, snapshot)
    in_force = corpus.in_force
    shown = args.json or not args.questions
    display = make_display(retriever, corpus.articles, corpus.keys, corpus.versions) if shown else None

    def search(batch: list[str], k: int):
        return corpus_search(retriever, in_force, batch, k, args.as_of)

    if args.questions:
        top, scores = search(questions, max(args.k if args.run else 1, args.top if args.json else 1))
        matched = real_results(retriever, top, scores).any(axis=1)  # (n,)
        _warn_unmatched(retriever, questions, ids, matched, args)
        if args.run:  # ranked to depth --k, as the evaluate stage writes its runs
            write_trec(
                args.run,
                [q for q, ok in zip(ids, matched) if ok],
                top[matched, : args.k],
                scores[matched, : args.k],
                args.system,
                docids=corpus.keys.articles if corpus.keys is not None else None,
            )
            log.info("wrote %d rankings of depth %d to %s", int(matched.sum()), args.k, args.run)
        if args.json:
            _show_many(retriever, display, questions, ids, top, scores, args, args.questions)
        return 0
    if args.question is not None:
        top, scores = search([args.question], args.top)
        _show_many(retriever, display, [args.question], None, top, scores, args, "the command line")
        return 0
    prompt = "\nquestion (empty line to quit)> "
    lineno = 0
    while True:  # interactive
        lineno += 1
        question = _read_interactive(args, prompt, lineno)
        if not question:
            return 0
        top, scores = search([question], args.top)
        _show_many(retriever, display, [question], None, top, scores, args, "standard input")


def cmd_regress(args) -> int:
    from lexgraph.core.io import write_text
    from lexgraph.evaluation.regression import expected_from_metrics, run_checks

    require_directory(
        args.metrics_dir, label="--metrics-dir", expected="the directory of <system>.json that `dvc repro` writes"
    )
    if args.update:
        from lexgraph.core.tracked import dvc_owner

        owner = dvc_owner(args.expected)
        if owner:
            raise LexgraphError(
                f"--expected {args.expected} {owner}; refusing to rewrite it, expected the "
                "expected-scores file you keep in git (like regression/sample.yaml)"
            )
        write_text(expected_from_metrics(args.metrics_dir, args.expected), args.expected)
        log.info("wrote %s from %s/ (review the diff before committing)", args.expected, args.metrics_dir)
        return 0
    outcome = run_checks(args.metrics_dir, args.expected)
    for line in outcome.failures:
        print(f"REGRESSION {line}", file=sys.stderr)
    sys.stderr.flush()  # the count comes last, also where stderr and stdout share a terminal
    if not outcome.failures:
        print(f"all metrics in {args.expected} reproduce")
    print(outcome.summary())
    return 1 if outcome.failures else 0


def cmd_systems(args: argparse.Namespace) -> int:
    """Print the registry: one line per system (name, kind, building stage, summary)."""
    from lexgraph.methods.catalog import systems

    rows = [(name, spec.kind, spec.stage, spec.summary) for name, spec in systems().items()]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3])
    return 0


def add_systems(sub) -> None:
    """The ``systems`` subcommand (``sub``: the subparsers)."""
    add_command(
        sub,
        "systems",
        cmd_systems,
        "list the retrieval systems: name, kind, the stage that builds it, what it is",
        "List the systems of the registry (lexgraph's own and those other installed packages "
        "declare under the lexgraph.systems entry points), in the order every listing uses.",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``lexgraph`` parser; every option has a help string, which shows its default."""
    parser = argparse.ArgumentParser(
        prog="lexgraph",
        description="Statutory article retrieval on BSARD with the systems that `dvc repro` builds "
        "(`lexgraph systems` lists them).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_systems(sub)
    s = add_command(
        sub,
        "search",
        cmd_search,
        "retrieve articles for questions with a trained system",
        "Retrieve articles for one question, a JSON-lines file of questions (batch "
        "mode) or questions typed one per line (interactive mode).",
    )
    s.add_argument(
        "question", nargs="?", help="one question (interactive mode when neither it nor --questions is given)"
    )
    s.add_argument(
        "--system",
        default="bm25",
        metavar="SYSTEM",
        help="the retrieval system, a name `lexgraph systems` lists (default: %(default)s)",
    )
    s.add_argument(
        "--questions", metavar="FILE.jsonl", help="JSON-lines file, one {'id', 'question'} per line (batch mode)"
    )
    s.add_argument("--run", metavar="OUT.trec", help="output TREC run file (batch mode)")
    s.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object per question (id, question, system, hits with rank, id, article, "
        "reference, path, score, snippet, highlights, matched_terms) instead of text",
    )
    s.add_argument("--k", type=int, default=500, help="ranking depth of the --run file (default: %(default)s)")
    s.add_argument("--top", type=int, default=10, help="articles shown per question (default: %(default)s)")
    workspace_option(
        s,
        "the lexgraph workspace: the directory with dvc.yaml and params.yaml where `dvc repro` wrote models/ and data/",
    )
    add_index_option(s)
    s.add_argument(
        "--as-of",
        metavar="DATE",
        help="search the law as in force on DATE (YYYY-MM-DD) in an --index of versions (default: today's)",
    )
    device_option(s, "auto", "where the dense systems run: auto (cuda when available, else cpu), cpu, cuda or cuda:N")
    r = add_command(
        sub,
        "regress",
        cmd_regress,
        "compare metrics/<system>.json with expected scores",
        "Check that metrics/<system>.json reproduce the expected scores within tolerance.",
    )
    r.add_argument(
        "--expected",
        default="regression/sample.yaml",
        metavar="FILE.yaml",
        help="the expected scores and tolerances, per system and split (default: %(default)s)",
    )
    r.add_argument(
        "--metrics-dir",
        default="metrics",
        metavar="DIR",
        help="the directory of <system>.json that `dvc repro evaluate` writes (default: %(default)s)",
    )
    r.add_argument(
        "--update",
        action="store_true",
        help="rewrite the expected file from the current metrics (keeps its comments and tolerances)",
    )
    add_plots_offline(sub)
    add_export(sub)
    add_mteb(sub)
    add_index(sub)
    add_serve(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from lexgraph.core.stage import setup_logging

    streams = sys.stdin, sys.stdout
    guard_streams()
    try:
        args = build_parser().parse_args(argv)
        setup_logging("INFO")
        try:
            status = reported(args.command, lambda: args.func(args))
        except BrokenPipeError:
            return _stdout_closed()
        if getattr(sys.stdout, "failed", False):
            _stdout_closed()  # what is still buffered for the failed stdout is dropped, not flushed at exit
        return status
    finally:
        sys.stdin, sys.stdout = streams


#: exit status when the reader of stdout goes away: 128 + SIGPIPE (13), what a shell reports
#: for a Unix tool that SIGPIPE ended (`yes | head -1` under `set -o pipefail`)
EXIT_BROKEN_PIPE = 141


def _stdout_closed() -> int:
    """Stop quietly when the reader of stdout went away (``lexgraph search --json | head -1``):
    no message, no traceback, as Unix tools do. Python's recipe (``signal`` docs, "Note on
    SIGPIPE"): point stdout at /dev/null so that the interpreter's last flush of what is still
    buffered does not fail again, then exit with :data:`EXIT_BROKEN_PIPE`."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout is no file (replaced, closed)
        pass
    return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())

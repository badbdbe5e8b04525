"""``lexgraph index --corpus FILE --out DIR [--workspace .] [--systems S ...]``: a corpus of one's
own encoded with a trained workspace's models, for ``lexgraph search --index DIR``.

The command only parses and checks its arguments; :func:`lexgraph.systems.corpus_index.index_corpus`
writes the index (see there for what ``DIR`` holds).
"""

from __future__ import annotations

import logging
from pathlib import Path

from lexgraph.cli.commands import add_command, device_option, workspace_option
from lexgraph.core.errors import LexgraphError
from lexgraph.models.precision import PRECISIONS

log = logging.getLogger("lexgraph")


def cmd_index(args) -> int:
    from lexgraph.cli.main import _check_workspace
    from lexgraph.core.inputs import shown_path
    from lexgraph.systems.corpus_index import check_out

    workspace = Path(args.workspace)
    if args.block < 1:
        raise LexgraphError(f"--block must be ≥ 1 (got {args.block}); expected the articles encoded per block")
    if args.snapshot is not None:
        from lexgraph.data.versions import date_problem

        problem = date_problem(args.snapshot)
        if problem:
            raise LexgraphError(f"--snapshot {problem}; expected the date YYYY-MM-DD the corpus's law is in force on")
    _check_workspace(workspace)
    check_out(Path(args.out), workspace)
    log.info(
        "index: indexing %s into %s with the models of %s (%s); torch and the models load first",
        shown_path(args.corpus),
        shown_path(args.out),
        shown_path(workspace.resolve()),
        ", ".join(args.systems) if args.systems else "every system it has built",
    )  # the first line, at once: what follows (torch, the workspace's checks, encoding) takes minutes
    from lexgraph.core.config import resolve_device
    from lexgraph.systems.corpus_index import index_corpus

    device = str(resolve_device(args.device, where="--device"))
    record = index_corpus(
        args.corpus, args.out, workspace, args.systems, device, args.block, args.snapshot, args.precision
    )
    print(f"indexed {record['articles']} articles of {args.corpus} to {args.out}: {', '.join(record['systems'])}")
    return 0


def add_index(sub) -> None:
    """The ``index`` subcommand of ``lexgraph`` (``sub``: its subparsers)."""
    p = add_command(
        sub,
        "index",
        cmd_index,
        "encode a corpus of your own with a trained workspace, for `lexgraph search --index`",
        "Read a corpus file (JSON lines, CSV or Parquet: id, text, path), clean it with the workspace's "
        "settings and encode it with the workspace's trained models for every system (or --systems), into DIR. "
        "No questions, no training; an interrupted run resumes from its finished blocks.",
    )
    p.add_argument(
        "--corpus", required=True, metavar="FILE", help="the corpus file (.jsonl, .jsonl.gz, .csv, .parquet)"
    )
    p.add_argument("--out", required=True, metavar="DIR", help="the index to write (new, or an earlier index)")
    workspace_option(p, "the trained lexgraph workspace whose models encode the corpus")
    p.add_argument(
        "--systems", nargs="+", metavar="SYSTEM", help="the systems to index (default: every one the workspace has)"
    )
    p.add_argument(
        "--block",
        type=int,
        default=2000,
        help="articles encoded per resumable block (default: %(default)s)",
    )
    p.add_argument(
        "--snapshot",
        metavar="DATE",
        help="the date (YYYY-MM-DD) the corpus's law is in force on, for a file of one state: `search --as-of` "
        "an earlier date is then refused (records' own valid_from/valid_to date each version instead)",
    )
    device_option(p, "auto", "where to encode: auto, cpu, cuda or cuda:N")
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="the chunk encoder's number format on the CPU: fp32; bf16 (2.4x faster on a CPU with AMX, one "
        "gold article fewer at rank 100 on the sample; docs/scale.md); auto: bf16 when the CPU has amx_bf16, "
        "else fp32; CUDA runs its own mixed precision (default: %(default)s)",
    )


def add_index_option(search) -> None:
    """``lexgraph search --index DIR`` (``search``: that subcommand's parser)."""
    search.add_argument(
        "--index",
        metavar="DIR",
        help="search the corpus indexed in DIR by `lexgraph index` (with the workspace's models) instead of "
        "the workspace's own",
    )

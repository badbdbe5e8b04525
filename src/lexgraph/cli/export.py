"""``lexgraph export --system S [--workspace W] OUT``: a dense system as a sentence-transformers folder.

The command only parses and checks its arguments; :func:`lexgraph.systems.export.export_system`
writes the folder (the query encoder, ``article_vectors.safetensors``, a model card).
"""

from __future__ import annotations

import logging
from pathlib import Path

from lexgraph.cli.commands import add_command, dense_system_option, device_option, workspace_option

log = logging.getLogger("lexgraph")


def cmd_export(args) -> int:
    from lexgraph.cli.main import _check_workspace
    from lexgraph.core.config import resolve_device
    from lexgraph.systems.export import check_out, check_system, export_system

    workspace = Path(args.workspace)
    check_system(args.system)  # every check before loading a system
    _check_workspace(workspace)
    check_out(args.out, workspace)
    device = str(resolve_device(args.device, where="--device"))
    out = export_system(args.system, workspace, args.out, device)
    print(f"exported {args.system} to {out}")
    return 0


def add_export(sub) -> None:
    """The ``export`` subcommand of ``lexgraph`` (``sub``: its subparsers)."""
    p = add_command(
        sub,
        "export",
        cmd_export,
        "write a dense system as a folder that sentence-transformers loads",
        "Write a dense system to OUT: its query encoder, its article encoder (lexgraph_st.py), its "
        "article vectors with their ids (article_vectors.safetensors) and a model card (README.md: metrics, exact "
        "params), a folder that sentence_transformers.SentenceTransformer(OUT, trust_remote_code=True) loads, "
        "ready to upload to the Hugging Face hub.",
    )
    p.add_argument("out", metavar="OUT", help="the folder to write (new, or an earlier export, which is replaced)")
    dense_system_option(p)
    workspace_option(p, "the lexgraph workspace where `dvc repro` wrote models/ and data/")
    device_option(p, "cpu", "where the article vectors are loaded: cpu, cuda or auto")

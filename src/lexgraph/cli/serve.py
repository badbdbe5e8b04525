"""``lexgraph serve [--workspace .] [--index DIR] [--host 127.0.0.1] [--port 8000]``: the workspace's
systems behind an HTTP API and a web page (:mod:`lexgraph.serve`), each loaded once.

What it loads and the bounds of requests are params.yaml's ``serve`` section; where it listens is
the command line (127.0.0.1 unless ``--host`` says otherwise). ``kill -HUP`` or
``POST /admin/reload`` loads the models again after ``dvc repro`` without dropping a request.
"""

from __future__ import annotations

import logging
from pathlib import Path

from lexgraph.cli.commands import add_command, device_option, workspace_option

log = logging.getLogger("lexgraph.serve")


def cmd_serve(args) -> int:
    from lexgraph.cli.main import _check_workspace
    from lexgraph.core.inputs import require_directory, shown_path
    from lexgraph.serve.settings import read_config
    from lexgraph.systems.index_record import read_index

    workspace = Path(args.workspace)
    _check_workspace(workspace)
    if not 0 <= args.port <= 65535:
        from lexgraph.core.errors import LexgraphError

        raise LexgraphError(f"--port {args.port}: expected a port in [0, 65535] (0: any free port)")
    if args.index is not None:
        require_directory(Path(args.index), label="--index", expected="a directory written by `lexgraph index`")
        read_index(args.index)
    systems = read_config(workspace).systems  # a bad serve section: one line, before anything loads
    log.info(
        "loading %d system(s) of serve.systems from %s%s: %s; the address follows once they are loaded",
        len(systems),
        shown_path(workspace.resolve()),
        f" over the index {shown_path(Path(args.index).resolve())}" if args.index is not None else "",
        ", ".join(systems),
    )  # the first line, at once: torch, the server and the models load after it
    from lexgraph.core.config import resolve_device
    from lexgraph.serve.server import serve

    device = str(resolve_device(args.device, where="--device"))
    return serve(workspace, args.host, args.port, device, Path(args.index) if args.index else None, args.access_log)


def add_serve(sub) -> None:
    """The ``serve`` subcommand of ``lexgraph`` (``sub``: its subparsers)."""
    p = add_command(
        sub,
        "serve",
        cmd_serve,
        "serve the workspace's systems over HTTP: a JSON API and a web page to search and inspect runs",
        "Load every system of params.yaml's serve.systems once and answer GET/POST /search, "
        "GET /articles/{id}, /systems, /health, and the web page at / (search) and /inspect (the runs of "
        "evaluate). SIGHUP or POST /admin/reload loads the models again after `dvc repro`.",
    )
    workspace_option(p, "the lexgraph workspace `dvc repro` filled")
    p.add_argument("--index", metavar="DIR", help="serve the corpus indexed in DIR by `lexgraph index` instead")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="the port, 0 for any free one (default: %(default)s)")
    device_option(p, "auto", "auto, cpu, cuda or cuda:N")
    p.add_argument("--access-log", action="store_true", help="log one line per request")

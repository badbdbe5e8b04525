"""`lexgraph serve` in the test's own process: a tiny workspace with runs to inspect, and the server
on a free port of 127.0.0.1 in a thread (the same uvicorn server `lexgraph serve` runs)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import polars as pl
import yaml

QUESTIONS = {  # id -> (question, gold article ids): the tiny workspace's test split
    101: ("le bail du contrat", [0, 1]),
    102: ("divorce et enfant", [2]),
    103: ("la loi du mariage", [3, 4, 5]),
}
SERVED = ["dsr", "bm25", "zeroshot"]


def set_serve(workspace: Path, **values) -> None:
    """Edit the ``serve`` section of the workspace's params.yaml (the admin token in the workspace's
    own ``admin-token`` unless ``admin_token_file`` is given: a test writes nothing in the user's home)."""
    values.setdefault("admin_token_file", str(workspace / "admin-token"))
    path = workspace / "params.yaml"
    params = yaml.safe_load(path.read_text(encoding="utf-8"))
    params["serve"].update(values)
    path.write_text(yaml.safe_dump(params, sort_keys=False, allow_unicode=True), encoding="utf-8")


def add_runs(workspace: Path, systems=SERVED, k: int = 20) -> None:
    """The test split's questions in data/clean and each system's run in data/runs, as evaluate writes them."""
    from lexgraph.evaluation.trec import write_trec
    from lexgraph.systems.registry import load_retriever

    ids = list(QUESTIONS)
    pl.DataFrame(
        {
            "id": ids,
            "question": [q for q, _ in QUESTIONS.values()],
            "article_ids": [g for _, g in QUESTIONS.values()],
            "split": ["test"] * len(ids),
        },
        schema={"id": pl.Int64, "question": pl.Utf8, "article_ids": pl.List(pl.Int64), "split": pl.Utf8},
    ).write_parquet(workspace / "data" / "clean" / "questions.parquet")
    for system in systems:
        top, scores = load_retriever(system, workspace, "cpu").search([q for q, _ in QUESTIONS.values()], k)
        write_trec(workspace / "data" / "runs" / system / "test.trec", ids, top, scores, system)


def served_workspace(root: Path, tiny_model_dir: Path, **settings) -> Path:
    """A tiny reproduced workspace at ``root`` serving :data:`SERVED` with the ``serve`` ``settings``
    given, and runs for the inspector."""
    from helpers_workspace import build_tiny_workspace

    build_tiny_workspace(root, tiny_model_dir)
    set_serve(root, systems=SERVED, **settings)
    add_runs(root)
    return root


class RunningServer:
    """``lexgraph serve`` on 127.0.0.1:<free port> in a thread; ``url``, ``server`` (the
    :class:`lexgraph.serve.app.Server`) and :meth:`stop`."""

    def __init__(self, workspace: Path, index: Path | None = None) -> None:
        from lexgraph.serve.app import Server
        from lexgraph.serve.server import bind, uvicorn_server

        self.server = Server(workspace, "cpu", index)
        self.server.prepare()
        sock = bind("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.uv = uvicorn_server(self.server, sock)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.uv.serve(sockets=[sock])), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.uv.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)

    @property
    def admin(self) -> dict[str, str]:
        """The headers of an admin request: the token of ``serve.admin_token_file``."""
        return {"authorization": f"Bearer {getattr(self.server.catalog, 'admin_token', None) or 'none'}"}

    def stop(self) -> None:
        self.uv.should_exit = True
        self.thread.join(timeout=30)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Loopback:
    """httpx's top-level ``get``, ``post``, ``delete`` and ``request`` for the test server on
    127.0.0.1: a fresh client, and so a fresh connection, per request, as theirs, but one TLS
    context made once and shared (httpx builds one per client, loading certifi's bundle: ~60 ms a
    request, for a context a request over http:// never uses)."""

    def __init__(self) -> None:
        import ssl

        self.tls = ssl.create_default_context()

    def request(self, method: str, url, **kwargs):
        import httpx

        return httpx.request(method, url, verify=self.tls, **kwargs)

    def get(self, url, **kwargs):
        return self.request("GET", url, **kwargs)

    def post(self, url, **kwargs):
        return self.request("POST", url, **kwargs)

    def delete(self, url, **kwargs):
        return self.request("DELETE", url, **kwargs)


#: :class:`Loopback`'s one instance, for the tests' requests to a :class:`RunningServer`
loopback = Loopback()

"""Run the server: load the catalogue, bind the socket, serve with uvicorn until SIGINT or SIGTERM.

SIGHUP reloads (as ``POST /admin/reload``). The socket is bound before uvicorn starts, so a port in
use is one line, and the address served (``--port 0`` picks a free port) is logged once it listens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from pathlib import Path

from lexgraph.core.errors import LexgraphError
from lexgraph.serve.app import Server, create_app
from lexgraph.serve.limits import BoundedH11Protocol

log = logging.getLogger("lexgraph.serve")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``, or one line naming ``--host``/``--port``."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        raise LexgraphError(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc})") from None
    sock.set_inheritable(True)
    return sock


def make_asgi(server: Server, header_timeout_s: float):
    """The app with its lifespan (the catalogue's batchers, SIGHUP) and the protocol class holding
    ``header_timeout_s``."""
    config = server.catalog_config

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await server.start(server.pending)
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread: no signals
            loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(_reload_quietly(server)))
        yield
        await server.stop()

    app = create_app(server, config)
    app.router.lifespan_context = lifespan
    protocol = type("Protocol", (BoundedH11Protocol,), {"header_timeout_s": header_timeout_s})
    return app, protocol


async def _reload_quietly(server: Server) -> None:
    with contextlib.suppress(LexgraphError):  # refused: logged by Server.reload, the old models serve on
        await server.reload()


def uvicorn_server(server: Server, sock: socket.socket, access_log: bool = False):
    """The uvicorn server of ``server`` on ``sock`` (``serve()`` it with ``sockets=[sock]``)."""
    import threading

    import uvicorn

    class Uvicorn(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            """uvicorn's SIGINT/SIGTERM handling (a graceful stop), without raising the signal again
            once stopped: `lexgraph serve` then ends with status 0, as a server stopped on purpose."""
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    app, protocol = make_asgi(server, server.catalog_config.header_timeout_s)
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol,
        lifespan="on",
        access_log=access_log,
        log_config=None,
        timeout_keep_alive=5,
        h11_max_incomplete_event_size=server.catalog_config.max_head_bytes,
        timeout_graceful_shutdown=10,
    )
    return Uvicorn(config)


def serve(workspace: Path, host: str, port: int, device: str, index: Path | None = None, access_log: bool = False):
    """Load, bind and serve until stopped (the ``lexgraph serve`` command)."""
    server = Server(workspace, device, index, settle=True)
    server.prepare()  # every system loaded once, before the port opens: a bad artefact is one line
    sock = bind(host, port)
    uv = uvicorn_server(server, sock, access_log)

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(uv.serve(sockets=[sock]))
        while not uv.started and not task.done():
            await asyncio.sleep(0.05)
        if uv.started:
            bound_host, bound_port = sock.getsockname()[:2]
            log.info(
                "serving %s on http://%s:%d/ (the API and its docs: /docs)",
                ", ".join(server.pending.searchers),
                bound_host,
                bound_port,
            )
        await task
        log.info("stopped")

    asyncio.run(main())
    return 0

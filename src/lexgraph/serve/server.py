"""Run the server: load the catalogue, bind the socket, serve with uvicorn until SIGINT or SIGTERM.

SIGHUP reloads (as ``POST /admin/reload``); SIGTERM or SIGINT during a reload abandons it with one log
line and stops cleanly. The socket is bound before uvicorn starts, so a port in use is one line, and
the address served (``--port 0`` picks a free port) is logged once it listens. The soft limit of
open files is raised to the hard one, and the event loop's own errors (``accept()`` out of file
descriptors) are one log line per interval (:func:`lexgraph.serve.security.quiet_loop_errors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from pathlib import Path

from lexgraph.core.errors import LexgraphError
from lexgraph.serve.app import Server, create_app, guarded
from lexgraph.serve.limits import BoundedH11Protocol
from lexgraph.serve.security import quiet_loop_errors, token_path

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


def make_asgi(server: Server, header_timeout_s: float, write_timeout_s: float = 10.0):
    """The app with its lifespan (the catalogue's batchers, SIGHUP, the event loop's error handler)
    behind its guard (lexgraph.serve.app.guarded), and the protocol class holding the timeouts."""
    config = server.catalog_config

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await server.start(server.pending)
        loop = asyncio.get_running_loop()
        quiet_loop_errors(loop)
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread: no signals
            loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(_reload_quietly(server)))
        yield
        await server.stop()

    app = create_app(server, config)
    app.router.lifespan_context = lifespan
    timeouts = {"header_timeout_s": header_timeout_s, "write_timeout_s": write_timeout_s}
    protocol = type("Protocol", (BoundedH11Protocol,), timeouts)
    return guarded(app, server), protocol


def raise_open_files_limit() -> None:
    """The soft limit of open files raised to the hard one (each connection is a descriptor)."""
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


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

        async def shutdown(self, sockets=None) -> None:
            server.begin_stop()  # a reload under way is abandoned now, not after the graceful wait
            await super().shutdown(sockets)

    if access_log:  # its lines are INFO; other libraries log at WARNING (lexgraph.core.stage.setup_logging)
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)
    settings = server.catalog_config
    app, protocol = make_asgi(server, settings.header_timeout_s, settings.write_timeout_s)
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol,
        lifespan="on",
        access_log=access_log,
        log_config=None,
        timeout_keep_alive=settings.idle_timeout_s,
        h11_max_incomplete_event_size=settings.max_head_bytes,
        timeout_graceful_shutdown=10,
    )
    return Uvicorn(config)


def serve(workspace: Path, host: str, port: int, device: str, index: Path | None = None, access_log: bool = False):
    """Load, bind and serve until stopped (the ``lexgraph serve`` command)."""
    raise_open_files_limit()
    server = Server(workspace, device, index, settle=True, host=host)
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
                ", ".join(server.catalog.searchers),
                bound_host,
                bound_port,
            )
            token = token_path(workspace, server.catalog_config.admin_token_file)
            log.info("admin actions need the token in %s (Authorization: Bearer <token>)", token)
        await task
        log.info("stopped")

    asyncio.run(main())
    return 0

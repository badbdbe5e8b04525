"""The ASGI application: the JSON API, the web pages, and the reload that swaps catalogues.

:class:`Server` holds the catalogue being served (:mod:`lexgraph.serve.catalog`) and replaces it
whole on :meth:`Server.reload` (``POST /admin/reload`` or SIGHUP): the new one is loaded on a
thread of its own while the old one answers, then swapped in at once; requests already holding the
old one finish on it, and its models are then let go and their memory returned to the system
(:func:`collect`, :func:`trim_heap`). Reloads run one at a time, one more may wait, and a later request joins
the waiting one. A catalogue that fails to load (a damaged or stale artefact) is refused with one
log line and the old one goes on serving; a reload under way when the server stops is abandoned
with one log line. :func:`create_app` builds the FastAPI app with every error as
``{"error": "<one line>"}`` and the right 4xx (:mod:`lexgraph.serve.limits`), and :func:`guarded`
puts :class:`lexgraph.serve.security.Guard` in front of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from lexgraph.core.errors import LexgraphError
from lexgraph.serve.catalog import Catalog, LoadStopped, load_catalog
from lexgraph.serve.limits import ApiError, RequestLimits, error_json
from lexgraph.serve.settings import ServeConfig, read_config

log = logging.getLogger("lexgraph.serve")


def settle_heap() -> None:
    """Collect once, then keep every object alive now out of the garbage collector's passes
    (:func:`gc.freeze`). A loaded catalogue is hundreds of thousands of long-lived objects (models,
    corpus, displays) that each full collection would walk again: under BM25 load one came every
    2 s or so and held the GIL for 270 ms (the p99 latency), 20 ms once they are frozen
    (benchmarks/serve.py). What an earlier call froze is unfrozen first, so that a catalogue
    retired by a reload is collected."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


MALLOC_TRIM = _malloc_trim()


def collect(settle: bool) -> None:
    """After a retired catalogue is let go: collect it (and freeze what lives on, with ``settle``)."""
    if settle:
        settle_heap()
    else:
        gc.collect()


def trim_heap() -> None:
    """Hand the free pages of the C heap back to the system (``malloc_trim``, where glibc has it; a
    foreign call, so the event loop runs on meanwhile): the models' tensors were allocated on the
    load thread, whose heap arena glibc otherwise keeps, so each reload added most of a catalogue
    to the RSS (docs/serve.md, "Memory and start-up")."""
    if MALLOC_TRIM is not None:
        MALLOC_TRIM(0)


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class Server:
    """The catalogue being served and how it is replaced (see the module docstring)."""

    def __init__(
        self,
        workspace: Path,
        device: str,
        index: Path | None = None,
        settle: bool = False,
        host: str | None = "127.0.0.1",
    ) -> None:
        self.workspace, self.device, self.index = workspace, device, index
        self.host = host  # the address of --host: a Host header may always name it
        self.settle = settle  # settle_heap() once a catalogue is loaded (the process is the server's own)
        self.search_executor = ThreadPoolExecutor(1, thread_name_prefix="lexgraph-search")
        self.load_executor = ThreadPoolExecutor(1, thread_name_prefix="lexgraph-load")
        self.catalog: Catalog | None = None
        self.pending: Catalog | None = None  # loaded by prepare(), started with the event loop
        self.reloads = 0  # reloads refused or done (a test waits on it)
        self.stopping = False
        self._stop: asyncio.Event | None = None
        self._running: asyncio.Task | None = None  # the reload under way
        self._waiting: asyncio.Task | None = None  # the one reload that waits for it (later requests join it)
        self._retired: set[asyncio.Task] = set()
        self._hosts: tuple[int, frozenset[str]] | None = None

    def load(self, generation: int) -> Catalog:
        """A new catalogue from the workspace as it is now (params.yaml's ``serve`` section included)."""
        config = read_config(self.workspace)
        try:
            return load_catalog(
                self.workspace, config, self.device, generation, self.index, stopping=lambda: self.stopping
            )
        except (LexgraphError, LoadStopped):
            raise
        except Exception as exc:  # a damaged artefact: whatever its reader raised, as one line
            raise LexgraphError(
                f"could not load the workspace's models: {type(exc).__name__}: {one_line(exc)}"
            ) from exc

    def prepare(self) -> None:
        """Load the first catalogue (generation 0), before the event loop starts."""
        self.pending = self.load(0)
        if self.settle:
            settle_heap()

    @property
    def catalog_config(self) -> ServeConfig:
        return (self.catalog or self.pending).config

    def allowed_hosts(self) -> frozenset[str]:
        """The names a request's Host may give: ``serve.allowed_hosts`` of the catalogue served, and --host's."""
        from lexgraph.serve.security import allowed_host_names

        catalog = self.catalog or self.pending
        if self._hosts is None or self._hosts[0] != id(catalog.config):
            self._hosts = (id(catalog.config), allowed_host_names(catalog.config.allowed_hosts, self.host))
        return self._hosts[1]

    async def start(self, catalog: Catalog) -> None:
        self._stop = asyncio.Event()
        catalog.start(self.search_executor)
        self.catalog, self.pending = catalog, None

    async def reload(self) -> Catalog:
        """Load a new catalogue and swap it in; raises :class:`LexgraphError` (the old one serving on).
        One reload runs at a time; while one runs, the first call queues one more and later calls
        join that one (they get its catalogue, or its refusal)."""
        if self.stopping:
            raise LexgraphError("the server is stopping; no reload")
        if self._waiting is None:
            self._waiting = asyncio.get_running_loop().create_task(self._reload_after(self._running))
            self._waiting.add_done_callback(_retrieved)
        return await asyncio.shield(self._waiting)

    async def _reload_after(self, previous: asyncio.Task | None) -> Catalog:
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        self._running, self._waiting = asyncio.current_task(), None  # the next call queues a new one
        try:
            return await self._reload()
        finally:
            self._running = None

    async def _reload(self) -> Catalog:
        old = self.catalog
        loop = asyncio.get_running_loop()
        loading = loop.run_in_executor(self.load_executor, self.load, old.generation + 1)
        stop = loop.create_task(self._stop.wait())
        await asyncio.wait({loading, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not loading.done() or isinstance(loading.exception(), LoadStopped):
            loading.add_done_callback(_retrieved)  # the load thread stops at its next system
            self.reloads += 1
            log.warning("reload abandoned: the server is stopping (generation %d was serving)", old.generation)
            raise LexgraphError("the server is stopping; the reload is abandoned")
        try:
            new = loading.result()
        except LexgraphError as exc:
            self.reloads += 1
            log.error("reload refused, generation %d serving on: %s", old.generation, one_line(exc))
            raise
        new.start(self.search_executor)
        self.catalog = new
        self.reloads += 1
        task = loop.create_task(self._retire(old))
        self._retired.add(task)
        task.add_done_callback(self._retired.discard)
        log.info("reloaded: generation %d serves %s", new.generation, ", ".join(new.searchers))
        return new

    async def _retire(self, old: Catalog) -> None:
        await old.close()  # once its last request is answered
        old.release()
        del old
        await asyncio.sleep(0)  # let the tasks that held it finish
        collect(self.settle)  # the old catalogue's objects collected (the new one's frozen)
        with contextlib.suppress(RuntimeError):  # the executor is shut down: the server stops anyway
            await asyncio.get_running_loop().run_in_executor(self.load_executor, trim_heap)

    def begin_stop(self) -> None:
        """The server is stopping (SIGTERM, SIGINT): a reload under way or waiting is abandoned, and
        the load thread stops at its next system."""
        self.stopping = True
        if self._stop is not None:
            self._stop.set()

    async def stop(self) -> None:
        self.begin_stop()
        for task in (self._waiting, self._running):
            if task is not None:
                await asyncio.gather(task, return_exceptions=True)
        if self.catalog is not None:
            await self.catalog.close()
        self.search_executor.shutdown(wait=False, cancel_futures=True)
        self.load_executor.shutdown(wait=False, cancel_futures=True)


def _retrieved(future) -> None:
    """Mark a future's exception as seen (its callers got it, or there were none to tell)."""
    if not future.cancelled():
        future.exception()


def _error(request: Request, status: int, message: str):
    """The error response: a page for the web page's paths, one line of JSON everywhere else."""
    from lexgraph.serve.pages import error_page, is_page

    message = " ".join(str(message).split())
    if is_page(request.url.path) and request.method == "GET":
        return error_page(request, status, message)
    close = {"connection": "close"} if status in (408, 413) else None  # a body left unread: end the connection
    return JSONResponse(status_code=status, content={"error": message}, headers=close)


def _validation_message(exc: RequestValidationError) -> str:
    first = exc.errors()[0]
    kind, *where = [str(part) for part in first.get("loc", ("request",))]
    return f"{kind} parameter '{'.'.join(where)}': {first.get('msg', 'invalid')}"


def _offline_docs(app: FastAPI) -> str:
    """FastAPI's interactive API page at ``/docs``, its Swagger UI served from the swagger-ui-bundle
    wheel (FastAPI's own page loads it from a CDN: blank offline); returns the page's HTML (its
    inline script is allowed by hash in its Content-Security-Policy)."""
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.staticfiles import StaticFiles
    from swagger_ui_bundle import swagger_ui_path

    app.mount("/static/swagger", StaticFiles(directory=str(swagger_ui_path)), name="swagger")

    def page():
        return get_swagger_ui_html(
            openapi_url=app.openapi_url,
            title="lexgraph API",
            swagger_js_url="/static/swagger/swagger-ui-bundle.js",
            swagger_css_url="/static/swagger/swagger-ui.css",
            swagger_favicon_url="data:,",
        )

    @app.get("/docs", include_in_schema=False)
    async def docs():
        return page()

    return page().body.decode("utf-8")


def create_app(server: Server, config: ServeConfig) -> FastAPI:
    """The FastAPI app over ``server`` (``config``: the bounds applied below the routes)."""
    from lexgraph.serve.api import router as api_router
    from lexgraph.serve.pages import router as pages_router

    app = FastAPI(
        title="lexgraph",
        summary="Statutory article retrieval: search statutes with the systems `dvc repro` built.",
        docs_url=None,
        redoc_url=None,
    )
    # the swagger-ui-bundle wheel's Swagger UI (4.15) reads OpenAPI 3.0 only: FastAPI's 3.1 label made
    # /docs say "Unable to render this definition" (the description uses nothing of 3.1 that 4.15 misreads)
    app.openapi_version = "3.0.3"
    app.state.server = server
    app.state.docs_html = _offline_docs(app)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return _error(request, exc.status, exc.message)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        message = exc.detail if isinstance(exc.detail, str) else "request refused"
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such path: {request.url.path}"
        return _error(request, exc.status_code, message)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return _error(request, 400, _validation_message(exc))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):  # a fault of the server's: one line of JSON
        return JSONResponse(status_code=500, content={"error": f"internal error ({type(exc).__name__})"})

    app.include_router(api_router)
    app.include_router(pages_router)
    limits = {"max_bytes": config.max_body_bytes, "timeout_s": config.body_timeout_s}
    app.add_middleware(RequestLimits, **limits, max_head_bytes=config.max_head_bytes)
    return app


def guarded(app: FastAPI, server: Server):
    """``app`` behind :class:`lexgraph.serve.security.Guard` (the outermost layer, so that every
    response, a 500 included, carries the security headers): the hosts of ``server``'s catalogue, and
    a Content-Security-Policy per kind of path."""
    from lexgraph.serve.pages import is_page, style_hashes
    from lexgraph.serve.security import API_POLICY, Guard, docs_policy, inline_hashes, page_policy

    pages, docs = page_policy(style_hashes()), docs_policy(inline_hashes(app.state.docs_html, "script"))

    def policy(path: str) -> str:
        return docs if path == "/docs" else pages if is_page(path) else API_POLICY

    return Guard(app, server.allowed_hosts, policy)


__all__ = ["Server", "create_app", "error_json", "guarded", "read_config"]

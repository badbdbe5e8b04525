"""The ASGI application: the JSON API, the web pages, and the reload that swaps catalogues.

:class:`Server` holds the catalogue being served (:mod:`lexgraph.serve.catalog`) and replaces it
whole on :meth:`Server.reload` (``POST /admin/reload`` or SIGHUP): the new one is loaded on a
thread of its own while the old one answers, then swapped in at once; requests already holding the
old one finish on it. A catalogue that fails to load (a damaged or stale artefact) is refused
with one log line and the old one goes on serving. :func:`create_app` builds the FastAPI app with
every error as ``{"error": "<one line>"}`` and the right 4xx (:mod:`lexgraph.serve.limits`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from lexgraph.core.errors import LexgraphError
from lexgraph.serve.catalog import Catalog, load_catalog
from lexgraph.serve.limits import ApiError, RequestLimits, error_json
from lexgraph.serve.settings import ServeConfig

log = logging.getLogger("lexgraph.serve")


def read_config(workspace: Path) -> ServeConfig:
    """The ``serve`` section of the workspace's params.yaml."""
    from lexgraph.core.config import load_params

    _, raw = load_params("serve", workspace / "params.yaml")
    return ServeConfig.from_params(raw)


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


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class Server:
    """The catalogue being served and how it is replaced (see the module docstring)."""

    def __init__(self, workspace: Path, device: str, index: Path | None = None, settle: bool = False) -> None:
        self.workspace, self.device, self.index = workspace, device, index
        self.settle = settle  # settle_heap() once a catalogue is loaded (the process is the server's own)
        self.search_executor = ThreadPoolExecutor(1, thread_name_prefix="lexgraph-search")
        self.load_executor = ThreadPoolExecutor(1, thread_name_prefix="lexgraph-load")
        self.catalog: Catalog | None = None
        self.pending: Catalog | None = None  # loaded by prepare(), started with the event loop
        self.reloads = 0  # reloads refused or done (a test waits on it)
        self._lock: asyncio.Lock | None = None
        self._retired: set[asyncio.Task] = set()

    def load(self, generation: int) -> Catalog:
        """A new catalogue from the workspace as it is now (params.yaml's ``serve`` section included)."""
        config = read_config(self.workspace)
        try:
            return load_catalog(self.workspace, config, self.device, generation, self.index)
        except LexgraphError:
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

    async def start(self, catalog: Catalog) -> None:
        catalog.start(self.search_executor)
        self.catalog = catalog

    async def reload(self) -> Catalog:
        """Load a new catalogue and swap it in; raises :class:`LexgraphError` (the old one serving on)."""
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            old = self.catalog
            try:
                new = await asyncio.get_running_loop().run_in_executor(
                    self.load_executor, self.load, old.generation + 1
                )
            except LexgraphError as exc:
                self.reloads += 1
                log.error("reload refused, generation %d serving on: %s", old.generation, one_line(exc))
                raise
            new.start(self.search_executor)
            self.catalog = new
            self.reloads += 1
            task = asyncio.get_running_loop().create_task(self._retire(old))
            self._retired.add(task)
            task.add_done_callback(self._retired.discard)
            log.info("reloaded: generation %d serves %s", new.generation, ", ".join(new.searchers))
            return new

    async def _retire(self, old: Catalog) -> None:
        await old.close()  # once its last request is answered
        del old
        if self.settle:
            settle_heap()  # the old catalogue's objects collected, the new one's frozen (one full pass)

    async def stop(self) -> None:
        if self.catalog is not None:
            await self.catalog.close()
        self.search_executor.shutdown(wait=False, cancel_futures=True)
        self.load_executor.shutdown(wait=False, cancel_futures=True)


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


def _offline_docs(app: FastAPI) -> None:
    """FastAPI's interactive API page at ``/docs``, its Swagger UI served from the swagger-ui-bundle
    wheel (FastAPI's own page loads it from a CDN: blank offline)."""
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.staticfiles import StaticFiles
    from swagger_ui_bundle import swagger_ui_path

    app.mount("/static/swagger", StaticFiles(directory=str(swagger_ui_path)), name="swagger")

    @app.get("/docs", include_in_schema=False)
    async def docs():
        return get_swagger_ui_html(
            openapi_url=app.openapi_url,
            title="lexgraph API",
            swagger_js_url="/static/swagger/swagger-ui-bundle.js",
            swagger_css_url="/static/swagger/swagger-ui.css",
            swagger_favicon_url="data:,",
        )


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
    app.state.server = server
    _offline_docs(app)

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

    app.include_router(api_router)
    app.include_router(pages_router)
    limits = {"max_bytes": config.max_body_bytes, "timeout_s": config.body_timeout_s}
    app.add_middleware(RequestLimits, **limits, max_head_bytes=config.max_head_bytes)
    return app


__all__ = ["Server", "create_app", "error_json", "read_config"]

"""The JSON API: ``GET /search``, ``POST /search``, ``GET /articles/{id}``, ``GET /systems``,
``GET /health`` and ``POST /admin/reload``; every refusal an :class:`lexgraph.serve.limits.ApiError`.

A question is text only (never a path), at most ``serve.max_question_chars`` characters, without
control characters; ``k`` is in ``[1, serve.max_k]``; ``system`` one the catalogue serves. The
server reads no path from a request: an article id is a key of the loaded corpus.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lexgraph.core.errors import LexgraphError
from lexgraph.core.inputs import text_problem
from lexgraph.serve.catalog import Catalog
from lexgraph.serve.limits import ApiError
from lexgraph.text.display import _CONTROLS as DISPLAY_CONTROLS
from lexgraph.text.display import hit_fields

router = APIRouter()

#: what a question may not hold: the controls lexgraph.text.display never lets reach a terminal (C0, DEL,
#: C1, the bidirectional embeddings, overrides and isolates), but tab, line feed and carriage return
_CONTROLS = {chr(c) for c in DISPLAY_CONTROLS} - set("\t\n\r")


def check_question(text: str, config, where: str = "q") -> str:
    """``text`` (a string: a query parameter, or an item of :class:`SearchBatch`) stripped, or an
    :class:`ApiError` naming ``where`` and what was expected."""
    problem = text_problem(text) or ("holds a control character" if not _CONTROLS.isdisjoint(text) else None)
    most = config.max_question_chars
    refusals = [  # (whether the question is refused so, the words): the first one found is raised
        (problem, f"the question {problem}; expected plain text"),
        (not text.strip(), "the question is empty; expected a question"),
        (len(text) > most, f"the question has {len(text)} characters; expected at most {most}"),
    ]
    words = next((words for refused, words in refusals if refused), None)
    if words is not None:
        raise ApiError(400, f"{where}: {words}")
    return text.strip()


def check_k(k, config) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= config.max_k:
        raise ApiError(400, f"k = {k!r}; expected an integer in [1, {config.max_k}]")
    return k


def check_system(system, catalog: Catalog) -> str:
    if system not in catalog.searchers:
        raise ApiError(400, f"unknown system {system!r}; expected one of {', '.join(catalog.searchers)}")
    return system


def check_as_of(as_of, catalog: Catalog) -> str | None:
    """``as_of`` (None: today's law), or a 400 :class:`ApiError` saying why it cannot be answered: no
    date, earlier than an index's snapshot, or a corpus without versions."""
    if as_of is None:
        return None
    if catalog.in_force is None:
        raise ApiError(400, f"as_of {as_of!r:.40}: this corpus holds no versions of articles; expected no as_of")
    problem = catalog.in_force.check(as_of, "as_of")
    if problem:
        raise ApiError(400, problem)
    return as_of


def dated(catalog: Catalog, as_of: str | None) -> dict:
    """The answer's ``as_of`` on a corpus of versions: the date whose law it holds (today's without one)."""
    from lexgraph.data.versions import today

    return {"as_of": as_of or today()} if catalog.in_force is not None else {}


async def answer(catalog: Catalog, system: str, questions: list[str], k: int, as_of: str | None = None) -> list[list]:
    """The hits of ``questions`` from ``system``'s batcher (of the law in force on ``as_of``), as
    dicts (each hit's own fields: a :class:`lexgraph.text.display.Hit` is made for this answer
    alone, so no deep copy)."""
    hits = await catalog.batchers[system].submit(questions, k, as_of)
    return [[hit_fields(h) for h in row] for row in hits]


def json_response(content) -> Response:
    """``content`` (plain dicts, lists, strings and numbers) as the JSON that FastAPI would send,
    rendered at once: FastAPI's ``jsonable_encoder`` walk of every hit, with the deep copy of
    ``dataclasses.asdict`` before it, was a quarter of a BM25 search's time in the server
    (benchmarks/serve.py)."""
    body = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return Response(body.encode("utf-8"), media_type="application/json")


@router.get("/search", tags=["search"])
async def search(
    request: Request,
    q: str = Query(description="the question, plain text"),
    system: str | None = Query(None, description="a system of GET /systems (default: the first)"),
    k: int = Query(10, description="hits to return, in [1, serve.max_k]"),
    as_of: str | None = Query(None, description="on a corpus of versions: the law in force on this date, YYYY-MM-DD"),
):
    """The ranked articles for one question: id, article number, reference, heading path, score,
    and a snippet whose ``highlights`` are the character spans of the question's terms; on a corpus
    of versions, each hit's ``version`` and the answer's ``as_of`` (today without one)."""
    async with request.app.state.server.catalog.use() as catalog:
        system = check_system(next(iter(catalog.searchers)) if system is None else system, catalog)
        question = check_question(q, catalog.config)
        as_of = check_as_of(as_of, catalog)
        (hits,) = await answer(catalog, system, [question], check_k(k, catalog.config), as_of)
        head = {"question": question, "system": system, "generation": catalog.generation, **dated(catalog, as_of)}
        return json_response({**head, "hits": hits})


class SearchBatch(BaseModel):
    """The body of ``POST /search``: JSON types as they are (a question is a string, ``k`` an
    integer), no other keys; the bounds of the catalogue's settings are checked against it after."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    questions: list[str] = Field(min_length=1, description="the questions, plain text")
    system: str | None = Field(None, description="a system of GET /systems (default: the first)")
    k: int = Field(10, description="hits to return per question, in [1, serve.max_k]")
    as_of: str | None = Field(None, description="on a corpus of versions: the law in force on this date, YYYY-MM-DD")


_BODY = 'a JSON object {"questions": [...], "system": ..., "k": ..., "as_of": ...}'
_BATCH_SCHEMA = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": SearchBatch.model_json_schema()}}}
}


@router.post("/search", tags=["search"], openapi_extra=_BATCH_SCHEMA)
async def search_batch(request: Request):
    """Several questions at once: ``{"questions": [...], "system": ..., "k": ...}`` gives
    ``{"system", "results": [{"question", "hits"}, ...]}`` in the questions' order."""
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
        raise ApiError(415, "expected a JSON body (Content-Type: application/json)")
    try:
        batch = SearchBatch.model_validate_json(await request.body())
    except ValidationError as exc:  # not JSON, not UTF-8, another shape: the first error, where it is
        error = exc.errors()[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])[1:] or "the body"
        raise ApiError(400, f"{where}: {error['msg']}; expected {_BODY}") from None
    async with request.app.state.server.catalog.use() as catalog:
        config = catalog.config
        if len(batch.questions) > config.max_batch_questions:
            raise ApiError(400, f"{len(batch.questions)} questions; expected 1 to {config.max_batch_questions}")
        questions = [check_question(q, config, f"questions[{i}]") for i, q in enumerate(batch.questions)]
        system = check_system(next(iter(catalog.searchers)) if batch.system is None else batch.system, catalog)
        as_of = check_as_of(batch.as_of, catalog)
        hits = await answer(catalog, system, questions, check_k(batch.k, config), as_of)
        results = [{"question": q, "hits": h} for q, h in zip(questions, hits)]
        head = {"system": system, "generation": catalog.generation, **dated(catalog, as_of)}
        return json_response({**head, "results": results})


@router.get("/articles", tags=["articles"])
async def article_by_query(request: Request, id: str = Query(description="the article's id, any string")):  # noqa: A002
    """One article, its id in the query (``/articles?id=a%2Fb``): every id a corpus may hold, ``..``
    and ``a/b`` included, which a path segment cannot always carry."""
    return _article(request, id)


@router.get("/articles/{article_id:path}", tags=["articles"])
async def article(request: Request, article_id: str):
    """One article: its text, reference, heading path and the ids of the articles under the same heading
    (an id with ``/`` percent-encoded or not; ``GET /articles?id=`` takes any id)."""
    return _article(request, article_id)


def _article(request: Request, article_id: str):
    found, siblings = check_article(article_id, request.app.state.server.catalog)
    fields = {name: value for name, value in asdict(found).items() if value is not None or name not in VERSIONED}
    return {**fields, "siblings": siblings}


#: an article's fields only a corpus of versions has
VERSIONED = ("version", "versions")


def check_article(article_id: str, catalog: Catalog):
    """The article ``article_id`` of ``catalog`` and the ids of the articles under its heading, or a 404
    :class:`ApiError` (for the JSON answer and the web page alike)."""
    found = catalog.articles.get(article_id)
    if found is None:
        raise ApiError(404, f"no article with id {article_id[:100]!r}")
    return found, catalog.siblings[tuple(found.path)]


@router.get("/systems", tags=["server"])
async def systems(request: Request):
    """The systems served (the first is the default), with the digests of the models each loaded."""
    catalog = request.app.state.server.catalog
    return {
        "generation": catalog.generation,
        "systems": [{"name": s, "models": catalog.digests[s]} for s in catalog.searchers],
    }


@router.get("/health", tags=["server"])
async def health(request: Request):
    catalog = request.app.state.server.catalog
    return {"status": "ok", "generation": catalog.generation, "systems": list(catalog.searchers)}


#: the content types a cross-site HTML form can send (never accepted by an admin action)
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data", "text/plain")


def check_admin(request: Request, token: str) -> None:
    """Refuse an admin request unless it comes from the server's own host, holds no form body and no
    query, and carries the admin token (``Authorization: Bearer <token>``, compared in constant time).
    The Host and Origin checks of every request (lexgraph.serve.security.Guard) come first."""
    from lexgraph.serve.security import LIMITER, token_matches

    client = request.client.host if request.client else ""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    # the checks in order, each made only once those before it pass: the first refusal is raised
    if client not in ("127.0.0.1", "::1", "localhost"):
        raise ApiError(403, "admin actions are allowed from the server's own host only")
    if kind in FORM_TYPES or (kind and kind != "application/json"):
        raise ApiError(415, "an admin action takes no form and no body; expected an empty POST")
    if request.url.query:
        raise ApiError(400, "an admin action takes no query; the token goes in the Authorization header")
    if not token_matches(request.headers.get("authorization"), token):
        LIMITER.log(logging.WARNING, "admin-token", "refused an admin request without the admin token")
        raise ApiError(401, "expected the admin token: Authorization: Bearer <the token of serve.admin_token_file>")


@router.post("/admin/reload", tags=["server"])
async def reload(request: Request):
    """Load the workspace's models again (after ``dvc repro``) and swap them in without dropping a
    request. From the server's own host only, with the admin token (``Authorization: Bearer``, the
    token of ``serve.admin_token_file``). Reloads run one at a time; one more waits, and any later
    request joins that one. A catalogue that fails to load is refused (503) and the old one serves on."""
    server = request.app.state.server
    check_admin(request, server.catalog.admin_token)
    try:
        catalog = await server.reload()
    except LexgraphError as exc:
        raise ApiError(503, f"reload refused, the previous models serve on: {exc}") from None
    return {"reloaded": True, "generation": catalog.generation, "systems": list(catalog.searchers)}

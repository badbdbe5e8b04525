"""The web page, rendered on the server (Jinja2, no script, no asset from elsewhere).

* ``/``: a question box, a system selector and the ranked articles, each with its heading path as
  breadcrumbs and the question's terms marked; an article's number opens it.
* ``/article?id=…``: the full article in its place in the hierarchy: its heading path and the
  articles under the same heading.
* ``/inspect?split=test&sort=&order=``: the split's questions with each system's recall of its run,
  a mean row over them, sorted by any column (linked from every page only where there are runs: not
  over an index of ``lexgraph index``); ``/inspect/question?split=test&id=…&a=&b=&k=``: two systems'
  top-k side by side, gold articles marked, and the rank of every gold article one of them missed;
  by default the served default system against the other system with the best mean recall@k.

Ids travel in the query, percent-encoded whole (:func:`article_url`, :func:`question_url`), never
as a path segment: a corpus may name an article ``a/b``, ``..`` or ``.``, which a path would split
or a browser resolve away (``/article/..`` is ``/``). The earlier paths ``/article/{id}`` and
``/inspect/{split}/{id}`` still answer, for the ids a path can carry.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from markupsafe import Markup, escape

from lexgraph.serve.api import answer, check_article, check_as_of, check_k, check_question, check_system, dated
from lexgraph.serve.limits import ApiError
from lexgraph.text.display import version_words

router = APIRouter(default_response_class=HTMLResponse, include_in_schema=False)
templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
#: the paths whose errors are pages, not JSON (each one and what lies under it)
PAGE_PATHS = ("/article", "/inspect")


def is_page(path: str) -> bool:
    return path == "/" or any(path == p or path.startswith(p + "/") for p in PAGE_PATHS)


def article_url(key: str) -> str:
    """The page of article ``key``: its id in the query, every reserved character encoded."""
    return "/article?" + urlencode({"id": key}, quote_via=quote)


def question_url(split: str, key: str, **params) -> str:
    """The inspector's page of question ``key`` of ``split`` (``params``: a, b, k; None ones left out)."""
    query = {"split": split, "id": key, **{name: v for name, v in params.items() if v is not None}}
    return "/inspect/question?" + urlencode(query, quote_via=quote)


def inspect_url(split: str, **params) -> str:
    query = {"split": split, **{name: v for name, v in params.items() if v is not None}}
    return "/inspect?" + urlencode(query, quote_via=quote)


def can_inspect(request: Request) -> bool:
    """Whether the catalogue served has runs to inspect: not over an index of ``lexgraph index`` (a
    corpus without questions), nor before ``evaluate`` ran; the pages link the inspector only then."""
    server = getattr(request.app.state, "server", None)
    catalog = getattr(server, "catalog", None)
    return getattr(catalog, "runs", None) is not None


templates.env.globals.update(
    article_url=article_url,
    question_url=question_url,
    inspect_url=inspect_url,
    can_inspect=can_inspect,
    version_words=version_words,
)


def style_hashes() -> list[str]:
    """The CSP sources of the page's inline style sheet (lexgraph.serve.security.page_policy)."""
    from lexgraph.serve.security import inline_hashes

    source, _, _ = templates.env.loader.get_source(templates.env, "base.html")
    return inline_hashes(source, "style")


def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    return templates.TemplateResponse(request, "error.html", {"status": status, "message": message}, status_code=status)


def marked(snippet: str, highlights) -> Markup:
    """``snippet`` as HTML with each ``[start, end)`` of ``highlights`` in ``<mark>``."""
    out, at = [], 0
    for start, end in highlights:
        out += [escape(snippet[at:start]), Markup("<mark>"), escape(snippet[start:end]), Markup("</mark>")]
        at = end
    return Markup("").join([*out, escape(snippet[at:])])


@router.get("/")
async def search_page(
    request: Request, q: str | None = None, system: str | None = None, k: str | None = None, as_of: str | None = None
):
    async with request.app.state.server.catalog.use() as catalog:
        config = catalog.config
        default = next(iter(catalog.searchers))
        context = {"systems": list(catalog.searchers), "system": default if system is None else system}
        context |= {"question": q, "k": config.page_k, "max_k": config.max_k, "hits": None, "error": None}
        context |= {"versioned": catalog.in_force is not None, "as_of": as_of or None}
        status = 200
        if q is not None:
            try:
                context["k"] = check_k(_integer(k) if k else config.page_k, config)
                question = check_question(q, config)
                date = check_as_of(as_of or None, catalog)  # the form sends an empty date: today's law
                context["answered"] = dated(catalog, date).get("as_of")
                system = check_system(context["system"], catalog)
                (hits,) = await answer(catalog, system, [question], context["k"], date)
                context["hits"] = [
                    {
                        **hit,
                        "marked": marked(hit["snippet"], hit["highlights"]),
                        "version_words": version_words(hit["version"]) if hit.get("version") else None,
                    }
                    for hit in hits
                ]
            except ApiError as exc:
                context["error"], status = exc.message, exc.status
        return templates.TemplateResponse(request, "search.html", context, status_code=status)


def _integer(text: str) -> int | str:
    try:
        return int(text)
    except ValueError:
        return text  # check_k names it


@router.get("/article")
async def article_query_page(request: Request, id: str = Query(description="the article's id")):  # noqa: A002
    return _article_page(request, id)


@router.get("/article/{article_id:path}")
async def article_page(request: Request, article_id: str):
    return _article_page(request, article_id)


def _article_page(request: Request, article_id: str):
    catalog = request.app.state.server.catalog
    article, sibling_ids = check_article(article_id, catalog)
    siblings = [catalog.articles[key] for key in sibling_ids]
    return templates.TemplateResponse(request, "article.html", {"article": article, "siblings": siblings})


def _runs(request: Request, split: str | None):
    """The runs of the catalogue served and the split asked for (None: test, else the first there is)."""
    runs = request.app.state.server.catalog.runs
    if runs is None:
        index = request.app.state.server.index
        raise ApiError(
            404,
            f"nothing to inspect: this server searches the index {index.name}, a corpus without questions or gold "
            "articles; the inspector shows the runs of `dvc repro`'s evaluate stage over a workspace's own corpus"
            if index is not None
            else "nothing to inspect: the workspace has no runs yet (`dvc repro` writes them in its evaluate stage)",
        )
    if split is None:
        split = "test" if "test" in runs.questions else next(iter(runs.questions))
    if split not in runs.questions:
        raise ApiError(404, f"no runs for split {split[:40]!r}; expected one of {', '.join(runs.questions)}")
    return runs, split


#: the inspector's columns besides each system's recall, which a table sorts by too
SORTS = ("id", "question", "gold")
ORDERS = ("asc", "desc")


def _sort_key(sort: str, systems: list[str]):
    """The value a row sorts by for column ``sort`` (id: the runs' id order)."""
    if sort == "id":
        return lambda row: row["order"]
    if sort == "question":
        return lambda row: row["text"].casefold()
    if sort == "gold":
        return lambda row: row["gold"]
    column = systems.index(sort)
    return lambda row: row["recall"][column]


def _header(split: str, k: int, sort: str, order: str, systems: list[str]) -> list[dict]:
    """The table's columns: each a link sorting by it (ascending first; again: the other way)."""
    columns = []
    for name in (*SORTS, *systems):
        current = order if name == sort else None
        again = "desc" if current == "asc" else "asc"
        url = inspect_url(split, k=k, sort=name, order=again)
        columns.append({"name": name, "url": url, "sorted": {"asc": "ascending", "desc": "descending"}.get(current)})
    return columns


@router.get("/inspect")
async def inspect_page(request: Request, split: str | None = None, k: int = 100, sort: str = "id", order: str = "asc"):
    """The split's questions with each system's recall@k, a mean row over them, sorted by any column
    (``sort``: id, question, gold or a system; ``order``: asc or desc; ties keep the id order)."""
    catalog = request.app.state.server.catalog
    runs, split = _runs(request, split)
    k = check_k(k, catalog.config) if k != 100 else k  # recall@100 is the headline; other depths within max_k
    systems = runs.systems(split)
    if sort not in (*SORTS, *systems):
        raise ApiError(400, f"sort {sort[:40]!r}: expected a column, one of {', '.join((*SORTS, *systems))}")
    if order not in ORDERS:
        raise ApiError(400, f"order {order[:10]!r}: expected asc or desc")
    rows = [
        {"order": i, "key": q.key, "text": q.text, "gold": len(q.gold)}
        | {"recall": [runs.recall(s, split, q, k) for s in systems]}
        for i, q in enumerate(runs.questions[split].values())
    ]
    n = max(len(rows), 1)
    mean = {
        "gold": sum(r["gold"] for r in rows) / n,
        "recall": [sum(r["recall"][i] for r in rows) / n for i in range(len(systems))],
    }
    rows = sorted(rows, key=_sort_key(sort, systems), reverse=order == "desc")  # stable: ties in id order
    context = {"split": split, "splits": list(runs.questions), "k": k, "systems": systems, "rows": rows, "mean": mean}
    context |= {"columns": _header(split, k, sort, order, systems), "sort": sort, "order": order, "error": None}
    return templates.TemplateResponse(request, "inspect.html", context)


@router.get("/inspect/question")
async def question_query_page(
    request: Request,
    split: str,
    id: str = Query(description="the question's id"),  # noqa: A002
    a: str | None = None,
    b: str | None = None,
    k: int | None = None,
):
    return _question_page(request, split, id, a, b, k)


@router.get("/inspect/{split}/{question_id:path}")
async def question_page(
    request: Request, split: str, question_id: str, a: str | None = None, b: str | None = None, k: int | None = None
):
    return _question_page(request, split, question_id, a, b, k)


def _question_page(request: Request, split: str, question_id: str, a: str | None, b: str | None, k: int | None):
    catalog = request.app.state.server.catalog
    runs, split = _runs(request, split)
    question = runs.questions[split].get(question_id)
    if question is None:
        raise ApiError(404, f"no {split} question with id {question_id[:100]!r}")
    systems = runs.systems(split)
    for name in (a, b):
        if name is not None and name not in systems:
            raise ApiError(400, f"no {split} run of system {name[:40]!r}; expected one of {', '.join(systems)}")
    k = check_k(k if k is not None else catalog.config.page_k, catalog.config)
    a, b, pair = _default_pair(catalog, runs, split, k, a, b)
    columns = [_column(catalog, runs, split, question, s, k) for s in (a, b)]
    missed = [
        {**_shown(catalog, key), "ranks": [runs.rank(s, split, question, key) for s in (a, b)]}
        for key in question.gold
        if any(key not in c["keys"] for c in columns)
    ]
    context = {"split": split, "question": question, "systems": systems, "a": a, "b": b, "k": k}
    context |= {"max_k": catalog.config.max_k, "columns": columns, "missed": missed, "pair": pair}
    return templates.TemplateResponse(request, "question.html", context)


def _default_pair(catalog, runs, split: str, k: int, a: str | None, b: str | None) -> tuple[str, str, str | None]:
    """The systems compared, ``a`` and ``b`` where given, and the sentence saying how the others were
    chosen (None when both were given): A is the served default (``serve.systems``' first) when it has
    a run on ``split``, else the system with the highest mean recall@k on the split; B is, of the other
    systems, the one with the highest mean recall@k on the split (ties: the registry's order)."""
    systems = runs.systems(split)
    served = next(iter(catalog.searchers), None)

    def best(excluded: str | None) -> str:
        others = [s for s in systems if s != excluded] or systems
        return max(others, key=lambda s: runs.mean_recall(s, split, k))  # the first of equals

    said = []
    if a is None:
        a = served if served in systems and served != b else best(b)
        why = "the served default, serve.systems' first" if a == served else f"the highest mean recall@{k} on {split}"
        said.append(f"A is {a} ({why})")
    if b is None:
        b = best(a)
        said.append(f"B is {b}, of the other systems the one with the highest mean recall@{k} on {split}")
    if not said:
        return a, b, None
    means = ", ".join(f"{s} {runs.mean_recall(s, split, k):.2f}" for s in (a, b))
    return a, b, f"Compared by default: {'; '.join(said)} (mean recall@{k} over the {split} questions: {means})."


def _shown(catalog, key: str) -> dict:
    article = catalog.articles.get(key)
    return {"key": key, "number": article.number if article else key, "path": article.path if article else []}


def _column(catalog, runs, split, question, system: str, k: int) -> dict:
    ranked = runs.ranking(system, split).get(question.key, [])[:k]
    gold = set(question.gold)
    hits = [{**_shown(catalog, key), "rank": i, "gold": key in gold} for i, key in enumerate(ranked, 1)]
    return {"system": system, "hits": hits, "keys": set(ranked), "recall": runs.recall(system, split, question, k)}

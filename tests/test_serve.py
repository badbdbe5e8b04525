"""`lexgraph serve` (issue 27): the API answers as `lexgraph search` does, batches concurrent
questions, refuses hostile requests with one line of JSON and a 4xx, reloads under load without
dropping a request, keeps serving when a reload meets a damaged artefact, and its inspector shows
what the runs hold. The server runs in a thread on a free port of 127.0.0.1 (tests/helpers_serve.py);
the browser tests are tests/test_serve_browser.py (slow), the load benchmark benchmarks/serve.py."""

from __future__ import annotations

import json
import logging
import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from helpers_serve import QUESTIONS, SERVED, RunningServer, loopback, served_workspace, set_serve
from lexgraph.cli.main import main

TEXTS = [q for q, _ in QUESTIONS.values()] + ["contrat de bail, loyer", "enfant mariage loi"]
H = b"Host: 127.0.0.1\r\n"  # a name the server answers for (serve.allowed_hosts)


@pytest.fixture(scope="module")
def workspace(tiny_model_dir, tmp_path_factory):
    settings = dict(max_wait_ms=50, header_timeout_s=1, body_timeout_s=1, max_body_bytes=4096)
    return served_workspace(tmp_path_factory.mktemp("serve_ws"), tiny_model_dir, **settings)


@pytest.fixture(scope="module")
def running(workspace):
    with RunningServer(workspace) as server:
        yield server


def _cli_hits(workspace, system, question, k, capsys):
    capsys.readouterr()
    assert main(["search", "--workspace", str(workspace), "--system", system, "--json", "--top", str(k), question]) == 0
    return json.loads(capsys.readouterr().out)["hits"]


@pytest.mark.parametrize("system", SERVED)
def test_get_search_answers_as_lexgraph_search_does(workspace, running, capsys, system):
    for question in TEXTS:
        response = loopback.get(f"{running.url}/search", params={"q": question, "system": system, "k": 5})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["system"] == system and body["question"] == question and body["generation"] == 0
        want = _cli_hits(workspace, system, question, 5, capsys)
        assert [h["id"] for h in body["hits"]] == [h["id"] for h in want]
        for got, expected in zip(body["hits"], want):
            assert got["score"] == pytest.approx(expected["score"], abs=1e-5)
            assert {k: v for k, v in got.items() if k != "score"} == {k: v for k, v in expected.items() if k != "score"}


def test_post_search_answers_each_question_as_get_does(running):
    response = loopback.post(f"{running.url}/search", json={"questions": TEXTS, "system": "bm25", "k": 4})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["question"] for r in results] == TEXTS
    for question, result in zip(TEXTS, results):
        single = loopback.get(f"{running.url}/search", params={"q": question, "system": "bm25", "k": 4}).json()
        assert result["hits"] == single["hits"]


def test_concurrent_dense_questions_are_searched_in_fewer_calls_with_the_same_hits(running):
    alone = {q: loopback.get(f"{running.url}/search", params={"q": q, "system": "dsr", "k": 5}).json() for q in TEXTS}
    batcher = running.server.catalog.batchers["dsr"]
    before = batcher.calls
    questions = TEXTS * 4  # 20 requests at once; the batcher waits up to serve.max_wait_ms = 50 for company
    with ThreadPoolExecutor(len(questions)) as pool:
        answers = list(
            pool.map(
                lambda q: loopback.get(f"{running.url}/search", params={"q": q, "system": "dsr", "k": 5}), questions
            )
        )
    assert all(a.status_code == 200 for a in answers)
    assert batcher.calls - before < len(questions) / 2  # batched: far fewer encoder calls than requests
    for question, answer in zip(questions, answers):
        got, want = answer.json()["hits"], alone[question]["hits"]
        assert [h["id"] for h in got] == [h["id"] for h in want]
        assert [h["score"] for h in got] == pytest.approx([h["score"] for h in want], abs=1e-5)


def test_articles_systems_and_health(workspace, running):
    import polars as pl

    articles = pl.read_parquet(workspace / "data" / "clean" / "articles.parquet").sort("id")
    row = articles.row(3, named=True)
    body = loopback.get(f"{running.url}/articles/{row['id']}").json()
    assert body["text"] == row["article"] and body["path"] == row["path"] and body["reference"] == row["reference"]
    same = [str(r["id"]) for r in articles.iter_rows(named=True) if r["path"] == row["path"]]
    assert body["siblings"] == same and body["key"] == str(row["id"])
    systems = loopback.get(f"{running.url}/systems").json()
    assert [s["name"] for s in systems["systems"]] == SERVED
    assert all(s["models"] for s in systems["systems"])  # the digests of the models each system loaded
    assert loopback.get(f"{running.url}/health").json() == {"status": "ok", "generation": 0, "systems": SERVED}
    assert loopback.get(f"{running.url}/openapi.json").json()["paths"].keys() >= {"/search", "/articles/{article_id}"}


def _raw(port: int, data: bytes, pause_after: bool = False, timeout: float = 5) -> bytes:
    """Send ``data`` on a fresh connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def _hostile(url: str, port: int) -> list[tuple[str, object]]:
    """(label, a callable returning (status, body bytes)) for every hostile request."""
    search = f"{url}/search"

    def get(path, **params):
        return lambda: _response(loopback.get(f"{url}{path}", params=params, timeout=10))

    def post(content=None, headers=None, **kw):
        headers = headers or {"content-type": "application/json"}
        return lambda: _response(loopback.post(search, content=content, headers=headers, timeout=10, **kw))

    def raw(data: bytes):
        def send():
            reply = _raw(port, data)
            head, _, body = reply.partition(b"\r\n\r\n")
            return int(head.split()[1]), body

        return send

    def chunks(n):
        yield from (b"x" * 1024 for _ in range(n))

    cases = [
        ("a body over the limit", post(b'{"questions": ["' + b"a" * 10000 + b'"]}')),
        ("a chunked body over the limit", post(chunks(8))),
        ("a Content-Length of 10 GB", raw(b"POST /search HTTP/1.1\r\n" + H + b"Content-Length: 10000000000\r\n\r\n")),
        ("malformed JSON", post(b'{"questions": [')),
        ("JSON that is a list", post(b'["a"]')),
        ("questions not a list", post(b'{"questions": "a"}')),
        ("no question", post(b'{"questions": []}')),
        ("65 questions", post(json.dumps({"questions": ["bail"] * 65}).encode())),
        ("an unknown key", post(b'{"questions": ["bail"], "path": "/etc/passwd"}')),
        ("a question that is a number", post(b'{"questions": [3]}')),
        ("a question that is an object", post(b'{"questions": [{"file": "/etc/passwd"}]}')),
        ("not JSON at all", post(b"questions=bail", headers={"content-type": "application/x-www-form-urlencoded"})),
        ("invalid UTF-8", post(b'{"questions": ["\xff\xfe"]}')),
        ("a NUL byte in a posted question", post(b'{"questions": ["bail\\u0000"]}')),
        ("a raw NUL in the request line", raw(b"GET /search?q=a\x00b HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")),
        ("a request head of 100 KB", raw(b"GET /health HTTP/1.1\r\n" + H + b"X-Big: " + b"a" * 100000 + b"\r\n\r\n")),
        ("not HTTP", raw(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 hello\r\n\r\n")),
        ("no q", get("/search", system="bm25")),
        ("a wrong method", lambda: _response(loopback.delete(search, timeout=10))),
        ("an unknown path", get("/../../etc/passwd")),
        ("an unknown path under the API", get("/admin/shell")),
    ]
    for key, value in (("k", -1), ("k", "5"), ("k", True), ("k", 1e999), ("system", 123), ("system", "nope")):
        body = json.dumps({"questions": ["bail"], key: value}).encode()
        cases.append((f"posted {key}={value!r}", post(body)))
    for system in ("nope", "../../etc/passwd", "BM25", "mvcl", "bm25\x00", ""):
        cases.append((f"system {system!r}", get("/search", q="bail", system=system)))
    for k in ("-1", "0", "101", "10" * 30, "abc", "1.5", "1e3", "", "nan"):
        for system in SERVED:
            cases.append((f"k={k!r} ({system})", get("/search", q="bail", system=system, k=k)))
    for q in ("", "   ", "\x00", "bail\x00", "\x1b[31m", "a" * 2001, "\u202e"):
        for system in SERVED:
            cases.append((f"q={q[:8]!r} ({system})", get("/search", q=q, system=system)))
    for article in ("..%2F..%2Fparams.yaml", "%2e%2e", "C:%5CWindows", "999999", "-1", "%00", "a" * 5000, "1 OR 1=1"):
        cases.append((f"article {article[:20]!r}", lambda a=article: _response(loopback.get(f"{url}/articles/{a}"))))
    for raw in ("/search?q=%FF", "/search?q=%ED%A0%80", "/articles/%C3"):  # not UTF-8 once decoded
        cases.append((f"raw {raw}", lambda r=raw: _response(loopback.get(f"{url}{r}"))))
    for path in ("/inspect?split=train", "/inspect/test/999?a=bm25", "/inspect/test/101?a=nope", "/article/..%2Fx"):
        cases.append((f"page {path}", lambda p=path: _response(loopback.get(f"{url}{p}"), page=True)))
    return cases


def _response(response: httpx.Response, page: bool = False):
    return response.status_code, (b"{}" if page and response.status_code < 500 else response.content)


def _slow(port: int, data: bytes) -> tuple[int, bytes, float]:
    start = time.monotonic()
    reply = _raw(port, data, timeout=10)
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), body, time.monotonic() - start


def test_a_hundred_hostile_requests_get_a_4xx_and_one_line_of_json(running, caplog):
    cases = _hostile(running.url, running.port)
    slow = [
        b"GET /search?q=bail HTTP/1.1\r\nHost: 127.0.0.1\r\n",  # the head never ends (slowloris)
        b"",  # connects, sends nothing
        b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
    ] * 4
    assert len(cases) + len(slow) >= 100
    with ThreadPoolExecutor(len(slow)) as pool:  # the slow clients hang on while everything else is asked
        pending = [pool.submit(_slow, running.port, data) for data in slow]
        for label, call in cases:
            status, body = call()
            assert 400 <= status < 500, (label, status, body[:200])
            assert b"\n" not in body.strip() and b"Traceback" not in body, (label, body[:200])
            assert isinstance(json.loads(body).get("error", ""), str), (label, body[:200])
        ok = loopback.get(f"{running.url}/search", params={"q": "bail", "system": "bm25"})
        assert ok.status_code == 200  # served while the slow clients hold their connections
        for future in pending:
            status, body, seconds = future.result()
            assert status == 408 and "error" in json.loads(body) and seconds < 5, (status, body, seconds)
    assert "Traceback" not in caplog.text
    assert loopback.get(f"{running.url}/health").status_code == 200


def _reload_under_load(running, question: dict, systems, change) -> None:
    """Clients asking ``question`` of each of ``systems`` throughout; ``change()`` then ``POST
    /admin/reload``: the reload succeeds (generation 1) and every request is answered, before the
    swap and after it (none dropped)."""
    stop, answers = threading.Event(), []

    def client(system: str) -> None:
        with httpx.Client(timeout=30) as http:
            while not stop.is_set():
                answers.append(http.get(f"{running.url}/search", params={**question, "system": system}))

    threads = [threading.Thread(target=client, args=(s,)) for s in systems]
    for t in threads:
        t.start()
    time.sleep(0.5)
    change()
    reload = loopback.post(f"{running.url}/admin/reload", headers=running.admin, timeout=120)
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join()
    assert reload.status_code == 200 and reload.json()["generation"] == 1, reload.text
    assert answers and all(a.status_code == 200 for a in answers), {a.status_code for a in answers}
    assert {a.json()["generation"] for a in answers} == {0, 1}  # answered before and after the swap


def test_a_reload_under_load_drops_no_request_and_a_damaged_artefact_keeps_the_old_models(workspace, caplog):
    with RunningServer(workspace) as running:
        question = {"q": "le bail du contrat", "system": "bm25", "k": 5}
        old = loopback.get(f"{running.url}/search", params=question).json()["hits"]
        saved = workspace / "bm25.saved"
        shutil.copytree(workspace / "models" / "bm25", saved)
        # as a new `dvc repro` with other BM25 settings would
        _reload_under_load(running, question, ("bm25", "bm25", "dsr", "zeroshot"), lambda: _refit(workspace))
        new = loopback.get(f"{running.url}/search", params=question).json()["hits"]
        assert [h["score"] for h in new] != [h["score"] for h in old]  # the new BM25 answers

        for path in (workspace / "models" / "bm25").iterdir():  # a damaged artefact
            if path.is_file():
                path.write_bytes(b"\x00garbage")
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="lexgraph.serve"):
            refused = loopback.post(f"{running.url}/admin/reload", headers=running.admin, timeout=120)
        assert refused.status_code == 503 and "\n" not in refused.text and "error" in refused.json()
        lines = [r.getMessage() for r in caplog.records if r.name == "lexgraph.serve"]
        assert len(lines) == 1 and "reload refused" in lines[0] and "\n" not in lines[0], lines
        after = loopback.get(f"{running.url}/search", params=question).json()
        assert after["generation"] == 1 and after["hits"] == new  # the models of generation 1 serve on
    shutil.rmtree(workspace / "models" / "bm25")
    shutil.move(saved, workspace / "models" / "bm25")


def _refit(workspace) -> None:
    import polars as pl

    from lexgraph.search.bm25 import BM25

    articles = pl.read_parquet(workspace / "data" / "clean" / "articles.parquet")
    BM25(k1=2.0, b=0.9).fit_texts(articles["article"].to_list(), articles["id"].to_list()).save(
        workspace / "models" / "bm25"
    )


def _missed_rows(page: str) -> list[str]:
    import re

    table = page.split('id="missed"')[1].split("</table>")[0]
    return re.findall(r'<tr data-id="([^"]+)">', table)


def test_the_inspector_shows_each_systems_recall_and_the_missed_gold_articles(workspace, running):
    from lexgraph.evaluation.trec import read_trec
    from lexgraph.methods.catalog import names

    systems = [s for s in names() if s in SERVED]  # the registry's order: every system with a run
    runs = {s: read_trec(workspace / "data" / "runs" / s / "test.trec") for s in systems}
    page = loopback.get(f"{running.url}/inspect", params={"split": "test", "k": 5}).text
    assert _columns(page) == ["id", "question", "gold", *systems]
    for qid, (_, gold) in QUESTIONS.items():
        row = page.split(f'<tr data-id="{qid}">')[1].split("</tr>")[0]
        cells = [c.split("<")[0] for c in row.split('<td class="num">')[2:]]
        want = [sum(g in runs[s][qid][:5] for g in gold) / len(gold) for s in systems]
        assert [float(c) for c in cells] == pytest.approx(want, abs=0.005), (qid, cells, want)
    qid, (_, gold) = 103, QUESTIONS[103]
    page = loopback.get(f"{running.url}/inspect/test/{qid}", params={"a": "bm25", "b": "dsr", "k": 2}).text
    missed = [g for g in gold if g not in runs["bm25"][qid][:2] or g not in runs["dsr"][qid][:2]]
    assert _missed_rows(page) == [str(g) for g in missed] and missed
    for g in missed:
        row = page.split(f'<tr data-id="{g}">')[1].split("</tr>")[0]
        ranks = [runs[s][qid].index(g) + 1 if g in runs[s][qid] else None for s in ("bm25", "dsr")]
        for rank in ranks:
            assert (str(rank) if rank else "not in the run") in row
    assert page.count('class="hit gold"') == sum(g in runs[s][qid][:2] for s in ("bm25", "dsr") for g in gold)


def _crawl(url: str, starts: list[str], limit: int = 400) -> dict[str, int]:
    """Every link of the web pages reachable from ``starts`` (each page's ``href``s, the forms' GET
    targets left aside) with its status; pages are followed, the API's interactive page and static
    files only fetched."""
    import html
    import re

    status: dict[str, int] = {}
    todo = list(starts)
    while todo and len(status) < limit:
        path = todo.pop(0)
        if path in status:
            continue
        response = loopback.get(url + path)
        status[path] = response.status_code
        if path.startswith(("/docs", "/static")) or "text/html" not in response.headers.get("content-type", ""):
            continue
        links = [html.unescape(h) for h in re.findall(r'href="([^"]+)"', response.text)]
        assert all(link.startswith("/") for link in links), links  # nothing from elsewhere
        todo += [link for link in links if link not in status]
    return status


def test_every_link_of_the_pages_resolves(running):
    """Every page link (the header's, the inspector's, the questions', the articles') answers 200."""
    status = _crawl(running.url, ["/", "/?q=le+bail+du+contrat&system=bm25"])
    assert any(p.startswith("/inspect/question") for p in status) and any(p.startswith("/article") for p in status)
    assert {p: s for p, s in status.items() if s != 200} == {}


def _columns(page: str) -> list[str]:
    import re

    return re.findall(r'data-sort="([^"]+)"', page)


def _cells(row: str) -> list[float]:
    """The numbers of a row of the inspector's table: gold, then each system's recall."""
    import re

    return [float(c) for c in re.findall(r'<td class="num">([^<]*)</td>', row)]


def test_the_inspector_has_a_mean_row_and_sorts_by_any_column(workspace, running):
    """Issue 41, item 5c: a mean row (each column's mean over the questions shown, computed here from
    the runs by hand) and sorting by any column on the server (``sort``, ``order``; ties in id order)."""
    import re

    from lexgraph.evaluation.trec import read_trec
    from lexgraph.methods.catalog import names

    systems = [s for s in names() if s in SERVED]
    runs = {s: read_trec(workspace / "data" / "runs" / s / "test.trec") for s in systems}
    recall = {
        (s, qid): sum(g in runs[s][qid][:3] for g in gold) / len(gold)
        for s in systems
        for qid, (_, gold) in QUESTIONS.items()
    }
    page = loopback.get(f"{running.url}/inspect", params={"split": "test", "k": 3}).text
    mean = page.split('id="mean">')[1].split("</tr>")[0]
    gold_mean = sum(len(g) for _, g in QUESTIONS.values()) / len(QUESTIONS)
    want = [gold_mean, *(sum(recall[s, q] for q in QUESTIONS) / len(QUESTIONS) for s in systems)]
    assert _cells(mean) == pytest.approx(want, abs=0.005) and f"{len(QUESTIONS)} questions" in mean
    for column in ("id", "question", "gold", *systems):
        for order in ("asc", "desc"):
            params = {"split": "test", "k": 3, "sort": column, "order": order}
            page = loopback.get(f"{running.url}/inspect", params=params).text
            shown = [int(q) for q in re.findall(r'<tr data-id="([^"]+)">', page)]
            value = {
                "id": lambda q: q,
                "question": lambda q: QUESTIONS[q][0].casefold(),
                "gold": lambda q: len(QUESTIONS[q][1]),
            }.get(column, lambda q, c=column: recall[c, q])
            assert shown == sorted(QUESTIONS, key=value, reverse=order == "desc"), (column, order)
            mean_again = page.split('id="mean">')[1].split("</tr>")[0]
            assert _cells(mean_again) == _cells(mean)  # the mean row stays on top, whatever the order
            head = page.split("<thead>")[1].split("</tr>")[0]
            link = re.search(rf'<th aria-sort="(\w+)"><a href="([^"]+)" data-sort="{column}"', head)
            again = "desc" if order == "asc" else "asc"
            assert link and link.group(1) == f"{order}ending" and f"order={again}" in link.group(2), head
    for bad in ({"sort": "nothing"}, {"order": "up"}):
        answer = loopback.get(f"{running.url}/inspect", params={"split": "test", **bad})
        assert answer.status_code == 400 and 'id="error"' in answer.text


def test_the_question_page_compares_the_served_default_with_the_strongest_other(workspace, running):
    """Issue 41, item 5c: by default the inspector compared bm25 with zeroshot (the registry's first
    two). Now A is the served default (serve.systems' first) and B the other system with the highest
    mean recall@k on the split (computed here from the runs), and the page says so."""
    from lexgraph.evaluation.trec import read_trec
    from lexgraph.methods.catalog import names

    systems = [s for s in names() if s in SERVED]
    runs = {s: read_trec(workspace / "data" / "runs" / s / "test.trec") for s in systems}
    k = 2

    def mean(s: str) -> float:
        return sum(sum(g in runs[s][q][:k] for g in gold) / len(gold) for q, (_, gold) in QUESTIONS.items()) / len(
            QUESTIONS
        )

    served = SERVED[0]
    strongest = max((s for s in systems if s != served), key=mean)  # the first of equals, in registry order
    page = loopback.get(f"{running.url}/inspect/question", params={"split": "test", "id": 101, "k": k}).text
    shown = [c.split('"')[0] for c in page.split('data-system="')[1:]]
    assert shown == [served, strongest], (shown, {s: mean(s) for s in systems})
    pair = page.split('id="pair">')[1].split("</p>")[0]
    assert f"A is {served} (the served default" in pair and f"B is {strongest}, of the other systems" in pair
    assert f"{served} {mean(served):.2f}, {strongest} {mean(strongest):.2f}" in pair
    chosen = loopback.get(
        f"{running.url}/inspect/question", params={"split": "test", "id": 101, "a": "bm25", "b": "dsr"}
    )
    assert 'id="pair"' not in chosen.text  # both given: nothing chosen by default
    only_b = loopback.get(
        f"{running.url}/inspect/question", params={"split": "test", "id": 101, "b": served, "k": k}
    ).text
    other = max((s for s in systems if s != served), key=mean)
    assert [c.split('"')[0] for c in only_b.split('data-system="')[1:]] == [other, served]


def test_an_index_of_ones_own_statutes_is_served_with_the_users_ids(workspace, tmp_path, capsys):
    """`lexgraph serve --index DIR`: hits and articles carry the corpus file's ids and heading paths,
    as `lexgraph search --index` shows them; there are no runs to inspect."""
    records = [
        {"id": f"art-{i}", "text": text, "path": ["Code Z", f"Livre {i % 2}"]}
        for i, text in enumerate(["le bail du contrat de louage", "le divorce et l'enfant", "la loi du mariage"] * 3)
    ]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    index = tmp_path / "idx"
    argv = ["index", "--workspace", str(workspace), "--corpus", str(tmp_path / "corpus.jsonl"), "--out", str(index)]
    assert main([*argv, "--systems", "bm25", "dsr", "--device", "cpu"]) == 0
    ws = tmp_path / "ws"
    shutil.copytree(workspace, ws)
    set_serve(ws, systems=["bm25", "dsr"])
    with RunningServer(ws, index) as running:
        url = running.url
        by_id = {r["id"]: r for r in records}
        for system in ("bm25", "dsr"):
            hits = loopback.get(f"{url}/search", params={"q": "le bail", "system": system, "k": 3}).json()["hits"]
            capsys.readouterr()
            cli = ["search", "--workspace", str(ws), "--index", str(index), "--system", system, "--json", "--top", "3"]
            assert main([*cli, "le bail"]) == 0
            assert [h["id"] for h in hits] == [h["id"] for h in json.loads(capsys.readouterr().out)["hits"]]
            assert all(h["id"] in by_id and h["path"] == by_id[h["id"]]["path"] for h in hits), hits
        article = loopback.get(f"{url}/articles/art-4").json()
        assert article["key"] == "art-4" and article["path"] == ["Code Z", "Livre 0"]
        assert article["siblings"] == [r["id"] for r in records if r["path"] == ["Code Z", "Livre 0"]]
        # no dead link (issue 41, item 5b): an index has no questions, so no page links the inspector,
        # and every link there is answers; /inspect itself says why in one line
        status = _crawl(url, ["/", "/?q=le+bail&system=bm25", "/article?id=art-4", "/no-such-page"])
        assert not any(p.startswith("/inspect") for p in status), status
        assert any(p.startswith("/article") for p in status) and "/docs" in status
        assert {p: s for p, s in status.items() if s != 200} == {"/no-such-page": 404}  # the page asked for only
        inspect = loopback.get(f"{url}/inspect")
        assert inspect.status_code == 404 and "this server searches the index idx" in inspect.text


def test_serve_refuses_bad_settings_and_ports_in_one_line(workspace, tmp_path, capsys):
    ws = tmp_path / "ws"
    shutil.copytree(workspace, ws)
    assert main(["serve", "--workspace", str(ws), "--port", "70000"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    set_serve(ws, systems=["bm25", "gdsr"])  # a system the workspace did not build
    assert main(["serve", "--workspace", str(ws), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gdsr" in err, err
    set_serve(ws, systems=["bm25"], max_k=0)
    assert main(["serve", "--workspace", str(ws), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'serve.max_k'" in err, err
    set_serve(ws, max_k=100)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["serve", "--workspace", str(ws), "--port", str(taken.getsockname()[1])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--port" in err, err


def _lexgraph_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("lexgraph")]


def test_serve_says_what_it_loads_before_loading_it(workspace, monkeypatch, caplog):
    """Issue 41, item 5a: `lexgraph serve` printed nothing for 40-137 s before its address. Its first
    line names the systems and the workspace before torch is imported (``resolve_device``, refused
    here, imports it) and before any system loads; then one line per system as it is loaded."""
    import lexgraph.core.config as config
    import lexgraph.serve.catalog as catalog
    from lexgraph.core.errors import LexgraphError

    def refused(*args, **kwargs):
        raise LexgraphError("no device in this test")

    argv = ["serve", "--workspace", str(workspace), "--port", "0", "--device", "cpu"]
    with monkeypatch.context() as patch, caplog.at_level(logging.INFO, logger="lexgraph"):
        patch.setattr(config, "resolve_device", refused)
        assert main(argv) == 2
    (line,) = _lexgraph_lines(caplog)
    assert line.startswith(f"loading {len(SERVED)} system(s) of serve.systems from {str(workspace.resolve())!r}")
    assert line.endswith(f": {', '.join(SERVED)}; the address follows once they are loaded"), line
    real, opened = catalog.open_searcher, []

    def damaged_last(system, *args):
        if len(opened) == len(SERVED) - 1:
            raise LexgraphError(f"{system}: damaged in this test")
        opened.append(system)
        return real(system, *args)

    caplog.clear()
    with monkeypatch.context() as patch, caplog.at_level(logging.INFO, logger="lexgraph"):
        patch.setattr(catalog, "open_searcher", damaged_last)
        assert main(argv) == 2
    lines = _lexgraph_lines(caplog)
    assert lines[0] == line and opened == SERVED[:-1]
    n = len(SERVED)
    loaded = [m.split(" in ")[0] for m in lines[1:] if m.startswith("loaded ")]  # (the admin token's line aside)
    assert loaded == [f"loaded {s} ({i} of {n})" for i, s in enumerate(opened, 1)]


@pytest.mark.slow
def test_the_command_serves_reloads_on_sighup_and_stops_on_sigterm(workspace):
    """`lexgraph serve` as a user runs it: it logs where it listens, SIGHUP loads generation 1,
    SIGTERM ends it with status 0 and no traceback."""
    import signal
    import subprocess
    import sys

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "lexgraph.cli", "serve", "--workspace", str(workspace), "--port", str(port)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"

    def generation() -> int | None:
        try:
            return loopback.get(f"{url}/health", timeout=2).json()["generation"]
        except httpx.HTTPError:
            return None

    try:
        deadline = time.monotonic() + 120
        while generation() != 0:
            assert process.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        process.send_signal(signal.SIGHUP)
        while generation() != 1:
            assert time.monotonic() < deadline, "SIGHUP did not reload"
            time.sleep(0.2)
        assert loopback.get(f"{url}/search", params={"q": "bail"}).json()["generation"] == 1
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
    log = process.stderr.read()
    assert f"on http://127.0.0.1:{port}/" in log and "reloaded: generation 1" in log and "Traceback" not in log, log


def test_the_api_docs_page_loads_nothing_from_elsewhere(running):
    import re

    page = loopback.get(f"{running.url}/docs").text
    sources = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)""", page) + re.findall(r"url:\s*'([^']+)'", page)
    assert sources and all(s.startswith("/") or s.startswith("data:") for s in sources), sources
    for asset in ("/static/swagger/swagger-ui-bundle.js", "/static/swagger/swagger-ui.css", "/openapi.json"):
        assert asset in sources and loopback.get(f"{running.url}{asset}").status_code == 200


def test_an_index_updated_in_place_is_served_after_a_reload_without_dropping_a_request(workspace, tmp_path):
    """Issue 44, item 1: `lexgraph index` over the served index (an amended corpus: one article
    repealed, one added) then `POST /admin/reload`: every request of the clients searching meanwhile
    is answered, from the old index or the new, and the new answers name the new article."""
    records = [
        {"id": f"art-{i}", "text": text, "path": ["Code Z", f"Livre {i % 2}"]}
        for i, text in enumerate(["le bail du contrat de louage", "le divorce et l'enfant", "la loi du mariage"] * 3)
    ]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    index = tmp_path / "idx"
    argv = ["index", "--workspace", str(workspace), "--corpus", str(corpus), "--out", str(index), "--device", "cpu"]
    assert main([*argv, "--systems", "bm25", "dsr"]) == 0
    ws = tmp_path / "ws"
    shutil.copytree(workspace, ws)
    set_serve(ws, systems=["bm25", "dsr"])
    question = {"q": "le bornage du mur mitoyen", "system": "bm25", "k": 3}
    with RunningServer(ws, index) as running:
        before = loopback.get(f"{running.url}/search", params=question).json()["hits"]
        amended = [*records[1:], {"id": "art-new", "text": "le bornage du mur mitoyen", "path": ["Code Z", "Livre 1"]}]

        def update() -> None:  # in place, while the server reads the old one
            corpus.write_text("".join(json.dumps(r) + "\n" for r in amended), encoding="utf-8")
            assert main([*argv, "--systems", "bm25", "dsr"]) == 0

        _reload_under_load(running, question, ("bm25", "dsr"), update)
        after = loopback.get(f"{running.url}/search", params=question).json()["hits"]
        assert "art-new" not in [h["id"] for h in before] and after[0]["id"] == "art-new"
        gone = loopback.get(f"{running.url}/articles/art-0")
        assert gone.status_code == 404

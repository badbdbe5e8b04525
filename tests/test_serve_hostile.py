"""`lexgraph serve` against hostile input, round five (issue 40): the server trusts no one for reaching
loopback (the admin token, the Host and Origin checks, relative redirects, the security headers),
bounds the clients that do not read their answers and the log lines of a resource error, gives a
lone question a fair share against large batches, reaches every id a corpus may hold from its pages
and its API, reads the inspector's runs with the catalogue (a damaged one refuses the reload), and
stops cleanly during a reload. The server runs in a thread on a free port of 127.0.0.1
(tests/helpers_serve.py); the tests that start `lexgraph serve` as a process are slow."""

from __future__ import annotations

import asyncio
import html
import json
import logging
import re
import shutil
import socket
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs, quote, urlsplit

import httpx
import polars as pl
import pytest

from helpers_serve import QUESTIONS, SERVED, RunningServer, loopback, served_workspace


@pytest.fixture(scope="module")
def workspace(tiny_model_dir, tmp_path_factory):
    settings = dict(max_wait_ms=5, header_timeout_s=2, body_timeout_s=2, write_timeout_s=1)
    return served_workspace(tmp_path_factory.mktemp("serve_hostile_ws"), tiny_model_dir, **settings)


@pytest.fixture(scope="module")
def running(workspace):
    with RunningServer(workspace) as server:
        yield server


@pytest.fixture(autouse=True)
def _fresh_log_limiter():
    """Each test sees the first line of each kind of fault (the limiter holds the rest for 10 s)."""
    from lexgraph.serve.security import LIMITER

    LIMITER._last.clear()
    LIMITER._held.clear()


def _one_line_json(response: httpx.Response) -> str:
    assert "\n" not in response.text.strip() and "Traceback" not in response.text, response.text[:300]
    assert response.headers["content-type"].startswith("application/json"), response.headers
    return response.json()["error"]


# --------------------------------------------------------------------------- admin actions


def test_admin_reload_needs_the_token_and_a_request_of_the_servers_own(running, caplog):
    url = f"{running.url}/admin/reload"
    admin = running.admin
    token = admin["authorization"].split()[1]
    before = (running.server.reloads, running.server.catalog.generation)
    cases = [
        ("no token", {}, None, 401),
        ("a wrong token of the right length", {"authorization": "Bearer " + "x" * len(token)}, None, 401),
        ("the token in another scheme", {"authorization": f"Basic {token}"}, None, 401),
        ("the token without its scheme", {"authorization": token}, None, 401),
        ("a cross-site form", {**admin, "content-type": "application/x-www-form-urlencoded"}, b"go=1", 415),
        ("a multipart form", {**admin, "content-type": "multipart/form-data; boundary=x"}, b"--x--\r\n", 415),
        ("a text/plain fetch", {**admin, "content-type": "text/plain"}, b"{}", 415),
        ("a foreign Origin", {**admin, "origin": "http://evil.example"}, None, 403),
        ("a foreign Origin on the same host", {**admin, "origin": "http://127.0.0.1:1"}, None, 403),
        ("Origin null (a sandboxed page)", {**admin, "origin": "null"}, None, 403),
        ("a cross-site fetch", {**admin, "sec-fetch-site": "cross-site"}, None, 403),
        ("a rebinding host", {**admin, "host": f"evil.example:{running.port}"}, None, 421),
    ]
    with caplog.at_level(logging.INFO, logger="lexgraph.serve"):
        for label, headers, body, status in cases:
            response = loopback.post(url, headers=headers, content=body, timeout=30)
            assert response.status_code == status, (label, response.status_code, response.text)
            _one_line_json(response)
        in_url = loopback.post(f"{url}?token={token}", headers=admin, timeout=30)  # a token never travels in a URL
        assert in_url.status_code == 400 and "header" in _one_line_json(in_url)
    assert (running.server.reloads, running.server.catalog.generation) == before  # none of them reloaded
    assert "Traceback" not in caplog.text and token not in caplog.text
    ok = loopback.post(url, headers={**admin, "origin": running.url}, timeout=120)  # the server's own page may
    assert ok.status_code == 200 and ok.json()["generation"] == before[1] + 1, ok.text


def test_reloads_run_one_at_a_time_and_at_most_one_waits(running):
    """Ten reload requests at once: one load runs, one more waits and the other eight join it."""
    server = running.server
    load, state = server.load, {"now": 0, "most": 0, "loads": 0}
    lock = threading.Lock()

    def slow_load(generation):
        with lock:
            state["now"] += 1
            state["most"], state["loads"] = max(state["most"], state["now"]), state["loads"] + 1
        try:
            time.sleep(0.5)
            return load(generation)
        finally:
            with lock:
                state["now"] -= 1

    server.load = slow_load
    try:
        first = server.catalog.generation
        with ThreadPoolExecutor(10) as pool:
            answers = list(
                pool.map(
                    lambda _: loopback.post(f"{running.url}/admin/reload", headers=running.admin, timeout=120),
                    range(10),
                )
            )
    finally:
        del server.load
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert state["most"] == 1 and state["loads"] == 2, state
    assert {a.json()["generation"] for a in answers} <= {first + 1, first + 2}
    assert server.catalog.generation == first + 2


def test_the_admin_token_is_made_once_with_mode_0600_and_one_others_may_read_is_refused(workspace, tmp_path):
    from lexgraph.core.errors import LexgraphError
    from lexgraph.serve.security import admin_token, token_matches, token_path

    served = workspace / "admin-token"  # the fixture's serve.admin_token_file, written at the server's first start
    assert served.is_file() and stat.S_IMODE(served.stat().st_mode) == 0o600
    path = tmp_path / "config" / "lexgraph" / "serve-admin-token"
    token = admin_token(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert admin_token(path) == token and len(token) >= 40  # read again, not made anew
    assert token_matches(f"Bearer {token}", token) and token_matches(f"bearer  {token} ", token)
    assert not any(token_matches(h, token) for h in (None, "", token, f"Bearer {token}x", f"Bearer {token[:-1]}"))
    path.chmod(0o644)
    with pytest.raises(LexgraphError) as refused:
        admin_token(path)
    assert "\n" not in str(refused.value) and "0644" in str(refused.value) and "chmod 600" in str(refused.value)
    path.chmod(0o600)
    path.write_text("short\n")
    with pytest.raises(LexgraphError, match="no usable token"):
        admin_token(path)
    assert token_path(tmp_path, "~/t") == token_path(tmp_path, "~/t").expanduser()
    assert token_path(tmp_path, "rel/t") == tmp_path / "rel" / "t"


# --------------------------------------------------------------------------- Host, Origin, headers


def test_a_request_for_another_host_is_refused_421_with_one_log_line(running, caplog):
    port = running.port
    with caplog.at_level(logging.INFO, logger="lexgraph.serve"):
        for path in ("/health", "/", "/search?q=bail", "/inspect", "/docs", "/articles/1"):
            response = loopback.get(f"{running.url}{path}", headers={"host": f"rebind.evil.example:{port}"})
            assert response.status_code == 421, (path, response.status_code)
            assert "rebind.evil.example" in _one_line_json(response)
        for host in ("", "127.0.0.1:8000@evil", "localhost:port", "[::1", "a b"):
            response = loopback.get(f"{running.url}/health", headers={"host": host})
            assert response.status_code in (400, 421), (host, response.status_code)
    lines = [r.getMessage() for r in caplog.records if r.name == "lexgraph.serve"]
    assert len(lines) == 1 and "rebind.evil.example" in lines[0], lines  # one line, not one per request
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST.", "127.0.0.1"):
        assert loopback.get(f"{running.url}/health", headers={"host": host}).status_code == 200, host


def test_allowed_hosts_are_the_setting_and_the_bound_address():
    from lexgraph.serve.security import allowed_host_names, parse_host

    names = allowed_host_names(["Lexgraph.Internal.", "[::1]", "127.0.0.1"], "10.1.2.3")
    assert names == {"lexgraph.internal", "::1", "127.0.0.1", "10.1.2.3"}
    assert allowed_host_names(["localhost"], "0.0.0.0") == {"localhost"}  # a wildcard is no name
    assert parse_host("LEXGRAPH.internal:443") == "lexgraph.internal" and parse_host("[::1]:80") == "::1"
    assert parse_host("a:b") is None and parse_host("[::1]x") is None and parse_host("") is None


def test_redirects_are_relative_and_never_name_the_host(running):
    port = running.port
    for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
        response = loopback.get(f"{running.url}/search/?q=bail", headers={"host": host}, follow_redirects=False)
        assert response.status_code in (307, 308), response.status_code
        assert response.headers["location"] == "/search?q=bail", response.headers["location"]
    response = loopback.get(f"{running.url}//evil.example/health/", follow_redirects=False)
    location = response.headers.get("location", "/")
    assert location.startswith("/") and not location.startswith("//"), location


def _raw(port: int, data: bytes, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def test_every_response_carries_the_security_headers(running):
    url, port = running.url, running.port
    responses = {
        "JSON": loopback.get(f"{url}/health"),
        "the search page": loopback.get(f"{url}/", params={"q": "bail"}),
        "an article page": loopback.get(f"{url}/article", params={"id": "3"}),
        "the inspector": loopback.get(f"{url}/inspect"),
        "a 404 page": loopback.get(f"{url}/article", params={"id": "nope"}),
        "a 404": loopback.get(f"{url}/nope"),
        "a 405": loopback.delete(f"{url}/search"),
        "a 413": loopback.post(f"{url}/search", content=b"x" * 100_000, headers={"content-type": "application/json"}),
        "a 415": loopback.post(f"{url}/search", content=b"{}", headers={"content-type": "text/plain"}),
        "a 421": loopback.get(f"{url}/health", headers={"host": "evil.example"}),
        "a 401": loopback.post(f"{url}/admin/reload"),
        "a redirect": loopback.get(f"{url}/search/?q=bail"),
        "/docs": loopback.get(f"{url}/docs"),
        "/openapi.json": loopback.get(f"{url}/openapi.json"),
        "Swagger UI's script": loopback.get(f"{url}/static/swagger/swagger-ui-bundle.js"),
    }
    raw = {
        "a 408 (a head that never ends)": _raw(port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"),
        "a 400 (not HTTP)": _raw(port, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 hello\r\n\r\n"),
    }
    found = {label: (r.status_code, r.headers) for label, r in responses.items()}
    found |= {label: (status, headers) for label, (status, headers, _) in raw.items()}
    assert found["a redirect"][0] in (307, 308) and found["a 408 (a head that never ends)"][0] == 408
    for label, (status, headers) in found.items():
        policy = headers.get("content-security-policy", "")
        sources = policy.replace(";", " ").split()
        assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy, (label, status, policy)
        assert not [s for s in sources if s == "*" or "http" in s or "://" in s or s.startswith("*.")], (label, policy)
        assert headers.get("x-content-type-options") == "nosniff", (label, status)
        assert headers.get("x-frame-options") == "DENY", (label, status)
        assert headers.get("referrer-policy") == "no-referrer", (label, status)


def test_the_pages_policy_allows_their_own_style_and_the_docs_their_own_script(running):
    import base64
    import hashlib

    def digest(text: str) -> str:
        return f"'sha256-{base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()}'"

    page = loopback.get(f"{running.url}/")
    (style,) = re.findall(r"<style>(.*?)</style>", page.text, flags=re.S)
    assert digest(style) in page.headers["content-security-policy"] and "<script" not in page.text
    docs = loopback.get(f"{running.url}/docs")
    inline = re.findall(r"<script>(.*?)</script>", docs.text, flags=re.S)
    assert inline and all(digest(s) in docs.headers["content-security-policy"] for s in inline)


# --------------------------------------------------------------------------- slow readers and fair share


def _connections_of(running, ports: set[int]) -> int:
    return sum(1 for c in list(running.uv.server_state.connections) if c.client and c.client[1] in ports)


def test_a_client_that_does_not_read_its_answers_is_dropped_within_the_write_timeout(running, caplog):
    """Three clients pipeline eight POST /search of 64 questions (megabytes of answers) and never
    read: each connection is dropped about serve.write_timeout_s (1 s here) after the server's buffer
    stops draining, with one log line, while a lone search is answered at once."""
    body = json.dumps({"questions": [f"contrat de bail {i} loyer mariage enfant" for i in range(64)], "k": 30})
    body = json.dumps({**json.loads(body), "system": "dsr"}).encode()
    request = (
        b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    one = loopback.post(f"{running.url}/search", content=body, headers={"content-type": "application/json"})
    assert one.status_code == 200 and len(one.content) * 8 > 2_000_000  # more than the socket buffers hold
    sockets = []
    with caplog.at_level(logging.INFO, logger="lexgraph.serve"):
        try:
            for _ in range(3):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.connect(("127.0.0.1", running.port))
                sock.sendall(request * 8)
                sockets.append(sock)
            ports = {s.getsockname()[1] for s in sockets}
            deadline = time.monotonic() + 3
            while _connections_of(running, ports) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            start = time.monotonic()
            lone = loopback.get(f"{running.url}/search", params={"q": "bail", "system": "bm25"}, timeout=10)
            assert lone.status_code == 200 and time.monotonic() - start < 2
            deadline = time.monotonic() + 20
            while _connections_of(running, ports) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert _connections_of(running, ports) == 0, "the connections of clients that read nothing stayed open"
        finally:
            for sock in sockets:
                sock.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "lexgraph.serve"]
    assert len(lines) == 1 and "dropped a connection" in lines[0], lines
    assert "Traceback" not in caplog.text


class _SlowSearcher:
    """A system whose calls take 1 ms a question (on the worker thread) and return each question's
    own hits: ``[question, k]``."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def hits(self, questions, k, as_of=None):
        time.sleep(0.001 * len(questions))
        self.calls.append(list(questions))
        return [[q, k] for q in questions]


def test_a_lone_question_is_searched_in_the_next_batch_not_behind_eight_large_ones():
    from lexgraph.serve.batcher import MicroBatcher

    async def scenario():
        searcher, executor = _SlowSearcher(), ThreadPoolExecutor(1)
        batcher = MicroBatcher(searcher, executor, max_batch=32, max_wait_s=0.002)
        batcher.start()
        large = [[f"L{i}-{j}" for j in range(64)] for i in range(8)]
        tasks = [asyncio.ensure_future(batcher.submit(qs, 100)) for qs in large]
        while not searcher.calls:  # the first batch is searched: the lone question comes behind 512
            await asyncio.sleep(0.001)
        calls_before = len(searcher.calls)
        lone = await batcher.submit(["lone"], 100)
        index = next(i for i, call in enumerate(searcher.calls) if "lone" in call)
        answers = await asyncio.gather(*tasks)
        await batcher.stop()
        executor.shutdown()
        return searcher.calls, calls_before, index, lone, answers, large

    calls, before, index, lone, answers, large = asyncio.run(scenario())
    assert lone == [["lone", 100]]
    assert index - before <= 1, (before, index)  # the next batch, or the one after it at the latest
    assert all(len(call) <= 32 for call in calls)  # no call over serve.max_batch
    for questions, hits in zip(large, answers):  # each large request gets its own hits, in its order
        assert hits == [[q, 100] for q in questions]


def test_the_oldest_request_moves_on_in_every_batch_and_a_lone_one_passes_twenty_large_ones():
    from lexgraph.serve.batcher import SHARE, MicroBatcher

    async def scenario(small: int):
        searcher, executor = _SlowSearcher(), ThreadPoolExecutor(1)
        batcher = MicroBatcher(searcher, executor, max_batch=32, max_wait_s=0.002)
        batcher.start()
        first = asyncio.ensure_future(batcher.submit([f"L{j}" for j in range(64)], 10))
        large = [asyncio.ensure_future(batcher.submit([f"M{i}-{j}" for j in range(64)], 10)) for i in range(20)]
        singles = [asyncio.ensure_future(batcher.submit([f"s{i}"], 10)) for i in range(small)]
        while not searcher.calls:  # the first batch is searched
            await asyncio.sleep(0.001)
        calls_before = len(searcher.calls)
        lone = asyncio.ensure_future(batcher.submit(["lone"], 10))
        await asyncio.gather(first, lone, *large, *singles)
        await batcher.stop()
        executor.shutdown()
        return searcher.calls, calls_before

    calls, _ = asyncio.run(scenario(small=100))  # a hundred single questions come after the large one
    with_first = [i for i, call in enumerate(calls) if any(q.startswith("L") for q in call)]
    assert with_first == list(range(64 // SHARE)), with_first  # the oldest has a share of every batch
    calls, before = asyncio.run(scenario(small=0))  # a lone question behind 21 requests of 64
    lone = next(i for i, call in enumerate(calls) if "lone" in call)
    assert lone - before <= 1, (before, lone)


def test_requests_with_other_ks_and_a_gone_client_are_answered_apart():
    from lexgraph.serve.batcher import MicroBatcher

    async def scenario():
        searcher, executor = _SlowSearcher(), ThreadPoolExecutor(1)
        batcher = MicroBatcher(searcher, executor, max_batch=8, max_wait_s=0.01)
        batcher.start()
        gone = asyncio.ensure_future(batcher.submit([f"g{j}" for j in range(40)], 5))
        a = asyncio.ensure_future(batcher.submit([f"a{j}" for j in range(20)], 5))
        b = asyncio.ensure_future(batcher.submit(["b0", "b1"], 7))
        await asyncio.sleep(0)
        gone.cancel()
        out = await asyncio.gather(a, b)
        await batcher.stop()
        executor.shutdown()
        return out, searcher.calls

    (a, b), calls = asyncio.run(scenario())
    assert a == [[f"a{j}", 5] for j in range(20)] and b == [["b0", 7], ["b1", 7]]
    assert sum(q.startswith("g") for call in calls for q in call) <= 8  # the gone client's rest is not searched


# --------------------------------------------------------------------------- every id reachable

HOSTILE = ["a/b", "..", ".", "%2F", "a b", "?", "#", "é/ü", "日本", "x?y=1&z=#w", "//evil.example", "%", "+", "a%20b"]
QUESTION_KEYS = {101: "q/1", 102: "..", 103: "."}


@pytest.fixture(scope="module")
def keyed(workspace, tmp_path_factory):
    """The tiny workspace as a corpus of one's own whose ids are every character a path treats
    specially, with runs that name them (as evaluate writes them)."""
    from lexgraph.evaluation.trec import read_trec

    root = tmp_path_factory.mktemp("serve_keys") / "ws"
    shutil.copytree(workspace, root)
    ids = sorted(pl.read_parquet(root / "data" / "clean" / "articles.parquet")["id"].to_list())
    names = {i: (HOSTILE[n] if n < len(HOSTILE) else f"art-{i}") for n, i in enumerate(ids)}
    rows = [("article", i, key) for i, key in names.items()] + [("question", q, k) for q, k in QUESTION_KEYS.items()]
    pl.DataFrame(rows, schema={"kind": pl.Utf8, "id": pl.Int64, "key": pl.Utf8}, orient="row").write_parquet(
        root / "data" / "clean" / "keys.parquet"
    )
    for system in SERVED:
        path = root / "data" / "runs" / system / "test.trec"
        run = read_trec(path)
        lines = []
        for qid, ranked in run.items():
            kept = [a for a in ranked if " " not in names[a]]  # TREC ids hold no whitespace
            lines += [f"{QUESTION_KEYS[qid]} Q0 {names[a]} {r} {1 / r:.6f} {system}" for r, a in enumerate(kept, 1)]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root, names


def _links(page: str, within: str) -> list[str]:
    part = page.split(within, 1)[1] if within else page
    return [html.unescape(h) for h in re.findall(r'<a href="([^"]+)"', part)]


def test_every_article_id_is_reachable_from_the_page_and_the_api(keyed):
    root, names = keyed
    with RunningServer(root) as running:
        url = running.url
        page = loopback.get(f"{url}/", params={"q": "bail contrat", "system": "dsr", "k": 30})
        assert page.status_code == 200
        hit = r'<li class="hit" data-id="([^"]*)">\s*<div class="ref">.*?<a href="([^"]+)"'
        hits = re.findall(hit, page.text, re.S)
        assert {html.unescape(i) for i, _ in hits} == set(names.values())  # dsr ranks every article
        hits = [(html.unescape(i), html.unescape(h)) for i, h in hits]
        reached = {key: loopback.get(f"{url}{href}") for key, href in hits}
        shown = {k: r.status_code == 200 and f'data-id="{html.escape(k)}"' in r.text for k, r in reached.items()}
        assert all(shown.values()), [(k, h, reached[k].status_code) for k, h in hits if not shown[k]]
        for key, href in hits:
            parts = urlsplit(href)
            assert parts.path == "/article" and parse_qs(parts.query) == {"id": [key]}, (key, href)
            for sibling in _links(reached[key].text, 'id="siblings"'):
                assert loopback.get(f"{url}{sibling}").status_code == 200, (key, sibling)
        for key in names.values():
            body = loopback.get(f"{url}/articles", params={"id": key}).json()
            assert body["key"] == key and key in body["siblings"], key
            if key not in (".", ".."):  # a dot segment is resolved away by every client before it is sent
                assert loopback.get(f"{url}/articles/{quote(key, safe='')}").json()["key"] == key, key
                assert loopback.get(f"{url}/article/{quote(key, safe='')}").status_code == 200, key
        assert loopback.get(f"{url}/articles/a/b").json()["key"] == "a/b"  # an earlier URL, unencoded
        for missing in ("", "a/", "/a/b"):
            assert loopback.get(f"{url}/articles", params={"id": missing}).status_code == 404, missing


def test_every_question_id_is_reachable_in_the_inspector(keyed):
    root, names = keyed
    with RunningServer(root) as running:
        url = running.url
        listing = loopback.get(f"{url}/inspect", params={"split": "test"})
        assert listing.status_code == 200
        links = _links(listing.text, "<tbody>")
        assert len(links) == len(QUESTIONS)
        for (qid, (text, gold)), href in zip(QUESTIONS.items(), links):
            page = loopback.get(f"{url}{href}{'&' if '?' in href else '?'}a=bm25&b=dsr&k=2")
            assert page.status_code == 200 and html.escape(text) in page.text, (href, page.status_code)
            assert parse_qs(urlsplit(href).query)["id"] == [QUESTION_KEYS[qid]], href
            for missed in re.findall(r'<tr data-id="([^"]*)">', page.text.split('id="missed"')[-1]):
                assert html.unescape(missed) in {names[g] for g in gold}
            for link in _links(page.text, '<div class="columns">'):
                assert loopback.get(f"{url}{link}").status_code == 200, link
        old = loopback.get(f"{url}/inspect/test/q/1")  # the earlier path, with a / in the id
        assert old.status_code == 200 and html.escape(QUESTIONS[101][0]) in old.text


# --------------------------------------------------------------------------- runs read with the catalogue


def test_a_damaged_run_refuses_the_reload_and_a_rewritten_one_is_not_shown_under_the_old_generation(
    workspace, tmp_path, caplog
):
    root = tmp_path / "ws"
    shutil.copytree(workspace, root)
    run = root / "data" / "runs" / "bm25" / "test.trec"
    with RunningServer(root) as running:
        page = f"{running.url}/inspect/question"
        params = {"split": "test", "id": "101", "a": "bm25", "b": "dsr", "k": 5}
        before = loopback.get(page, params=params).text
        good = run.read_text()
        first = good.splitlines()[0].split()
        run.write_text(f"{first[0]} Q0 {first[2]} 1 0.5\n" + good)  # five fields: a damaged run
        with caplog.at_level(logging.INFO, logger="lexgraph.serve"):
            refused = loopback.post(f"{running.url}/admin/reload", headers=running.admin, timeout=120)
        assert refused.status_code == 503 and "test.trec" in _one_line_json(refused)
        lines = [r.getMessage() for r in caplog.records if r.name == "lexgraph.serve"]
        lines = [line for line in lines if not line.startswith("loaded ")]  # the load's progress, one per system
        assert len(lines) == 1 and "reload refused" in lines[0] and "test.trec" in lines[0], lines
        shown = loopback.get(page, params=params)
        assert shown.status_code == 200 and shown.text == before  # the old generation's runs, as loaded
        reversed_run = [line.split() for line in good.splitlines()]
        run.write_text("".join(f"{q} Q0 {d} {100 - int(r)} {s} {t}\n" for q, _, d, r, s, t in reversed_run))
        assert loopback.get(page, params=params).text == before  # read at load, not under the request
    assert "Traceback" not in caplog.text


def test_a_stop_during_a_reload_abandons_it_in_one_log_line(workspace, caplog):
    with RunningServer(workspace) as running:
        server, load, started = running.server, running.server.load, threading.Event()

        def slow_load(generation):  # a load that takes long, as the full sample's 20 s
            started.set()
            for _ in range(300):
                if server.stopping:
                    break
                time.sleep(0.01)
            return load(generation)

        server.load = slow_load
        answer = {}

        def reload():
            answer["response"] = loopback.post(f"{running.url}/admin/reload", headers=running.admin, timeout=60)

        with caplog.at_level(logging.INFO):
            thread = threading.Thread(target=reload)
            thread.start()
            assert started.wait(30)
            start = time.monotonic()
            running.stop()
            stopped_in = time.monotonic() - start
            thread.join(30)
    response = answer["response"]
    assert response.status_code == 503 and "stopping" in _one_line_json(response)
    assert stopped_in < 8, stopped_in  # not held until the graceful shutdown's 10 s run out
    assert "Traceback" not in caplog.text and "CancelledError" not in caplog.text
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("lexgraph") and "reload" in r.getMessage()]
    assert len(lines) == 1 and "abandoned" in lines[0], lines


# --------------------------------------------------------------------------- the command, as a process


def _serve_process(workspace, port: int, limit_files: int | None = None):
    import resource
    import subprocess
    import sys

    def limit():
        if limit_files:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit_files, limit_files))

    command = [sys.executable, "-m", "lexgraph.cli", "serve", "--workspace", str(workspace), "--port", str(port)]
    return subprocess.Popen(command, stderr=subprocess.PIPE, text=True, preexec_fn=limit)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_health(url: str, process, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if loopback.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.2)


@pytest.mark.slow
def test_out_of_file_descriptors_is_one_log_line_per_interval_not_a_flood(workspace):
    """`lexgraph serve` under a limit of 256 open files: 400 clients connect and hold on for 4 s; the
    log has a line or two for the failed accepts (asyncio logs one traceback per failed accept, up to
    the listen backlog at every wake-up: 55,000-80,000 lines in 12 s before), and the server answers
    once they are gone."""
    import signal

    port = _free_port()
    process = _serve_process(workspace, port, limit_files=256)
    url = f"http://127.0.0.1:{port}"
    clients = []
    try:
        _wait_health(url, process)
        for _ in range(400):
            try:
                clients.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError:
                break
        time.sleep(4)
        for sock in clients:
            sock.close()
        clients = []
        deadline = time.monotonic() + 20
        while True:
            try:
                if loopback.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not answer once the clients were gone"
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        for sock in clients:
            sock.close()
        if process.poll() is None:
            process.kill()
    log = process.stderr.read()
    resource_lines = [line for line in log.splitlines() if "accept" in line]
    assert 1 <= len(resource_lines) <= 3 and "Traceback" not in log, log[-3000:]


@pytest.mark.slow
def test_sigterm_during_a_reload_is_a_clean_stop(workspace):
    """SIGTERM while POST /admin/reload loads: the reload is answered 503 in one line of JSON (or 200,
    had it finished first), the log has one line for it and no traceback, and the command ends with 0
    (before: a CancelledError traceback and a 500 once the graceful shutdown's 10 s ran out)."""
    import signal

    port = _free_port()
    process = _serve_process(workspace, port)
    url = f"http://127.0.0.1:{port}"
    answer = {}

    def reload():
        token = (workspace / "admin-token").read_text().strip() if (workspace / "admin-token").is_file() else "none"
        headers = {"authorization": f"Bearer {token}"}
        answer["response"] = loopback.post(f"{url}/admin/reload", headers=headers, timeout=60)

    try:
        _wait_health(url, process)
        thread = threading.Thread(target=reload)
        thread.start()
        time.sleep(0.3)
        start = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        stopped_in = time.monotonic() - start
        thread.join(30)
    finally:
        if process.poll() is None:
            process.kill()
    log = process.stderr.read()
    response = answer["response"]
    assert "Traceback" not in log and "CancelledError" not in log, log[-3000:]
    if response.status_code == 503:
        assert "stopping" in _one_line_json(response) and log.count("reload abandoned") == 1, log[-3000:]
        assert stopped_in < 8, stopped_in
    else:
        assert response.status_code == 200 and "reloaded: generation 1" in log, (response.status_code, log[-3000:])

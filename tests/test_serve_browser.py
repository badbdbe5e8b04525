"""`lexgraph serve`'s pages in a real headless browser (issue 27): Selenium drives Debian's chromium
(/usr/bin/chromium, /usr/bin/chromedriver; `.ci/run` installs them) through the forms and links a
user follows, and checks what it shows against independent references: `lexgraph search --json`
for the hits, data/clean/articles.parquet for an article, the run files for the inspector.

Slow (`pytest -m slow tests/test_serve_browser.py`). The search results, an article and an
inspector question page are saved as PNGs in ``$LEXGRAPH_SCREENSHOTS`` (default: the test's tmp_path).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import polars as pl
import pytest

from helpers_serve import QUESTIONS, SERVED, RunningServer, add_runs, set_serve
from helpers_workspace import build_tiny_workspace
from lexgraph.cli.main import main

pytestmark = pytest.mark.slow

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
QUESTION = "contrat de bail et mariage"  # words of the tiny workspace's vocabulary (conftest.TINY_WORDS)
K = 5


def _path(article_id: int) -> list[str]:
    """A heading path of 2 or 3 levels: the tiny workspace's articles spread over 6 headings."""
    return ["Code A", f"Livre {article_id % 3 + 1}"] + (["Titre I"] if article_id % 2 else [])


@pytest.fixture(scope="module")
def workspace(tiny_model_dir, tmp_path_factory):
    root = build_tiny_workspace(tmp_path_factory.mktemp("serve_browser_ws"), tiny_model_dir)
    articles = root / "data" / "clean" / "articles.parquet"  # one heading for all; give them a hierarchy
    table = pl.read_parquet(articles)
    table.with_columns(pl.Series("path", [_path(i) for i in table["id"]])).write_parquet(articles)
    set_serve(root, systems=SERVED)
    add_runs(root)
    return root


@pytest.fixture(scope="module")
def running(workspace):
    with RunningServer(workspace) as server:
        yield server


def _start_chrome():
    """Headless chromium at 1200x900, or a one-line failure naming what is missing."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.is_file()]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not found: run the project's setup (.ci/run installs Debian's "
            "chromium and chromium-driver: apt-get install -y chromium chromium-driver)",
            pytrace=False,
        )
    from selenium import webdriver
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)  # with the driver's path: Selenium Manager downloads nothing
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=1200,900")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console: violations of the pages' policy
    try:
        driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    except WebDriverException as exc:
        first = (exc.msg or str(exc)).strip().splitlines()[0]
        pytest.fail(f"chromium did not start ({first}): run the project's setup (.ci/run)", pytrace=False)
    driver.set_page_load_timeout(30)
    return driver


@pytest.fixture(scope="module")
def browser():
    """A callable returning the module's chromium, started on first use: a missing browser fails
    the test that asks for it (FAILED, one line), never skips it."""
    started = []

    def get():
        if not started:
            started.append(_start_chrome())
        started[0].set_window_size(1200, 900)
        return started[0]

    yield get
    for driver in started:
        driver.quit()


@pytest.fixture
def shots(tmp_path) -> Path:
    folder = Path(os.environ.get("LEXGRAPH_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _cli_hits(workspace, system, question, k, capsys):
    capsys.readouterr()
    assert main(["search", "--workspace", str(workspace), "--system", system, "--json", "--top", str(k), question]) == 0
    return json.loads(capsys.readouterr().out)["hits"]


def _text(element) -> str:
    return element.get_attribute("textContent")


def _crumbs(element) -> list[str]:
    from selenium.webdriver.common.by import By

    return [_text(li) for li in element.find_elements(By.CSS_SELECTOR, "nav.crumbs ol li")]


def _submit(driver, button) -> None:
    """Click ``button`` and wait for the page it loads: the old page carries a mark the new one
    lacks. (Waiting for the old page's element to go stale fails now and then in chromedriver 150,
    which answers "Node with given id does not belong to the document" while the page changes.)"""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    driver.execute_script("window.lexgraphOldPage = true")
    button.click()
    loaded = "return window.lexgraphOldPage === undefined && document.readyState === 'complete'"
    WebDriverWait(driver, 30, ignored_exceptions=(WebDriverException,)).until(lambda d: d.execute_script(loaded))


def _search(driver, url: str, question: str, system: str, k: int) -> None:
    """Type ``question`` into the search page's form, pick ``system`` and ``k``, and submit it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver.get(f"{url}/")
    box = driver.find_element(By.ID, "q")
    box.clear()
    box.send_keys(question)
    Select(driver.find_element(By.ID, "system")).select_by_value(system)
    depth = driver.find_element(By.ID, "k")
    depth.clear()
    depth.send_keys(str(k))
    _submit(driver, driver.find_element(By.ID, "go"))


@pytest.mark.parametrize("system", SERVED)
def test_the_search_form_shows_lexgraph_searchs_hits_with_crumbs_and_marked_words(
    workspace, running, browser, capsys, shots, system
):
    from selenium.webdriver.common.by import By

    driver = browser()
    _search(driver, running.url, QUESTION, system, K)
    query = parse_qs(urlsplit(driver.current_url).query)
    assert query == {"q": [QUESTION], "system": [system], "k": [str(K)]}, driver.current_url
    want = _cli_hits(workspace, system, QUESTION, K, capsys)
    hits = driver.find_elements(By.CSS_SELECTOR, "ol#hits > li.hit")
    assert want and [h.get_attribute("data-id") for h in hits] == [str(h["id"]) for h in want]
    first, expected = hits[0], want[0]
    link = first.find_element(By.CSS_SELECTOR, ".ref a")
    assert link.text == expected["article"] and _article_id(link.get_attribute("href")) == str(expected["id"])
    assert _crumbs(first) == expected["path"] and len(expected["path"]) >= 2
    words = set(QUESTION.split())
    for hit, reference in zip(hits, want):  # the snippet as the CLI gives it, its highlights in <mark>
        assert _text(hit.find_element(By.CSS_SELECTOR, ".snippet")) == reference["snippet"]
        marks = [_text(m) for m in hit.find_elements(By.CSS_SELECTOR, ".snippet mark")]
        assert marks == [reference["snippet"][a:b] for a, b in reference["highlights"]]
        assert {m.lower() for m in marks} <= words, marks
    assert first.find_elements(By.CSS_SELECTOR, ".snippet mark")  # the best hit matches a word of the question
    assert driver.find_element(By.ID, "q").get_attribute("value") == QUESTION  # the form keeps what was asked
    if system == "bm25":
        driver.save_screenshot(str(shots / "serve-search.png"))


def test_a_hits_link_opens_the_article_with_its_text_path_and_siblings(workspace, running, browser, capsys, shots):
    from selenium.webdriver.common.by import By

    driver = browser()
    _search(driver, running.url, QUESTION, "bm25", K)
    first = _cli_hits(workspace, "bm25", QUESTION, K, capsys)[0]
    _submit(driver, driver.find_element(By.CSS_SELECTOR, "ol#hits > li.hit .ref a"))
    assert _article_id(driver.current_url) == str(first["id"])
    articles = pl.read_parquet(workspace / "data" / "clean" / "articles.parquet").sort("id")
    row = articles.filter(pl.col("id") == first["id"]).row(0, named=True)
    page = driver.find_element(By.CSS_SELECTOR, "article#article")
    assert page.get_attribute("data-id") == str(row["id"])
    assert page.find_element(By.TAG_NAME, "h1").text == first["article"]
    assert _text(page.find_element(By.ID, "text")) == row["article"]
    assert _crumbs(page) == row["path"]
    siblings = driver.find_elements(By.CSS_SELECTOR, "ul#siblings > li")
    same = [str(r["id"]) for r in articles.iter_rows(named=True) if r["path"] == row["path"]]
    hrefs = [_article_id(li.find_element(By.TAG_NAME, "a").get_attribute("href")) for li in siblings]
    assert hrefs == same and 1 < len(same) < len(articles)
    current = driver.find_elements(By.CSS_SELECTOR, "ul#siblings > li.current")
    assert len(current) == 1 and _article_id(current[0].find_element(By.TAG_NAME, "a").get_attribute("href")) == str(
        row["id"]
    )
    driver.save_screenshot(str(shots / "serve-article.png"))


def _missed(runs, a: str, b: str, k: int) -> tuple[int, list[int]]:
    """The first test question with a gold article outside ``a``'s or ``b``'s top ``k``, and those articles."""
    for qid, (_, gold) in QUESTIONS.items():
        missed = [g for g in gold if g not in runs[a][qid][:k] or g not in runs[b][qid][:k]]
        if missed:
            return qid, missed
    raise AssertionError(f"every gold article is in both top {k}s: the test needs a miss")


def test_the_inspector_compares_two_systems_and_ranks_the_missed_gold_articles(workspace, running, browser, shots):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from lexgraph.evaluation.trec import read_trec

    runs = {s: read_trec(workspace / "data" / "runs" / s / "test.trec") for s in SERVED}
    a, b, k = "bm25", "dsr", 3
    qid, missed = _missed(runs, a, b, k)
    gold = QUESTIONS[qid][1]
    driver = browser()
    driver.get(f"{running.url}/inspect?split=test")
    rows = driver.find_elements(By.CSS_SELECTOR, "table#questions tbody tr[data-id]")
    assert [r.get_attribute("data-id") for r in rows] == [str(q) for q in QUESTIONS]
    _submit(driver, driver.find_element(By.CSS_SELECTOR, f'table#questions tr[data-id="{qid}"] a'))
    where = urlsplit(driver.current_url)
    assert where.path == "/inspect/question" and parse_qs(where.query) == {"split": ["test"], "id": [str(qid)]}
    assert driver.find_element(By.ID, "question").text == QUESTIONS[qid][0]
    Select(driver.find_element(By.NAME, "a")).select_by_visible_text(a)
    Select(driver.find_element(By.NAME, "b")).select_by_visible_text(b)
    depth = driver.find_element(By.NAME, "k")
    depth.clear()
    depth.send_keys(str(k))
    _submit(driver, driver.find_element(By.CSS_SELECTOR, "form button[type=submit]"))
    query = parse_qs(urlsplit(driver.current_url).query)
    assert query == {"split": ["test"], "id": [str(qid)], "a": [a], "b": [b], "k": [str(k)]}

    sections = driver.find_elements(By.CSS_SELECTOR, "section[data-system]")
    assert [s.get_attribute("data-system") for s in sections] == [a, b]
    for section, system in zip(sections, (a, b)):
        top = runs[system][qid][:k]
        hits = section.find_elements(By.CSS_SELECTOR, "li.hit")
        assert [h.get_attribute("data-id") for h in hits] == [str(i) for i in top]
        golden = [h.get_attribute("data-id") for h in hits if "gold" in h.get_attribute("class").split()]
        badged = [h.get_attribute("data-id") for h in hits if h.find_elements(By.CSS_SELECTOR, ".badge")]
        assert golden == badged == [str(i) for i in top if i in gold], system

    table = driver.find_elements(By.CSS_SELECTOR, "table#missed tbody tr[data-id]")
    assert [r.get_attribute("data-id") for r in table] == [str(g) for g in missed]
    for row, article in zip(table, missed):
        cells = row.find_elements(By.CSS_SELECTOR, "td.num")
        ranks = [runs[s][qid].index(article) + 1 if article in runs[s][qid] else None for s in (a, b)]
        assert [c.text for c in cells] == [str(r) if r else "not in the run" for r in ranks]
        flagged = ["missed" in c.get_attribute("class").split() for c in cells]
        assert flagged == [r is None or r > k for r in ranks] and any(flagged)
    driver.save_screenshot(str(shots / "serve-inspect.png"))


def test_at_a_phone_width_no_page_overflows_sideways(running, browser):
    from selenium.webdriver.common.by import By

    driver = browser()
    driver.set_window_size(390, 844)
    assert driver.execute_script("return window.innerWidth") == 390  # the viewport is a phone's
    results = "/?" + urlencode({"q": QUESTION, "system": "bm25", "k": 10})
    driver.get(f"{running.url}{results}")
    first = driver.find_element(By.CSS_SELECTOR, "ol#hits > li.hit").get_attribute("data-id")
    for page in (results, f"/article?id={first}", "/inspect?split=test", "/inspect/question?split=test&id=103&k=5"):
        driver.get(f"{running.url}{page}")
        widths = driver.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
        assert widths[0] <= widths[1], (page, widths)


def _article_id(href: str) -> str | None:
    """The id of an article page's URL (``/article?id=…``), None for any other URL."""
    parts = urlsplit(href)
    return parse_qs(parts.query).get("id", [None])[0] if parts.path == "/article" else None


def test_the_pages_and_the_api_docs_work_under_their_content_security_policy(running, browser):
    """The policy names no source outside the server: the page's own style sheet applies (by its
    hash), Swagger UI renders the API from the server's own copy, and the browser reports no
    violation of the policy."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = browser()
    driver.get(f"{running.url}/?q=bail")
    background = driver.execute_script("return getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(250, 251, 252)", background  # base.html's style sheet applied
    driver.get(f"{running.url}/docs")
    try:
        WebDriverWait(driver, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".opblock"))
    except TimeoutException:
        raise AssertionError(f"Swagger UI rendered no operation; the console: {driver.get_log('browser')}") from None
    paths = {e.text for e in driver.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")}
    assert {"/search", "/articles", "/articles/{article_id}", "/health"} <= paths, paths
    violations = [e["message"] for e in driver.get_log("browser") if "Content Security Policy" in e["message"]]
    assert not violations, violations


#: a versioned corpus for the date field: each article a text until 2000-01-01 and another after it
VERSIONED = [
    {"id": f"v-{n}", "text": text, "path": ["Code V"], "valid_from": start, "valid_to": end, "act": f"Loi {start}"}
    for n in range(6)
    for text, start, end in (
        (f"Le contrat de bail numéro {n} et le mariage", "1980-01-01", "2000-01-01"),
        (f"Le divorce et la loi numéro {n} du contrat", "2000-01-01", None),
    )
]


def test_the_date_field_searches_the_law_in_force_on_that_date(workspace, browser, tmp_path, capsys):
    """Over an index of versions the form has a date field; its answer is `lexgraph search --as-of`'s,
    each hit showing its version's dates and act."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    corpus = tmp_path / "versions.jsonl"
    corpus.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in VERSIONED), encoding="utf-8")
    index = tmp_path / "idx"
    args = ["index", "--workspace", str(workspace), "--corpus", str(corpus), "--out", str(index), "--device", "cpu"]
    assert main([*args, "--systems", *SERVED]) == 0  # the systems the workspace serves
    driver = browser()
    with RunningServer(workspace, index) as server:
        for date in ("1990-06-01", "2010-06-01"):
            driver.get(f"{server.url}/")
            driver.find_element(By.ID, "q").send_keys("contrat de bail")
            Select(driver.find_element(By.ID, "system")).select_by_value("bm25")
            field = driver.find_element(By.ID, "as_of")
            assert field.get_attribute("type") == "date"
            driver.execute_script("arguments[0].value = arguments[1]", field, date)
            _submit(driver, driver.find_element(By.ID, "go"))
            assert parse_qs(urlsplit(driver.current_url).query)["as_of"] == [date]
            assert driver.find_element(By.ID, "answered").text == date
            capsys.readouterr()
            cli = ["search", "--workspace", str(workspace), "--index", str(index), "--system", "bm25", "--json"]
            assert main([*cli, "--as-of", date, "--top", str(10), "contrat de bail"]) == 0
            want = json.loads(capsys.readouterr().out)["hits"]
            hits = driver.find_elements(By.CSS_SELECTOR, "ol#hits > li.hit")
            assert want and [h.get_attribute("data-id") for h in hits] == [h["id"] for h in want]
            for hit, reference in zip(hits, want):
                version = reference["version"]
                assert version["valid_from"] <= date < (version["valid_to"] or "9999")
                shown = _text(hit.find_element(By.CSS_SELECTOR, ".version"))
                assert version["valid_from"] in shown and version["act"] in shown


def test_the_missing_browser_message_is_one_line(monkeypatch):
    """Without chromium the browser tests fail (not skip) in one line that says to run the setup."""
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", Path("/nonexistent/chromium"))
    with pytest.raises(pytest.fail.Exception) as failed:
        _start_chrome()
    message = str(failed.value)
    assert "\n" not in message and "/nonexistent/chromium" in message and "setup" in message

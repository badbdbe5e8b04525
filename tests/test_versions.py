"""Versions of articles and the law "as in force on" a date (issue 44, item 2): the corpus reader
takes dated versions of one id and refuses what is not one, `Versions.in_force` agrees with a
day-by-day reading of the intervals and with facts of the Code civil's history (data/history), a
search as of a date equals a brute-force filter of the system's whole ranking, and `lexgraph search
--as-of` over an index of versions ranks, for a dense system, exactly as an index of that date's
law alone. The worked example with the sample's real encoder: tests/test_pipeline.py (slow)."""

from __future__ import annotations

import datetime
import json
import re

import numpy as np
import pytest

from conftest import ROOT
from helpers_workspace import build_tiny_workspace, random_texts
from lexgraph.cli.main import main
from lexgraph.core.errors import DataError

HISTORY = ROOT / "data" / "history" / "code-civil-versions.jsonl.gz"


def _write(path, records) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


def _article(key, text, start=None, end=None, act=None, path=("Livre I",)):
    record = {"id": key, "text": text, "path": list(path)}
    for field, value in (("valid_from", start), ("valid_to", end), ("act", act)):
        if value is not None:
            record[field] = value
    return record


# --- the reader ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        (
            [_article("a", "un texte de loi", "2001-01-01"), _article("a", "un autre texte")],
            r"row 2.*article id 'a' is already used by row 1.*without valid_from or valid_to",
        ),
        ([_article("a", "un texte de loi"), _article("a", "un autre texte")], r"row 2.*already used by row 1"),
        ([_article("a", "un texte de loi", "2001-02-30")], r"row 1.*valid_from '2001-02-30' is no day of the calendar"),
        ([_article("a", "un texte de loi", None, "1er mai")], r"row 1.*valid_to '1er mai' is not a date YYYY-MM-DD"),
        (
            [_article("a", "un texte de loi", "2005-01-01", "2005-01-01")],
            r"row 1.*valid_to 2005-01-01 is not after valid_from 2005-01-01",
        ),
        ([{**_article("a", "un texte de loi", "2005-01-01"), "act": 3.5}], r"row 1.*act is a float"),
    ],
)
def test_the_reader_refuses_what_is_not_a_version_in_one_line(tmp_path, records, expected):
    from lexgraph.data.corpus import read_corpus

    _write(tmp_path / "c.jsonl", records)
    with pytest.raises(DataError) as caught:
        read_corpus(tmp_path / "c.jsonl")
    assert re.search(expected, str(caught.value)), str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_reader_keeps_every_version_and_the_pipeline_refuses_them(tmp_path):
    from lexgraph.data.corpus import read_corpus, read_corpus_source

    records = [
        _article("144", "la femme avant quinze ans", "1970-01-31", "2006-04-05", "origine"),
        _article("144", "avant dix-huit ans", "2006-04-05", None, "Loi n°2006-399"),
        _article("145", "le procureur de la République peut accorder des dispenses"),
    ]
    _write(tmp_path / "c.jsonl", records)
    articles, _, keys, versions = read_corpus(tmp_path / "c.jsonl")
    assert articles["id"].to_list() == [0, 1, 2] and keys == ["144", "144", "145"]
    assert versions == [("1970-01-31", "2006-04-05", "origine"), ("2006-04-05", None, "Loi n°2006-399"), (None,) * 3]
    _write(tmp_path / "q.jsonl", [{"id": "q", "question": "âge ?", "article_ids": ["144"], "split": s} for s in "ab"])
    with pytest.raises(DataError, match=r"article id '144' has several versions.*`lexgraph index`"):
        read_corpus_source(tmp_path / "c.jsonl", tmp_path / "q.jsonl")


# --- in force on a date ----------------------------------------------------------------------------


def _reference_in_force(rows, date: datetime.date) -> set[int]:
    """Day by day, from the definition: of an article's versions whose [from, to) holds ``date``,
    the one that began last (ties: the later record)."""
    best: dict[str, tuple] = {}
    for i, (key, start, end) in enumerate(rows):
        since = datetime.date.fromisoformat(start) if start else datetime.date.min
        until = datetime.date.fromisoformat(end) if end else datetime.date.max
        if since <= date < until and (key not in best or best[key] < (since, i)):
            best[key] = (since, i)
    return {i for _, i in best.values()}


def test_in_force_is_the_definition_day_by_day_on_random_versions():
    from lexgraph.data.keys import keys_table
    from lexgraph.data.versions import versions_of

    rng = np.random.default_rng(5)
    day0 = datetime.date(2000, 1, 1)
    rows = []
    for key in range(40):
        cuts = sorted(rng.choice(400, size=int(rng.integers(1, 5)), replace=False))
        for n, (a, b) in enumerate(zip([None, *cuts], [*cuts, None])):
            if rng.random() < 0.2 and n:
                a = int(a) - int(rng.integers(1, 20))  # shares days with the version before
            start = None if a is None else (day0 + datetime.timedelta(days=int(a))).isoformat()
            end = None if b is None else (day0 + datetime.timedelta(days=int(b))).isoformat()
            if start is None and end is None:
                end = "2000-06-01"
            rows.append((f"k{key}", start, end))
    keys = keys_table([r[0] for r in rows], [], [(r[1], r[2], None) for r in rows])
    versions = versions_of(keys)
    for offset in range(-3, 410, 7):
        date = day0 + datetime.timedelta(days=offset)
        mask = versions.in_force(date.isoformat())
        assert set(np.flatnonzero(mask)) == _reference_in_force(rows, date), date


def test_the_code_civils_history_in_force_on_its_dates():
    """Facts of the history file (../shared's README): art. 144's three texts, art. 143 from
    2013-05-19 (absent between its 1978 repeal and then), and the 1,799 articles in force on
    2020-09-01, fr-codes-2020's Code civil."""
    from lexgraph.data.corpus import read_corpus
    from lexgraph.data.keys import keys_table
    from lexgraph.data.versions import versions_of

    articles, _, keys, versions = read_corpus(HISTORY)
    table = versions_of(keys_table(keys, [], versions))
    text = dict(zip(articles["id"].to_list(), articles["article"].to_list()))

    def in_force(date: str) -> dict[str, str]:
        return {keys[i]: text[i] for i in np.flatnonzero(table.in_force(date))}

    assert in_force("2000-01-01")["144"].startswith("L'homme avant dix-huit ans révolus, la femme avant quinze")
    assert (
        in_force("2010-01-01")["144"] == "L'homme et la femme ne peuvent contracter mariage avant dix-huit ans révolus."
    )
    assert in_force("2013-05-19")["144"] == "Le mariage ne peut être contracté avant dix-huit ans révolus."
    assert "143" not in in_force("2012-01-01") and "143" not in in_force("2013-05-18")
    assert "de même sexe" in in_force("2013-05-19")["143"] and "6-1" in in_force("2014-01-01")
    assert len(in_force("2020-09-01")) == 1799


# --- a search as of a date -------------------------------------------------------------------------


class _Ranking:
    """A system whose ranking of each question is a fixed score row over every article."""

    def __init__(self, scores: np.ndarray) -> None:
        self.scores, self.calls = scores, []

    def search(self, questions, k):
        self.calls.append(k)
        rows = np.array([int(q) for q in questions])
        order = np.lexsort(
            (np.broadcast_to(np.arange(self.scores.shape[1]), self.scores[rows].shape), -self.scores[rows])
        )
        order = order[:, :k]
        return order.astype(np.int64), np.take_along_axis(self.scores[rows], order, axis=1)


@pytest.mark.parametrize(("share", "k"), [(0.5, 5), (0.05, 10), (0.01, 30), (1.0, 7)])
def test_a_search_as_of_a_date_is_the_whole_ranking_filtered(share, k):
    from lexgraph.search.in_force import search_in_force

    rng = np.random.default_rng(int(share * 100) + k)
    scores = rng.random((6, 500)).astype(np.float32)
    mask = rng.random(500) < share
    system = _Ranking(scores)
    ids, got = search_in_force(system, [str(q) for q in range(6)], k, mask)
    for q in range(6):
        brute = [i for i in np.lexsort((np.arange(500), -scores[q])) if mask[i]][:k]
        assert ids[q, : len(brute)].tolist() == brute
        assert (ids[q, len(brute) :] == -1).all() and np.allclose(got[q, : len(brute)], scores[q, brute])
    assert system.calls[-1] <= 500 and (share < 1 or len(system.calls) == 1)


# --- lexgraph index / search --as-of ---------------------------------------------------------------

DATES = ["1990-01-01", "2000-01-01", "2010-01-01"]


@pytest.fixture(scope="module")
def history(tiny_model_dir, tmp_path_factory):
    """A tiny workspace, a corpus of 12 articles with versions over 1990-2010, and its index."""
    root = tmp_path_factory.mktemp("versions")
    (root / "ws").mkdir()
    workspace = build_tiny_workspace(root / "ws", tiny_model_dir)
    texts = iter(random_texts(40, 7))
    records = []
    for n in range(12):
        cuts = [None, "1995-06-01", "2005-03-15", None][: 2 + n % 3]
        for start, end in zip(cuts, cuts[1:] + [None]):
            if start is None and end is None and n % 3:
                continue
            records.append(
                _article(f"art-{n}", next(texts), start or "1980-01-01", end, f"Loi {n}", (f"Livre {n % 2}",))
            )
        if n % 4 == 3:
            records[-1]["valid_to"] = "2008-01-01"  # repealed in 2008
    _write(root / "versions.jsonl", records)
    args = ["index", "--workspace", str(workspace), "--corpus", str(root / "versions.jsonl"), "--device", "cpu"]
    assert main([*args, "--out", str(root / "idx")]) == 0
    return workspace, root, records


def _hits(capsys, workspace, index, system, question, *extra) -> list[dict]:
    capsys.readouterr()
    base = ["search", "--workspace", str(workspace), "--index", str(index), "--system", system, "--json"]
    assert main([*base, "--top", "50", *extra, question]) == 0
    return json.loads(capsys.readouterr().out)["hits"]


def _state(records, date: str) -> list[dict]:
    """The records in force on ``date``: the corpus of that date's law."""
    return [r for r in records if r["valid_from"] <= date < (r.get("valid_to") or "9999")]


@pytest.mark.parametrize("system", ["zeroshot", "dsr"])
def test_as_of_ranks_as_an_index_of_that_dates_law_alone(history, tmp_path, capsys, system):
    workspace, root, records = history
    question = "le bail du contrat et le mariage"
    for date in DATES:
        state = [
            {k: v for k, v in r.items() if k not in ("valid_from", "valid_to", "act")} for r in _state(records, date)
        ]
        _write(tmp_path / f"{date}.jsonl", state)
        alone = tmp_path / f"idx-{date}"
        args = ["index", "--workspace", str(workspace), "--corpus", str(tmp_path / f"{date}.jsonl"), "--device", "cpu"]
        assert main([*args, "--out", str(alone), "--systems", system]) == 0
        expected = _hits(capsys, workspace, alone, system, question)
        got = _hits(capsys, workspace, root / "idx", system, question, "--as-of", date)
        assert [h["id"] for h in got] == [h["id"] for h in expected], date
        assert np.allclose([h["score"] for h in got], [h["score"] for h in expected], atol=1e-5)
        by_key = {r["id"]: r for r in _state(records, date)}
        for hit in got:  # each hit's version is the one in force that day, with its dates and act
            record = by_key[hit["id"]]
            assert hit["version"] == {
                "valid_from": record["valid_from"],
                "valid_to": record.get("valid_to"),
                "act": record["act"],
            }
            assert "version" not in expected[0]


def test_without_a_date_a_search_answers_with_todays_law(history, capsys):
    workspace, root, records = history
    got = _hits(capsys, workspace, root / "idx", "bm25", "bail contrat mariage loyer vente")
    today = datetime.date.today().isoformat()
    in_force = {(r["id"], r["valid_from"]) for r in _state(records, today)}
    assert got and {(h["id"], h["version"]["valid_from"]) for h in got} <= in_force
    assert len({h["id"] for h in got}) == len(got)  # one version of an article at most


def test_a_date_an_index_cannot_answer_is_one_line(history, tmp_path, capsys):
    workspace, root, records = history
    base = ["search", "--workspace", str(workspace), "--system", "bm25", "loi"]
    cases = [
        (["--index", str(root / "idx"), "--as-of", "2010-13-01"], r"--as-of '2010-13-01' is no day of the calendar"),
        (["--as-of", "2010-01-01"], r"--as-of: .* holds no versions of articles"),
    ]
    undated = [
        {k: v for k, v in r.items() if k not in ("valid_from", "valid_to", "act")}
        for r in _state(records, "2010-01-01")
    ]
    _write(tmp_path / "snapshot.jsonl", undated)
    args = ["index", "--workspace", str(workspace), "--corpus", str(tmp_path / "snapshot.jsonl"), "--systems", "bm25"]
    assert main([*args, "--out", str(tmp_path / "snap"), "--snapshot", "2010-01-01"]) == 0
    cases.append(
        (["--index", str(tmp_path / "snap"), "--as-of", "2009-12-31"], r"as in force on 2010-01-01 \(its snapshot")
    )
    for extra, expected in cases:
        capsys.readouterr()
        assert main([*base, *extra]) != 0
        err = capsys.readouterr().err.strip()
        assert re.search(expected, err) and len(err.splitlines()) == 1, err
    capsys.readouterr()
    assert main([*base, "--index", str(tmp_path / "snap"), "--as-of", "2011-01-01", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hits"]
    assert main([*args, "--out", str(tmp_path / "snap2"), "--snapshot", "2010-02-30"]) != 0
    assert "--snapshot '2010-02-30' is no day of the calendar" in capsys.readouterr().err


def test_the_api_and_the_article_take_the_date(history):
    from helpers_serve import RunningServer, loopback, set_serve

    workspace, root, records = history
    set_serve(workspace, systems=["zeroshot", "bm25"])
    with RunningServer(workspace, root / "idx") as running:
        url = running.url
        for date in DATES:
            answer = loopback.get(f"{url}/search", params={"q": "bail contrat mariage", "k": 50, "as_of": date}).json()
            in_force = {(r["id"], r["valid_from"]) for r in _state(records, date)}
            assert answer["as_of"] == date
            assert {(h["id"], h["version"]["valid_from"]) for h in answer["hits"]} == in_force
            body = {"questions": ["bail contrat mariage"], "k": 50, "as_of": date}
            batch = loopback.post(f"{url}/search", json=body).json()
            assert batch["results"][0]["hits"] == answer["hits"] and batch["as_of"] == date
        bad = loopback.get(f"{url}/search", params={"q": "bail", "as_of": "hier"})
        assert bad.status_code == 400 and "as_of 'hier' is not a date YYYY-MM-DD" in bad.json()["error"]
        article = loopback.get(f"{url}/articles/art-1").json()
        versions = [r for r in records if r["id"] == "art-1"]
        assert [v["valid_from"] for v in article["versions"]] == [r["valid_from"] for r in versions]
        assert article["version"]["valid_from"] == versions[-1]["valid_from"]
        page = loopback.get(f"{url}/", params={"q": "bail contrat", "as_of": "1990-01-01"}).text
        assert 'type="date" name="as_of"' in page and "in force from 1980-01-01 to 1995-06-01" in page

"""`lexgraph search` (batch, one question, interactive) and `lexgraph regress` on a tiny workspace."""

from __future__ import annotations

import io
import json

import polars as pl
import pytest

from lexgraph.cli.main import main
from lexgraph.evaluation.trec import read_trec
from lexgraph.search.bm25 import BM25

ARTICLES = {
    1: "Le propriétaire du mur mitoyen paie la réparation du mur.",
    2: "Le bail est un contrat de louage de choses.",
    3: "Le locataire paie le loyer au bailleur.",
}


@pytest.fixture
def ws(tmp_path):
    (tmp_path / "data" / "clean").mkdir(parents=True)
    pl.DataFrame(
        {
            "id": list(ARTICLES),
            "article": list(ARTICLES.values()),
            "reference": [f"Art. {i}" for i in ARTICLES],
            "path": [["Code A", "Livre 1"]] * 3,
            "heading_id": [1, 1, 1],
        }
    ).write_parquet(tmp_path / "data" / "clean" / "articles.parquet")
    BM25(k1=1.2, b=0.75).fit_texts(list(ARTICLES.values()), list(ARTICLES)).save(tmp_path / "models" / "bm25")
    return tmp_path


def test_batch_mode_writes_trec_run(ws):
    qfile = ws / "q.jsonl"
    qfile.write_text(
        json.dumps({"id": "a", "question": "Qui paie le loyer ?"})
        + "\n"
        + json.dumps({"id": 7, "question": "réparation du mur mitoyen"})
        + "\n",
        encoding="utf-8",
    )
    run = ws / "out.trec"
    assert (
        main(
            [
                "search",
                "--system",
                "bm25",
                "--questions",
                str(qfile),
                "--run",
                str(run),
                "--k",
                "2",
                "--workspace",
                str(ws),
            ]
        )
        == 0
    )
    ranked = read_trec(run, qid_type=str)
    assert ranked["a"][0] == 3 and ranked["7"][0] == 1
    assert all(len(v) <= 2 for v in ranked.values())
    line = run.read_text(encoding="utf-8").splitlines()[0].split()
    assert line[:4] == ["a", "Q0", "3", "1"] and line[5] == "bm25"


def test_batch_mode_bad_questions_file(ws, capsys):
    qfile = ws / "q.jsonl"
    qfile.write_text('{"id": 1, "question": "ok ?"}\n{"question": "no id"}\n', encoding="utf-8")
    rc = main(["search", "--questions", str(qfile), "--run", str(ws / "r.trec"), "--workspace", str(ws)])
    assert rc == 2
    assert "q.jsonl, row 2: expected an object with keys 'id' and 'question'" in capsys.readouterr().err
    assert not (ws / "r.trec").exists()


def test_unknown_system_and_missing_models(ws, tmp_path_factory, capsys):
    assert main(["search", "--system", "tfidf", "x", "--workspace", str(ws)]) == 2
    assert "unknown system 'tfidf'" in capsys.readouterr().err
    empty = tmp_path_factory.mktemp("empty")
    assert main(["search", "--system", "bm25", "x", "--workspace", str(empty)]) == 2
    assert f"({str(empty.resolve())!r}) is not a lexgraph workspace" in capsys.readouterr().err
    (empty / "dvc.yaml").write_text("stages: {}\n", encoding="utf-8")  # a workspace, before `dvc repro`
    assert main(["search", "--system", "bm25", "x", "--workspace", str(empty)]) == 2
    assert "run `dvc repro bm25` first" in capsys.readouterr().err


def test_one_question_prints_reference_path_and_snippet(ws, capsys):
    # article 2 matches "bail"; article 1 only "paie", in 2 of the 3 articles: Robertson's idf ln(1.5/2.5) < 0,
    # floored to ln(1 + 0.5/3.5) = ln(8/7) > 0 (issue 41), so article 1 is found too, last
    assert (
        main(
            [
                "search",
                "--system",
                "bm25",
                "Qui paie le loyer du bail au bailleur ?",
                "--top",
                "3",
                "--workspace",
                str(ws),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "  1. Art. 3   (score " in out and "Code A › Livre 1" in out and "Le locataire **paie** le **loyer**" in out
    assert out.index("  1. Art. 3") < out.index("  2. Art. 2") < out.index("  3. Art. 1") and "  4. " not in out


def test_interactive_mode_reads_until_empty_line(ws, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("contrat de bail\n\n"))
    assert main(["search", "--system", "bm25", "--top", "1", "--workspace", str(ws)]) == 0
    out = capsys.readouterr().out
    assert "1. Art. 2" in out


HIT_KEYS = {"rank", "id", "article", "reference", "path", "score", "snippet", "highlights", "matched_terms"}


def _check_record(record: dict, question: str, qid, top: int) -> list[dict]:
    assert set(record) == {"id", "question", "system", "hits"}
    assert record["id"] == qid and record["question"] == question and record["system"] == "bm25"
    hits = record["hits"]
    assert 0 < len(hits) <= top
    for hit in hits:
        assert set(hit) == HIT_KEYS
        assert isinstance(hit["id"], int) and isinstance(hit["score"], float) and isinstance(hit["path"], list)
        assert hit["reference"] == f"Art. {hit['id']}" and hit["article"] == hit["reference"]
        assert all(hit["snippet"][s:e] for s, e in hit["highlights"])
    assert [h["rank"] for h in hits] == list(range(1, len(hits) + 1))
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    return hits


def test_one_question_as_json(ws, capsys):
    question = "Qui paie la réparation des murs ?"
    assert main(["search", question, "--json", "--top", "3", "--workspace", str(ws)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    hits = _check_record(json.loads(lines[0]), question, None, 3)
    assert hits[0]["id"] == 1 and hits[0]["matched_terms"] == ["paie", "réparation", "murs"]
    assert [hits[0]["snippet"][s:e] for s, e in hits[0]["highlights"]] == ["mur", "paie", "réparation", "mur"]
    assert hits[0]["path"] == ["Code A", "Livre 1"]


def test_batch_as_json_lines_with_and_without_a_run(ws, capsys):
    qfile = ws / "q.jsonl"
    qfile.write_text(
        json.dumps({"id": "a", "question": "Qui paie le loyer ?"})
        + "\n"
        + json.dumps({"id": 7, "question": "xyzzy"})
        + "\n",
        encoding="utf-8",
    )
    assert main(["search", "--questions", str(qfile), "--json", "--top", "2", "--workspace", str(ws)]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in records] == ["a", "7"] and records[1]["hits"] == []
    assert _check_record(records[0], "Qui paie le loyer ?", "a", 2)[0]["id"] == 3
    run = ws / "out.trec"
    assert (
        main(
            [
                "search",
                "--questions",
                str(qfile),
                "--json",
                "--top",
                "1",
                "--run",
                str(run),
                "--k",
                "3",
                "--workspace",
                str(ws),
            ]
        )
        == 0
    )
    assert [len(json.loads(line)["hits"]) for line in capsys.readouterr().out.splitlines()] == [1, 0]
    assert len(read_trec(run, qid_type=str)["a"]) == 3


def test_interactive_json_prints_only_json_lines(ws, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("contrat de bail\nloyer\n\n"))
    assert main(["search", "--json", "--top", "1", "--workspace", str(ws)]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["question"], r["hits"][0]["id"]) for r in records] == [("contrat de bail", 2), ("loyer", 3)]


def test_questions_need_run_or_json(ws, capsys):
    (ws / "q.jsonl").write_text('{"id": 1, "question": "loyer"}\n', encoding="utf-8")
    assert main(["search", "--questions", str(ws / "q.jsonl"), "--workspace", str(ws)]) == 2
    assert "--questions needs --run OUT.trec, --json or both" in capsys.readouterr().err


def test_regress(tmp_path, capsys):
    (tmp_path / "bm25.json").write_text(json.dumps({"test": {"recall@100": 0.40, "map": 0.10}}))
    spec = tmp_path / "exp.yaml"
    spec.write_text("tolerance: 0.01\nsystems:\n  bm25:\n    test: {recall@100: 0.405, map: 0.12}\n")
    assert main(["regress", "--expected", str(spec), "--metrics-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "bm25/test/map: 0.1000, expected 0.1200" in err and "recall@100" not in err


def test_regress_ends_with_the_count_of_checks_that_pass(tmp_path, capsys):
    """Whatever the outcome, `lexgraph regress` ends with "N of M checks pass": one check per
    metric of each system and split in the expected file (a missing metrics file fails all of
    its system's checks)."""
    (tmp_path / "bm25.json").write_text(json.dumps({"dev": {"map": 0.2}, "test": {"recall@100": 0.40, "map": 0.10}}))
    spec = tmp_path / "exp.yaml"
    spec.write_text(
        "tolerance: 0.01\nsystems:\n  bm25:\n    dev: {map: 0.2}\n    test: {recall@100: 0.405, map: 0.12}\n"
        "  dsr:\n    test: {recall@100: 0.5, map: 0.2}\n"
    )
    args = ["regress", "--expected", str(spec), "--metrics-dir", str(tmp_path)]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "2 of 5 checks pass"
    spec.write_text("tolerance: 0.01\nsystems:\n  bm25:\n    dev: {map: 0.2}\n    test: {recall@100: 0.405}\n")
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "2 of 2 checks pass"


def test_regress_update_rewrites_values_and_keeps_tolerances(tmp_path, capsys):
    (tmp_path / "bm25.json").write_text(json.dumps({"test": {"recall@100": 0.40, "map": 0.10, "mrr@10": 0.3}}))
    (tmp_path / "dsr.json").write_text(json.dumps({"dev": {"recall@100": 0.7}, "test": {"recall@100": 0.72}}))
    (tmp_path / "train_dsr.json").write_text(json.dumps({"best_epoch": 3, "dev": {"map": 0.2}}))  # not a system
    spec = tmp_path / "exp.yaml"
    spec.write_text(
        "# header\ntolerance: 0.01\nsystems:\n  bm25:\n    test: {recall@100: 0.3, map: 0.12}\n"
        "  dsr:\n    tolerance: 0.03\n    test: {recall@100: 0.5}\n"
    )
    assert main(["regress", "--update", "--expected", str(spec), "--metrics-dir", str(tmp_path)]) == 0
    text = spec.read_text()
    assert text.startswith("# header\ntolerance: 0.01\n")
    import yaml

    got = yaml.safe_load(text)
    assert got["systems"] == {
        "bm25": {"test": {"recall@100": 0.40, "map": 0.10}},
        "dsr": {"tolerance": 0.03, "dev": {"recall@100": 0.7}, "test": {"recall@100": 0.72}},
    }
    assert main(["regress", "--expected", str(spec), "--metrics-dir", str(tmp_path)]) == 0


def test_hits_stop_at_the_last_article_that_matches(ws, capsys, caplog, monkeypatch):
    """`--top 5000` on a question that one article of three matches: one hit, not the whole corpus
    with the rest at score 0 and no matched term (issue 18); the same rule for one question, the
    interactive mode and batch JSON (lexgraph.text.display.ranked_entries), and a log line says so."""
    import logging

    with caplog.at_level(logging.INFO, logger="lexgraph"):
        assert main(["search", "loyer", "--top", "5000", "--json", "--workspace", str(ws)]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert [(h["id"], h["matched_terms"]) for h in hits] == [(3, ["loyer"])] and hits[0]["score"] > 0
    assert "only 1 article(s) match any term of the question (the others score 0)" in caplog.text

    assert main(["search", "loyer", "--top", "5000", "--workspace", str(ws)]) == 0
    out = capsys.readouterr().out
    assert "  1. Art. 3" in out and "  2. " not in out

    monkeypatch.setattr("sys.stdin", io.StringIO("loyer\ncontrat de bail\n\n"))
    assert main(["search", "--json", "--top", "50", "--workspace", str(ws)]) == 0
    assert [[h["id"] for h in json.loads(line)["hits"]] for line in capsys.readouterr().out.splitlines()] == [[3], [2]]

    qfile = ws / "q.jsonl"
    qfile.write_text(
        json.dumps({"id": "a", "question": "loyer"})
        + "\n"
        + json.dumps({"id": "b", "question": "réparation du mur ou loyer"})
        + "\n",
        encoding="utf-8",
    )
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lexgraph"):
        assert main(["search", "--questions", str(qfile), "--json", "--top", "50", "--workspace", str(ws)]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [[h["id"] for h in r["hits"]] for r in records] == [[3], [1, 3]]
    assert all(h["score"] > 0 and h["matched_terms"] for r in records for h in r["hits"])
    assert (
        "fewer than --top 50 articles match any term of 2 question(s)" in caplog.text and "(ids: a, b;" in caplog.text
    )


def test_run_keeps_its_depth(ws):
    """The TREC run is ranked to depth --k as the evaluate stage writes its runs (the articles
    scoring 0 after the matching ones included): byte for byte what it was before issue 18."""
    qfile = ws / "q.jsonl"
    qfile.write_text(json.dumps({"id": "a", "question": "loyer"}) + "\n", encoding="utf-8")
    assert (
        main(["search", "--questions", str(qfile), "--run", str(ws / "r.trec"), "--k", "3", "--workspace", str(ws)])
        == 0
    )
    assert (ws / "r.trec").read_text(encoding="utf-8") == (
        "a Q0 3 1 0.542532 bm25\na Q0 1 2 0.000000 bm25\na Q0 2 3 0.000000 bm25\n"
    )


# ---------------------------------------------------------------------------
# issue 41: a term in every article of one's own corpus still finds them
# ---------------------------------------------------------------------------

SALARIE = [  # a toy corpus of one's own: "salarié" in all three articles
    "Le salarié a droit à un congé payé de deux jours et demi par mois de travail effectif.",
    "Le contrat de travail du salarié est exécuté de bonne foi par les parties.",
    "L'employeur verse au salarié une indemnité de licenciement calculée sur son ancienneté.",
]


def _index_salarie(tmp_path, **bm25):
    """A BM25-only workspace (params.yaml, the three-article table, ``models/bm25`` built with
    ``bm25``'s settings) and ``lexgraph index --systems bm25`` of :data:`SALARIE` with it."""
    import shutil

    from conftest import ROOT

    ws = tmp_path / "ws"
    (ws / "data" / "clean").mkdir(parents=True)
    shutil.copy(ROOT / "params.yaml", ws / "params.yaml")
    pl.DataFrame(
        {"id": list(ARTICLES), "article": list(ARTICLES.values()), "reference": [f"Art. {i}" for i in ARTICLES]}
    ).write_parquet(ws / "data" / "clean" / "articles.parquet")
    BM25(k1=1.2, b=0.75, **bm25).fit_texts(list(ARTICLES.values()), list(ARTICLES)).save(ws / "models" / "bm25")
    corpus = tmp_path / "travail.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"id": f"ct-{i}", "text": text, "path": ["Code du travail"]}, ensure_ascii=False) + "\n"
            for i, text in enumerate(SALARIE)
        ),
        encoding="utf-8",
    )
    index = tmp_path / "index"
    args = ["index", "--workspace", str(ws), "--corpus", str(corpus), "--out", str(index), "--systems", "bm25"]
    assert main([*args, "--device", "cpu"]) == 0
    return ws, index


def test_a_term_in_every_article_of_ones_own_corpus_finds_them_all(tmp_path, capsys):
    """`lexgraph search --index` finds the three articles for "salarié", scored by the formula: idf
    max(ln((N - df + 0.5) / (df + 0.5)), ln(1 + 0.5 / (N + 0.5))) = ln(1 + 0.5 / 3.5) at N = df = 3."""
    import math

    from lexgraph.text.analyzer import FrenchAnalyzer

    ws, index = _index_salarie(tmp_path)
    capsys.readouterr()
    assert main(["search", "--workspace", str(ws), "--index", str(index), "salarié"]) == 0
    out = capsys.readouterr().out
    assert "no results" not in out and all(f"id ct-{i})" in out for i in range(3)) and "  3. " in out
    assert main(["search", "--workspace", str(ws), "--index", str(index), "--json", "salarié"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    lengths = [len(FrenchAnalyzer()(text)) for text in SALARIE]
    avgdl, idf = sum(lengths) / 3, math.log(1 + 0.5 / 3.5)
    by_hand = {f"ct-{i}": idf * 2.2 / (1 + 1.2 * (0.25 + 0.75 * dl / avgdl)) for i, dl in enumerate(lengths)}
    assert {h["id"]: h["score"] for h in hits} == pytest.approx(by_hand, abs=1e-6)


def test_with_the_floor_0_of_before_issue_41_no_results_say_why(tmp_path, capsys, caplog):
    """A workspace BM25 with idf_floor 0.0 (the default before issue 41): the index warns, and a
    question of only common terms gets no results with the true reason, never "no article matches"."""
    import logging

    with caplog.at_level(logging.WARNING):
        ws, index = _index_salarie(tmp_path, idf_floor=0.0)
    assert "get idf 0 under the workspace BM25's idf_floor 0.0" in caplog.text
    capsys.readouterr()
    assert main(["search", "--workspace", str(ws), "--index", str(index), "salarié"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "no results: the question's terms that the articles hold are each in at least half of the 3" in out
    assert "idf_floor 0.0" in out and "no article matches" not in out
    questions = tmp_path / "q.jsonl"
    questions.write_text(
        json.dumps({"id": "s", "question": "salarié"}) + "\n" + json.dumps({"id": "z", "question": "xyzzy"}) + "\n",
        encoding="utf-8",
    )
    caplog.clear()
    search = ["search", "--workspace", str(ws), "--index", str(index), "--questions", str(questions)]
    with caplog.at_level(logging.WARNING):
        assert main([*search, "--run", str(tmp_path / "r.trec")]) == 0
    warnings = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "no results" in r.getMessage()
    ]
    assert len(warnings) == 2
    assert "(ids: s): the question's terms that the articles hold" in warnings[0]
    assert "(ids: z): no article matches any term of the question" in warnings[1]

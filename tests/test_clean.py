"""clean: text normalisation on hand-made dirty articles, hierarchy table, question checks."""

from __future__ import annotations

import csv
import logging
import shutil
import subprocess
import sys

import polars as pl
import pytest

from conftest import ROOT, section, write_params
from lexgraph.core.errors import DataError
from lexgraph.data.clean import clean, clean_text
from lexgraph.data.fetch import FetchConfig, fetch
from lexgraph.data.schema import ARTICLE_COLUMNS


def raw_articles(rows):
    data = []
    for r in rows:
        rec = {c: None for c in ARTICLE_COLUMNS}
        rec.update(r)
        data.append(rec)
    return pl.DataFrame(data, schema={c: (pl.Int64 if c == "id" else pl.Utf8) for c in ARTICLE_COLUMNS})


def raw_questions(rows):
    return pl.DataFrame(
        [{"id": i, "question": q, "article_ids": a, "split": s} for i, q, a, s in rows],
        schema={"id": pl.Int64, "question": pl.Utf8, "article_ids": pl.Utf8, "split": pl.Utf8},
    )


def test_unwraps_hard_wrapped_text_and_keeps_paragraphs():
    text = "Le propriétaire d'un mur\nmitoyen peut le faire\r\nexhausser.\n\n  Il doit payer\tseul la dépense.\n"
    assert clean_text(text) == (
        "Le propriétaire d'un mur mitoyen peut le faire exhausser.\nIl doit payer seul la dépense.",
        0,
    )


def test_unicode_nfc_and_spaces():
    decomposed = "Le pre\u0301avis\u00a0est d\u2019un mois."  # e + combining acute, NBSP
    cleaned, _ = clean_text(decomposed)
    assert cleaned == "Le préavis est d\u2019un mois." and cleaned == __import__("unicodedata").normalize(
        "NFC", cleaned
    )


def test_removes_amendment_artefacts():
    text = (
        "[1 Le bailleur est tenu de délivrer le bien loué.]1 "
        "<L 2006-05-10/33, art. 3, 004; En vigueur : 01-07-2006>\n\n"
        "1° Alinéa abrogé ;\n\n2° Il entretient la chose."
    )
    cleaned, n = clean_text(text)
    assert cleaned == "Le bailleur est tenu de délivrer le bien loué.\n2° Il entretient la chose."
    assert n == 4


def test_drops_empty_repealed_and_short_articles_with_reasons():
    raw = raw_articles(
        [
            {"id": 1, "article": "Le preneur paie le loyer aux termes convenus.", "code": "Code A"},
            {"id": 2, "article": "   \n ", "code": "Code A"},
            {"id": 3, "article": "(Abrogé)", "code": "Code A"},
            {"id": 4, "article": "Abrogé par la loi du 3 mai 2003.", "code": "Code A"},
            {"id": 5, "article": "Voir ci-dessus.", "code": "Code A"},
            {"id": 6, "article": "Le bailleur délivre la chose louée.", "code": "Code A"},  # corpus minimum: 2
        ]
    )
    q = raw_questions(
        [
            (1, "Quand payer ?", "1", "train"),
            (2, "Article abrogé ?", "3,1", "test"),
            (3, "Vide ?", "2", "dev"),
            (4, "Payer quand ?", "1", "dev"),
        ]
    )  # a split that loses every question is an error
    # test question 2 loses gold article 3: allowed here (clean.allow_test_changes), an error by default
    articles, _, questions, stats = clean(
        raw, q, section("clean", min_words=3, drop_repealed=True, allow_test_changes=True)
    )
    assert articles["id"].to_list() == [1, 6]
    assert stats["articles"]["dropped"] == {"empty": 1, "repealed": 2, "too_short": 1}
    # gold ids pointing at dropped articles are removed; questions left without gold dropped
    assert questions.filter(pl.col("id") == 2)["article_ids"].to_list() == [[1]]
    assert 3 not in questions["id"].to_list()
    assert stats["questions"]["gold_ids_removed"] == 2
    assert stats["questions"]["by_split"]["dev"] == {"in": 2, "out": 1, "dropped_no_gold": 1}


def test_hierarchy_nodes_are_unique_by_full_path_and_handle_missing_levels():
    raw = raw_articles(
        [
            {
                "id": 1,
                "article": "Texte un de l'article.",
                "code": "Code A",
                "book": "Livre 1",
                "chapter": "Dispositions générales",
            },
            {
                "id": 2,
                "article": "Texte deux de l'article.",
                "code": "Code A",
                "book": "Livre 2",
                "chapter": "Dispositions générales",
            },
            {"id": 3, "article": "Texte trois de l'article.", "code": "Code B"},
            {"id": 4, "article": "Texte quatre de l'article."},
        ]
    )
    q = raw_questions([(1, "Question ?", "1", "train")])
    articles, headings, _, _ = clean(raw, q, section("clean", min_words=1))
    rows = headings.select("heading_id", "parent_id", "level", "level_name", "path").rows()
    assert rows == [
        (0, -1, 1, "code", ["Code A"]),
        (1, 0, 2, "book", ["Code A", "Livre 1"]),
        (2, 1, 3, "chapter", ["Code A", "Livre 1", "Dispositions générales"]),
        (3, 0, 2, "book", ["Code A", "Livre 2"]),
        (4, 3, 3, "chapter", ["Code A", "Livre 2", "Dispositions générales"]),
        (5, -1, 1, "code", ["Code B"]),
    ]
    assert articles["heading_id"].to_list() == [2, 4, 5, -1]


def test_parses_article_ids_to_unique_int_lists():
    raw = raw_articles([{"id": i, "article": f"Article numéro {i} du code."} for i in (1, 2, 3)])
    q = raw_questions([(1, "  Une   question ? ", " 3, 1,3 ", "train")])
    _, _, questions, _ = clean(raw, q, section("clean"))
    assert questions.row(0, named=True)["article_ids"] == [3, 1]
    assert questions.row(0, named=True)["question"] == "Une question ?"


def test_dangling_article_id_names_row_and_column():
    raw = raw_articles([{"id": i, "article": f"Article numéro {i} du code."} for i in (1, 2)])
    q = raw_questions([(1, "Q1 ?", "1", "train"), (2, "Q2 ?", "2,77", "test")])
    with pytest.raises(
        DataError, match=r"questions, row 2, column 'article_ids': question 2 cites article id\(s\) \[77\]"
    ):
        clean(raw, q, section("clean"), ("articles", "questions"))


def test_duplicate_article_id():
    raw = raw_articles([{"id": 1, "article": "Un article complet."}, {"id": 1, "article": "Un autre article."}])
    with pytest.raises(DataError, match=r"row 2, column 'id': duplicate article id 1"):
        clean(raw, raw_questions([(1, "Q ?", "1", "train")]), section("clean"))


def test_duplicate_question_id_across_human_splits():
    raw = raw_articles([{"id": 1, "article": "Un article complet."}])
    with pytest.raises(DataError, match=r"row 2, column 'id': duplicate question id 5"):
        clean(raw, raw_questions([(5, "Q ?", "1", "train"), (5, "Q bis ?", "1", "test")]), section("clean"))


def test_synthetic_ids_colliding_with_human_ones_are_renumbered(bsard_dir):
    articles, questions, _ = fetch(
        FetchConfig.from_params(section("fetch", source="local", local_dir=str(bsard_dir), synthetic=True)), seed=1
    )
    _, _, clean_q, _ = clean(articles, questions, section("clean"))
    assert clean_q["id"].is_unique().all()
    synthetic = clean_q.filter(pl.col("split") == "synthetic")
    assert synthetic["id"].to_list() == [1 + 9, 2 + 9]  # offset = max raw id (8) + 1


# ----------------------------------------------------------------------------- issue 18: the test set, leaks, ids

CHANGING = [
    (1, "Quand payer le loyer ?", "1", "train"),
    (2, "Et le bail ?", "3", "dev"),
    (7, "Qui paie ?", "1", "test"),
    (8, "Que dit l'article vide ?", "2", "test"),
    (9, "Un bail court ?", "3,4", "test"),
]


def changing_articles():
    return raw_articles(
        [
            {"id": 1, "article": "Le preneur paie le loyer aux termes convenus."},
            {"id": 2, "article": "  \n "},
            {"id": 3, "article": "Le bail est un contrat de louage."},
            {"id": 4, "article": "Voir ci-dessus."},
        ]
    )


def test_cleaning_that_changes_the_test_set_names_the_questions_the_articles_and_the_rules():
    """Test question 8 loses its only gold article (empty), question 9 one of two (too short):
    before, 8 left the test set silently and 9's gold shrank."""
    with pytest.raises(DataError) as err:
        clean(changing_articles(), raw_questions(CHANGING), section("clean"), ("articles", "questions"))
    assert str(err.value) == (
        "questions: cleaning would change the test set: test question 8 (row 4) would be dropped, losing gold "
        "article(s) 2 (empty after cleaning); test question 9 (row 5) would lose gold article(s) 4 (shorter than "
        "'clean.min_words' = 3 words); expected every test question kept with all its gold articles: fix those "
        "articles in the source corpus, or set 'clean.allow_test_changes' to true in params.yaml"
    )


def test_allowed_test_set_changes_are_logged(caplog):
    with caplog.at_level(logging.WARNING, logger="lexgraph.data.clean"):
        _, _, questions, stats = clean(
            changing_articles(), raw_questions(CHANGING), section("clean", allow_test_changes=True)
        )
    assert questions.filter(pl.col("split") == "test")["id"].to_list() == [7, 9]
    assert stats["questions"]["by_split"]["test"] == {"in": 3, "out": 2, "dropped_no_gold": 1}
    assert "test question 8 (row 4) would be dropped, losing gold article(s) 2 (empty after cleaning)" in caplog.text


def test_train_and_dev_questions_may_still_lose_gold_articles():
    rows = [
        (1, "Quand payer le loyer ?", "1,2", "train"),
        (2, "Vide ?", "2", "dev"),
        (3, "Et le bail ?", "3", "dev"),
        (7, "Qui paie ?", "1", "test"),
    ]
    _, _, questions, stats = clean(changing_articles(), raw_questions(rows), section("clean"))
    assert questions["id"].to_list() == [1, 3, 7] and stats["questions"]["gold_ids_removed"] == 2


def emptied_sample(tmp_path, article_id: int = 2163):
    """A copy of the embedded sample with one article's text emptied."""
    sample = tmp_path / "sample"
    shutil.copytree(ROOT / "data/sample", sample)
    path = sample / "articles.csv"
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f))
    for row in rows[1:]:
        if row[0] == str(article_id):
            row[1] = ""
    with path.open("w", encoding="utf-8", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)
    return sample


def test_sample_with_an_emptied_gold_article_keeps_its_test_set_or_stops(tmp_path):
    """The issue's case: article 2163 emptied; clean dropped test question 8 (its only gold) and
    logged 329 questions at INFO (data.json: test 66 -> 65)."""
    sample = emptied_sample(tmp_path)
    articles, questions, _ = fetch(FetchConfig.from_params(section("fetch", sample_dir=str(sample))), seed=13)
    row = questions.with_row_index().filter((pl.col("id") == 8) & (pl.col("split") == "test"))["index"][0] + 1
    with pytest.raises(DataError) as err:
        clean(articles, questions, section("clean"), ("data/raw/articles.parquet", "data/raw/questions.parquet"))
    assert str(err.value) == (
        f"data/raw/questions.parquet: cleaning would change the test set: test question 8 (row {row}) would be "
        "dropped, losing gold article(s) 2163 (empty after cleaning); expected every test question kept with all its "
        "gold articles: fix those articles in the source corpus, or set 'clean.allow_test_changes' to true in "
        "params.yaml"
    )


def files_of(root):
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_stage_that_would_change_the_test_set_stops_in_one_line_keeping_its_outputs(tmp_path):
    sample = emptied_sample(tmp_path)
    articles, questions, _ = fetch(FetchConfig.from_params(section("fetch", sample_dir=str(sample))), seed=13)
    raw = tmp_path / "raw"
    raw.mkdir()
    articles.write_parquet(raw / "articles.parquet")
    questions.write_parquet(raw / "questions.parquet")
    out, metrics = tmp_path / "clean", tmp_path / "data.json"
    out.mkdir()
    (out / "questions.parquet").write_bytes(b"previous output")
    metrics.write_text('{"previous": true}\n', encoding="utf-8")
    before, inputs = files_of(out) | {metrics: metrics.read_bytes()}, files_of(raw)
    params = write_params(tmp_path / "params.yaml", base={"seed": 13, "device": "cpu"})
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "stages/clean.py"),
            "--params",
            str(params),
            "--raw",
            str(raw),
            "--out",
            str(out),
            "--metrics",
            str(metrics),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    assert (
        lines[0].startswith(
            f"lexgraph clean: error: {raw / 'questions.parquet'}: cleaning would change the test "
            "set: test question 8 (row "
        )
        and "gold article(s) 2163 (empty after cleaning)" in lines[0]
    )
    assert files_of(out) | {metrics: metrics.read_bytes()} == before and files_of(raw) == inputs


@pytest.mark.parametrize("text", ["Quand payer le loyer ?", "QUAND  payer le loyer", "\uff31uand payer le loyer ?"])
def test_question_text_in_two_splits_is_refused_on_the_raw_table(text):
    raw = raw_articles([{"id": 1, "article": "Le preneur paie le loyer aux termes convenus."}])
    q = raw_questions(
        [(1, "Quand payer le loyer ?", "1", "train"), (2, "Qui paie ?", "1", "train"), (8, text, "1", "test")]
    )
    with pytest.raises(DataError) as err:
        clean(raw, q, section("clean"), ("articles", "questions"))
    assert str(err.value) == (
        "questions, row 3, column 'question': question 8 (test) has the same text as question 1 (train, row 1); "
        "expected each question text in only one of the train, dev and test splits (texts compared NFKC-normalised "
        "and casefolded, punctuation and spacing ignored)"
    )


def test_same_text_within_one_split_or_in_synthetic_is_not_leakage():
    raw = raw_articles(
        [
            {"id": 1, "article": "Le preneur paie le loyer aux termes convenus."},
            {"id": 2, "article": "Le bailleur délivre la chose louée."},
        ]
    )
    q = raw_questions(
        [
            (1, "Quand payer ?", "1", "train"),
            (2, "Quand payer ?", "1", "train"),
            (3, "Qui paie ?", "1", "test"),
            (4, "Qui paie ?", "1", "synthetic"),
        ]
    )
    _, _, questions, _ = clean(raw, q, section("clean"))
    assert questions.height == 4


@pytest.mark.parametrize("synthetic_first", [False, True])
def test_a_synthetic_id_reused_in_data_raw_is_refused_whatever_the_order(synthetic_first):
    """fetch gives every question its own id; clean no longer renumbers by order of arrival."""
    raw = raw_articles([{"id": 1, "article": "Le preneur paie le loyer aux termes convenus."}])
    rows = [(1, "Quand payer ?", "1", "train"), (1, "payer loyer", "1", "synthetic")]
    with pytest.raises(DataError, match=r"duplicate question id 1 .*across every split, synthetic included"):
        clean(raw, raw_questions(rows[::-1] if synthetic_first else rows), section("clean"))


@pytest.mark.parametrize(
    ("ids", "reason"),
    [
        (",", "no relevant article ids"),
        (" , ;", "no relevant article ids"),
        ("", "no relevant article ids"),
        ("1,,1", "article ids '1,,1' have an empty item (item 2 of 3)"),
        ("1_0", "article id '1_0' is not an integer"),
    ],
    ids=["comma", "separators", "empty", "empty-item", "underscore"],
)
def test_article_ids_without_an_id_are_one_error_on_the_raw_table(ids, reason):
    """`","` dropped the question silently while `""` was an error: the same error now."""
    raw = raw_articles([{"id": 1, "article": "Le preneur paie le loyer aux termes convenus."}])
    q = raw_questions([(1, "Quand payer ?", "1", "train"), (2, "Qui paie ?", ids, "train"), (3, "Et ?", "1", "test")])
    with pytest.raises(DataError) as err:
        clean(raw, q, section("clean"), ("articles", "questions"))
    assert (
        str(err.value)
        == f"questions, row 2, column 'article_ids': {reason}; expected a comma-separated list of integers"
    )

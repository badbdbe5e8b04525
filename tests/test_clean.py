"""clean: text normalisation on hand-made dirty articles, hierarchy table, question checks."""

from __future__ import annotations

import polars as pl
import pytest

from lexgraph.data.clean import clean, clean_text
from lexgraph.data.fetch import FetchConfig, fetch
from lexgraph.data.schema import ARTICLE_COLUMNS
from lexgraph.errors import DataError
from tests.conftest import section


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
    assert clean_text(text) == ("Le propriétaire d'un mur mitoyen peut le faire exhausser.\nIl doit payer seul la dépense.", 0)


def test_unicode_nfc_and_spaces():
    decomposed = "Le pre\u0301avis\u00a0est d\u2019un mois."  # e + combining acute, NBSP
    cleaned, _ = clean_text(decomposed)
    assert cleaned == "Le préavis est d\u2019un mois." and cleaned == __import__("unicodedata").normalize("NFC", cleaned)


def test_removes_amendment_artefacts():
    text = (
        "[1 Le bailleur est tenu de délivrer le bien loué.]1 <L 2006-05-10/33, art. 3, 004; En vigueur : 01-07-2006>\n\n"
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
        ]
    )
    q = raw_questions([(1, "Quand payer ?", "1", "train"), (2, "Article abrogé ?", "3,1", "test"), (3, "Vide ?", "2", "dev"),
                       (4, "Payer quand ?", "1", "dev")])  # a split that loses every question is an error
    articles, _, questions, stats = clean(raw, q, section("clean", min_words=3, drop_repealed=True))
    assert articles["id"].to_list() == [1]
    assert stats["articles"]["dropped"] == {"empty": 1, "repealed": 2, "too_short": 1}
    # gold ids pointing at dropped articles are removed; questions left without gold dropped
    assert questions.filter(pl.col("id") == 2)["article_ids"].to_list() == [[1]]
    assert 3 not in questions["id"].to_list()
    assert stats["questions"]["gold_ids_removed"] == 2
    assert stats["questions"]["by_split"]["dev"] == {"in": 2, "out": 1, "dropped_no_gold": 1}


def test_hierarchy_nodes_are_unique_by_full_path_and_handle_missing_levels():
    raw = raw_articles(
        [
            {"id": 1, "article": "Texte un de l'article.", "code": "Code A", "book": "Livre 1", "chapter": "Dispositions générales"},
            {"id": 2, "article": "Texte deux de l'article.", "code": "Code A", "book": "Livre 2", "chapter": "Dispositions générales"},
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
    with pytest.raises(DataError, match=r"questions, row 2, column 'article_ids': question 2 cites article id\(s\) \[77\]"):
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
    articles, questions, _ = fetch(FetchConfig.from_params(section("fetch", source="local", local_dir=str(bsard_dir), synthetic=True)), seed=1)
    _, _, clean_q, _ = clean(articles, questions, section("clean"))
    assert clean_q["id"].is_unique().all()
    synthetic = clean_q.filter(pl.col("split") == "synthetic")
    assert synthetic["id"].to_list() == [1 + 9, 2 + 9]  # offset = max raw id (8) + 1

"""Issue 28, class 5: ids and corpora at the edges, refused where they are read (fetch, clean).

- One id rule (``lexgraph.data.schema.id_problem_of``) for every id of every input file (the
  articles' and questions' ``id`` columns, each id of ``article_ids``, the BM25 negatives' ids):
  a non-negative decimal integer within int64, without sign or leading zero. ``+7`` and ``007``
  were read as 7, ``-1`` (search's padding) was accepted, an id past int64 was "not an integer";
- a corpus of fewer than ``MIN_ARTICLES`` articles is refused by fetch and, after cleaning, by clean;
- a column outside BSARD's layout (a ninth hierarchy level) is refused, not dropped;
- a ``fetch.dev_fraction`` that leaves train or dev empty is refused where dev is carved.

Each error is one line naming the file, row and column (or the params.yaml key) and what was
expected; inputs and previous outputs are left byte-identical.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from conftest import ROOT, section, write_params, write_questions
from helpers_config import LOCAL_FETCH
from lexgraph.core.errors import ConfigError, DataError
from lexgraph.data.clean import clean
from lexgraph.data.fetch import FetchConfig, fetch
from lexgraph.data.sample import build_sample
from lexgraph.data.schema import ARTICLE_COLUMNS

PARAMS = LOCAL_FETCH
EXPECTED_ID = (
    "expected a non-negative integer id in decimal digits 0-9, without sign or leading zero, at most 2**63 - 1"
)
PROBLEMS = {
    "-1": "is negative (search uses -1 as padding, so ids must be 0 or more)",
    "-7": "is negative (search uses -1 as padding, so ids must be 0 or more)",
    "+7": "has a sign",
    "007": "has a leading zero",
    "99999999999999999999": "is larger than 2**63 - 1 (int64)",
    "9223372036854775808": "is larger than 2**63 - 1 (int64)",
}


def files_of(root: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def refused(root: Path, error=DataError, **extra) -> str:
    """fetch's one-line error on the local copy ``root``, which is left untouched."""
    before = files_of(root)
    with pytest.raises(error) as err:
        fetch(FetchConfig.from_params(section("fetch", **{**PARAMS, "local_dir": str(root), **extra})), seed=1)
    assert files_of(root) == before and "\n" not in str(err.value)
    return str(err.value)


def replace_in(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


# ----------------------------------------------------------------------------- (a) the id rule


@pytest.mark.parametrize("value", list(PROBLEMS))
def test_article_id_column_follows_the_id_rule(bsard_dir, value):
    path = bsard_dir / "articles.csv"  # article 3 is row 3, on line 5 (article 1 spans two lines)
    replace_in(path, "\n3,", f"\n{value},")
    assert refused(bsard_dir) == (
        f"{path}, row 3, column 'id': id {value!r} {PROBLEMS[value]}; {EXPECTED_ID} (row 3 starts on line 5)"
    )


@pytest.mark.parametrize("value", list(PROBLEMS))
def test_question_id_column_follows_the_id_rule(bsard_dir, value):
    path = bsard_dir / "questions_test.csv"
    write_questions(path, [(8, "Et le loyer ?", "5"), (value, "Qui répare le mur ?", "3")])
    assert refused(bsard_dir) == (
        f"{path}, row 2, column 'id': id {value!r} {PROBLEMS[value]}; {EXPECTED_ID} (row 2 starts on line 3)"
    )


@pytest.mark.parametrize("value", list(PROBLEMS))
def test_cited_article_ids_follow_the_id_rule(bsard_dir, value):
    """``+7`` was refused as "not an integer", ``07`` read as 7, an id past int64 "not in the corpus"."""
    path = bsard_dir / "questions_test.csv"
    write_questions(path, [(7, "Qui répare le mur ?", "3"), (8, "Et le loyer ?", f"5,{value}")])
    assert refused(bsard_dir) == (
        f"{path}, row 2, column 'article_ids': article id {value!r} {PROBLEMS[value]}; expected a comma-separated "
        f"list of integer ids of {bsard_dir / 'articles.csv'} (row 2 starts on line 3)"
    )


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        ({"question_id": 1, "article_ids": [-1]}, f"id -1 {PROBLEMS['-1']}"),
        ({"question_id": 1, "article_ids": [2**63]}, f"id {2**63} {PROBLEMS['9223372036854775808']}"),
        ({"question_id": -3, "article_ids": [2]}, f"id -3 {PROBLEMS['-1']}"),
        ({"question_id": 1, "article_ids": ["+2"]}, "id '+2' has a sign"),
        ({"question_id": "01", "article_ids": [2]}, "id '01' has a leading zero"),
    ],
    ids=["negative", "past-int64", "negative-question", "sign", "leading-zero"],
)
def test_negatives_json_ids_follow_the_id_rule(bsard_dir, record, problem):
    """-1 was accepted, 2**63 a polars TypeError traceback, ``"+2"`` "not an integer id"."""
    path = bsard_dir / "negatives" / "bm25_negatives_train.json"
    path.write_text(json.dumps([record]), encoding="utf-8")
    assert refused(bsard_dir) == (
        f"{path}: question {record['question_id']!r}: negatives must be integer article ids ({problem}; {EXPECTED_ID})"
    )


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (-1, f"id -1 {PROBLEMS['-1']}; {EXPECTED_ID}"),
        ("+7", f"id '+7' has a sign; {EXPECTED_ID}"),
        (7.5, f"id 7.5 is not an integer; {EXPECTED_ID}"),
    ],
    ids=["negative", "sign", "float"],
)
def test_sample_builder_ids_follow_the_id_rule(tmp_path, value, problem):
    """``int()`` read 7.5 and "+7" as 7 and kept -1."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "headings.json").write_text("{}", encoding="utf-8")
    record = {"id": value, "number": "1", "path": ["Livre I"], "text": "Texte."}
    (src / "articles.jsonl").write_text(json.dumps(record) + "\n", encoding="utf-8")
    (src / "questions.jsonl").write_text(
        json.dumps({"id": 1, "question": "Q ?", "split": "train", "article_ids": [1]}) + "\n", encoding="utf-8"
    )
    with pytest.raises(DataError) as err:
        build_sample(src, tmp_path / "out")
    assert str(err.value) == f"{src / 'articles.jsonl'}: line 1: {problem}"
    assert not (tmp_path / "out").exists()


def test_clean_refuses_a_negative_id_in_data_raw():
    """A data/raw written before the rule: clean checks it again."""
    raw = pl.DataFrame(
        [{c: None for c in ARTICLE_COLUMNS} | {"id": i, "article": "Le preneur paie le loyer."} for i in (1, -1)],
        schema={c: (pl.Int64 if c == "id" else pl.Utf8) for c in ARTICLE_COLUMNS},
    )
    questions = pl.DataFrame(
        {"id": [1], "question": ["Quand ?"], "article_ids": ["1"], "split": ["train"]},
        schema={"id": pl.Int64, "question": pl.Utf8, "article_ids": pl.Utf8, "split": pl.Utf8},
    )
    with pytest.raises(DataError) as err:
        clean(raw, questions, section("clean"), ("data/raw/articles.parquet", "data/raw/questions.parquet"))
    assert (
        str(err.value)
        == f"data/raw/articles.parquet, row 2, column 'id': id -1 is negative; {EXPECTED_ID} (rerun fetch)"
    )


# ----------------------------------------------------------------------------- (b) corpus size


def test_a_corpus_of_one_article_is_refused_by_fetch(bsard_dir):
    """It passed fetch and clean, and train_dsr then had no negative for any question."""
    path = bsard_dir / "articles.csv"
    path.write_text("id,article\n1,Le preneur paie le loyer aux termes convenus.\n", encoding="utf-8")
    for split in ("train", "test"):
        write_questions(bsard_dir / f"questions_{split}.csv", [(1 if split == "train" else 2, f"{split} ?", "1")])
    assert refused(bsard_dir) == (
        f"{path}: 1 article(s); expected at least 2 (training needs, for every question, an article it does not "
        "cite as a negative)"
    )


def test_a_cleaning_that_keeps_one_article_is_refused():
    raw = pl.DataFrame(
        [
            {c: None for c in ARTICLE_COLUMNS} | {"id": i, "article": text}
            for i, text in ((1, "Le preneur paie le loyer aux termes convenus."), (2, "Voir ci-dessus."))
        ],
        schema={c: (pl.Int64 if c == "id" else pl.Utf8) for c in ARTICLE_COLUMNS},
    )
    questions = pl.DataFrame(
        {"id": [1, 2], "question": ["Quand ?", "Qui ?"], "article_ids": ["1", "1,2"], "split": ["train", "test"]},
        schema={"id": pl.Int64, "question": pl.Utf8, "article_ids": pl.Utf8, "split": pl.Utf8},
    )
    with pytest.raises(DataError) as err:
        clean(raw, questions, section("clean", min_words=3, allow_test_changes=True), ("articles.parquet", "q"))
    assert str(err.value) == (
        "articles.parquet: cleaning kept 1 of 2 articles; expected at least 2 (training needs, for every question, "
        "an article it does not cite as a negative): fetch a larger corpus, or lower 'clean.min_words' in params.yaml"
    )


def test_a_question_citing_every_article_is_refused_by_fetch(bsard_dir):
    """Two articles, a train question citing both: no negative for it in train_dsr."""
    path = bsard_dir / "articles.csv"
    path.write_text("id,article\n1,Le mur est mitoyen.\n2,Le loyer est payé.\n", encoding="utf-8")
    write_questions(bsard_dir / "questions_train.csv", [(1, "Qui paie ?", "2"), (2, "Le mur et le loyer ?", "2,1")])
    write_questions(bsard_dir / "questions_test.csv", [(7, "Qui répare le mur ?", "1")])
    assert refused(bsard_dir) == (
        f"{bsard_dir / 'questions_train.csv'}, row 2, column 'article_ids': question 2 cites all 2 articles of "
        f"{path}; expected a question that leaves at least one article uncited (training needs a negative) "
        "(row 2 starts on line 3)"
    )


def test_a_question_citing_every_article_cleaning_keeps_is_refused():
    raw = pl.DataFrame(
        [
            {c: None for c in ARTICLE_COLUMNS} | {"id": i, "article": text}
            for i, text in enumerate(("Le preneur paie le loyer.", "Le mur est mitoyen.", "Voir plus haut."), 1)
        ],
        schema={c: (pl.Int64 if c == "id" else pl.Utf8) for c in ARTICLE_COLUMNS},
    )
    questions = pl.DataFrame(
        {"id": [1, 2], "question": ["Quand ?", "Qui ?"], "article_ids": ["1", "1,2,3"], "split": ["test", "train"]},
        schema={"id": pl.Int64, "question": pl.Utf8, "article_ids": pl.Utf8, "split": pl.Utf8},
    )
    with pytest.raises(DataError) as err:
        clean(raw, questions, section("clean", min_words=4), ("articles.parquet", "questions.parquet"))
    assert str(err.value) == (
        "questions.parquet, row 2, column 'article_ids': question 2 cites all 2 articles that cleaning keeps; "
        "expected a question that leaves at least one article uncited (training needs a negative): fetch a larger "
        "corpus, or lower 'clean.min_words' in params.yaml"
    )


# ----------------------------------------------------------------------------- (c) unexpected columns


def add_column(path: Path, name: str, after: str) -> None:
    """Insert column ``name`` (``Paragraphe 1`` in every row) after column ``after``, in the header and every row."""
    import csv
    import io

    rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"), newline="")))
    at = rows[0].index(after) + 1
    out = io.StringIO(newline="")
    rows = [rows[0][:at] + [name] + rows[0][at:]] + [r[:at] + ["Paragraphe 1"] + r[at:] for r in rows[1:]]
    csv.writer(out, lineterminator="\n").writerows(rows)
    path.write_text(out.getvalue(), encoding="utf-8")


ARTICLE_EXPECTED = (
    "expected comma-separated columns id, article and optionally reference, law_type, code, book, part, act, "
    "chapter, section, subsection, description and no other"
)


def test_a_ninth_hierarchy_column_is_refused_not_dropped(bsard_dir):
    path = bsard_dir / "articles.csv"
    add_column(path, "paragraph", after="subsection")
    assert refused(bsard_dir) == (
        f"{path}: unexpected column(s) ['paragraph']; {ARTICLE_EXPECTED} (BSARD's hierarchy has 8 levels, "
        "law_type, code, book, part, act, chapter, section, subsection): remove or merge the extra column(s)"
    )


def test_an_unknown_question_column_is_refused(bsard_dir):
    path = bsard_dir / "questions_train.csv"
    add_column(path, "articles_ids", after="article_ids")
    assert refused(bsard_dir) == (
        f"{path}: unexpected column(s) ['articles_ids']; expected comma-separated columns id, question, "
        "article_ids and optionally category, subcategory, extra_description and no other: remove or merge the "
        "extra column(s)"
    )


def test_an_extra_hub_column_is_a_warning_and_left_out(hub_dir, caplog):
    """The hub's tables are not the user's to edit, and a new revision may widen them."""
    repo = hub_dir.with_name("hub_extra_column")  # its own name: `datasets` caches by directory name
    hub_dir.rename(repo)
    add_column(repo / "articles.csv", "article_english", after="description")
    config = FetchConfig.from_params(section("fetch", **{**PARAMS, "source": "hub", "hub_repo": str(repo)}))
    with caplog.at_level("WARNING", logger="lexgraph.data.readers"):
        articles, _, _ = fetch(config, seed=1)
    assert articles.columns == list(ARTICLE_COLUMNS)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"{repo}@main (corpus): unexpected column(s) ['article_english']; {ARTICLE_EXPECTED} (BSARD's hierarchy "
        "has 8 levels, law_type, code, book, part, act, chapter, section, subsection); left out"
    ]


# ----------------------------------------------------------------------------- (d) split settings


@pytest.mark.parametrize(("fraction", "split"), [(0.99, "train"), (0.01, "dev")])
def test_a_dev_fraction_that_empties_a_split_is_refused_naming_the_key(bsard_dir, fraction, split):
    """0.99 passed fetch and clean, and left train_dsr without a train question."""
    msg = refused(bsard_dir, error=ConfigError, dev_fraction=fraction)
    assert msg == (
        f"params.yaml: 'fetch.dev_fraction' = {fraction} leaves 0 {split} questions of 6 (the source has no dev "
        "file, so dev is carved from its 6 train questions); expected a fraction that leaves at least one question "
        "in each of train and dev"
    )


def test_dev_fraction_is_not_used_with_a_dev_file(bsard_dir):
    write_questions(bsard_dir / "questions_dev.csv", [(9, "Le mur est-il mitoyen ?", "1")])
    config = FetchConfig.from_params(section("fetch", **{**PARAMS, "local_dir": str(bsard_dir), "dev_fraction": 0.99}))
    _, questions, _ = fetch(config, seed=1)
    assert dict(questions["split"].value_counts().iter_rows()) == {"train": 6, "dev": 1, "test": 2}


# ----------------------------------------------------------------------------- stage level


@pytest.mark.parametrize("case", ["negative-article-id", "plus-cited", "one-article", "ninth-level", "dev-fraction"])
def test_stage_refuses_edges_in_one_line_keeping_inputs_and_outputs(tmp_path, bsard_dir, case):
    params = {**PARAMS, "local_dir": str(bsard_dir)}
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "questions.parquet").write_bytes(b"a previous output")
    articles, test = bsard_dir / "articles.csv", bsard_dir / "questions_test.csv"
    if case == "negative-article-id":
        replace_in(articles, "\n3,", "\n-1,")
        expected = f"{articles}, row 3, column 'id': id '-1' is negative (search uses -1 as padding"
    elif case == "plus-cited":
        write_questions(test, [(7, "Qui répare le mur ?", "+3")])
        expected = f"{test}, row 1, column 'article_ids': article id '+3' has a sign"
    elif case == "one-article":
        articles.write_text("id,article\n3,Le mur mitoyen est à la charge de tous.\n", encoding="utf-8")
        expected = f"{articles}: 1 article(s); expected at least 2"
    elif case == "ninth-level":
        add_column(articles, "paragraph", after="subsection")
        expected = f"{articles}: unexpected column(s) ['paragraph']"
    else:
        params["dev_fraction"] = 0.99
        expected = "params.yaml: 'fetch.dev_fraction' = 0.99 leaves 0 train questions of 6"
    inputs, outputs = files_of(bsard_dir), files_of(tmp_path / "raw")
    write_params(tmp_path / "params.yaml", base={"seed": 1, "device": "cpu"}, fetch=params)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "stages/fetch.py"), "--params", str(tmp_path / "params.yaml"), "--out", "raw"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert all(" INFO " in line for line in lines[:-1]), proc.stderr
    assert lines[-1].startswith(f"lexgraph fetch: error: {expected}"), lines[-1]
    assert files_of(bsard_dir) == inputs and files_of(tmp_path / "raw") == outputs

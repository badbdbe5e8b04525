"""``fetch.source: corpus``: the field's JSON-lines/CSV/Parquet corpus (string ids, heading paths of
any depth) and its questions file, read into data/raw and data/clean; bad input is one line naming
the file, the record (and its line) and the field."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from conftest import ROOT, section, write_params
from helpers_corpus import corpus_records, question_records, write_jsonl
from helpers_dvc import run_stage_in_process
from lexgraph.core.errors import DataError
from lexgraph.core.stage import StageContext
from lexgraph.data.clean import CleanConfig, CleanPaths, run_clean
from lexgraph.data.fetch import FetchConfig, FetchPaths, run_fetch

ON_CPU = StageContext(seed=1, device="cpu")


@pytest.fixture(autouse=True)
def workspace(tmp_path, monkeypatch) -> Path:
    """tmp_path is the workspace (the current directory); the user's files go in its data/corpus."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "corpus").mkdir(parents=True)
    return tmp_path / "data" / "corpus"


def corpus_config(corpus: Path, questions: Path) -> FetchConfig:
    return FetchConfig.from_params(
        section("fetch", source="corpus", corpus_file=str(corpus), questions_file=str(questions))
    )


@pytest.fixture
def corpus_files(workspace):
    articles = corpus_records()
    return write_jsonl(workspace / "corpus.jsonl", articles), write_jsonl(
        workspace / "questions.jsonl", question_records(articles)
    )


def fetch_and_clean(corpus: Path, questions: Path, out: Path) -> None:
    run_fetch(FetchPaths(out=out / "raw"), corpus_config(corpus, questions), ON_CPU)
    clean = CleanConfig.from_params(section("clean"))
    run_clean(
        CleanPaths(raw=out / "raw", out=out / "clean", metrics=out / "data.json"),
        clean,
        ON_CPU,
    )


def test_a_three_level_corpus_with_string_ids_reaches_data_clean(corpus_files, tmp_path):
    corpus, questions = corpus_files
    fetch_and_clean(corpus, questions, tmp_path)
    articles = pl.read_parquet(tmp_path / "clean" / "articles.parquet")
    headings = pl.read_parquet(tmp_path / "clean" / "headings.parquet")
    keys = pl.read_parquet(tmp_path / "clean" / "keys.parquet")
    assert articles["id"].to_list() == list(range(24))
    assert articles["path"][0].to_list() == ["Code test", "Livre 0", "Titre 0", "Chapitre 0"]
    # one code, 2 books, 6 titles, 12 chapters; the deepest heading holds its 2 articles
    assert headings.height == 1 + 2 + 6 + 12 and headings["level"].max() == 4
    assert articles.group_by("heading_id").len()["len"].to_list() == [2] * 12
    article_keys = keys.filter(pl.col("kind") == "article")
    assert article_keys["key"].to_list() == [r["id"] for r in corpus_records()]
    questions_table = pl.read_parquet(tmp_path / "clean" / "questions.parquet")
    assert sorted(questions_table["split"].unique().to_list()) == ["dev", "test", "train"]
    assert questions_table.sort("id")["article_ids"][0].to_list() == [0, 1]


def test_a_deep_path_keeps_every_level_and_csv_and_parquet_read_alike(tmp_path, workspace):
    records = corpus_records()
    for r in records:
        r["path"] = r["path"] + [f"Section {j}" for j in range(8)]  # 11 levels under the code
    csv_rows = [{**r, "path": json.dumps(r["path"])} for r in records]
    pl.DataFrame(csv_rows).write_csv(workspace / "corpus.csv")
    pl.DataFrame(records).write_parquet(workspace / "corpus.parquet")
    questions = write_jsonl(workspace / "questions.jsonl", question_records(records))
    tables = {}
    for name in ("corpus.csv", "corpus.parquet"):
        fetch_and_clean(workspace / name, questions, tmp_path / name.replace(".", "_"))
        tables[name] = pl.read_parquet(tmp_path / name.replace(".", "_") / "clean" / "headings.parquet")
    assert tables["corpus.csv"].equals(tables["corpus.parquet"])
    assert tables["corpus.csv"]["level"].max() == 12


def error_of(tmp_path, articles, questions=None) -> str:
    corpus = write_jsonl(tmp_path / "data/corpus/corpus.jsonl", articles)
    q = write_jsonl(tmp_path / "data/corpus/questions.jsonl", questions or question_records(corpus_records()))
    with pytest.raises(DataError) as err:
        run_fetch(FetchPaths(out=tmp_path / "raw"), corpus_config(corpus, q), ON_CPU)
    message = str(err.value)
    assert "\n" not in message and not (tmp_path / "raw").exists()
    return message


def test_bad_input_is_one_line_naming_the_file_the_record_and_the_field(tmp_path):
    cf, qf = tmp_path / "data/corpus/corpus.jsonl", tmp_path / "data/corpus/questions.jsonl"
    articles = corpus_records()
    no_text = [dict(a) for a in articles]
    del no_text[4]["text"]
    assert error_of(tmp_path, no_text) == (
        f"{cf}, row 5, column 'text': article 'civ:0.1.0-0' has no text (missing); "
        "expected a non-empty string (row 5 starts on line 5)"
    )
    duplicate = [dict(a) for a in articles]
    duplicate[7]["id"] = duplicate[2]["id"]
    assert error_of(tmp_path, duplicate) == (
        f"{cf}, row 8, column 'id': article id 'civ:0.0.1-0' is already used by row 3 of "
        f"{cf} (line 3); expected each id once (row 8 starts on line 8)"
    )
    flat = [dict(a) for a in articles]
    flat[3]["path"] = "Livre 0 > Titre 0"
    assert error_of(tmp_path, flat) == (
        f"{cf}, row 4, column 'path': path is a str ('Livre 0 > Titre 0'); expected a "
        "list of heading labels from the top (may be empty) (row 4 starts on line 4)"
    )
    questions = question_records(articles)
    questions[5]["article_ids"] = [articles[0]["id"], "civ:9.9.9-9"]
    assert error_of(tmp_path, articles, questions) == (
        f"{qf}, row 6, column 'article_ids': question 'q-5' cites article id "
        f"'civ:9.9.9-9', which is not in {cf} (row 6 starts on line 6)"
    )


def test_a_question_text_in_two_splits_is_named_by_the_users_id(tmp_path):
    qf = tmp_path / "data/corpus/questions.jsonl"
    articles = corpus_records()
    questions = question_records(articles)
    questions[3]["question"] = questions[0]["question"]  # q-3 (test) repeats q-0 (train)
    assert error_of(tmp_path, articles, questions).startswith(
        f"{qf}, row 4, column 'question': question 'q-3' (test) has the same text as "
        f"question 'q-0' (train, row 1 of {qf} (line 1)); expected each question text"
    )


def test_a_question_citing_every_article_is_named_by_the_users_id(tmp_path):
    cf, qf = tmp_path / "data/corpus/corpus.jsonl", tmp_path / "data/corpus/questions.jsonl"
    articles = corpus_records()[:2]
    questions = [
        {"id": "a", "question": "Premier ?", "article_ids": [articles[0]["id"]], "split": "train"},
        {"id": "b", "question": "Second ?", "article_ids": [a["id"] for a in articles], "split": "test"},
    ]
    assert error_of(tmp_path, articles, questions) == (
        f"{qf}, row 2, column 'article_ids': question 'b' cites all 2 articles of "
        f"{cf}; expected a question that leaves at least one article uncited (training "
        "needs a negative) (row 2 starts on line 2)"
    )


@pytest.mark.parametrize("field", ["text", "path", "number", "question"])
def test_a_lone_surrogate_in_a_text_is_one_line_naming_the_file_the_record_and_the_field(tmp_path, field):
    """Ids were checked, texts were not: ``"\\udc80"`` (a JSON escape) in an article's text, a heading
    label, an optional field or a question's text reached polars as a UnicodeEncodeError traceback."""
    cf, qf = tmp_path / "data/corpus/corpus.jsonl", tmp_path / "data/corpus/questions.jsonl"
    articles = [dict(a) for a in corpus_records()]
    questions = question_records(articles)
    if field == "question":
        questions[2]["question"] = "Qui paie \udc80 le mur ?"
    elif field == "path":
        articles[2]["path"] = [*articles[2]["path"][:-1], "Chapitre \udc80"]
    else:
        articles[2][field] = "\udc80" if field == "number" else "Le mur \udc80 mitoyen est entretenu."
    where = qf if field == "question" else cf
    for path, records in ((cf, articles), (qf, questions)):  # JSON's escape: the file itself is ASCII
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="ascii")
    with pytest.raises(DataError) as err:
        run_fetch(FetchPaths(out=tmp_path / "raw"), corpus_config(cf, qf), ON_CPU)
    error = str(err.value)
    assert "\n" not in error and not (tmp_path / "raw").exists()
    assert error.startswith(f"{where}, row 3, column '{field}': ") and "'\\udc80'" in error, error
    assert "a lone surrogate that is not valid Unicode text; expected valid Unicode text" in error


@pytest.mark.parametrize("kind", ["fifo", "devnull", "directory"])
def test_a_corpus_file_that_is_no_file_is_said_as_what_it_is(tmp_path, kind):
    import os

    from lexgraph.data.corpus import read_corpus

    if kind == "fifo":
        path, said = tmp_path / "corpus.jsonl", "a named pipe (FIFO), not a regular file"
        os.mkfifo(path)
    elif kind == "devnull":
        path, said = Path("/dev/null"), "a character device (such as /dev/null), not a regular file"
    else:
        path, said = tmp_path, "a directory, not a regular file"
    with pytest.raises(DataError) as err:
        read_corpus(path)
    assert str(err.value) == f"{path}: {said}; expected a JSON-lines, CSV or Parquet file"


def test_a_damaged_gzip_corpus_is_one_line(tmp_path):
    import gzip

    from lexgraph.data.corpus import read_corpus

    whole = gzip.compress(json.dumps(corpus_records()).encode())
    (tmp_path / "corpus.jsonl.gz").write_bytes(whole[: len(whole) // 2])  # read_corpus reads any path
    with pytest.raises(DataError, match=r"corpus.jsonl.gz: not readable \(Compressed file ended"):
        read_corpus(tmp_path / "corpus.jsonl.gz")


def test_the_corpus_source_needs_its_files_named(tmp_path):
    from lexgraph.core.errors import ConfigError

    with pytest.raises(ConfigError, match="'fetch.corpus_file'"):
        FetchConfig.from_params(section("fetch", source="corpus"))


def test_a_corpus_file_outside_data_corpus_is_refused_in_one_line(corpus_files, tmp_path, capsys):
    """fetch's dvc.yaml dep is data/corpus: a file elsewhere (or reached by '..') would not rerun fetch."""
    corpus, questions = corpus_files
    (tmp_path / "elsewhere.jsonl").write_bytes(corpus.read_bytes())
    refused = (("corpus_file", str(tmp_path / "elsewhere.jsonl")), ("questions_file", "data/corpus/../q.jsonl"))
    for key, value in refused:
        files = {"corpus_file": "data/corpus/corpus.jsonl", "questions_file": "data/corpus/questions.jsonl", key: value}
        params = write_params(tmp_path / "params.yaml", fetch={"source": "corpus", **files})
        capsys.readouterr()
        assert run_stage_in_process(ROOT / "stages/fetch.py", "--params", params, "--out", "data/raw") == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith(
            f"params.yaml: 'fetch.{key}' = {value!r}, expected a file under data/corpus/, fetch's dvc.yaml "
            "dependency (DVC would not see edits to a file elsewhere, and fetch would not rerun)"
        )
        assert "\n" not in err and not (tmp_path / "data/raw").exists()
    # the same files named inside data/corpus, relative to the workspace: fetched
    files = {"corpus_file": "data/corpus/corpus.jsonl", "questions_file": "./data/corpus/questions.jsonl"}
    params = write_params(tmp_path / "params.yaml", fetch={"source": "corpus", **files})
    assert run_stage_in_process(ROOT / "stages/fetch.py", "--params", params, "--out", "data/raw") == 0
    assert pl.read_parquet(tmp_path / "data/raw/articles.parquet").height == len(corpus_records())


def test_the_pipeline_runs_end_to_end_on_a_jsonl_corpus_and_its_runs_name_the_users_ids(
    corpus_files, tmp_path, monkeypatch, capsys
):
    """fetch -> clean -> bm25_tune -> bm25 -> evaluate on a 3-level corpus with string ids: the
    TREC runs and qrels name questions and articles by the user's ids, and score as the metrics."""
    corpus, questions = corpus_files
    params = write_params(
        tmp_path / "params.yaml",
        fetch={"source": "corpus", "corpus_file": str(corpus), "questions_file": str(questions)},
        evaluate={"systems": ["bm25"], "baselines": ["bm25"]},
    )
    clean_dir = ("--articles", "data/clean/articles.parquet")
    stages = [
        ("fetch", "--out", "data/raw"),
        ("clean", "--raw", "data/raw", "--out", "data/clean", "--metrics", "metrics/data.json"),
        ("bm25_tune", *clean_dir, "--questions", "data/clean/questions.parquet"),
        ("bm25", *clean_dir, "--tuned", "metrics/bm25_tune.json", "--out", "models/bm25"),
        ("evaluate", "--questions", "data/clean/questions.parquet", "--runs", "data/runs", "--metrics-dir", "metrics"),
    ]
    extra = {
        "bm25_tune": ("--best", "metrics/bm25_tune.json", "--grid", "metrics/bm25_tune.csv"),
        "evaluate": ("--keys", "data/clean/keys.parquet", "--workspace", "."),
    }
    for name, *args in stages:
        assert run_stage_in_process(ROOT / f"stages/{name}.py", "--params", params, *args, *extra.get(name, ())) == 0
    article_keys = {r["id"] for r in corpus_records()}
    question_keys = {q["id"]: q for q in question_records(corpus_records())}
    run = [line.split() for line in Path("data/runs/bm25/test.trec").read_text().splitlines()]
    qrels = [line.split() for line in Path("data/runs/test.qrels").read_text().splitlines()]
    assert {r[0] for r in run} == {q for q, rec in question_keys.items() if rec["split"] == "test"}
    assert {r[2] for r in run} <= article_keys and len({r[2] for r in run}) > 2
    position = {r["id"]: i for i, r in enumerate(corpus_records())}  # qrels list gold articles in corpus order
    tests = [(q, rec) for q, rec in question_keys.items() if rec["split"] == "test"]
    assert qrels == [[q, "0", a, "1"] for q, rec in tests for a in sorted(rec["article_ids"], key=position.get)]
    # the run scores, by the user's ids, as evaluate scored it by lexgraph's
    recall = []
    for qid in {r[0] for r in run}:
        top = [r[2] for r in run if r[0] == qid][:100]
        gold = set(question_keys[qid]["article_ids"])
        recall.append(len(gold & set(top)) / len(gold))
    metrics = json.loads(Path("metrics/bm25.json").read_text())
    assert metrics["test"]["recall@100"] == pytest.approx(sum(recall) / len(recall), abs=1e-4)
    per_query = pl.read_csv("metrics/per_query/test.csv")
    assert per_query["id"].to_list() == [q for q, _ in tests]
    # lexgraph search shows, and writes, the user's ids; hits carry the heading path
    from lexgraph.cli.main import main

    capsys.readouterr()
    assert main(["search", "--system", "bm25", "--workspace", ".", "--top", "1", "--json", "Article 6"]) == 0
    hit = json.loads(capsys.readouterr().out)["hits"][0]
    assert (hit["id"], hit["path"]) == ("civ:0.1.0-1", ["Code test", "Livre 0", "Titre 1", "Chapitre 0"])
    write_jsonl(tmp_path / "mine.jsonl", [{"id": "mine-1", "question": "Article 6"}])
    assert main(["search", "--system", "bm25", "--questions", "mine.jsonl", "--run", "mine.trec", "--k", "2"]) == 0
    assert Path("mine.trec").read_text().split()[:3] == ["mine-1", "Q0", "civ:0.1.0-1"]


def test_clean_always_writes_keys_and_the_samples_has_no_rows(tmp_path):
    """dvc.yaml declares data/clean/keys.parquet (evaluate's --keys): clean writes it on BSARD's
    layout too, without rows (the integer ids are the user's), and the reader then maps nothing."""
    from lexgraph.data.keys import keys_of

    sample = FetchConfig.from_params(section("fetch", sample_dir=str(ROOT / "data" / "sample")))
    run_fetch(FetchPaths(out=tmp_path / "raw"), sample, ON_CPU)
    clean = CleanConfig.from_params(section("clean"))
    run_clean(
        CleanPaths(raw=tmp_path / "raw", out=tmp_path / "clean", metrics=tmp_path / "data.json"),
        clean,
        ON_CPU,
    )
    keys = pl.read_parquet(tmp_path / "clean" / "keys.parquet")
    assert keys.height == 0 and keys.schema == {"kind": pl.Utf8, "id": pl.Int64, "key": pl.Utf8}
    assert not (tmp_path / "raw" / "keys.parquet").exists() and keys_of(tmp_path / "clean" / "keys.parquet") is None


def test_cleans_errors_name_the_users_ids(corpus_files, workspace, tmp_path):
    """An article too short for clean.min_words is dropped: the test question citing it would lose a gold
    article, and clean's error names both by the user's ids (row: data/raw/questions.parquet's)."""
    articles = corpus_records()
    articles[3]["text"] = "Deux mots"  # civ:0.0.1-1, a gold article of q-3 (test)
    corpus = write_jsonl(workspace / "corpus.jsonl", articles)
    with pytest.raises(DataError) as err:
        fetch_and_clean(corpus, workspace / "questions.jsonl", tmp_path)
    row = pl.read_parquet(tmp_path / "raw" / "questions.parquet")["id"].to_list().index(3) + 1  # q-3 is id 3
    assert str(err.value).startswith(
        f"{tmp_path / 'raw' / 'questions.parquet'}: cleaning would change the test set: test question 'q-3' "
        f"(row {row}) would lose gold article(s) 'civ:0.0.1-1' (shorter than 'clean.min_words' = 3 words); "
    )
    assert not (tmp_path / "clean").exists()

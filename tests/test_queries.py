"""Synthetic queries (stage `generate_queries`): crop, doc2query with a tiny local mT5, none."""

from __future__ import annotations

import polars as pl
import pytest

from conftest import section, write_params
from helpers_queries import ARTICLES
from lexgraph.core.errors import ConfigError, HubUnreachableError
from lexgraph.core.stage import run_stage
from lexgraph.data import queries as q

SCHEMA = {
    "id": pl.Int64,
    "question": pl.Utf8,
    "category": pl.Utf8,
    "subcategory": pl.Utf8,
    "extra_description": pl.Utf8,
    "article_ids": pl.List(pl.Int64),
    "split": pl.Utf8,
}


def is_contiguous_span(query: str, text: str) -> bool:
    words, span = text.split(), query.split()
    return any(words[i : i + len(span)] == span for i in range(len(words) - len(span) + 1))


# --------------------------------------------------------------------------- crop


def test_crop_spans_are_contiguous_and_within_bounds():
    pairs = q.crop_queries(ARTICLES, per_article=20, min_words=3, max_words=7, seed=1)
    text = dict(ARTICLES)
    assert {a for a, _ in pairs} == {10, 11, 12, 14}  # the empty article gives nothing
    for article_id, query in pairs:
        n_words = len(text[article_id].split())
        assert min(3, n_words) <= len(query.split()) <= 7
        assert is_contiguous_span(query, text[article_id])
    lengths = {len(t.split()) for a, t in pairs if a == 14}
    assert lengths == set(range(3, 8))  # 20 draws over 5 lengths: all bounds reached


def test_crop_is_seeded_per_article():
    a = q.crop_queries(ARTICLES, per_article=5, min_words=3, max_words=7, seed=1)
    b = q.crop_queries(ARTICLES, per_article=5, min_words=3, max_words=7, seed=1)
    c = q.crop_queries(ARTICLES, per_article=5, min_words=3, max_words=7, seed=2)
    assert a == b and a != c
    # an article's queries do not depend on the other articles
    alone = q.crop_queries([ARTICLES[1]], per_article=5, min_words=3, max_words=7, seed=1)
    assert alone == [p for p in a if p[0] == 11]


def test_deduplicate():
    pairs = [(1, " a  b "), (1, "a b"), (1, ""), (1, "   "), (2, "c d"), (3, "c d"), (2, "e"), (1, "f")]
    assert q.deduplicate(pairs) == [(1, "a b"), (2, "e"), (1, "f")]


def test_crop_stage_output_schema_and_ids(tmp_path):
    articles = tmp_path / "articles.parquet"
    pl.DataFrame({"id": [a for a, _ in ARTICLES], "article": [t for _, t in ARTICLES]}).write_parquet(articles)
    params = tmp_path / "params.yaml"
    write_params(
        params,
        base={"seed": 3},
        queries={"generator": "crop", "per_article": 4, "min_words": 2, "max_words": 5, "first_id": 500},
    )
    out = tmp_path / "queries" / "synthetic.parquet"
    questions = tmp_path / "questions.parquet"
    clean_questions([]).write_parquet(questions)
    argv = ["--params", str(params), "--articles", str(articles), "--questions", str(questions), "--out", str(out)]
    assert run_stage(_driver(), argv) == 0
    df = pl.read_parquet(out)
    assert dict(df.schema) == SCHEMA
    assert df["id"].to_list() == list(range(500, 500 + df.height))
    assert set(df["category"]) == {"synthetic"} and set(df["subcategory"]) == {"crop"}
    assert set(df["split"]) == {"synthetic"} and set(df["extra_description"]) == {""}
    assert all(len(ids) == 1 for ids in df["article_ids"])
    assert df.select(pl.col("article_ids").list.first(), "question").is_duplicated().sum() == 0
    first = out.read_bytes()
    assert run_stage(_driver(), argv) == 0
    assert out.read_bytes() == first  # byte-identical rerun


def test_none_generator_writes_empty_file_with_schema(tmp_path):
    df = q.generate(ARTICLES, q.QueriesConfig.from_params(section("queries", generator="none")), seed=0)
    assert df.height == 0 and dict(df.schema) == SCHEMA


@pytest.mark.parametrize("params", [{"generator": "t5"}, {"min_words": 9, "max_words": 3}, {"top_p": 0}, {"n": 1}])
def test_bad_params_are_config_errors(params):
    with pytest.raises(ConfigError):
        q.QueriesConfig.from_params(section("queries", **params))


# --------------------------------------------------------------------------- fetched synthetic questions


def clean_questions(fetched: list[tuple[int, str, list[int]]]) -> pl.DataFrame:
    """A clean questions table: two human questions and the ``fetched`` synthetic ones (id, text,
    gold), as clean writes them (the hub's empty category columns included)."""
    human = [(1, "Qui paie le mur mitoyen ?", [10], "train"), (2, "Peut-on exproprier ?", [11], "test")]
    rows = human + [(i, t, g, "synthetic") for i, t, g in fetched]
    return pl.DataFrame(
        {
            "id": [r[0] for r in rows],
            "question": [r[1] for r in rows],
            "category": [None if r[3] == "synthetic" else "Logement" for r in rows],
            "subcategory": [None] * len(rows),
            "extra_description": [None] * len(rows),
            "article_ids": [r[2] for r in rows],
            "split": [r[3] for r in rows],
        },
        schema=SCHEMA,
    )


CROP = {"generator": "crop", "per_article": 3, "min_words": 2, "max_words": 5, "first_id": 500}


def run_driver(tmp_path, articles, questions: pl.DataFrame, queries: dict) -> pl.DataFrame:
    """stages/generate_queries.py on ``articles`` and the clean ``questions``; its output."""
    paths = {name: tmp_path / f"{name}.parquet" for name in ("articles", "questions")}
    pl.DataFrame({"id": [a for a, _ in articles], "article": [t for _, t in articles]}).write_parquet(paths["articles"])
    questions.write_parquet(paths["questions"])
    params = tmp_path / "params.yaml"
    write_params(params, base={"seed": 3}, queries=queries)
    out = tmp_path / "synthetic.parquet"
    argv = ["--params", str(params), "--articles", str(paths["articles"]), "--questions", str(paths["questions"])]
    assert run_stage(_driver(), [*argv, "--out", str(out)]) == 0
    return pl.read_parquet(out)


def test_fetched_synthetic_questions_are_kept_and_only_the_other_articles_get_generated_ones(tmp_path, caplog):
    """fetch.synthetic: the hub's synthetic questions (clean's rows of split synthetic) are the
    output's first rows, ids and text as clean has them; the generator runs for the articles
    none of them cites (10 and 12 are cited, 13 is empty: only 11 and 14 get crops)."""
    fetched = [(331, "Que ne peut faire le propriétaire du fonds servant ?", [10]), (332, "Abrogé ?", [12])]
    caplog.set_level("INFO", logger="lexgraph.data.queries")
    df = run_driver(tmp_path, ARTICLES, clean_questions(fetched), CROP)
    assert dict(df.schema) == SCHEMA
    hub = df.head(2)
    assert hub.equals(clean_questions(fetched).filter(pl.col("split") == "synthetic"))  # every column as clean has it
    generated = df.slice(2)
    assert generated.height > 0 and set(generated["subcategory"]) == {"crop"}
    assert {ids[0] for ids in generated["article_ids"]} == {11, 14}
    assert generated["id"].to_list() == list(range(500, 500 + generated.height))
    cfg = q.QueriesConfig.from_params(section("queries", **CROP))
    alone = q.generate([a for a in ARTICLES if a[0] in (11, 13, 14)], cfg, seed=3)
    assert generated.equals(alone)  # crops are seeded per article: those of the uncited articles
    assert "2 from the hub" in caplog.text and f"{generated.height} generated (crop)" in caplog.text


def test_without_fetched_synthetic_questions_the_output_is_unchanged(tmp_path):
    """The embedded sample's layout (no synthetic rows in the clean questions): every article
    goes to the generator, as before the clean questions were read."""
    df = run_driver(tmp_path, ARTICLES, clean_questions([]), CROP)
    cfg = q.QueriesConfig.from_params(section("queries", **CROP))
    assert df.equals(q.generate(ARTICLES, cfg, seed=3))
    assert {ids[0] for ids in df["article_ids"]} == {10, 11, 12, 14}
    with_file = tmp_path / "synthetic.parquet"
    q.write_queries(tmp_path / "articles.parquet", tmp_path / "again.parquet", cfg, seed=3)  # no questions file at all
    assert (tmp_path / "again.parquet").read_bytes() == with_file.read_bytes()


def test_a_generated_text_that_repeats_a_fetched_question_is_dropped_and_ids_may_not_clash():
    cfg = q.QueriesConfig.from_params(section("queries", **CROP))
    first = q.generate([ARTICLES[1]], cfg, seed=3)
    taken = first["question"][0]
    fetched = clean_questions([(331, f" {taken} ", [10])]).filter(pl.col("split") == "synthetic")
    df = q.with_fetched(ARTICLES[:2], fetched, cfg, seed=3)
    assert taken not in df["question"].to_list()[1:] and df.height == first.height  # 1 fetched + the others
    clash = clean_questions([(500, "Une question du hub ?", [10])]).filter(pl.col("split") == "synthetic")
    with pytest.raises(ConfigError, match=r"'queries.first_id' = 500: .* reuse the id 500 .*above 500"):
        q.with_fetched(ARTICLES, clash, cfg, seed=3)


# --------------------------------------------------------------------------- doc2query


D2Q = dict(generator="doc2query", per_article=3, top_k=7, top_p=0.9, max_length=9, max_input_length=12, batch_size=2)


def test_doc2query_passes_generation_arguments(tiny_mt5, monkeypatch):
    from transformers import MT5ForConditionalGeneration

    calls = []
    original = MT5ForConditionalGeneration.generate

    def recording_generate(self, *args, **kwargs):
        calls.append(kwargs)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(MT5ForConditionalGeneration, "generate", recording_generate)
    cfg = q.QueriesConfig.from_params(section("queries", **D2Q, model=str(tiny_mt5)))
    df = q.generate(ARTICLES, cfg, seed=5)

    assert len(calls) == 2  # 4 non-empty articles in batches of 2
    for kwargs in calls:
        assert kwargs["do_sample"] is True
        assert (kwargs["top_k"], kwargs["top_p"], kwargs["max_length"], kwargs["num_return_sequences"]) == (
            7,
            0.9,
            9,
            3,
        )
        assert kwargs["input_ids"].shape[1] <= 12 and kwargs["attention_mask"].shape == kwargs["input_ids"].shape
    assert max(k["input_ids"].shape[1] for k in calls) == 12  # the long article was truncated to 12

    assert dict(df.schema) == SCHEMA
    assert set(df["subcategory"]) == {"doc2query"}
    assert df["question"].str.strip_chars().str.len_chars().min() > 0
    per_article = df.group_by(pl.col("article_ids").list.first()).len()
    assert per_article["len"].max() <= 3
    assert set(per_article["article_ids"]) <= {a for a, t in ARTICLES if t}
    assert q.generate(ARTICLES, cfg, seed=5).equals(df)  # seeded


def test_doc2query_hub_unreachable_is_one_sentence(monkeypatch, tmp_path, capsys):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    cfg = q.QueriesConfig.from_params(section("queries", **D2Q, model="lexgraph-test/no-such-doc2query"))
    with pytest.raises(HubUnreachableError) as info:
        q.generate(ARTICLES, cfg, seed=0)
    assert "\n" not in str(info.value) and "lexgraph-test/no-such-doc2query" in str(info.value)
    assert "queries.model" in str(info.value)

    # through the stage driver: one line on stderr, exit status 2, no output file
    articles = tmp_path / "articles.parquet"
    pl.DataFrame({"id": [1], "article": ["Un article."]}).write_parquet(articles)
    params = tmp_path / "params.yaml"
    write_params(params, queries={"generator": "doc2query", "model": "lexgraph-test/no-such-doc2query"})
    out = tmp_path / "synthetic.parquet"
    questions = tmp_path / "questions.parquet"
    clean_questions([]).write_parquet(questions)
    argv = ["--params", str(params), "--articles", str(articles), "--questions", str(questions), "--out", str(out)]
    assert run_stage(_driver(), argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lexgraph generate_queries: error: could not load")
    assert not out.exists()


# --------------------------------------------------------------------------- helpers


def _driver():
    """The stage stages/generate_queries.py declares."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "stages" / "generate_queries.py"
    spec = importlib.util.spec_from_file_location("stage_generate_queries", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.STAGE

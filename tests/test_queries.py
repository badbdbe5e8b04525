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
    argv = ["--params", str(params), "--articles", str(articles), "--out", str(out)]
    assert run_stage("queries", *_driver(), argv, config=q.QueriesConfig.from_params) == 0
    df = pl.read_parquet(out)
    assert dict(df.schema) == SCHEMA
    assert df["id"].to_list() == list(range(500, 500 + df.height))
    assert set(df["category"]) == {"synthetic"} and set(df["subcategory"]) == {"crop"}
    assert set(df["split"]) == {"synthetic"} and set(df["extra_description"]) == {""}
    assert all(len(ids) == 1 for ids in df["article_ids"])
    assert df.select(pl.col("article_ids").list.first(), "question").is_duplicated().sum() == 0
    first = out.read_bytes()
    assert run_stage("queries", *_driver(), argv, config=q.QueriesConfig.from_params) == 0
    assert out.read_bytes() == first  # byte-identical rerun


def test_none_generator_writes_empty_file_with_schema(tmp_path):
    df = q.generate(ARTICLES, q.QueriesConfig.from_params(section("queries", generator="none")), seed=0)
    assert df.height == 0 and dict(df.schema) == SCHEMA


@pytest.mark.parametrize("params", [{"generator": "t5"}, {"min_words": 9, "max_words": 3}, {"top_p": 0}, {"n": 1}])
def test_bad_params_are_config_errors(params):
    with pytest.raises(ConfigError):
        q.QueriesConfig.from_params(section("queries", **params))


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
    argv = ["--params", str(params), "--articles", str(articles), "--out", str(out)]
    assert run_stage("queries", *_driver(), argv, config=q.QueriesConfig.from_params) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lexgraph queries: error: could not load")
    assert not out.exists()


# --------------------------------------------------------------------------- helpers


def _driver():
    """``(main, configure)`` of stages/generate_queries.py."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "stages" / "generate_queries.py"
    spec = importlib.util.spec_from_file_location("stage_generate_queries", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main, module.configure

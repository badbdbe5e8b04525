"""benchmarks/french_law.py: the corpus reader's one-line errors, the sizes, the statute's headings by hand,
and a BM25 run end to end on a tiny workspace and a tiny synthetic corpus."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest

from conftest import load_benchmark
from lexgraph.core.errors import DataError, LexgraphError
from lexgraph.search.bm25 import BM25

fl = load_benchmark("french_law")

ARTICLES = [
    (1, "Le propriétaire d'un mur mitoyen peut le faire exhausser."),
    (2, "Tout propriétaire peut obliger son voisin au bornage de leurs propriétés contiguës."),
    (3, "Le bail est un contrat par lequel une partie s'oblige à faire jouir l'autre d'une chose."),
]
DISTRACTORS = [
    {"id": 1, "code": "Code civil", "path": ["Livre Ier"], "text": "Texte de 2020 du code civil."},
    {"id": 2, "code": "Code rural", "path": ["Livre Ier : Du sol", "Titre II"], "text": "Le bornage des champs."},
    {"id": 3, "code": "Code rural", "path": [], "text": "Les haies\nvives."},
    {"id": 4, "code": "Code de la route", "path": ["Partie I"], "text": "Le conducteur doit rester maître."},
]


def write_corpus(path, rows) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        for row in rows:
            fh.write((row if isinstance(row, str) else json.dumps(row, ensure_ascii=False)) + "\n")


@pytest.fixture
def workspace(tmp_path):
    ws = tmp_path / "ws"
    (ws / "data/clean").mkdir(parents=True)
    ids, texts = [a for a, _ in ARTICLES], [t for _, t in ARTICLES]
    pl.DataFrame({"id": ids, "article": texts, "heading_id": [0, 0, -1]}).write_parquet(
        ws / "data/clean/articles.parquet"
    )
    pl.DataFrame(
        {
            "heading_id": [0],
            "parent_id": [-1],
            "level": [1],
            "level_name": ["code"],
            "label": ["Code A"],
            "path": [["Code A"]],
            "text": ["Code A"],
        }
    ).write_parquet(ws / "data/clean/headings.parquet")
    pl.DataFrame(
        {
            "id": [10, 11, 12],
            "question": ["mur mitoyen exhausser", "bornage voisin", "contrat de bail"],
            "article_ids": [[1], [2], [3]],
            "split": ["test", "test", "train"],
        }
    ).write_parquet(ws / "data/clean/questions.parquet")
    BM25(k1=1.0, b=0.1).fit_texts(texts, ids).save(ws / "models/bm25")
    return ws


def test_reader_drops_the_code_civil_offsets_ids_and_unwraps_texts(tmp_path):
    path = tmp_path / "c.jsonl.gz"
    write_corpus(path, DISTRACTORS)
    dis = fl.read_corpus(path)
    assert dis.dropped == 1
    assert dis.ids.tolist() == [fl.DISTRACTOR_OFFSET + i for i in (2, 3, 4)]
    assert dis.paths[0] == ("Code rural", "Livre Ier : Du sol", "Titre II") and dis.paths[1] == ("Code rural",)
    assert "\n" not in dis.texts[1]


@pytest.mark.parametrize(
    "row, expected",
    [
        (
            {"id": 9, "code": "Code rural", "path": []},
            "row 2, column 'text': 'text' is None; expected a non-empty text",
        ),
        ({"id": 9, "code": "Code rural", "path": "Livre I", "text": "x"}, "column 'path': 'path' is 'Livre I'"),
        ({"id": 2, "code": "Code rural", "path": [], "text": "x"}, "row 2, column 'id': duplicate id 2"),
        ({"id": "a", "code": "Code rural", "path": [], "text": "x"}, "column 'id': 'id' is 'a'; expected an integer"),
        ("{not json", "row 2: not JSON"),
        ("[1, 2]", "row 2: not a JSON object"),
    ],
)
def test_a_bad_corpus_line_is_one_error_naming_file_row_and_field(tmp_path, row, expected):
    path = tmp_path / "c.jsonl.gz"
    write_corpus(path, [DISTRACTORS[1], row])
    with pytest.raises(DataError) as err:
        fl.read_corpus(path)
    assert str(err.value).startswith(str(path)) and expected in str(err.value)
    assert "\n" not in str(err.value)


def test_a_corpus_that_is_not_gzip_or_holds_only_the_code_civil_is_refused(tmp_path):
    plain = tmp_path / "c.jsonl"
    plain.write_text(json.dumps(DISTRACTORS[1]) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match="cannot read the corpus"):
        fl.read_corpus(plain)
    only = tmp_path / "only.jsonl.gz"
    write_corpus(only, DISTRACTORS[:1])
    with pytest.raises(DataError, match="no article outside"):
        fl.read_corpus(only)


def test_sizes_are_sorted_distinct_and_bounded():
    assert fl.resolve_sizes(["all", "3", "5", "3"], 3, 4) == [3, 5, 7]
    for bad in (["2"], ["8"]):
        with pytest.raises(LexgraphError, match=r"expected a size in \[3, 7\]"):
            fl.resolve_sizes(bad, 3, 4)


def test_the_statute_holds_the_sample_then_the_distractors_headings_by_hand(tmp_path, workspace):
    """Distractor headings are built as clean builds a corpus's (code, then path), shifted past the
    sample's; a size keeps its articles and every heading above them, no other."""
    path = tmp_path / "c.jsonl.gz"
    write_corpus(path, DISTRACTORS)
    dis = fl.read_corpus(path)
    statute = fl.read_statute(workspace, path, dis)
    off, h = fl.DISTRACTOR_OFFSET, fl.HEADING_OFFSET
    heads = {r["heading_id"]: (r["parent_id"], tuple(r["path"])) for r in statute.headings.iter_rows(named=True)}
    assert heads == {
        0: (-1, ("Code A",)),
        h + 0: (-1, ("Code rural",)),
        h + 1: (h + 0, ("Code rural", "Livre Ier : Du sol")),
        h + 2: (h + 1, ("Code rural", "Livre Ier : Du sol", "Titre II")),
        h + 3: (-1, ("Code de la route",)),
        h + 4: (h + 3, ("Code de la route", "Partie I")),
    }
    under = dict(zip(statute.articles["id"].to_list(), statute.articles["heading_id"].to_list()))
    assert under == {1: 0, 2: 0, 3: -1, off + 2: h + 2, off + 3: h + 0, off + 4: h + 4}
    articles, kept = fl.statute_at(statute, [1, off + 2])
    assert sorted(articles["id"].to_list()) == [1, off + 2]
    assert sorted(kept["heading_id"].to_list()) == [0, h + 0, h + 1, h + 2]


def test_bm25_end_to_end_writes_quality_tests_and_steps(tmp_path, workspace):
    corpus, out = tmp_path / "c.jsonl.gz", tmp_path / "out.json"
    write_corpus(corpus, DISTRACTORS)
    argv = ["--corpus", str(corpus), "--workspace", str(workspace), "--out", str(out)]
    assert fl.main([*argv, "--sizes", "3", "all", "--systems", "bm25", "--k", "100", "--resamples", "50"]) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["sizes"] == [3, 6] and result["n_queries"] == 2 and result["dropped_articles"] == 1
    assert result["quality"]["bm25"]["3"]["recall@10"] == 1.0
    assert {t["metric"] for t in result["paired"]} == set(fl.COMPARED)
    assert all({"p_value", "p_holm", "ci95", "diff"} <= t.keys() for t in result["paired"])
    steps = {(s["system"], s["step"], s["size"]) for s in result["steps"]}
    assert {("bm25", "fit", 3), ("bm25", "search", 6), ("all", "read", None)} <= steps
    assert all(s["wall_s"] >= 0 and s["peak_rss_mib"] > 0 for s in result["steps"])


def test_bad_arguments_are_one_line(tmp_path, workspace, caplog):
    corpus = tmp_path / "c.jsonl.gz"
    write_corpus(corpus, DISTRACTORS)
    argv = ["--corpus", str(corpus), "--workspace", str(workspace), "--systems", "bm25"]
    assert fl.main([*argv, "--out", str(tmp_path / "o.json"), "--sizes", "99"]) == 2
    assert "--sizes: 99 articles, expected a size in [3, 6]" in caplog.text
    assert fl.main([*argv, "--out", str(tmp_path), "--sizes", "3"]) == 2
    assert "is a directory" in caplog.text
    assert fl.main([*argv, "--out", str(tmp_path / "o.json"), "--sizes", "few"]) == 2
    assert "--sizes: 'few'" in caplog.text


def test_blocks_cut_at_every_block_and_every_size():
    assert fl.blocks([3, 3 + 2 * fl.BLOCK + 5], 3) == [
        (0, fl.BLOCK),
        (fl.BLOCK, 2 * fl.BLOCK),
        (2 * fl.BLOCK, 2 * fl.BLOCK + 5),
    ]
    assert fl.blocks([3, 10, 20], 3) == [(0, 7), (7, 17)]
    assert fl.blocks([3], 3) == []


def test_a_cache_of_another_key_is_refused_in_one_line(tmp_path):
    key = {
        "corpus": "c.jsonl.gz",
        "corpus_bytes": 10,
        "seed": 13,
        "block": fl.BLOCK,
        "settings": {},
        "base_encoder": "a",
    }
    cache = tmp_path / "cache"
    assert fl.open_cache(cache, key) == cache and fl.open_cache(cache, key) == cache  # created, then reused
    with pytest.raises(DataError, match=r"cache.json: chunk vectors of another base_encoder, seed than this run's"):
        fl.open_cache(cache, {**key, "seed": 1, "base_encoder": "b"})
    (tmp_path / "file").write_text("x", encoding="utf-8")
    with pytest.raises(DataError, match="is a file"):
        fl.open_cache(tmp_path / "file", key)
    assert fl.open_cache(None, key) is None


def test_table_of_a_saved_result_and_its_bad_inputs(tmp_path, workspace, caplog, capsys):
    corpus, out = tmp_path / "c.jsonl.gz", tmp_path / "out.json"
    write_corpus(corpus, DISTRACTORS)
    argv = ["--corpus", str(corpus), "--workspace", str(workspace), "--out", str(out), "--systems", "bm25"]
    assert fl.main([*argv, "--sizes", "3", "all", "--k", "100", "--resamples", "50"]) == 0
    printed = capsys.readouterr().out
    assert fl.main(["--table", str(out)]) == 0
    table = capsys.readouterr().out
    assert table == printed and "| bm25 | 6 |" in table and "| bm25 3 → 6 | recall@100 |" in table
    assert "| bm25 | fit | 3 |" in table
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"sizes": [3]}), encoding="utf-8")
    assert fl.main(["--table", str(broken)]) == 2
    assert str(broken) in caplog.text and "quality" in caplog.text
    assert fl.main(["--corpus", str(corpus)]) == 2
    assert "--workspace, --out required (or --table JSON)" in caplog.text


def test_cost_rows_sum_each_size_steps_and_write_the_plot_csv(tmp_path):
    """The cost chart's rows by hand: a size's steps summed by column, the encoding from scratch at
    the measured rate, the size's peak; size-less steps (read, load) stay out of it."""
    step = lambda name, size, wall, peak=100.0: {"step": name, "size": size, "wall_s": wall, "peak_rss_mib": peak}  # noqa: E731
    result = {
        "sizes": [3, 9],
        "sample_articles": 3,
        "encode_rate": {"per_s": 1.5, "articles": 6, "wall_s": 4.0, "threads": 2},
        "steps": [
            step("read", None, 50.0, 999.0),
            step("fit", 3, 1.0),
            step("index + search", 3, 0.5, 120.0),
            step("search", 3, 0.25),
            step("fit", 9, 2.0),
            step("build graph", 9, 3.0),
            step("graph pass", 9, 2.0, 300.0),
            step("propagate", 9, 1.0),
            step("encode candidates + re-rank", 9, 7.0),
        ],
    }
    zero = dict.fromkeys(["search_s", "graph_build_s", "graph_pass_s", "hybrid_s", "xrerank_s"], 0.0)
    assert fl.cost_rows(result) == [
        {"articles": 3, "encode_s": 0.0, "bm25_fit_s": 1.0, **zero, "search_s": 0.75, "peak_rss_mib": 120.0},
        {
            "articles": 9,
            "encode_s": 4.0,
            "bm25_fit_s": 2.0,
            **zero,
            "graph_build_s": 3.0,
            "graph_pass_s": 3.0,
            "xrerank_s": 7.0,
            "peak_rss_mib": 300.0,
        },
    ]
    fl.write_plots(result, tmp_path / "cost.csv")
    lines = (tmp_path / "cost.csv").read_text(encoding="utf-8").splitlines()
    assert (
        lines[0] == "articles,encode_s,bm25_fit_s,search_s,graph_build_s,graph_pass_s,hybrid_s,xrerank_s,peak_rss_mib"
    )
    assert lines[2] == "9,4.0,2.0,0.0,3.0,3.0,0.0,7.0,300.0"


def test_the_docs_tables_and_the_chart_data_are_the_committed_result(tmp_path):
    """docs/scale.md's tables are ``--table benchmarks/french_law.json`` line for line, and the
    plotted CSV is its ``--plots`` (rerun the benchmark, then regenerate both)."""
    from conftest import ROOT

    result = fl.read_result(ROOT / "benchmarks" / "french_law.json")
    expected = [line for line in fl.markdown_tables(result).splitlines() if line.startswith("|")]
    docs = (ROOT / "docs" / "scale.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(docs) if line.startswith("**All of French law, measured**"))
    end = next(i for i in range(start + 1, len(docs)) if docs[i].startswith("#"))
    assert [line for line in docs[start:end] if line.startswith("|")] == expected
    fl.write_plots(result, tmp_path / "cost.csv")
    committed = (ROOT / "benchmarks" / "french_law_cost.csv").read_text(encoding="utf-8")
    assert committed == (tmp_path / "cost.csv").read_text(encoding="utf-8")


def test_score_compares_each_size_pair_and_each_drop_with_bm25s_by_hand():
    """recall@100 by hand: bm25 loses half of q1's and all of q2's gold articles from 3 to 9
    articles (per-query drops -0.5, -1), dsr loses none; so dsr's drop minus bm25's is +0.75."""
    qrels = {1: [10, 11], 2: [20]}
    runs = {
        "bm25": {3: {1: [10, 11], 2: [20]}, 9: {1: [10, 99], 2: [98]}},
        "dsr": {3: {1: [11, 10], 2: [20]}, 9: {1: [10, 11], 2: [20]}},
    }
    result = fl.score(runs, qrels, n_resamples=200, seed=0)
    assert result["quality"]["bm25"]["9"]["recall@100"] == 0.25
    paired = {(t["system"], t["metric"]): t for t in result["paired"]}
    assert paired["bm25", "recall@100"]["diff"] == -0.75 and paired["dsr", "recall@100"]["diff"] == 0.0
    against = {(t["system"], t["metric"]): t for t in result["against_bm25"]}
    assert set(against) == {("dsr", m) for m in fl.COMPARED}
    assert against["dsr", "recall@100"]["diff"] == 0.75
    for t in [*result["paired"], *result["against_bm25"]]:
        assert 0 < t["p_value"] <= t["p_holm"] <= 1 and t["ci95"][0] <= t["diff"] <= t["ci95"][1]
    assert paired["dsr", "recall@100"]["p_value"] == 1.0  # identical per-query scores

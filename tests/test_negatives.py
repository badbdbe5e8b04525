"""BM25 negative mining and the mine_negatives stage driver on tiny Parquet fixtures."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml

from conftest import write_params
from lexgraph.core.stage import run_stage
from lexgraph.methods.dsr.negatives import NegativesConfig, mine_from_index, mine_negatives
from lexgraph.search.bm25 import BM25
from lexgraph.text.analyzer import FrenchAnalyzer

ROOT = Path(__file__).resolve().parents[1]

ARTICLES = [
    (101, "Le propriétaire d'un fonds peut le clore et exiger le bornage avec ses voisins."),
    (102, "Les servitudes sont établies pour l'usage et l'utilité des fonds voisins."),
    (103, "La servitude de passage est due au propriétaire d'un fonds enclavé."),
    (104, "L'usufruitier jouit des fruits du fonds comme le propriétaire."),
    (105, "Le mariage est contracté par deux personnes de sexe différent ou de même sexe."),
    (106, "Les époux se doivent mutuellement respect, fidélité, secours et assistance."),
    (107, "Le divorce peut être prononcé par consentement mutuel des époux."),
    (108, "La succession s'ouvre par la mort au dernier domicile du défunt."),
    (109, "Un héritier peut accepter la succession ou y renoncer."),
    (110, "Le testament peut être olographe, authentique ou mystique."),
    (111, "Les fruits naturels et industriels pendants par les racines appartiennent au propriétaire du fonds."),
    (112, "Nul ne peut être contraint de céder sa propriété, si ce n'est pour cause d'utilité publique."),
]

QUESTIONS = [
    (1, "Mon voisin peut-il passer sur mon fonds enclavé ? Quelle servitude de passage ?", [103], "train"),
    (2, "Puis-je renoncer à la succession de mon père, héritier malgré moi ?", [109, 108], "train"),
    (3, "Les époux peuvent-ils divorcer par consentement mutuel ?", [107], "dev"),
    (4, "Qui récolte les fruits du fonds, le propriétaire ou l'usufruitier ?", [104, 111], "train"),
    (5, "Quelle est la couleur du ciel ?", [110], "train"),  # matches nothing
]


BASE = {"seed": 1, "device": "cpu", "log_level": "WARNING"}
NEGATIVES = {"k1": 1.0, "b": 0.6, "depth": 500, "k": 3, "splits": ["train", "synthetic"]}


def write_fixtures(tmp_path: Path, *, drop_article_ids: bool = False) -> dict[str, Path]:
    articles = pl.DataFrame(
        {"id": [a for a, _ in ARTICLES], "article": [t for _, t in ARTICLES], "reference": ["Art."] * len(ARTICLES)},
        schema={"id": pl.Int64, "article": pl.String, "reference": pl.String},
    )
    questions = pl.DataFrame(
        {
            "id": [q[0] for q in QUESTIONS],
            "question": [q[1] for q in QUESTIONS],
            "category": ["x"] * len(QUESTIONS),
            "article_ids": [q[2] for q in QUESTIONS],
            "split": [q[3] for q in QUESTIONS],
        },
        schema={
            "id": pl.Int64,
            "question": pl.String,
            "category": pl.String,
            "article_ids": pl.List(pl.Int64),
            "split": pl.String,
        },
    )
    synthetic = pl.DataFrame(
        {"id": [1], "question": ["servitudes des fonds voisins"], "article_ids": [[102]], "split": ["synthetic"]},
        schema={"id": pl.Int64, "question": pl.String, "article_ids": pl.List(pl.Int64), "split": pl.String},
    )
    if drop_article_ids:
        questions = questions.drop("article_ids")
    paths = {
        "articles": tmp_path / "articles.parquet",
        "questions": tmp_path / "questions.parquet",
        "synthetic": tmp_path / "synthetic.parquet",
        "params": tmp_path / "params.yaml",
        "hub": tmp_path / "raw_negatives.parquet",
    }
    pl.DataFrame(schema={"question_id": pl.Int64, "split": pl.Utf8, "article_ids": pl.List(pl.Int64)}).write_parquet(
        paths["hub"]
    )  # fetch.negatives false: nothing fetched
    articles.write_parquet(paths["articles"])
    questions.write_parquet(paths["questions"])
    synthetic.write_parquet(paths["synthetic"])
    write_params(paths["params"], base=BASE, negatives=NEGATIVES)
    return paths


def expected_negatives(question: str, gold: list[int], k: int, depth: int = 500) -> list[int]:
    """Brute force: dense scores of every article, ranked, gold and zero scores removed."""
    analyzer = FrenchAnalyzer()
    bm = BM25(k1=1.0, b=0.6).fit(analyzer.analyze_many([t for _, t in ARTICLES]), [a for a, _ in ARTICLES])
    scores = bm.score_tokens([analyzer(question)])[0]
    order = np.lexsort((bm.doc_ids, -scores))[:depth]
    return [int(bm.doc_ids[j]) for j in order if scores[j] > 0 and bm.doc_ids[j] not in gold][:k]


def load_driver():
    spec = importlib.util.spec_from_file_location("stage_mine_negatives", ROOT / "stages" / "mine_negatives.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mine_from_index_never_returns_gold_and_matches_brute_force():
    rng = random.Random(0)
    terms = [f"t{i}" for i in range(30)]
    docs = [rng.choices(terms, k=rng.randint(1, 15)) for _ in range(200)]
    ids = list(range(1000, 1200))
    bm = BM25(k1=1.0, b=0.6).fit(docs, ids)
    queries = [rng.choices(terms, k=rng.randint(1, 5)) for _ in range(50)]
    gold = [rng.sample(ids, rng.randint(0, 30)) for _ in queries]
    for k, depth in ((10, 500), (5, 12), (40, 60)):
        negatives = mine_from_index(bm, queries, gold, k=k, depth=depth, batch_size=16)
        dense = bm.score_tokens(queries)
        for neg, g, row in zip(negatives, gold, dense):
            assert neg.dtype == np.int64 and len(neg) <= k
            assert not set(neg.tolist()) & set(g)
            order = np.lexsort((bm.doc_ids, -row))[:depth]
            want = [int(bm.doc_ids[j]) for j in order if row[j] > 0 and bm.doc_ids[j] not in g][:k]
            assert neg.tolist() == want


def test_mine_negatives_dataframe():
    articles = pl.DataFrame({"id": [a for a, _ in ARTICLES], "article": [t for _, t in ARTICLES]})
    questions = pl.DataFrame(
        {
            "id": [q[0] for q in QUESTIONS],
            "question": [q[1] for q in QUESTIONS],
            "article_ids": [q[2] for q in QUESTIONS],
            "split": [q[3] for q in QUESTIONS],
        }
    )
    out = mine_negatives(articles, questions, k=2)
    assert out.schema == {"question_id": pl.Int64, "split": pl.String, "negative_ids": pl.List(pl.Int64)}
    for (_qid, text, gold, _), negs in zip(QUESTIONS, out["negative_ids"].to_list()):
        assert negs == expected_negatives(text, gold, 2)
        assert len(negs) <= 2 and not set(negs) & set(gold)
    assert out.filter(pl.col("question_id") == 5)["negative_ids"].to_list() == [[]]


def run_stage_once(tmp_path):
    """Run the mine_negatives stage on the fixtures: ``(driver, argv, out)``."""
    paths = write_fixtures(tmp_path)
    out = tmp_path / "data" / "negatives" / "negatives.parquet"
    driver = load_driver()
    argv = [
        "--params",
        str(paths["params"]),
        "--articles",
        str(paths["articles"]),
        "--questions",
        str(paths["questions"]),
        "--synthetic",
        str(paths["synthetic"]),
        "--hub-negatives",
        str(paths["hub"]),
        "--out",
        str(out),
    ]
    assert run_stage(driver.STAGE, argv) == 0
    return driver, argv, out


def test_stage_writes_expected_parquet(tmp_path):
    driver, argv, out = run_stage_once(tmp_path)
    df = pl.read_parquet(out)
    assert df.schema == {"question_id": pl.Int64, "split": pl.String, "negative_ids": pl.List(pl.Int64)}
    # train questions in input order (the dev one is skipped), then the synthetic one
    assert list(zip(df["question_id"], df["split"])) == [
        (1, "train"),
        (2, "train"),
        (4, "train"),
        (5, "train"),
        (1, "synthetic"),
    ]
    texts = {(q[0], "train"): (q[1], q[2]) for q in QUESTIONS}
    texts[(1, "synthetic")] = ("servitudes des fonds voisins", [102])
    for qid, split, negs in df.iter_rows():
        text, gold = texts[(qid, split)]
        assert negs == expected_negatives(text, gold, 3)
        assert len(negs) <= 3 and not set(negs) & set(gold)
    assert df.filter(pl.col("question_id") == 1)["negative_ids"].list.len().to_list() == [3, 3]
    first = out.read_bytes()
    # deterministic; an absent synthetic file is skipped with a warning
    assert run_stage(driver.STAGE, argv) == 0
    assert out.read_bytes() == first
    argv[argv.index("--synthetic") + 1] = str(tmp_path / "absent.parquet")
    assert run_stage(driver.STAGE, argv) == 0
    assert pl.read_parquet(out)["split"].to_list() == ["train"] * 4


def test_stage_fails_cleanly_without_article_ids(tmp_path, capsys):
    paths = write_fixtures(tmp_path, drop_article_ids=True)
    out = tmp_path / "out" / "negatives.parquet"
    driver = load_driver()
    argv = [
        "--params",
        str(paths["params"]),
        "--articles",
        str(paths["articles"]),
        "--questions",
        str(paths["questions"]),
        "--synthetic",
        str(tmp_path / "none.parquet"),
        "--hub-negatives",
        str(paths["hub"]),
        "--out",
        str(out),
    ]
    assert run_stage(driver.STAGE, argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "article_ids" in err and str(paths["questions"]) in err
    assert not out.exists()
    assert not out.parent.exists() or not any(out.parent.iterdir())


def test_stage_rejects_string_article_ids(tmp_path, capsys):
    paths = write_fixtures(tmp_path)
    raw = pl.read_parquet(paths["questions"]).with_columns(
        pl.col("article_ids").list.eval(pl.element().cast(pl.String)).list.join(",")
    )
    raw.write_parquet(paths["questions"])
    out = tmp_path / "negatives.parquet"
    driver = load_driver()
    argv = [
        "--params",
        str(paths["params"]),
        "--articles",
        str(paths["articles"]),
        "--questions",
        str(paths["questions"]),
        "--synthetic",
        str(tmp_path / "none.parquet"),
        "--hub-negatives",
        str(paths["hub"]),
        "--out",
        str(out),
    ]
    assert run_stage(driver.STAGE, argv) == 2
    err = capsys.readouterr().err.strip()
    assert "column 'article_ids'" in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("bad", ["k: 0", "splits: []", "k1: fast"])
def test_stage_rejects_bad_params(tmp_path, capsys, bad):
    paths = write_fixtures(tmp_path)
    key = bad.split(":")[0]
    write_params(paths["params"], base=BASE, negatives={**NEGATIVES, **yaml.safe_load(bad)})
    out = tmp_path / "negatives.parquet"
    driver = load_driver()
    argv = [
        "--params",
        str(paths["params"]),
        "--articles",
        str(paths["articles"]),
        "--questions",
        str(paths["questions"]),
        "--synthetic",
        str(tmp_path / "none.parquet"),
        "--hub-negatives",
        str(paths["hub"]),
        "--out",
        str(out),
    ]
    assert run_stage(driver.STAGE, argv) == 2
    assert f"negatives.{key}" in capsys.readouterr().err
    assert not out.exists()


def test_stage_rejects_duplicate_question_ids(tmp_path, capsys):
    paths = write_fixtures(tmp_path)
    syn = pl.read_parquet(paths["synthetic"])
    pl.concat([syn, syn]).write_parquet(paths["synthetic"])
    out = tmp_path / "negatives.parquet"
    driver = load_driver()
    argv = [
        "--params",
        str(paths["params"]),
        "--articles",
        str(paths["articles"]),
        "--questions",
        str(paths["questions"]),
        "--synthetic",
        str(paths["synthetic"]),
        "--hub-negatives",
        str(paths["hub"]),
        "--out",
        str(out),
    ]
    assert run_stage(driver.STAGE, argv) == 2
    err = capsys.readouterr().err.strip()
    assert "more than once" in err and "synthetic.parquet" in err
    assert not out.exists()


def test_stage_on_a_full_disk_keeps_the_previous_output(tmp_path, capsys, monkeypatch):
    """ENOSPC while the stage writes its output (issue 18): one line naming the output and
    the reason, exit 2, the previous output byte-identical, no temporary left."""
    import errno
    import os

    driver, argv, out = run_stage_once(tmp_path)
    previous = out.read_bytes()
    capsys.readouterr()

    def full_disk(self, file, *args, **kwargs):
        with open(file, "wb") as fh:
            fh.write(b"PAR1 half a file")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))

    monkeypatch.setattr(pl.DataFrame, "write_parquet", full_disk)
    assert run_stage(driver.STAGE, argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("lexgraph mine_negatives: error: ")]
    assert len(lines) == 1, err
    assert f"{out}: not written, no space left on device; free space and rerun" in lines[0]
    assert out.read_bytes() == previous
    assert [p.name for p in out.parent.iterdir()] == ["negatives.parquet"]


def test_dev_questions_are_mined_with_split_dev_when_listed(tmp_path):
    """negatives.splits with dev (both profiles): the refits train on dev with BM25 negatives."""
    from lexgraph.methods.dsr.negatives import mine

    paths = write_fixtures(tmp_path)
    config = NegativesConfig.from_params({**NEGATIVES, "splits": ["train", "dev", "synthetic"]})
    df = mine(config, paths["articles"], paths["questions"], paths["synthetic"])
    assert list(zip(df["question_id"], df["split"])) == [
        (1, "train"),
        (2, "train"),
        (3, "dev"),
        (4, "train"),
        (5, "train"),
        (1, "synthetic"),
    ]
    dev = df.filter(pl.col("split") == "dev")["negative_ids"].to_list()[0]
    assert dev == expected_negatives(QUESTIONS[2][1], QUESTIONS[2][2], 3)


def test_the_hub_lists_are_used_where_fetched_and_the_rest_is_mined(tmp_path):
    """data/raw/negatives.parquet (fetch.negatives) is read: a fetched question with a hub list
    keeps it (gold and unknown articles dropped, the first k), a carved dev question keeps its
    train list, the others and every generated question are mined as without hub lists."""
    from lexgraph.methods.dsr.negatives import mine

    paths = write_fixtures(tmp_path)
    hub = pl.DataFrame(
        {
            "question_id": [1, 3],
            "split": ["train", "train"],
            "article_ids": [[110, 103, 999, 104, 105, 106], [101, 107]],
        },
        schema={"question_id": pl.Int64, "split": pl.Utf8, "article_ids": pl.List(pl.Int64)},
    )
    hub.write_parquet(paths["hub"])
    config = NegativesConfig.from_params({**NEGATIVES, "splits": ["train", "dev", "synthetic"]})
    df = mine(config, paths["articles"], paths["questions"], paths["synthetic"], paths["hub"])
    got = {(q, s): n for q, s, n in df.iter_rows()}
    assert got[(1, "train")] == [110, 104, 105]  # 103 is gold, 999 not an article, then k = 3
    assert got[(3, "dev")] == [101]  # 107 is gold
    mined = mine(config, paths["articles"], paths["questions"], paths["synthetic"], None)
    alone = {(q, s): n for q, s, n in mined.iter_rows()}
    for key in ((2, "train"), (4, "train"), (5, "train"), (1, "synthetic")):  # generated question 1: mined
        assert got[key] == alone[key]
    assert list(zip(df["question_id"], df["split"])) == list(zip(mined["question_id"], mined["split"]))
    # an empty hub file (nothing fetched) changes nothing
    empty = tmp_path / "empty.parquet"
    hub.clear().write_parquet(empty)
    assert mine(config, paths["articles"], paths["questions"], paths["synthetic"], empty).equals(mined)


def test_fetched_synthetic_questions_in_both_inputs_count_once_and_take_the_hub_lists(tmp_path):
    """generate_queries copies the fetched synthetic questions (clean's rows, ids included) into
    the synthetic file: mine_negatives counts each once, as a clean question, so it takes the
    hub's synthetic list (fetch renumbered the list's question id with the question); the
    generated question is mined; a copy that differs from clean's row is refused."""
    from lexgraph.core.errors import DataError
    from lexgraph.methods.dsr.negatives import mine

    paths = write_fixtures(tmp_path)
    questions = pl.read_parquet(paths["questions"])
    fetched = pl.DataFrame(
        {
            "id": [20],
            "question": ["servitude de passage du fonds enclavé"],
            "category": [None],
            "article_ids": [[103]],
            "split": ["synthetic"],
        },
        schema=questions.schema,
    )
    pl.concat([questions, fetched]).write_parquet(paths["questions"])
    generated = pl.read_parquet(paths["synthetic"])  # id 1, also a train id: never a hub list
    pl.concat([fetched.select(generated.columns), generated]).write_parquet(paths["synthetic"])
    pl.DataFrame(
        {
            "question_id": [20, 1],
            "split": ["synthetic", "train"],
            "article_ids": [[103, 110, 999, 101, 102, 104], [105]],
        },
        schema={"question_id": pl.Int64, "split": pl.Utf8, "article_ids": pl.List(pl.Int64)},
    ).write_parquet(paths["hub"])
    config = NegativesConfig.from_params(NEGATIVES)
    df = mine(config, paths["articles"], paths["questions"], paths["synthetic"], paths["hub"])
    assert list(zip(df["question_id"], df["split"])) == [(1, "train"), (2, "train"), (4, "train"), (5, "train")] + [
        (20, "synthetic"),
        (1, "synthetic"),
    ]
    got = {(q, s): n for q, s, n in df.iter_rows()}
    assert got[(20, "synthetic")] == [110, 101, 102]  # the hub's: 103 gold, 999 not an article, k = 3
    assert got[(1, "synthetic")] == expected_negatives("servitudes des fonds voisins", [102], 3)  # mined
    assert got[(1, "train")] == [105]
    altered = fetched.with_columns(pl.lit("une autre question").alias("question")).select(generated.columns)
    pl.concat([altered, generated]).write_parquet(paths["synthetic"])
    with pytest.raises(DataError, match="question id 20 occurs more than once in split 'synthetic'"):
        mine(config, paths["articles"], paths["questions"], paths["synthetic"], paths["hub"])

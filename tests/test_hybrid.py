"""The hybrid system (lexgraph.methods.hybrid.system): fusion math against hand computations and
an independent reference, agreement with ranx, dev-only selection, config errors, the
retriever's shapes and order, and the stage's outputs on a tiny workspace."""

from __future__ import annotations

import json
import zlib

import numpy as np
import polars as pl
import pytest
import yaml

from conftest import ROOT, replace_loader, section
from helpers_config import sample_config
from helpers_dvc import run_stage_in_process
from lexgraph.core.errors import ConfigError, DataError, LexgraphError
from lexgraph.core.io import json_text
from lexgraph.methods.hybrid.system import HybridConfig, HybridRetriever, dense_systems, grid
from lexgraph.methods.hybrid.tune import tune
from lexgraph.metrics.ir import DEEPEST
from lexgraph.search.fusion import Fusion, fuse
from lexgraph.systems.registry import load_retriever

# ---------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "edits, fragment",
    [
        (
            {"split": "test"},
            "'hybrid.split' = 'test', expected dev (or train); the 'test' split is held out for evaluation",
        ),
        ({"split": "dve"}, "'hybrid.split' = 'dve', expected dev (or train)"),
        ({"metric": "recall@1000"}, "'hybrid.metric' = 'recall@1000', expected one of recall@10"),
        (
            {"dense": "bm25"},
            "'hybrid.dense' = 'bm25', expected one of zeroshot, dsr, hprior, gdsr, qabisar, hgraph, hgraph_qa or best",
        ),
        ({"depth": 100}, "'hybrid.depth' = 100, expected an integer >= 500"),
        ({"depth": 1000.5}, "'hybrid.depth' = 1000.5, expected an integer >= 500"),
        ({"rrf_k": [60, -1]}, "'hybrid.rrf_k' = [60, -1], expected a list of distinct integers >= 0"),
        ({"rrf_k": 60}, "'hybrid.rrf_k' = 60, expected a list of distinct integers >= 0"),
        (
            {"norms": ["minmax"]},
            "'hybrid.norms' = ['minmax'], expected a list of distinct normalisations among min-max, zmuv",
        ),
        ({"weights": [0.5, 1.2]}, "'hybrid.weights' = [0.5, 1.2], expected a list of distinct numbers in [0, 1]"),
        (
            {"rrf_k": [], "weights": []},
            "'hybrid.rrf_k' = [], expected a non-empty list, or non-empty 'hybrid.norms' and 'hybrid.weights' (no "
            "fusion is left to try)",
        ),
        ({"wieghts": [0.5]}, "unknown keys 'hybrid.wieghts' (did you mean 'hybrid.weights'?)"),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, dict) else None,
)
def test_config_errors_name_params_yaml_and_the_key(edits, fragment):
    with pytest.raises(ConfigError) as info:
        HybridConfig.from_params(section("hybrid", **edits))
    message = str(info.value)
    assert message.startswith("params.yaml: ") and fragment in message, message
    assert "\n" not in message


def test_profiles_build_and_the_grid_is_ordered():
    import yaml

    for profile in (ROOT / "params.yaml", ROOT / "profiles" / "paper.yaml"):
        params = yaml.safe_load(profile.read_text(encoding="utf-8"))
        config = HybridConfig.from_params(params["hybrid"])
        assert config.split == "dev" and config.depth >= DEEPEST
        assert "hybrid" in params["evaluate"]["systems"]
    labels = [
        f.label
        for f in grid(
            sample_config(HybridConfig, "hybrid", rrf_k=[60, 10], norms=["zmuv", "min-max"], weights=[0.5, 0.2])
        )
    ]
    assert labels == [
        "rrf k=10",
        "rrf k=60",
        "wsum zmuv w=0.2",
        "wsum zmuv w=0.5",
        "wsum min-max w=0.2",
        "wsum min-max w=0.5",
        "bm25 alone",
        "dense alone",
    ]  # one system last: ties go to a fusion
    assert [f.label for f in grid(sample_config(HybridConfig, "hybrid", rrf_k=[60], alone=False))][
        -1
    ] == "wsum zmuv w=0.9"


# ---------------------------------------------------------------------------
# Stand-in systems and questions
# ---------------------------------------------------------------------------

CORPUS = np.arange(1, 61, dtype=np.int64)  # articles 1..60


class Table:
    """A stand-in retriever: each question gets a fixed pseudo-random ranking of the
    corpus (seeded by its text), with its ``boost`` articles moved to the top; records
    every question it is asked."""

    def __init__(self, name: str, boost: dict[str, list[int]] | None = None, scale: float = 1.0, zero_after=None):
        self.name, self.source = name, name
        self.article_ids = CORPUS.copy()
        self.boost, self.scale, self.zero_after = boost or {}, scale, zero_after
        self.seen: list[str] = []

    def search(self, questions, k):
        self.seen.extend(questions)
        k = min(int(k), CORPUS.size)
        ids = np.full((len(questions), k), -1, dtype=np.int64)
        scores = np.zeros((len(questions), k), dtype=np.float32)
        for i, q in enumerate(questions):
            rng = np.random.default_rng(zlib.crc32(f"{self.name}|{q}".encode()))
            order = [int(d) for d in self.boost.get(q, [])]
            order += [int(d) for d in rng.permutation(CORPUS) if int(d) not in order]
            values = np.sort(rng.random(CORPUS.size))[::-1] * self.scale
            if self.zero_after is not None:
                values[self.zero_after :] = 0.0
            ids[i], scores[i] = order[:k], values[:k]
        return ids, scores


def questions_table(rows):
    return pl.DataFrame(
        [{"id": qid, "question": text, "article_ids": gold, "split": split} for qid, text, gold, split in rows],
        schema={"id": pl.Int64, "question": pl.Utf8, "article_ids": pl.List(pl.Int64), "split": pl.Utf8},
    )


QUESTIONS = [
    (1, "train one", [1], "train"),
    (2, "dev one", [3, 7], "dev"),
    (3, "dev two", [11], "dev"),
    (4, "dev three", [20, 21, 22], "dev"),
    (5, "dev four", [40], "dev"),
    (6, "test one", [5], "test"),
    (7, "test two", [9, 10], "test"),
]
DEV = {q[1]: q[2] for q in QUESTIONS if q[3] == "dev"}
TEST_TEXTS = {q[1] for q in QUESTIONS if q[3] == "test"}


def systems():
    """BM25 finds half the dev gold, each dense system a different part; gdsr is the best dense system."""
    sparse = Table("bm25", {q: g[: max(1, len(g) // 2)] for q, g in DEV.items()}, scale=12.0, zero_after=40)
    dense = {
        "zeroshot": Table("zeroshot"),
        "dsr": Table("dsr", {"dev one": [7], "dev three": [22]}),
        "hprior": Table("hprior", {"dev one": [3], "dev four": [40]}),
        "gdsr": Table("gdsr", {q: g[-1:] for q, g in DEV.items()}),
        "qabisar": Table("qabisar", {"dev two": [11]}),
        "hgraph": Table("hgraph", {"dev one": [3]}),
        "hgraph_qa": Table("hgraph_qa", {"dev four": [40]}),
    }
    return sparse, dense


CONFIG = sample_config(
    HybridConfig, "hybrid", metric="recall@10", dense="best", rrf_k=[10, 60], weights=[0.2, 0.5, 0.8]
)


def test_selection_reads_the_dev_split_only():
    """Corrupting every test question (text and gold articles) changes nothing, and no
    system is ever asked a test question."""
    sparse, dense = systems()
    report = tune(questions_table(QUESTIONS), sparse, dense, CONFIG)
    for system in (sparse, *dense.values()):
        assert set(system.seen) == set(DEV), system.name
    corrupt = [
        (qid, f"garbage {qid} ?" if split == "test" else text, [59, 60] if split == "test" else gold, split)
        for qid, text, gold, split in QUESTIONS
    ]
    sparse2, dense2 = systems()
    again = tune(questions_table(corrupt), sparse2, dense2, CONFIG)
    assert json_text(again, sort_keys=True) == json_text(report, sort_keys=True)
    assert not (set(sparse2.seen) | {q for s in dense2.values() for q in s.seen}) & (TEST_TEXTS | {"garbage 6 ?"})
    assert report["n_questions"] == len(DEV) and report["split"] == "dev"


def test_selection_picks_the_best_dense_system_and_the_best_fusion_on_dev():
    from lexgraph.metrics.ir import evaluate_run

    sparse, dense = systems()
    report = tune(questions_table(QUESTIONS), sparse, dense, CONFIG)
    refs = report["references"]
    assert report["dense"] == "gdsr" == max(dense_systems(), key=lambda n: refs[n]["recall@10"])
    assert [row["label"] for row in report["grid"]] == [f.label for f in grid(CONFIG)]
    best = max(report["grid"], key=lambda row: row["score"])
    assert report["fusion"] == Fusion.from_dict(best).as_dict() and report["score"] == best["score"]
    first_best = next(row for row in report["grid"] if row["score"] == report["score"])
    assert report["label"] == first_best["label"]  # ties: the first in grid order
    # each grid score is the metric of that fusion of the two dev runs, recomputed here
    qids = [2, 3, 4, 5]
    texts = [q[1] for q in QUESTIONS if q[0] in qids]
    sparse2, dense2 = systems()
    fused = fuse(
        sparse2.search(texts, 1000), dense2["gdsr"].search(texts, 1000), Fusion.from_dict(report["fusion"]), 500
    )
    got = evaluate_run(
        {q: [x for x in row.tolist() if x >= 0] for q, row in zip(qids, fused[0])},
        {q[0]: q[2] for q in QUESTIONS if q[0] in qids},
    )
    assert round(got["recall@10"], 4) == report["score"] == report["dev"]["recall@10"]
    assert set(report["grid"][0]["dev"]) >= {"recall@100", "map", "ndcg@10"}


def test_fixed_dense_system_is_used_as_named_and_others_are_not_needed():
    sparse, dense = systems()
    report = tune(
        questions_table(QUESTIONS),
        sparse,
        {"dsr": dense["dsr"]},
        sample_config(HybridConfig, "hybrid", dense="dsr", rrf_k=[60]),
    )
    assert report["dense"] == "dsr" and set(report["references"]) == {"bm25", "dsr"}
    with pytest.raises(ValueError, match="needs the dense systems gdsr"):
        tune(
            questions_table(QUESTIONS),
            sparse,
            {"dsr": dense["dsr"]},
            sample_config(HybridConfig, "hybrid", dense="gdsr"),
        )


def test_selection_chooses_one_system_when_every_fusion_loses_on_dev():
    """BM25 ranks every dev gold article first and the dense system is noise: every fusion
    lowers dev mAP, so the hybrid is BM25 alone, and hybrid.json says so."""

    def stand_ins():
        return Table("bm25", dict(DEV), scale=12.0, zero_after=40), {"dsr": Table("dsr")}

    config = sample_config(HybridConfig, "hybrid", metric="map", dense="dsr", rrf_k=[60], weights=[0.5])
    sparse, dense = stand_ins()
    report = tune(questions_table(QUESTIONS), sparse, dense, config)
    fused = [row for row in report["grid"] if row["method"] in ("rrf", "wsum")]
    alone = {row["method"]: row["score"] for row in report["grid"] if row["method"] in ("bm25", "dense")}
    assert alone["bm25"] == report["references"]["bm25"]["map"] == 1.0
    assert alone["dense"] == report["references"]["dsr"]["map"]
    assert max(row["score"] for row in fused) < alone["bm25"]
    assert report["fusion"]["method"] == "bm25" and report["uses"] == ["bm25"] and report["label"] == "bm25 alone"
    assert report["score"] == 1.0
    # the retriever then returns BM25's own ranking, unchanged, without a dense system
    texts = list(DEV)
    hybrid = HybridRetriever(stand_ins()[0], None, Fusion.from_dict(report["fusion"]), depth=report["depth"])
    for k in (5, 60):
        want = stand_ins()[0].search(texts, k)
        got = hybrid.search(texts, k)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    # without hybrid.alone the same dev data still fuses (the behaviour before)
    sparse, dense = stand_ins()
    forced = tune(
        questions_table(QUESTIONS),
        sparse,
        dense,
        sample_config(HybridConfig, "hybrid", metric="map", dense="dsr", rrf_k=[60], weights=[0.5], alone=False),
    )
    assert forced["fusion"]["method"] in ("rrf", "wsum") and forced["uses"] == ["bm25", "dsr"]


def test_selection_refuses_the_test_split_and_an_empty_split():
    sparse, dense = systems()
    with pytest.raises(ConfigError, match="'hybrid.split' = 'test', but the 'test' split is held out"):
        tune(questions_table(QUESTIONS), sparse, dense, _unchecked(split="test"))
    with pytest.raises(ConfigError, match="'hybrid.split' = 'train', but that split has no questions"):
        tune(
            questions_table([q for q in QUESTIONS if q[3] != "train"]),
            sparse,
            dense,
            sample_config(HybridConfig, "hybrid", split="train"),
        )


def _unchecked(**values) -> HybridConfig:
    """A config that skipped HybridConfig's checks (model_copy): tune() itself must still refuse the test split."""
    config = sample_config(HybridConfig, "hybrid")
    for key, value in values.items():
        object.__setattr__(config, key, value)
    return config


# ---------------------------------------------------------------------------
# The retriever
# ---------------------------------------------------------------------------


def test_hybrid_retriever_search_shapes_and_order():
    sparse, dense = systems()
    hybrid = HybridRetriever(sparse, dense["dsr"], Fusion("wsum", norm="min-max", weight=0.3), depth=20)
    texts = ["dev one", "dev two", "anything else"]
    ids, scores = hybrid.search(texts, 10)
    assert ids.shape == scores.shape == (3, 10) and ids.dtype == np.int64 and scores.dtype == np.float32
    assert np.all(np.diff(scores, axis=1) <= 0)
    assert all(len(set(row)) == row.size for row in ids)
    deep_ids, deep_scores = hybrid.search(texts, 60)  # at most 2 * depth = 40 fused: the rest is padding
    np.testing.assert_array_equal(deep_ids[:, :10], ids)  # top ranks do not depend on k
    assert deep_ids.shape == (3, 60) and np.all(deep_ids[:, 40:] == -1) and np.all(deep_ids[:, :20] >= 0)
    assert hybrid.search(texts, 500)[0].shape == (3, 60)  # k clipped to the corpus
    assert hybrid.search([], 5)[0].shape == (0, 5)
    want = fuse(sparse.search(texts, 20), dense["dsr"].search(texts, 20), hybrid.fusion, 10)
    np.testing.assert_array_equal(ids, want[0])
    for k in (0, -3, 2.5, True):
        with pytest.raises(LexgraphError, match="expected a positive integer"):
            hybrid.search(texts, k)


def test_hybrid_retriever_refuses_systems_of_different_corpora():
    sparse, dense = systems()
    other = Table("dsr")
    other.article_ids = CORPUS + 1
    with pytest.raises(LexgraphError, match="expected both built on the same corpus"):
        HybridRetriever(sparse, other, Fusion("rrf", k=60), depth=10)


# ---------------------------------------------------------------------------
# The stage and load_retriever("hybrid") on a tiny workspace
# ---------------------------------------------------------------------------


def load_table_dsr(workspace, device="cpu"):
    """Registered as ``dsr`` by the workspace fixture: the stand-in dense system."""
    return systems()[1]["dsr"]


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    from lexgraph.search.bm25 import BM25

    words = ["mur", "mitoyen", "bail", "loyer", "voisin", "bornage", "contrat", "enfant", "divorce", "mariage"]
    texts = [" ".join(words[(i * j) % len(words)] for j in range(1, 8)) + f" article{i}" for i in CORPUS.tolist()]
    (tmp_path / "data/clean").mkdir(parents=True)
    pl.DataFrame({"id": CORPUS, "article": texts}).write_parquet(tmp_path / "data/clean/articles.parquet")
    rows = [
        (qid, text.replace("dev", "mur bail").replace("test", "loyer"), gold, split)
        for qid, text, gold, split in QUESTIONS
    ]
    questions_table(rows).write_parquet(tmp_path / "data/clean/questions.parquet")
    BM25(k1=1.2, b=0.75).fit_texts(texts, CORPUS.tolist()).save(tmp_path / "models/bm25")
    replace_loader(monkeypatch, "dsr", load_table_dsr)
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    params["hybrid"]["dense"] = "dsr"  # the one dense system this workspace fakes
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    return tmp_path


def run_stage_script(ws, *extra):
    return run_stage_in_process(
        ROOT / "stages/hybrid.py",
        *("--params", ws / "params.yaml", "--questions", ws / "data/clean/questions.parquet", "--workspace", ws),
        *("--out", ws / "models/hybrid", "--metrics", ws / "metrics/hybrid_tune.json", *extra),
    )


def test_stage_writes_deterministic_outputs_that_load_as_the_hybrid_system(workspace):
    assert run_stage_script(workspace) == 0
    settings_path = workspace / "models/hybrid/hybrid.json"
    first = settings_path.read_bytes(), (workspace / "metrics/hybrid_tune.json").read_bytes()
    assert run_stage_script(workspace) == 0
    assert (settings_path.read_bytes(), (workspace / "metrics/hybrid_tune.json").read_bytes()) == first
    settings = json.loads(first[0])
    assert first[0].decode() == json.dumps(settings, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    import yaml

    config = HybridConfig.from_params(yaml.safe_load((workspace / "params.yaml").read_text(encoding="utf-8"))["hybrid"])
    assert settings["dense"] == "dsr" and settings["split"] == "dev" and len(settings["grid"]) == len(grid(config))
    assert str(workspace) not in first[0].decode()  # no machine paths
    summary = json.loads(first[1])
    assert summary["score"] == settings["score"] and summary["method"] == settings["fusion"]["method"]

    hybrid = load_retriever("hybrid", workspace, "cpu")
    assert hybrid.name == "hybrid" and hybrid.fusion == Fusion.from_dict(settings["fusion"]) and hybrid.depth == 1000
    ids, scores = hybrid.search(["mur bail one", "loyer two"], 500)
    assert ids.shape == (2, 60) and np.all(np.diff(scores, axis=1) <= 0)


def test_loading_needs_the_stage_and_refuses_a_corrupt_settings_file(workspace):
    with pytest.raises(
        LexgraphError, match=r"hybrid\.json: the hybrid fusion settings not found; run `dvc repro hybrid`"
    ):
        load_retriever("hybrid", workspace, "cpu")
    path = workspace / "models/hybrid/hybrid.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"format": "lexgraph-hyb', encoding="utf-8")
    with pytest.raises(DataError, match="truncated or corrupt hybrid settings"):
        load_retriever("hybrid", workspace, "cpu")
    path.write_text(
        json.dumps(
            {
                "format": "lexgraph-hybrid",
                "version": 1,
                "sparse": "bm25",
                "dense": "dsr",
                "depth": 1000,
                "fusion": {"method": "wsum", "norm": "l2", "weight": 0.5},
            }
        )
    )
    with pytest.raises(DataError, match="inconsistent hybrid settings"):
        load_retriever("hybrid", workspace, "cpu")


def test_a_single_system_choice_loads_and_searches_as_that_system(workspace, monkeypatch):
    """hybrid.json chose BM25 alone: `hybrid` loads BM25 only and returns its ranking."""
    assert run_stage_script(workspace) == 0
    path = workspace / "models/hybrid/hybrid.json"
    settings = json.loads(path.read_text(encoding="utf-8"))
    settings["fusion"] = Fusion("bm25").as_dict()
    path.write_text(json_text(settings, sort_keys=True), encoding="utf-8")

    def no_dense(*args, **kwargs):
        raise AssertionError("the dense system is loaded although the hybrid is BM25 alone")

    replace_loader(monkeypatch, "dsr", no_dense)
    hybrid = load_retriever("hybrid", workspace, "cpu")
    texts = ["mur bail one", "loyer two", "rien"]
    got = hybrid.search(texts, 50)
    want = load_retriever("bm25", workspace, "cpu").search(texts, 50)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_stage_refuses_the_test_split_before_any_work(workspace):
    import yaml

    params = yaml.safe_load((workspace / "params.yaml").read_text(encoding="utf-8"))
    params["hybrid"]["split"] = "test"
    (workspace / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    assert run_stage_script(workspace) == 2
    assert not (workspace / "models/hybrid").exists() and not (workspace / "metrics").exists()


@pytest.mark.parametrize("depth", [0, -5, 10, 499, 2.5, True, "1000", None])
def test_the_depth_is_checked_where_the_settings_file_is_read(workspace, depth):
    """``depth`` is checked once, by read_settings (the retriever trusts it), against the range
    params.yaml allows for ``hybrid.depth`` (issue 28: an edited depth 10 was used as it was)."""
    path = workspace / "models/hybrid/hybrid.json"
    path.parent.mkdir(parents=True)
    settings = {"format": "lexgraph-hybrid", "version": 1, "sparse": "bm25", "dense": "dsr", "depth": depth}
    settings["fusion"] = {"method": "rrf", "k": 60}
    path.write_text(json.dumps(settings), encoding="utf-8")
    with pytest.raises(
        DataError, match=r"hybrid\.json: key 'depth' = .*, expected an integer >= 500; rerun `dvc repro hybrid`"
    ):
        load_retriever("hybrid", workspace, "cpu")

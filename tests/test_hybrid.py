"""The hybrid system (lexgraph.retrieval.hybrid): fusion math against hand computations and
an independent reference, agreement with ranx, dev-only selection, config errors, the
retriever's shapes and order, and the stage's outputs on a tiny workspace."""

from __future__ import annotations

import json
import runpy
import sys
import zlib

import numpy as np
import polars as pl
import pytest

from lexgraph.metrics import DEEPEST

import yaml

from conftest import ROOT, section
from lexgraph.errors import ConfigError, DataError, LexgraphError
from lexgraph.retrieval.systems import SYSTEMS, load_retriever
from lexgraph.retrieval import hybrid as hybrid_module
from lexgraph.retrieval.hybrid import (
    DENSE_SYSTEMS,
    Fusion,
    HybridConfig,
    HybridRetriever,
    _Prepared,
    fuse,
    fuse_ranx,
    grid,
    to_json,
    tune,
)


def arrays(rows, width):
    """``[[(id, score), ...], ...]`` -> ``(ids int64 (n, width), scores float32 (n, width))``, -1 padded."""
    ids = np.full((len(rows), width), -1, dtype=np.int64)
    scores = np.zeros((len(rows), width), dtype=np.float32)
    for i, row in enumerate(rows):
        for j, (doc, score) in enumerate(row):
            ids[i, j], scores[i, j] = doc, score
    return ids, scores


# Three questions. q0: BM25 ties articles 1 and 3 (in that order) and pads its top with
# article 5 at score 0 (no term matched); q1: BM25 matched nothing (a row of -1);
# q2: neither system returned anything.
SPARSE = arrays([[(1, 2.0), (3, 2.0), (2, 0.5), (5, 0.0)], [], []], 4)
DENSE = arrays([[(2, 0.9), (4, 0.8), (1, 0.1)], [(4, 0.5), (2, 0.2)], []], 4)


def test_rrf_equals_the_hand_computation():
    """Cormack et al. (2009): sum over systems of 1 / (k + rank), 1-based ranks, the
    systems' own order (tied BM25 scores keep the order given), zero-score BM25 padding
    left out; fused ties go to the lower article id."""
    ids, scores = fuse(SPARSE, DENSE, Fusion("rrf", k=60))
    assert ids.dtype == np.int64 and scores.dtype == np.float32 and ids.shape == scores.shape == (3, 6)
    # q0: 1 -> ranks 1 (bm25), 3 (dense); 3 -> 2 (bm25); 2 -> 3 (bm25), 1 (dense); 4 -> 2 (dense)
    want = {1: 1 / 61 + 1 / 63, 3: 1 / 62, 2: 1 / 63 + 1 / 61, 4: 1 / 62}
    assert ids[0].tolist() == [1, 2, 3, 4, -1, -1]  # 1 and 2 tie, 3 and 4 tie: lower id first
    np.testing.assert_allclose(scores[0, :4], [want[d] for d in (1, 2, 3, 4)], rtol=1e-6)
    assert ids[1].tolist() == [4, 2, -1, -1, -1, -1]
    np.testing.assert_allclose(scores[1, :2], [1 / 61, 1 / 62], rtol=1e-6)
    assert ids[2].tolist() == [-1] * 6 and not scores[2].any()
    np.testing.assert_allclose(fuse(SPARSE, DENSE, Fusion("rrf", k=0))[1][0, :2], [1 + 1 / 3, 1 + 1 / 3], rtol=1e-6)


def test_wsum_min_max_equals_the_hand_computation():
    """w * minmax(bm25) + (1 - w) * minmax(dense); an article absent from a list gets 0 from it."""
    ids, scores = fuse(SPARSE, DENSE, Fusion("wsum", norm="min-max", weight=0.3))
    bm25 = {1: (2.0 - 0.5) / 1.5, 3: (2.0 - 0.5) / 1.5, 2: 0.0}
    dense = {2: (0.9 - 0.1) / 0.8, 4: (0.8 - 0.1) / 0.8, 1: 0.0}
    want = {d: 0.3 * bm25.get(d, 0.0) + 0.7 * dense.get(d, 0.0) for d in (1, 2, 3, 4)}  # 2: .7, 4: .6125, 1, 3: .3
    assert ids[0, :4].tolist() == [2, 4, 1, 3]
    np.testing.assert_allclose(scores[0, :4], [want[d] for d in (2, 4, 1, 3)], rtol=1e-6)
    assert ids[1, :2].tolist() == [4, 2]
    np.testing.assert_allclose(scores[1, :2], [0.7, 0.0], atol=1e-7)


def test_wsum_zmuv_equals_the_hand_computation():
    """z-scores with the population standard deviation, per question and system."""
    ids, scores = fuse(SPARSE, DENSE, Fusion("wsum", norm="zmuv", weight=0.6))
    b = np.array([2.0, 2.0, 0.5])
    d = np.array([0.9, 0.8, 0.1])
    bz = dict(zip((1, 3, 2), (b - b.mean()) / b.std()))
    dz = dict(zip((2, 4, 1), (d - d.mean()) / d.std()))
    want = {doc: 0.6 * bz.get(doc, 0.0) + 0.4 * dz.get(doc, 0.0) for doc in (1, 2, 3, 4)}
    order = sorted(want, key=lambda doc: (-want[doc], doc))
    assert ids[0, :4].tolist() == order
    np.testing.assert_allclose(scores[0, :4], [want[doc] for doc in order], rtol=1e-6)
    np.testing.assert_allclose(scores[1, :2], [0.4, -0.4], rtol=1e-6)  # dense alone: z = +1, -1


def reference_fuse(sparse, dense, fusion: Fusion, k: int):
    """An independent pure-Python fusion (the formulas of the module docstring)."""

    def lists(ids, scores, drop_zero):
        out = []
        for row_ids, row_scores in zip(ids.tolist(), scores.astype(np.float64).tolist()):
            out.append([(i, s) for i, s in zip(row_ids, row_scores) if i >= 0 and not (drop_zero and s == 0.0)])
        return out

    def norm(row):
        if not row:
            return {}
        s = np.array([x for _, x in row])
        if fusion.norm == "min-max":
            z = (s - s.min()) / max(s.max() - s.min(), 1e-9)
        else:
            z = (s - s.mean()) / max(s.std(), 1e-9)
        return dict(zip([i for i, _ in row], z.tolist()))

    out_ids = np.full((len(sparse[0]), k), -1, dtype=np.int64)
    out_scores = np.zeros((len(sparse[0]), k), dtype=np.float64)
    for q, (a, b) in enumerate(zip(lists(*sparse, True), lists(*dense, False))):
        if fusion.method == "rrf":
            parts = [{i: 1.0 / (fusion.k + r) for r, (i, _) in enumerate(row, start=1)} for row in (a, b)]
            weights = (1.0, 1.0)
        else:
            parts = [norm(a), norm(b)]
            weights = (fusion.weight, 1.0 - fusion.weight)
        docs = set(parts[0]) | set(parts[1])
        fused = {d: weights[0] * parts[0].get(d, 0.0) + weights[1] * parts[1].get(d, 0.0) for d in docs}
        ranked = sorted(fused, key=lambda d: (-fused[d], d))[:k]
        out_ids[q, : len(ranked)] = ranked
        out_scores[q, : len(ranked)] = [fused[d] for d in ranked]
    return out_ids, out_scores


def random_rankings(rng, n_questions=12, depth=30, corpus=80, zero_tail=False, short=True):
    ids = np.full((n_questions, depth), -1, dtype=np.int64)
    scores = np.zeros((n_questions, depth), dtype=np.float32)
    for q in range(n_questions):
        m = int(rng.integers(0, depth + 1)) if short and q % 4 == 3 else depth  # some short (or empty) rows
        ids[q, :m] = rng.choice(corpus, size=m, replace=False) + 100
        scores[q, :m] = np.sort(rng.random(m).astype(np.float32) * 10)[::-1]
        if zero_tail and m > 5:
            scores[q, m - 5 : m] = 0.0  # BM25: the matched articles ran out
    return ids, scores


@pytest.mark.parametrize("fusion", [Fusion("rrf", k=0), Fusion("rrf", k=60), Fusion("wsum", norm="min-max", weight=0.25),
                                    Fusion("wsum", norm="zmuv", weight=0.7), Fusion("wsum", norm="min-max", weight=1.0)],
                         ids=lambda f: f.label)
def test_fusion_equals_an_independent_reference_on_random_rankings(fusion):
    rng = np.random.default_rng(7)
    sparse, dense = random_rankings(rng, zero_tail=True), random_rankings(rng)
    got_ids, got_scores = fuse(sparse, dense, fusion, 45)
    want_ids, want_scores = reference_fuse(sparse, dense, fusion, 45)
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_allclose(got_scores, want_scores, rtol=1e-5, atol=1e-6)


def test_fused_scores_agree_with_ranx_fuse_called_directly():
    """On tie-free scores, feeding ranx the systems' own scores gives the same fused
    scores as the hybrid's own path (ranks in place of scores for RRF)."""
    from ranx import Run
    from ranx import fuse as ranx_fuse

    rng = np.random.default_rng(3)
    sparse, dense = random_rankings(rng, 8, 20, 50, short=False), random_rankings(rng, 8, 20, 50, short=False)

    def run(ids, scores):
        return Run.from_dict({str(q): {str(i): float(s) for i, s in zip(r_ids, r_s) if i >= 0}
                              for q, (r_ids, r_s) in enumerate(zip(ids.tolist(), scores.tolist()))})

    for fusion in (Fusion("rrf", k=60), Fusion("wsum", norm="min-max", weight=0.4), Fusion("wsum", norm="zmuv", weight=0.4)):
        args = fusion.ranx_args()
        theirs = ranx_fuse([run(*sparse), run(*dense)], norm=args["norm"], method=args["method"],
                           params=args["params"]).to_dict()
        ids, scores = fuse(sparse, dense, fusion, 40)
        for q in range(8):
            want = theirs[str(q)]
            got = {str(i): float(s) for i, s in zip(ids[q].tolist(), scores[q].tolist()) if i >= 0}
            assert set(got) == set(want)
            np.testing.assert_allclose([got[d] for d in want], list(want.values()), rtol=1e-6, atol=1e-7)


def exact_cases():
    """Rankings on which the numpy fusion must give ranx's numbers to the last bit: the hand
    example (ties, zero-score BM25 padding, empty rows), random rankings with short and
    empty rows, the same with many tied scores, and long (depth 1000) float32 lists,
    where a pairwise sum (numpy's) and a left-to-right one (ranx's numba) differ."""
    rng = np.random.default_rng(11)
    cases = [(SPARSE, DENSE)]
    for _ in range(3):
        cases.append((random_rankings(rng, zero_tail=True), random_rankings(rng)))
    sparse, dense = random_rankings(rng, zero_tail=True), random_rankings(rng)
    cases.append(((sparse[0], np.round(sparse[1]).astype(np.float32)),
                  (dense[0], (np.round(dense[1] * 2) / 2).astype(np.float32))))
    long = []
    for scale, offset in ((3.0, 10.0), (0.1, 0.5)):
        ids = np.stack([rng.choice(3000, size=1000, replace=False) for _ in range(4)]).astype(np.int64)
        scores = np.sort((rng.standard_normal((4, 1000)) * scale + offset).astype(np.float32), axis=1)[:, ::-1]
        long.append((ids, np.ascontiguousarray(scores)))
    cases.append(tuple(long))
    return cases


EXACT_FUSIONS = [Fusion("rrf", k=0), Fusion("rrf", k=1), Fusion("rrf", k=60)] + [
    Fusion("wsum", norm=norm, weight=w) for norm in ("min-max", "zmuv") for w in (0.0, 0.1, 0.3, 0.7, 1.0)]


@pytest.mark.parametrize("fusion", EXACT_FUSIONS, ids=lambda f: f.label)
def test_fusion_equals_ranx_fuse_to_the_last_bit(fusion):
    """`fuse` computes ranx.fuse's scores with numpy (ranx's runs cost seconds of numba
    compilation and typed-dictionary reads per stage); ranx stays the reference: every
    fused article and its float64 score are ranx's exactly, and so are the cut lists."""
    for sparse, dense in exact_cases():
        prepared = _Prepared(sparse, dense)
        assert prepared.fused_rows(fusion) == prepared.fused_rows_ranx(fusion)
        for k in (None, 45, 0):
            got, want = fuse(sparse, dense, fusion, k), fuse_ranx(sparse, dense, fusion, k)
            np.testing.assert_array_equal(got[0], want[0])
            assert got[1].dtype == want[1].dtype == np.float32 and got[1].tobytes() == want[1].tobytes()


def test_fusion_in_blocks_equals_fusion_in_one_block(monkeypatch):
    """Questions are laid out in blocks (bounded memory); the block size changes nothing."""
    sparse, dense = random_rankings(np.random.default_rng(5), zero_tail=True), random_rankings(np.random.default_rng(6))
    whole = [fuse(sparse, dense, f, 50) for f in EXACT_FUSIONS]
    monkeypatch.setattr(hybrid_module, "_BLOCK", 5)
    assert len(_Prepared(sparse, dense)._blocks) == 3
    for f, (ids, scores) in zip(EXACT_FUSIONS, whole):
        got_ids, got_scores = fuse(sparse, dense, f, 50)
        np.testing.assert_array_equal(got_ids, ids)
        assert got_scores.tobytes() == scores.tobytes()


def test_fusion_refuses_an_article_ranked_twice():
    ids, scores = arrays([[(1, 2.0), (1, 1.0)]], 2)
    with pytest.raises(ValueError, match="row 0 of the sparse ranking holds an article twice"):
        fuse((ids, scores), arrays([[(2, 0.5)]], 2), Fusion("rrf", k=60))


def test_fusion_refuses_bad_parameters():
    for bad in (dict(method="rrf", k=-1), dict(method="rrf", k=60, norm="zmuv"), dict(method="wsum", norm="max", weight=0.5),
                dict(method="wsum", norm="min-max", weight=1.5), dict(method="combmnz")):
        with pytest.raises(LexgraphError, match="is not valid"):
            Fusion(**bad)


# ---------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("edits, fragment", [
    ({"split": "test"}, "'hybrid.split' = 'test', but the 'test' split is held out for evaluation; expected dev (or train)"),
    ({"split": "dve"}, "'hybrid.split' = 'dve', expected dev (or train)"),
    ({"metric": "recall@1000"}, "'hybrid.metric' = 'recall@1000', expected one of recall@10"),
    ({"dense": "bm25"}, "'hybrid.dense' = 'bm25', expected one of zeroshot, dsr, hprior, gdsr, qabisar, hgraph, hgraph_qa or best"),
    ({"depth": 100}, "'hybrid.depth' = 100, expected an integer >= 500"),
    ({"depth": 1000.5}, "'hybrid.depth' = 1000.5, expected an integer >= 500"),
    ({"rrf_k": [60, -1]}, "'hybrid.rrf_k' = [60, -1], expected a list of distinct integers >= 0"),
    ({"rrf_k": 60}, "'hybrid.rrf_k' = 60, expected a list of distinct integers >= 0"),
    ({"norms": ["minmax"]}, "'hybrid.norms' = ['minmax'], expected a list of distinct normalisations among min-max, zmuv"),
    ({"weights": [0.5, 1.2]}, "'hybrid.weights' = [0.5, 1.2], expected a list of distinct numbers in [0, 1]"),
    ({"rrf_k": [], "weights": []}, "leave no fusion to try; expected a non-empty 'hybrid.rrf_k'"),
    ({"wieghts": [0.5]}, "unknown keys 'hybrid.wieghts' (did you mean 'hybrid.weights'?)"),
], ids=lambda v: "-".join(v) if isinstance(v, dict) else None)
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
    labels = [f.label for f in grid(HybridConfig(rrf_k=[60, 10], norms=["zmuv", "min-max"], weights=[0.5, 0.2]))]
    assert labels == ["rrf k=10", "rrf k=60", "wsum zmuv w=0.2", "wsum zmuv w=0.5", "wsum min-max w=0.2",
                      "wsum min-max w=0.5"]


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
                values[self.zero_after:] = 0.0
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


CONFIG = HybridConfig(metric="recall@10", dense="best", rrf_k=[10, 60], weights=[0.2, 0.5, 0.8])


def test_selection_reads_the_dev_split_only():
    """Corrupting every test question (text and gold articles) changes nothing, and no
    system is ever asked a test question."""
    sparse, dense = systems()
    report = tune(questions_table(QUESTIONS), sparse, dense, CONFIG)
    for system in (sparse, *dense.values()):
        assert set(system.seen) == set(DEV), system.name
    corrupt = [(qid, f"garbage {qid} ?" if split == "test" else text, [59, 60] if split == "test" else gold, split)
               for qid, text, gold, split in QUESTIONS]
    sparse2, dense2 = systems()
    again = tune(questions_table(corrupt), sparse2, dense2, CONFIG)
    assert to_json(again) == to_json(report)
    assert not (set(sparse2.seen) | {q for s in dense2.values() for q in s.seen}) & (TEST_TEXTS | {"garbage 6 ?"})
    assert report["n_questions"] == len(DEV) and report["split"] == "dev"


def test_selection_picks_the_best_dense_system_and_the_best_fusion_on_dev():
    from lexgraph.metrics import evaluate_run

    sparse, dense = systems()
    report = tune(questions_table(QUESTIONS), sparse, dense, CONFIG)
    refs = report["references"]
    assert report["dense"] == "gdsr" == max(DENSE_SYSTEMS, key=lambda n: refs[n]["recall@10"])
    assert [row["label"] for row in report["grid"]] == [f.label for f in grid(CONFIG)]
    best = max(report["grid"], key=lambda row: row["score"])
    assert report["fusion"] == Fusion.from_dict(best).as_dict() and report["score"] == best["score"]
    first_best = next(row for row in report["grid"] if row["score"] == report["score"])
    assert report["label"] == first_best["label"]  # ties: the first in grid order
    # each grid score is the metric of that fusion of the two dev runs, recomputed here
    qids = [2, 3, 4, 5]
    texts = [q[1] for q in QUESTIONS if q[0] in qids]
    sparse2, dense2 = systems()
    fused = fuse(sparse2.search(texts, 1000), dense2["gdsr"].search(texts, 1000), Fusion.from_dict(report["fusion"]), 500)
    got = evaluate_run({q: [x for x in row.tolist() if x >= 0] for q, row in zip(qids, fused[0])},
                       {q[0]: q[2] for q in QUESTIONS if q[0] in qids})
    assert round(got["recall@10"], 4) == report["score"] == report["dev"]["recall@10"]
    assert set(report["grid"][0]["dev"]) >= {"recall@100", "map", "ndcg@10"}


def test_fixed_dense_system_is_used_as_named_and_others_are_not_needed():
    sparse, dense = systems()
    report = tune(questions_table(QUESTIONS), sparse, {"dsr": dense["dsr"]}, HybridConfig(dense="dsr", rrf_k=[60]))
    assert report["dense"] == "dsr" and set(report["references"]) == {"bm25", "dsr"}
    with pytest.raises(ValueError, match="needs the dense systems gdsr"):
        tune(questions_table(QUESTIONS), sparse, {"dsr": dense["dsr"]}, HybridConfig(dense="gdsr"))


def test_selection_refuses_the_test_split_and_an_empty_split():
    sparse, dense = systems()
    with pytest.raises(ConfigError, match="'hybrid.split' = 'test', but the 'test' split is held out"):
        tune(questions_table(QUESTIONS), sparse, dense, _unchecked(split="test"))
    with pytest.raises(ConfigError, match="'hybrid.split' = 'train', but that split has no questions"):
        tune(questions_table([q for q in QUESTIONS if q[3] != "train"]), sparse, dense, HybridConfig(split="train"))


def _unchecked(**values) -> HybridConfig:
    """A config that skipped validate(): tune() itself must still refuse the test split."""
    config = HybridConfig()
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
    from lexgraph.retrieval.bm25 import BM25

    words = ["mur", "mitoyen", "bail", "loyer", "voisin", "bornage", "contrat", "enfant", "divorce", "mariage"]
    texts = [" ".join(words[(i * j) % len(words)] for j in range(1, 8)) + f" article{i}" for i in CORPUS.tolist()]
    (tmp_path / "data/clean").mkdir(parents=True)
    pl.DataFrame({"id": CORPUS, "article": texts}).write_parquet(tmp_path / "data/clean/articles.parquet")
    rows = [(qid, text.replace("dev", "mur bail").replace("test", "loyer"), gold, split)
            for qid, text, gold, split in QUESTIONS]
    questions_table(rows).write_parquet(tmp_path / "data/clean/questions.parquet")
    BM25(k1=1.2, b=0.75).fit_texts(texts, CORPUS.tolist()).save(tmp_path / "models/bm25")
    monkeypatch.setitem(SYSTEMS, "dsr", load_table_dsr)
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    params["hybrid"]["dense"] = "dsr"  # the one dense system this workspace fakes
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    return tmp_path


def run_stage_script(ws, *extra):
    argv = [str(ROOT / "stages/hybrid.py"), "--params", str(ws / "params.yaml"), "--questions",
            str(ws / "data/clean/questions.parquet"), "--workspace", str(ws), "--out", str(ws / "models/hybrid"),
            "--metrics", str(ws / "metrics/hybrid_tune.json"), *extra]
    old, sys.argv = sys.argv, argv
    try:
        with pytest.raises(SystemExit) as info:
            runpy.run_path(argv[0], run_name="__main__")
    finally:
        sys.argv = old
    return info.value.code


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
    with pytest.raises(LexgraphError, match=r"hybrid\.json: the hybrid fusion settings not found; run `dvc repro hybrid`"):
        load_retriever("hybrid", workspace, "cpu")
    path = workspace / "models/hybrid/hybrid.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"format": "lexgraph-hyb', encoding="utf-8")
    with pytest.raises(DataError, match="truncated or corrupt hybrid settings"):
        load_retriever("hybrid", workspace, "cpu")
    path.write_text(json.dumps({"format": "lexgraph-hybrid", "version": 1, "sparse": "bm25", "dense": "dsr",
                                "depth": 1000, "fusion": {"method": "wsum", "norm": "l2", "weight": 0.5}}))
    with pytest.raises(DataError, match="inconsistent hybrid settings"):
        load_retriever("hybrid", workspace, "cpu")


def test_stage_refuses_the_test_split_before_any_work(workspace):
    import yaml

    params = yaml.safe_load((workspace / "params.yaml").read_text(encoding="utf-8"))
    params["hybrid"]["split"] = "test"
    (workspace / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    assert run_stage_script(workspace) == 2
    assert not (workspace / "models/hybrid").exists() and not (workspace / "metrics").exists()

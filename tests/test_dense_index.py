"""lexgraph.search.index: FAISS search against the torch reference and a float64 brute force;
the evaluate.index settings; the sample's embeddings ranked as before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from conftest import ROOT, section
from lexgraph.core.errors import ConfigError
from lexgraph.evaluation.evaluate import EvaluateConfig
from lexgraph.metrics.ir import exact_top_k
from lexgraph.search.index import DenseIndex, IndexConfig


def reference(queries: np.ndarray, articles: np.ndarray, ids: np.ndarray, k: int):
    """float64 cosine, ranked by (-score, id) with a full lexsort per query."""
    q = queries.astype(np.float64)
    a = articles.astype(np.float64)
    scores = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (a / np.linalg.norm(a, axis=1, keepdims=True)).T
    order = np.stack([np.lexsort((ids, -row))[:k] for row in scores])
    return ids[order], np.take_along_axis(scores, order, axis=1)


def clustered(n: int, dim: int, seed: int, centres: int = 20) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(centres, dim))
    return (c[rng.integers(0, centres, n)] + 0.4 * rng.normal(size=(n, dim))).astype(np.float32)


def test_flat_equals_torch_exact_top_k_and_float64_reference():
    rng = np.random.default_rng(1)
    articles = rng.normal(size=(500, 32)).astype(np.float32)
    articles[200:205] = articles[3]  # exact ties: ordered by lower id
    ids = rng.permutation(np.arange(10_000, 10_500)).astype(np.int64)
    queries = rng.normal(size=(30, 32)).astype(np.float32)
    queries[0] = 2.0 * articles[3]
    index = DenseIndex(ids, articles, IndexConfig(type="flat"))
    assert index.kind == "flat"
    order = np.argsort(ids)
    want_ids, want_scores = exact_top_k(torch.from_numpy(queries), torch.from_numpy(articles[order]), ids[order], 50)
    got_ids, got_scores = index.search(queries, 50)
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_allclose(got_scores, want_scores, atol=1e-6)
    ref_ids, ref_scores = reference(queries, articles, ids, 50)
    np.testing.assert_array_equal(got_ids, ref_ids)
    np.testing.assert_allclose(got_scores, ref_scores, atol=1e-6)
    assert got_ids[0, :6].tolist() == sorted(ids[[3, 200, 201, 202, 203, 204]].tolist())


def test_ivf_visiting_every_list_is_exact():
    articles = clustered(2000, 16, seed=2)
    ids = np.arange(2000, dtype=np.int64) * 3
    queries = clustered(40, 16, seed=3)
    ivf = DenseIndex(ids, articles, IndexConfig(type="ivf", nlist=16, nprobe=16))
    assert ivf.kind == "ivf" and ivf.index.nlist == 16
    got, _ = ivf.search(queries, 20)
    want, _ = reference(queries, articles, ids, 20)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "config", [IndexConfig(type="ivf", nprobe=32), IndexConfig(type="hnsw", hnsw_m=16, ef_search=64)]
)
def test_ann_recall_against_exact(config):
    articles = clustered(3000, 24, seed=4)
    ids = np.arange(3000, dtype=np.int64)
    queries = clustered(50, 24, seed=5)
    index = DenseIndex(ids, articles, config)
    assert index.kind == config.type
    got, scores = index.search(queries, 10)
    want, _ = reference(queries, articles, ids, 10)
    recall = np.mean([len(set(g) & set(w)) / 10 for g, w in zip(got, want)])
    assert recall >= 0.9, recall
    assert np.all(np.diff(scores, axis=1) <= 1e-6)  # best first


def test_auto_switches_at_exact_below():
    articles = clustered(300, 8, seed=6)
    ids = np.arange(300, dtype=np.int64)
    assert DenseIndex(ids, articles, IndexConfig(exact_below=301)).kind == "flat"
    assert DenseIndex(ids, articles, IndexConfig(exact_below=300, ann="ivf")).kind == "ivf"
    assert IndexConfig(exact_below=300).resolve(300) == "ivf"
    assert DenseIndex(ids, articles, IndexConfig(exact_below=300, ann="hnsw")).kind == "hnsw"
    assert (
        IndexConfig().lists(1_000_000) == 4000 and IndexConfig().lists(10) == 10 and IndexConfig(nlist=7).lists(10) == 7
    )


def test_k_beyond_the_corpus_and_zero_vectors():
    articles = np.eye(4, dtype=np.float32)
    articles[2] = 0.0  # a zero vector scores 0, it is not NaN
    index = DenseIndex(np.array([8, 6, 4, 2]), articles)
    ids, scores = index.search(np.array([[1.0, 1.0, 0.0, 0.0]], dtype=np.float32), 10)
    assert ids.tolist() == [[6, 8, 2, 4]]
    np.testing.assert_allclose(scores, [[2**-0.5, 2**-0.5, 0.0, 0.0]], atol=1e-6)


def test_evaluate_index_settings():
    for path in ("params.yaml", "profiles/paper.yaml"):
        profile = yaml.safe_load((ROOT / path).read_text(encoding="utf-8"))["evaluate"]
        assert EvaluateConfig.from_params(profile).index == IndexConfig(**profile["index"])
    sample = section("evaluate")
    index = sample["index"]

    def evaluate(**index_edits):
        return EvaluateConfig.from_params({**sample, "index": {**index, **index_edits}})

    cfg = evaluate(type="ivf", nprobe=4)
    assert cfg.index.type == "ivf" and cfg.index.nprobe == 4 and cfg.index.hnsw_m == index["hnsw_m"]
    with pytest.raises(ConfigError, match=r"'evaluate\.index\.nprob'.*did you mean 'evaluate\.index\.nprobe'"):
        evaluate(nprob=4)
    with pytest.raises(ConfigError, match=r"evaluate\.index\.type"):
        evaluate(type="annoy")
    with pytest.raises(ConfigError, match=r"evaluate\.index\.nprobe"):
        evaluate(nprobe=0)
    with pytest.raises(ConfigError, match=r"evaluate\.index"):
        EvaluateConfig.from_params({**sample, "index": "hnsw"})
    with pytest.raises(ConfigError, match=r"missing key 'evaluate\.index\.nprobe'"):  # no silent default
        EvaluateConfig.from_params({**sample, "index": {k: v for k, v in index.items() if k != "nprobe"}})


SAMPLE = ROOT / "data" / "embed"


@pytest.mark.skipif(not (SAMPLE / "articles.safetensors").is_file(), reason="needs `dvc repro embed` (or dvc checkout)")
def test_sample_rankings_unchanged():
    """The DSR embeddings of the sample: FAISS flat ranks as the torch matmul did (ties aside)."""
    from lexgraph.encoding.embed import load_embeddings

    ids, articles = load_embeddings(SAMPLE / "articles.safetensors")
    _, questions = load_embeddings(SAMPLE / "questions.safetensors")
    order = np.argsort(ids)
    want_ids, want_scores = exact_top_k(questions, articles[order], ids[order], 500)
    got_ids, got_scores = DenseIndex(ids, articles.numpy()).search(questions.numpy(), 500)
    np.testing.assert_allclose(got_scores, want_scores, atol=1e-6)
    # positions may differ only where the two scores are within float rounding of a tie
    differ = got_ids != want_ids
    near_tie = np.abs(np.diff(want_scores, axis=1, prepend=np.inf)) < 1e-6
    near_tie |= np.abs(np.diff(want_scores, axis=1, append=-np.inf)) < 1e-6
    assert not np.any(differ & ~near_tie)
    assert differ.mean() < 0.01


def test_params_key_documented_in_docs():
    # the FAISS settings moved from the README to the docs page on scale (docs/scale.md)
    readme = Path(ROOT / "docs" / "scale.md").read_text(encoding="utf-8")
    assert "evaluate.index" in readme


def test_search_reads_the_workspace_index_settings(tmp_path):
    from lexgraph.serve.searcher import index_config as _index_config

    assert _index_config(tmp_path) == IndexConfig()  # no params.yaml: the defaults
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    params["evaluate"]["index"].update(type="hnsw", ef_search=512)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    assert _index_config(tmp_path) == IndexConfig(**params["evaluate"]["index"])
    assert _index_config(tmp_path).type == "hnsw" and _index_config(tmp_path).ef_search == 512
    params["evaluate"]["index"]["typ"] = "flat"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"evaluate\.index\.typ"):
        _index_config(tmp_path)


def test_faiss_loads_without_loader_noise(tmp_path):
    """Importing faiss the way lexgraph does, with the CLI's logging (INFO on stderr), prints
    none of faiss's loader lines ("Loading faiss ...", the ModuleNotFoundError of each
    instruction set it tries): a dense search used to open with nine of them (issue 25)."""
    import os
    import subprocess
    import sys

    script = (
        "from lexgraph.core.stage import setup_logging\nsetup_logging('INFO')\n"
        "from lexgraph.search.index import _faiss\nprint(_faiss().IndexFlatIP(4).d)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.strip() == "4", done.stderr
    assert "ModuleNotFoundError" not in done.stderr and "Loading faiss" not in done.stderr, done.stderr
    assert "faiss.loader" not in done.stderr, done.stderr

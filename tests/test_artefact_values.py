"""Edited artefacts are not used as they are (issue 28, class 3, part B): the values a system
reads back from ``models/`` and ``data/`` (tuned settings, article vectors, index ids) are checked
against the domain params.yaml allows them, an approximate index that cannot reach ``k`` says so
once, and a setting that cannot take effect is refused. Every refusal: exit status 2, one line
naming the file (or key), what was expected and the remedy, no traceback, nothing changed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from conftest import ROOT, write_params
from helpers_cli import ARTICLES, write_articles
from helpers_config import sample_config
from helpers_dvc import run_stage_in_process
from lexgraph.cli.main import main
from lexgraph.encoding.embed import save_embeddings
from lexgraph.search.bm25 import BM25, _write_npz
from lexgraph.search.index import DenseIndex, IndexConfig


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def ws(tmp_path):
    """A BM25 workspace (articles 1-3), a questions file and an earlier run."""
    write_articles(tmp_path, ARTICLES)
    BM25().fit_texts(list(ARTICLES.values()), list(ARTICLES)).save(tmp_path / "models" / "bm25")
    (tmp_path / "q.jsonl").write_text(json.dumps({"id": "a", "question": "Qui paie le loyer ?"}) + "\n")
    (tmp_path / "out.trec").write_text("old Q0 1 1 1.000000 bm25\n", encoding="utf-8")
    return tmp_path


@pytest.fixture
def dense_ws(ws, dense_model):
    shutil.copytree(dense_model, ws, dirs_exist_ok=True)
    return ws


def search(ws: Path, system: str) -> list[str]:
    return ["search", "--questions", str(ws / "q.jsonl"), "--run", str(ws / "out.trec"), "--workspace", str(ws)] + [
        "--system",
        system,
    ]


# ---------------------------------------------------------------------------
# the edits: each returns the system to search with
# ---------------------------------------------------------------------------


def _bm25_ids(ws: Path, how) -> str:
    path = ws / "models/bm25/index.npz"
    with np.load(path) as z:
        arrays = {name: z[name] for name in z.files}
    arrays["doc_ids"] = how(arrays["doc_ids"])
    _write_npz(path, arrays)
    return "bm25"


def _bm25_meta(ws: Path, **values) -> str:
    path = ws / "models/bm25/bm25.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}), encoding="utf-8")
    return "bm25"


def _vectors(ws: Path, ids, rows: torch.Tensor) -> str:
    save_embeddings(ws / "data/embed/articles.safetensors", ids, rows)
    return "dsr"


def _with_nan(rows: list[int], value: float = float("nan")) -> torch.Tensor:
    x = torch.randn(3, 16)
    x[rows, 1] = value
    return x


def _hybrid(ws: Path, depth=1000, fusion=None) -> str:
    path = ws / "models/hybrid/hybrid.json"
    path.parent.mkdir(parents=True)
    settings = {"format": "lexgraph-hybrid", "version": 1, "sparse": "bm25", "dense": "dsr", "depth": depth}
    settings["fusion"] = fusion or {"method": "rrf", "k": 60}
    path.write_text(json.dumps(settings), encoding="utf-8")
    return "hybrid"


def _mvcl(ws: Path, key: str, value, in_config: bool = False, variant: str = "xrerank") -> str:
    """A saved re-ranker (xrerank: fused with its first stage; mvcl: the re-ranked list alone),
    ``key`` of ``mvcl.json`` (or of its ``config``) then edited."""
    from lexgraph.methods.rerank.config import RerankConfig
    from lexgraph.methods.rerank.io import build_model, save_model

    config = sample_config(RerankConfig, "rerank", variant, first_stage="bm25")
    alpha = config.interpolation[0] if config.fusion else None
    save_model(build_model(6, config), config, {"alpha": alpha, "epoch": 1}, ws / f"models/{variant}")
    path = ws / f"models/{variant}/mvcl.json"
    settings = json.loads(path.read_text())
    (settings["config"] if in_config else settings)[key] = value
    if value == "<missing>":
        del (settings["config"] if in_config else settings)[key]
    path.write_text(json.dumps(settings), encoding="utf-8")
    return variant


def _zeroshot(ws: Path, **values) -> str:
    """The zeroshot stage's output (settings as it writes them), ``values`` then edited."""
    settings = {"base": "models/pretrain", "dim": 16, "prefix": "", "query_max_length": 512, "token_pooling": "mean"}
    (ws / "data/zeroshot").mkdir(parents=True)
    (ws / "data/zeroshot/zeroshot.json").write_text(json.dumps({**settings, **values, "window": 512}))
    save_embeddings(ws / "data/zeroshot/articles.safetensors", list(ARTICLES), torch.randn(3, 16))
    return "zeroshot"


def _nan_weights(ws: Path) -> str:
    """A saved xrerank whose network holds a nan weight (every score would be nan)."""
    from safetensors.torch import load_file, save_file

    variant = _mvcl(ws, "epoch", 1)
    path = ws / f"models/{variant}/mvcl.safetensors"
    tensors = load_file(str(path))
    name = sorted(n for n, t in tensors.items() if t.is_floating_point())[0]
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, str(path))
    return variant


CASES = [
    # (b) an index's ids are what it scores: rotated, permuted or repeated ids are refused
    (
        "bm25-ids-rotated",
        "ws",
        lambda ws: _bm25_ids(ws, lambda a: np.roll(a, 1)),
        ["index.npz", "'doc_ids' out of order"],
    ),
    ("bm25-ids-swapped", "ws", lambda ws: _bm25_ids(ws, lambda a: a[[0, 2, 1]]), ["index.npz", "position 2 of 3"]),
    ("bm25-ids-repeated", "ws", lambda ws: _bm25_ids(ws, lambda a: a[[0, 0, 2]]), ["index.npz", "strictly ascending"]),
    # (a) tuned values in the domain params.yaml allows
    ("bm25-b-5", "ws", lambda ws: _bm25_meta(ws, b=5), ["models/bm25/bm25.json", "b = 5", "a number in [0, 1]"]),
    ("bm25-k1-negative", "ws", lambda ws: _bm25_meta(ws, k1=-1), ["bm25.json", "k1 = -1", "a finite number >= 0"]),
    ("bm25-k1-text", "ws", lambda ws: _bm25_meta(ws, k1="1.2"), ["bm25.json", "k1 = '1.2'", "a finite number"]),
    (
        "hybrid-depth-10",
        "ws",
        lambda ws: _hybrid(ws, depth=10),
        ["models/hybrid/hybrid.json", "key 'depth' = 10", "expected an integer >= 500"],
    ),
    (
        "hybrid-depth-text",
        "ws",
        lambda ws: _hybrid(ws, depth="1000"),
        ["hybrid.json", "key 'depth' = '1000'", "expected an integer >= 500"],
    ),
    (
        "hybrid-weight-7",
        "ws",
        lambda ws: _hybrid(ws, fusion={"method": "wsum", "norm": "min-max", "weight": 7}),
        ["hybrid.json", "'weight': 7.0", "a weight in [0, 1]"],
    ),
    (
        "xrerank-alpha-5",
        "ws",
        lambda ws: _mvcl(ws, "alpha", 5.0),
        ["models/xrerank/mvcl.json", "key 'alpha' = 5.0", "expected one of config.interpolation [0.0, 0.1,"],
    ),
    (
        "mvcl-alpha-5",
        "ws",
        lambda ws: _mvcl(ws, "alpha", 5.0, variant="mvcl"),
        ["models/mvcl/mvcl.json", "key 'alpha' = 5.0", "expected null (no config.fusion)"],
    ),
    (
        "mvcl-alpha-missing",
        "ws",
        lambda ws: _mvcl(ws, "alpha", "<missing>"),
        ["mvcl.json", "key 'alpha' = '<missing>'"],
    ),
    ("mvcl-k-edited", "ws", lambda ws: _mvcl(ws, "k", 7), ["mvcl.json", "key 'k' = 7", "expected config.k"]),
    (
        "mvcl-config-k-1",
        "ws",
        lambda ws: _mvcl(ws, "k", 1, in_config=True),
        ["mvcl.json", "key 'config'", "'rerank.k' = 1", "an integer >= 2"],
    ),
    (
        "mvcl-config-interpolation",
        "ws",
        lambda ws: _mvcl(ws, "interpolation", [5.0], in_config=True),
        ["mvcl.json", "key 'config'", "'rerank.xrerank.interpolation' = [5.0]", "in [0, 1]"],
    ),
    (
        "zeroshot-query-length-0",
        "ws",
        lambda ws: _zeroshot(ws, query_max_length=0),
        ["data/zeroshot/zeroshot.json", "key 'query_max_length' = 0", "expected a positive integer"],
    ),
    (
        "zeroshot-query-length-negative",
        "ws",
        lambda ws: _zeroshot(ws, query_max_length=-3),
        ["zeroshot.json", "key 'query_max_length' = -3", "expected a positive integer", "dvc repro zeroshot"],
    ),
    (
        "zeroshot-pooling",
        "ws",
        lambda ws: _zeroshot(ws, token_pooling="max"),
        ["zeroshot.json", "key 'token_pooling' = 'max'", "expected one of cls, mean"],
    ),
    (
        "xrerank-nan-weight",
        "ws",
        _nan_weights,
        ["models/xrerank/mvcl.safetensors", "1 of ", "tensors hold nan or infinite values", "expected finite weights"],
    ),
    # (a) vectors read from an artefact are finite, one row per id
    (
        "dense-nan-rows",
        "dense_ws",
        lambda ws: _vectors(ws, list(ARTICLES), _with_nan([0, 2])),
        ["data/embed/articles.safetensors", "2 of 3 rows hold nan or infinite values (first: id 1)"],
    ),
    (
        "dense-inf-row",
        "dense_ws",
        lambda ws: _vectors(ws, list(ARTICLES), _with_nan([1], float("inf"))),
        ["articles.safetensors", "1 of 3 rows", "expected finite vectors"],
    ),
    (  # (b) ids rotated against their vectors: each vector would answer for another article
        "dense-ids-rotated",
        "dense_ws",
        lambda ws: _vectors(ws, [3, 1, 2], torch.randn(3, 16)),
        ["data/embed/articles.safetensors", "ids out of order at row 1 of 3 (id 1 after 3)", "strictly ascending"],
    ),
    (
        "dense-repeated-id",
        "dense_ws",
        lambda ws: _vectors(ws, [1, 2, 2, 3], torch.randn(4, 16)),
        ["articles.safetensors", "1 of 4 rows repeat an earlier id (first: id 2)"],
    ),
]


@pytest.mark.parametrize("case, fixture, edit, expected", CASES, ids=[c[0] for c in CASES])
def test_an_edited_artefact_is_refused_in_one_line(case, fixture, edit, expected, request, capsys):
    ws = request.getfixturevalue(fixture)
    system = edit(ws)
    before = snapshot(ws)
    assert main(search(ws, system)) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "lexgraph search: error: " in line]
    assert len(lines) == 1, err
    for part in [*expected, "dvc repro"]:
        assert part in lines[0], f"{part!r} not in {lines[0]!r}"
    assert "Traceback" not in err
    assert snapshot(ws) == before


def test_unedited_artefacts_still_load(dense_ws, capsys):
    _hybrid(dense_ws)
    for system in ("bm25", "dsr", "hybrid"):
        assert main(search(dense_ws, system)) == 0, capsys.readouterr().err


# ---------------------------------------------------------------------------
# (c) an approximate index that cannot reach k: one warning line, no numpy warning
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n, config, words",
    [
        (50, IndexConfig(type="ivf", nlist=100000, nprobe=1), "ivf, nlist 50 (evaluate.index.nlist 100000: at most"),
        (
            600,
            IndexConfig(type="hnsw", hnsw_m=2, ef_search=1, ef_construction=1),
            "hnsw, M 2, efConstruction 1, efSearch 58 (evaluate.index.ef_search 1, raised to k)",
        ),
    ],
)
def test_a_search_short_of_k_says_so_once(n, config, words, caplog):
    """IVF with more lists than articles and one probed, HNSW with two links per node: far fewer
    than k articles come back; one warning line names the settings and "returned n of k"."""
    rng = np.random.default_rng(0)
    ids = np.arange(n, dtype=np.int64) * 7 + 3
    index = DenseIndex(ids, rng.standard_normal((n, 16)).astype(np.float32), config)
    queries = rng.standard_normal((4, 16)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy RuntimeWarning
        caplog.clear()
        got, scores = index.search(queries, 50)
        index.search(queries, 50)  # said once per index
    found = (got >= 0).sum(axis=1)
    assert found.min() < 50
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(lines) == 1, lines
    assert words in lines[0] and f": returned {found.min()} of 50 articles for" in lines[0], lines[0]
    assert np.all(scores[got < 0] == 0)


def test_an_exact_index_never_warns(caplog):
    rng = np.random.default_rng(1)
    index = DenseIndex(np.arange(20), rng.standard_normal((20, 8)).astype(np.float32), IndexConfig(type="flat"))
    assert (index.search(rng.standard_normal((3, 8)).astype(np.float32), 20)[0] >= 0).all()
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


@pytest.mark.slow  # a subprocess that loads the CLI or a stage: ~5 s on 2 cores
def test_search_with_an_index_short_of_k_warns_in_one_line(dense_ws):
    """`lexgraph search` (a process: stderr as a user sees it) with evaluate.index settings that
    cannot reach k: one warning line naming them, no numpy RuntimeWarning, the run written."""
    from conftest import sample_params

    evaluate = sample_params()["evaluate"]
    evaluate["index"] = {**evaluate["index"], "type": "ivf", "nlist": 100000, "nprobe": 1}
    write_params(dense_ws / "params.yaml", evaluate=evaluate)
    before = {k: v for k, v in snapshot(dense_ws).items() if k != "out.trec"}
    proc = subprocess.run(
        [sys.executable, "-m", "lexgraph.cli", *search(dense_ws, "dsr"), "--k", "3"],
        cwd=dense_ws,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "RuntimeWarning" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "returned" in line]
    assert (
        len(lines) == 1
        and "ivf, nlist 3 (evaluate.index.nlist 100000: at most one per article), nprobe 1: returned 1 of 3" in lines[0]
    ), proc.stderr
    assert {k: v for k, v in snapshot(dense_ws).items() if k != "out.trec"} == before


# ---------------------------------------------------------------------------
# (d) a setting that cannot take effect: hprior.scopes beyond the hierarchy's depth
# ---------------------------------------------------------------------------


def _toy_graph_dir(root: Path) -> Path:
    """A three-level hierarchy (R > H1 > H3), so scopes 0..2 reach a heading of their own."""
    from lexgraph.graph.build import GraphConfig, build_graph, save_graph

    articles = pl.DataFrame({"id": [1, 2, 3, 4], "article": ["t"] * 4, "heading_id": [3, 3, 1, 2]})
    headings = pl.DataFrame(
        {"heading_id": [0, 1, 2, 3], "parent_id": [-1, 0, 0, 1], "label": list("RABC"), "text": list("RABC")}
    )
    questions = pl.DataFrame({"id": [100], "question": ["q"], "article_ids": [[1]], "split": ["dev"]})
    data, nodes = build_graph(
        articles, headings, questions, GraphConfig(directed=True, consecutive=False, questions=False)
    )
    save_graph(data, nodes, root / "data/graph")
    return root / "data/graph"


def run_hprior_stage(ws: Path) -> int:
    return run_stage_in_process(
        ROOT / "stages/hprior.py",
        *("--params", ws / "params.yaml", "--graph", ws / "data/graph", "--embed", ws / "data/embed"),
        *("--questions", ws / "data/clean/questions.parquet", "--out", ws / "models/hprior"),
        *("--metrics", ws / "metrics/hprior_tune.json"),
    )


@pytest.mark.parametrize("scopes", [[40], [0, 3]])
def test_hprior_scopes_beyond_the_hierarchy_are_refused(tmp_path, scopes, capsys):
    from conftest import section

    graph = _toy_graph_dir(tmp_path)
    write_params(tmp_path / "params.yaml", hprior=section("hprior", scopes=scopes))
    before = snapshot(tmp_path)
    assert run_hprior_stage(tmp_path) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    for part in (f"'hprior.scopes' = {scopes}", "each in [0, 2]", str(graph), "2 levels above"):
        assert part in lines[0], lines[0]
    assert snapshot(tmp_path) == before and not (tmp_path / "models").exists()


def test_token_states_with_nan_are_refused_naming_the_file(tmp_path):
    """The re-rankers' cached token states (data/rerank): a text with a nan or infinite state is
    refused in one line naming the file and how many texts (read by `lexgraph search --system
    xrerank` and the rerank stage; a workspace for the search itself needs a PLM, so the reader is
    tested here)."""
    from lexgraph.core.errors import DataError
    from lexgraph.methods.rerank.features import TokenStore

    states = [torch.randn(n, 4, dtype=torch.float16) for n in (2, 3, 1)]
    states[1][2, 0], states[2][0, 3] = float("nan"), float("-inf")
    path = tmp_path / "articles.safetensors"
    TokenStore.from_list([7, 8, 9], states, 4).save(path)
    before = path.read_bytes()
    with pytest.raises(DataError) as info:
        TokenStore.load(path)
    message = str(info.value)
    assert message.startswith(f"{path}, column 'states': 2 of 3 texts hold nan or infinite token states (first: id 8)")
    assert "dvc repro encode_rerank" in message and "\n" not in message
    assert path.read_bytes() == before
    states[1][2, 0], states[2][0, 3] = 1.0, 1.0
    TokenStore.from_list([7, 8, 9], states, 4).save(path)
    assert TokenStore.load(path).get(9).shape == (1, 4)

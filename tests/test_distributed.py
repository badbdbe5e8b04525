"""Sharded `embed` and `doc2query` (lexgraph.core.distributed): 2 gloo processes under torchrun
write the same bytes as 1 process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import torch

from helpers_queries import ARTICLES
from lexgraph.core.distributed import map_batches, shard_range
from lexgraph.models.article_encoder import HierarchicalArticleEncoder
from lexgraph.models.dsr import DSR
from lexgraph.models.encoders import QueryEncoder

ROOT = Path(__file__).resolve().parents[1]


def test_shard_range_by_hand():
    assert [shard_range(7, r, 3) for r in range(3)] == [(0, 3), (3, 5), (5, 7)]
    assert [shard_range(2, r, 4) for r in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert shard_range(5, 0, 1) == (0, 5)
    with pytest.raises(ValueError):
        shard_range(5, 2, 2)


def test_map_batches_without_a_process_group_is_a_plain_map():
    assert map_batches(lambda b: sum(b), [[1, 2], [3], []]) == [3, 3, 0]


WORKER = """
import logging, sys, torch
logging.basicConfig(level=logging.INFO)
torch.set_num_threads(1)
from pathlib import Path
from lexgraph.encoding.embed import EmbedConfig, EmbedPaths, run_embed
from lexgraph.core.stage import StageContext
from lexgraph.data.queries import QueriesConfig, write_queries
dsr, data, out, mt5 = sys.argv[1:5]
run_embed(EmbedPaths(dsr=Path(dsr), chunks=Path(data, "chunks"), articles=Path(data, "articles.parquet"),
                     headings=Path(data, "headings.parquet"), questions=Path(data, "questions.parquet"),
                     synthetic=Path(data, "synthetic.parquet"), out=Path(out, "embed")),
          EmbedConfig(batch_size=2), StageContext(seed=0, device="cpu"))
write_queries(data + "/articles.parquet", out + "/synthetic.parquet",
    QueriesConfig(generator="doc2query", model=mt5, per_article=2, top_k=7, top_p=0.9, max_length=9,
                  max_input_length=12, batch_size=1, first_id=1000000, min_words=8, max_words=24,
                  mixed_precision=True), seed=3, device="cpu")
"""


def _launch(n: int, worker: Path, args: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", str(worker), *args]
    # a session of its own, so that a hung run's workers die with the launcher
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, stderr[-3000:]
    return stderr


@pytest.mark.slow
def test_two_gloo_processes_write_the_bytes_of_one(tiny_model_dir, tiny_mt5, tmp_path):
    torch.manual_seed(0)
    query = QueryEncoder.from_pretrained(tiny_model_dir, max_length=16)
    article = HierarchicalArticleEncoder.from_pretrained(
        tiny_model_dir, max_chunk_length=16, max_document_length=48, num_layers=1, num_heads=2
    )
    DSR(query, article).save(tmp_path / "dsr")
    data = tmp_path / "data"
    data.mkdir()
    words = ["le contrat de bail", "article du mariage", "la loi du divorce", "enfant", "les loi"]
    texts = [" ".join(words[(i + j) % 5] for j in range(i % 7 + 1)) for i in range(11)]
    pl.DataFrame({"id": [100 + i for i in range(11)], "article": texts}).write_parquet(data / "articles.parquet")
    pl.DataFrame({"heading_id": [0, 1, 2], "text": ["Code civil", "Titre du mariage", "bail"]}).write_parquet(
        data / "headings.parquet"
    )
    pl.DataFrame({"id": list(range(7)), "question": [w + " ?" for w in words] + ["loi", "bail"]}).write_parquet(
        data / "questions.parquet"
    )
    pl.DataFrame({"id": [1000000 + i for i in range(5)], "question": words}).write_parquet(data / "synthetic.parquet")
    mt5_articles = data / "mt5"
    mt5_articles.mkdir()
    pl.DataFrame({"id": [a for a, _ in ARTICLES], "article": [t for _, t in ARTICLES]}).write_parquet(
        mt5_articles / "articles.parquet"
    )
    worker = tmp_path / "worker.py"
    worker.write_text(
        WORKER.replace(
            'data + "/articles.parquet", out + "/synthetic', 'data + "/mt5/articles.parquet", out + "/synthetic'
        )
    )
    outputs = {}
    for n in (1, 2):
        out = tmp_path / f"out{n}"
        logs = _launch(n, worker, [str(tmp_path / "dsr"), str(data), str(out), str(tiny_mt5)])
        outputs[n] = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
        if n == 2:  # rank 1 really ran its own slice: chunk, aggregate, query and doc2query batches
            shards = [line.split("batches ")[1] for line in logs.splitlines() if "rank 1: batches" in line]
            assert len(shards) >= 4 and all(not s.startswith("0-") for s in shards), logs[-3000:]
    assert sorted(outputs[1]) == [
        "embed/articles.safetensors",
        "embed/headings.safetensors",
        "embed/questions.safetensors",
        "embed/synthetic.safetensors",
        "synthetic.parquet",
    ]
    assert outputs[1] == outputs[2]
    queries = pl.read_parquet(tmp_path / "out2" / "synthetic.parquet")
    assert queries.height > 0 and set(queries["article_ids"].list.first()) <= {a for a, t in ARTICLES if t}

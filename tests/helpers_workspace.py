"""A tiny trained workspace (bm25, zeroshot and a frozen-chunk dsr, seeded) as `dvc repro` leaves it
for those three systems, at toy sizes: for the `lexgraph index` and `lexgraph serve` tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch

from conftest import ROOT, TINY_WORDS

N_WORKSPACE = 30
CHUNKS = {"max_chunk_length": 16, "max_document_length": 32, "token_pooling": "mean"}


def random_texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)  # each text draws from 4 of the words: BM25's idf tells them apart
    return [
        " ".join(rng.choice(rng.choice(TINY_WORDS, size=4, replace=False), size=int(rng.integers(6, 30))))
        for _ in range(n)
    ]


def chunk_encoder(pretrain):
    from lexgraph.models.article_encoder import HierarchicalArticleEncoder

    return HierarchicalArticleEncoder.from_pretrained(pretrain, **CHUNKS, num_layers=0).eval()


def build_tiny_workspace(root: Path, tiny_model_dir: Path) -> Path:
    """A workspace with bm25, zeroshot and a frozen-chunk dsr trained on nothing (seeded) at ``root``."""
    from helpers_cli import write_articles
    from lexgraph.core.config import load_params
    from lexgraph.encoding.chunks import embed_from_chunks, encode_chunk_table, save_chunk_table
    from lexgraph.encoding.embed import save_embeddings
    from lexgraph.methods.zeroshot.system import ZeroshotConfig, zeroshot_embeddings
    from lexgraph.models.article_encoder import HierarchicalArticleEncoder
    from lexgraph.models.dsr import DSR
    from lexgraph.models.encoders import QueryEncoder
    from lexgraph.search.bm25 import BM25

    shutil.copy(ROOT / "params.yaml", root / "params.yaml")
    pretrain = root / "models" / "pretrain"
    shutil.copytree(tiny_model_dir, pretrain)
    articles = dict(enumerate(random_texts(N_WORKSPACE, 1)))
    write_articles(root, articles)
    ids = np.array(list(articles))
    table = encode_chunk_table(chunk_encoder(pretrain), ids, list(articles.values()), 8)
    save_chunk_table(table, root / "data" / "chunks" / "articles.safetensors")
    torch.manual_seed(0)
    query = QueryEncoder.from_pretrained(pretrain, max_length=16, token_pooling="mean")
    article = HierarchicalArticleEncoder.from_pretrained(
        pretrain, **CHUNKS, pooling="mean", num_layers=1, num_heads=2, freeze_backbone=True
    )
    DSR(query, article, temperature=0.05).save(root / "models" / "dsr", backbone_source=pretrain)
    dsr = DSR.load(root / "models" / "dsr", with_article_backbone=False)
    save_embeddings(
        root / "data" / "embed" / "articles.safetensors", ids, embed_from_chunks(dsr.article_encoder, table)
    )
    BM25(k1=0.9, b=0.4).fit_texts(list(articles.values()), ids.tolist()).save(root / "models" / "bm25")
    config = ZeroshotConfig.from_params(load_params("zeroshot", root / "params.yaml")[1])
    zeroshot_embeddings(
        pretrain, root / "data" / "clean" / "articles.parquet", root / "data" / "zeroshot", config, "cpu"
    )
    return root

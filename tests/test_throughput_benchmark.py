"""benchmarks/throughput.py: its FLOP accounting and padding table against hand computations."""

from __future__ import annotations

import numpy as np
import pytest
from torch import nn

from conftest import load_benchmark

throughput = load_benchmark("throughput")


def test_matmul_params_counts_linears_and_attention_projections_not_embeddings():
    model = nn.Sequential(nn.Embedding(100, 8), nn.Linear(8, 4), nn.MultiheadAttention(8, 2), nn.LayerNorm(8))
    # Linear 8x4 = 32; attention: in_proj 3 x 8 x 8 = 192, out_proj 8 x 8 = 64; no embedding, no LayerNorm
    assert throughput.matmul_params(model) == 32 + 192 + 64


def test_attention_flops_by_hand():
    # 4 S^2 d per layer: sequences of 3 and 5 tokens, d = 2, 2 layers
    assert throughput.attention_flops([3, 5], layers=2, dim=2) == 2 * 4 * 2 * (9 + 25)


def test_padding_table_on_a_known_distribution():
    # every article: one full chunk of 128 and one of 16 tokens -> useful 144 per article
    chunks = [[128, 16]] * 10
    ratios = throughput.padding_table(
        chunks, batch_articles=24, max_chunks=8, chunk_length=128, rng=np.random.default_rng(0)
    )
    assert ratios["slots"] == pytest.approx(8 * 128 / 144)
    assert ratios["real"] == pytest.approx(2 * 128 / 144)  # 48 rows (a stable count) x 128
    # 48 chunks: the 24 of 128 form one call, the 24 of 16 another at 32 (the width multiple)
    assert ratios["packed"] == pytest.approx((24 * 128 + 24 * 32) / (24 * 144))


def test_small_defaults_fit_a_24_gb_machine():
    args = throughput.parse_args(["--small", "--stages", "train_dsr"])
    assert (args.dsr_batch, args.embed_batch) == (4, 32)
    assert throughput.parse_args(["--small", "--dsr-batch", "6"]).dsr_batch == 6


def test_batch_sizes_default_to_the_paper_profile():
    args = throughput.parse_args(["--stages", "train_dsr"])
    assert (args.dsr_batch, args.pretrain_batch, args.pretrain_length) == (24, 32, 512)
    assert (args.d2q_batch, args.d2q_returns, args.d2q_length, args.embed_batch) == (64, 5, 60, 256)
    assert (args.chunk_length, args.document_length) == (128, 1024)
    assert throughput.parse_args(["--dsr-batch", "3"]).dsr_batch == 3
    with pytest.raises(SystemExit):
        throughput.parse_args(["--stages", "nope"])

"""benchmarks/gdsr_pairs.py: the train subsets and the synthetic merge, checked by hand on toy tables."""

from __future__ import annotations

import numpy as np
import polars as pl
import torch

from conftest import load_benchmark

pairs = load_benchmark("gdsr_pairs")


def toy_questions():
    return pl.DataFrame(
        {
            "id": [5, 1, 9, 3, 7, 2],
            "question": ["a", "b", "c", "d", "e", "f"],
            "article_ids": [[1], [2], [3], [4], [5], [6]],
            "split": ["train", "train", "dev", "train", "train", "test"],
        }
    )


def test_train_subset_keeps_a_seeded_share_of_train_and_every_other_row():
    q = toy_questions()
    half = pairs.train_subset(q, 0.5, seed=13)
    train = half.filter(pl.col("split") == "train")["id"].to_list()
    assert len(train) == 2 and set(train) <= {1, 3, 5, 7}
    assert sorted(half.filter(pl.col("split") != "train")["id"].to_list()) == [2, 9]
    assert pairs.train_subset(q, 0.5, seed=13).equals(half)  # deterministic per seed
    assert pairs.train_subset(q, 0.01, seed=13).filter(pl.col("split") == "train").height == 1  # at least one
    assert pairs.train_subset(q, 1.0, seed=13).height == q.height


def test_with_synthetic_relabels_and_merges_vectors_in_id_order():
    q = toy_questions()
    negatives = pl.DataFrame(
        {"question_id": [5, 100, 101], "split": ["train", "synthetic", "synthetic"], "negative_ids": [[7], [8], [9]]}
    )
    ids = np.array([1, 2, 3, 5, 7, 9])
    vectors = torch.arange(6, dtype=torch.float32).unsqueeze(1)  # (6, 1): row r holds r
    synthetic = pl.DataFrame(
        {
            "id": [100, 101],
            "question": ["s0", "s1"],
            "article_ids": [[1], [2]],
            "split": ["synthetic", "synthetic"],
            "category": ["x", "x"],
        }
    )
    syn_vectors = torch.tensor([[10.0], [11.0]])  # (2, 1)
    q2, neg2, (ids2, vec2) = pairs.with_synthetic(q, negatives, (ids, vectors), synthetic, syn_vectors, 2, seed=13)
    assert q2.columns == q.columns and q2.height == 8
    assert q2.filter(pl.col("id") >= 100)["split"].to_list() == ["train", "train"]
    assert sorted(neg2.filter(pl.col("question_id") >= 100)["split"].to_list()) == ["train", "train"]
    assert ids2.tolist() == [1, 2, 3, 5, 7, 9, 100, 101]
    assert vec2.squeeze(1).tolist() == [0, 1, 2, 3, 4, 5, 10, 11]  # each id keeps its own vector

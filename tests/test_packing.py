"""Packed chunks and length buckets of the hierarchical article encoder.

The reference for every equivalence is computed chunk by chunk: each real chunk alone
through the backbone (no padding at all), then the chunk-level module on that article
alone (no empty slots), so packing, bucketing and scattering are checked against a path
that has none of them.
"""

from __future__ import annotations

import pytest
import torch

from lexgraph.models import article_encoder
from lexgraph.models.article_encoder import HierarchicalArticleEncoder
from lexgraph.models.encoders import TextEncoder
from lexgraph.models.packing import collate_chunks, length_buckets, pack_chunks, scatter_chunks, trimmed_length

TEXTS = [
    "le contrat de bail " * 12,  # 4 chunks (truncated)
    "article du mariage",  # 1 short chunk
    "la loi du divorce et de l'enfant " * 2,  # 2 chunks, the last one short
    "bail",  # 1 very short chunk
    "le mariage de la loi du contrat " * 5,  # 3 chunks, the last one short
]


def _encoder(path, pooling="max", token_pooling="cls") -> HierarchicalArticleEncoder:
    torch.manual_seed(3)
    enc = HierarchicalArticleEncoder.from_pretrained(
        path,
        max_chunk_length=16,
        max_document_length=64,
        pooling=pooling,
        num_layers=2,
        num_heads=2,
        token_pooling=token_pooling,
        dropout=0.0,
    )
    with torch.no_grad():  # non-trivial chunk positions and chunk Transformer
        for p in [enc.chunk_positions.weight, *enc.chunk_transformer.parameters()]:
            p.add_(0.2 * torch.randn_like(p))
    return enc.eval()


def _reference(enc: HierarchicalArticleEncoder, texts) -> torch.Tensor:
    """One article at a time, one chunk at a time, no padding anywhere: ``(n, dim)``."""
    out = []
    for doc in enc.chunk(texts):
        vectors = torch.cat([enc._pool(torch.tensor([c]), torch.ones(1, len(c), dtype=torch.long)) for c in doc])
        tokens = torch.tensor([[len(c) for c in doc]])  # (1, chunks)
        mask = torch.ones(1, len(doc), dtype=torch.bool)  # (1, chunks)
        out.append(enc.aggregate(vectors.unsqueeze(0), mask, tokens)[0])
    return torch.stack(out)


def test_pack_chunks_layout_by_hand():
    packed = pack_chunks([[[5, 6, 7], [5, 8]], [[5, 9, 9, 9]]], pad_id=0)
    assert packed["chunk_counts"].tolist() == [2, 1]
    assert packed["input_ids"].tolist() == [[5, 6, 7, 0], [5, 8, 0, 0], [5, 9, 9, 9]]
    assert packed["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    with pytest.raises(ValueError):
        pack_chunks([[[5]], []], pad_id=0)


def test_scatter_chunks_puts_rows_in_their_slots_and_masks_the_rest():
    values = torch.arange(1.0, 7.0).unsqueeze(1)  # 6 chunks: article 0 has 3, article 1 has 1, article 2 has 2
    padded, mask = scatter_chunks(values, torch.tensor([3, 1, 2]))
    assert padded.squeeze(-1).tolist() == [[1, 2, 3], [4, 0, 0], [5, 6, 0]]
    assert mask.tolist() == [[True, True, True], [True, False, False], [True, True, False]]
    with pytest.raises(ValueError):
        scatter_chunks(values, torch.tensor([3, 1]))


def test_length_buckets_by_hand():
    lengths = [128, 20, 128, 100, 90, 50, 30, 128]
    # min_rows=2, ratio 0.75: [128,128,128,100] (100 >= 96); 90 < 96 opens a bucket; 50 < 67.5 joins it
    # anyway (it holds one row < min_rows); 30 < 67.5 opens one; 20 joins (one row).
    assert length_buckets(lengths, min_rows=2, ratio=0.75) == [[0, 2, 7, 3], [4, 5], [6, 1]]
    assert length_buckets(lengths, min_rows=100) == [[0, 2, 7, 3, 4, 5, 6, 1]]
    assert sorted(i for b in length_buckets(lengths, min_rows=1, ratio=0.99) for i in b) == list(range(8))
    assert trimmed_length(20, 128) == 24 and trimmed_length(125, 128) == 128 and trimmed_length(8, 128) == 8


@pytest.mark.parametrize("min_bucket", [1, 16])  # 1: every length its own trimmed bucket
@pytest.mark.parametrize("pooling,token_pooling", [("max", "cls"), ("mean", "mean"), ("token_mean", "cls")])
def test_packed_padded_and_encode_equal_the_chunk_by_chunk_reference(
    tiny_model_dir, pooling, token_pooling, min_bucket, monkeypatch
):
    monkeypatch.setattr(article_encoder, "MIN_BUCKET", min_bucket)
    enc = _encoder(tiny_model_dir, pooling, token_pooling)
    expected = _reference(enc, TEXTS)  # (5, 16)
    chunks = enc.chunk(TEXTS)
    assert [len(doc) for doc in chunks] == [4, 1, 2, 1, 3]
    with torch.no_grad():
        packed = enc(**enc.pack(TEXTS))
        padded = enc(**collate_chunks(chunks, enc.tokenizer.pad_token_id))
        vectors, mask, tokens = enc.chunk_vectors(**enc.pack(TEXTS))
    torch.testing.assert_close(packed, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded, expected, atol=1e-5, rtol=1e-5)
    for batch_size in (1, 2, 64):  # chunk batches and aggregate batches of every size
        torch.testing.assert_close(
            enc.encode(TEXTS, batch_size=batch_size, show_progress=False), expected, atol=1e-5, rtol=1e-5
        )
    assert mask.tolist() == [[i < n for i in range(4)] for n in (4, 1, 2, 1, 3)]
    assert tokens.tolist() == [[len(c) for c in doc] + [0] * (4 - len(doc)) for doc in chunks]
    assert bool((vectors[~mask] == 0).all())  # empty slots hold nothing


def test_max_pool_ignores_empty_slots(tiny_model_dir):
    enc = _encoder(tiny_model_dir, "max")
    with torch.no_grad():
        vectors, mask, tokens = enc.chunk_vectors(**enc.pack(TEXTS[:2]))
        # a huge value in article 1's empty slots must not reach its max
        poisoned = vectors.clone()
        poisoned[~mask] = 1e6
        torch.testing.assert_close(enc.aggregate(poisoned, mask, tokens), enc.aggregate(vectors, mask, tokens))
        assert float(enc.aggregate(poisoned, mask, tokens).max()) < 1e3


def test_bucketed_training_gradients_equal_the_padded_ones(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(article_encoder, "MIN_BUCKET", 1)
    calls = []
    monkeypatch.setattr(
        HierarchicalArticleEncoder, "_pool", lambda self, i, m: calls.append(i.shape) or TextEncoder._pool(self, i, m)
    )
    enc = _encoder(tiny_model_dir, "max")
    weights = torch.randn(len(TEXTS), enc.dim)

    def grads(**inputs):
        enc.zero_grad(set_to_none=True)
        (enc(**inputs) * weights).sum().backward()
        return {n: p.grad.clone() for n, p in enc.named_parameters() if p.grad is not None}

    packed = grads(**enc.pack(TEXTS))
    assert len(calls) > 1 and min(shape[1] for shape in calls) < 16  # several buckets, short ones trimmed
    flat_one_call = enc.encode_flat  # the unbucketed path: one call over all chunks

    def unbucketed(input_ids, attention_mask, bucket=True):
        return flat_one_call(input_ids, attention_mask, bucket=False)

    enc.encode_flat = unbucketed
    try:
        plain = grads(**enc.pack(TEXTS))
    finally:
        del enc.encode_flat
    assert packed.keys() == plain.keys() and any(n.startswith("backbone.") for n in packed)
    for name in packed:
        torch.testing.assert_close(packed[name], plain[name], atol=1e-5, rtol=1e-4)


def test_no_text_is_no_chunk_and_an_empty_table_gives_no_vector(tiny_model_dir):
    """A corpus part with nothing to encode (french_law.py's distractor headings at the sample's own
    size) is an empty chunk table and a (0, dim) matrix, not the fast tokenizer's IndexError."""
    from lexgraph.encoding.chunks import embed_from_chunks, encode_chunk_table

    enc = _encoder(tiny_model_dir)
    assert enc.chunk([]) == []
    table = encode_chunk_table(enc, [], [])
    assert len(table) == 0
    assert tuple(embed_from_chunks(enc, table).shape) == (0, enc.dim)

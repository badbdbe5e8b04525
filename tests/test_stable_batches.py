"""Shape-stable batches (lexgraph.encoding.stable_batches): the planner's batches, and for the
chunk encoder (:func:`encode_chunk_table`), the chunk-level pass (:func:`embed_from_chunks`) and
the frozen re-ranker's token states (:meth:`FrozenTokenEncoder.encode_ids`), ``stable=True``
gives a text the same bits whatever it is encoded with (a subset, a superset with new texts,
another order); ``stable=False`` gives what the code gave before ``stable`` (tiny local BERT)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from conftest import TINY_WORDS
from lexgraph.encoding import stable_batches as sb
from lexgraph.encoding.chunks import ChunkTable, embed_from_chunks, encode_chunk_table
from lexgraph.methods.rerank.features import FrozenTokenEncoder
from lexgraph.models.article_encoder import HierarchicalArticleEncoder

SETTINGS = dict(
    max_chunk_length=64, max_document_length=256, pooling="token_mean", num_layers=1, num_heads=2, token_pooling="mean"
)
BATCH = 4


def _texts(n: int, seed: int) -> list[str]:
    """``n`` texts of 1 to 120 words, some spelled out in letters (several tokens each)."""
    rng = random.Random(seed)
    words = [*TINY_WORDS, "mur", "voisin", "prix", "terme"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 120))) for _ in range(n)]


# the texts of a corpus and of the three other encodings: ids into CORPUS (40 texts)
CORPUS = _texts(40, seed=1)
BASE = list(range(20))
CASES = {
    "subset": [3, 4, 7, 8, 9, 12, 15],
    "superset": [*range(0, 20, 2), *range(20, 40), *range(1, 20, 2)],
    "order": [int(i) for i in np.random.default_rng(2).permutation(BASE)],
}


@pytest.fixture(scope="module")
def encoder(tiny_model_dir) -> HierarchicalArticleEncoder:
    """A tiny article encoder with a non-trivial chunk Transformer (random weights)."""
    torch.manual_seed(3)
    enc = HierarchicalArticleEncoder.from_pretrained(tiny_model_dir, **SETTINGS, freeze_backbone=True).eval()
    with torch.no_grad():
        for p in enc.chunk_transformer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return enc


def _chunk_rows(table: ChunkTable) -> dict[int, torch.Tensor]:
    """Chunk vectors ``(chunks, dim)`` of each text, by id."""
    return {int(i): table.vectors[table.offsets[r] : table.offsets[r + 1]] for r, i in enumerate(table.ids)}


def test_the_planner_buckets_pads_and_fills_with_dummies():
    lengths = [5, 40, 33, 16, 48, 1, 32]
    assert sb.stable_batches(lengths, 2, 32, max_length=48) == [
        sb.StableBatch((1, 2), 48, 0),  # 40 and 33 round to 64, cut to the longest allowed 48
        sb.StableBatch((4,), 48, 1),
        sb.StableBatch((0, 3), 32, 0),
        sb.StableBatch((5, 6), 32, 0),
    ]
    assert sb.stable_batches([3, 17, 2], 4, 16) == [sb.StableBatch((1,), 32, 3), sb.StableBatch((0, 2), 16, 2)]
    assert sb.stable_batches([], 4, 16) == []
    assert sb.bucket_length(0, 16) == 16 and sb.bucket_length(16, 16) == 16 and sb.bucket_length(17, 16) == 32
    with pytest.raises(ValueError, match="49 tokens"):
        sb.bucket_length(49, 32, max_length=48)
    with pytest.raises(ValueError, match="batch_size"):
        sb.stable_batches([1], 0, 16)
    ids, attention = sb.stable_inputs([[7, 8, 9], [5]], sb.StableBatch((1, 0), 4, 2), pad_id=0)
    assert ids.tolist() == [[5, 0, 0, 0], [7, 8, 9, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert attention.tolist() == [[1, 0, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0], [1, 0, 0, 0]]
    from importlib.metadata import version

    key = sb.batching(32, "cpu", type("Config", (), {"_attn_implementation": "sdpa"})())
    builds = f"torch={torch.__version__} transformers={version('transformers')} tokenizers={version('tokenizers')}"
    assert key == f"stable rows=32 step={sb.STABLE_STEP} {builds} attention=sdpa on cpu " + (
        torch.backends.cpu.get_cpu_capability()
    )
    assert sb.batching(8, torch.device("cpu"), step=16).startswith("stable rows=8 step=16 ")


def _old_chunk_vectors(encoder, texts: list[str], batch_size: int) -> torch.Tensor:
    """encode_chunk_table's vectors before ``stable``: longest first, padded to the batch's longest."""
    flat = [chunk for doc in encoder.chunk(texts) for chunk in doc]
    out = torch.empty(len(flat), encoder.dim)  # (m, dim)
    order = sorted(range(len(flat)), key=lambda i: (-len(flat[i]), i))
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            length = max(len(flat[i]) for i in idx)
            ids = torch.full((len(idx), length), encoder.tokenizer.pad_token_id, dtype=torch.long)  # (batch, len)
            mask = torch.zeros((len(idx), length), dtype=torch.long)  # (batch, len)
            for row, i in enumerate(idx):
                ids[row, : len(flat[i])] = torch.tensor(flat[i])
                mask[row, : len(flat[i])] = 1
            out[torch.tensor(idx)] = encoder._pool(ids, mask).float()
    return out


def test_encode_chunk_table_stable_vectors_do_not_depend_on_the_other_texts(encoder):
    base = encode_chunk_table(encoder, BASE, [CORPUS[i] for i in BASE], BATCH, stable=True)
    assert len({len(c) for doc in encoder.chunk(CORPUS) for c in doc}) > 10  # chunks of many lengths
    reference = _chunk_rows(base)
    for case, ids in CASES.items():
        other = _chunk_rows(encode_chunk_table(encoder, ids, [CORPUS[i] for i in ids], BATCH, stable=True))
        for i in set(ids) & set(BASE):
            assert torch.equal(other[i], reference[i]), (case, i)
    torch.testing.assert_close(base.vectors, _old_chunk_vectors(encoder, [CORPUS[i] for i in BASE], BATCH))


def test_stable_encoding_counts_its_texts_by_their_tokens(encoder, monkeypatch):
    """The stable path's progress counts texts (``unit``) by the share of their tokens encoded, from
    its first 2 s with the rate: it ends at the number of texts, each batch adding its tokens' share."""
    from lexgraph.core import progress as progress_module

    made = []
    real = progress_module.progress_bar

    def kept(*args, **kwargs):
        made.append((real(*args, **kwargs), kwargs))
        return made[-1][0]

    monkeypatch.setattr(progress_module, "progress_bar", kept)
    texts = [CORPUS[i] for i in BASE]
    encode_chunk_table(encoder, BASE, texts, BATCH, stable=True, unit="article")
    ((bar, kwargs),) = made
    assert bar.total == len(texts) and bar.count == pytest.approx(len(texts))
    assert kwargs == {"unit": "article", "first": 2.0, "rate": True}


def test_encode_chunk_table_default_is_unchanged(encoder):
    texts = [CORPUS[i] for i in CASES["superset"]]
    table = encode_chunk_table(encoder, CASES["superset"], texts, BATCH)
    assert torch.equal(table.vectors, _old_chunk_vectors(encoder, texts, BATCH))


def _old_embed(encoder, table: ChunkTable, rows: np.ndarray, batch_size: int) -> torch.Tensor:
    """embed_from_chunks before ``stable``: each batch padded to its largest chunk count."""
    with torch.no_grad():
        return torch.cat(
            [encoder.aggregate(*table.padded(rows[s : s + batch_size])) for s in range(0, len(rows), batch_size)]
        )


def test_embed_from_chunks_stable_embeddings_do_not_depend_on_the_other_articles(encoder):
    ids = CASES["superset"]
    table = encode_chunk_table(encoder, ids, [CORPUS[i] for i in ids], BATCH, stable=True)
    assert len(set(np.diff(table.offsets).tolist())) > 1  # articles of several chunk counts
    base_rows = table.rows(BASE)
    reference = dict(zip(BASE, embed_from_chunks(encoder, table, base_rows, BATCH, stable=True)))
    for case, wanted in CASES.items():
        out = embed_from_chunks(encoder, table, table.rows(wanted), BATCH, stable=True)
        for i, vector in zip(wanted, out):
            if i in reference:
                assert torch.equal(vector, reference[i]), (case, i)
    every = embed_from_chunks(encoder, table, batch_size=BATCH, stable=True)
    torch.testing.assert_close(every, _old_embed(encoder, table, np.arange(len(table)), BATCH), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="does not fit"):
        table.padded(base_rows, width=1)


def test_embed_from_chunks_default_is_unchanged(encoder):
    ids = CASES["superset"]
    table = encode_chunk_table(encoder, ids, [CORPUS[i] for i in ids], BATCH)
    rows = table.rows(CASES["order"])
    assert torch.equal(embed_from_chunks(encoder, table, rows, BATCH), _old_embed(encoder, table, rows, BATCH))
    assert torch.equal(embed_from_chunks(encoder, table), _old_embed(encoder, table, np.arange(len(table)), 256))


@pytest.fixture(scope="module")
def frozen(tiny_model_dir) -> FrozenTokenEncoder:
    return FrozenTokenEncoder(tiny_model_dir, torch.device("cpu"))


def _sequences(frozen: FrozenTokenEncoder, n: int, seed: int) -> list[list[int]]:
    """``n`` token-id sequences of 2 to 64 tokens ([CLS] ... [SEP])."""
    rng = random.Random(seed)
    tok = frozen.tokenizer
    return [
        [tok.cls_token_id, *(rng.randrange(5, len(tok)) for _ in range(rng.randint(0, 62))), tok.sep_token_id]
        for _ in range(n)
    ]


def _old_encode_ids(frozen: FrozenTokenEncoder, sequences: list[list[int]], batch_size: int) -> list[torch.Tensor]:
    """encode_ids before ``stable``: shortest first, padded to the batch's longest."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    out: list = [None] * len(sequences)
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            length = max(len(sequences[i]) for i in rows)
            ids = torch.full((len(rows), length), frozen.tokenizer.pad_token_id, dtype=torch.long)  # (b, L)
            mask = torch.zeros(len(rows), length, dtype=torch.long)  # (b, L)
            for j, i in enumerate(rows):
                ids[j, : len(sequences[i])] = torch.tensor(sequences[i])
                mask[j, : len(sequences[i])] = 1
            states = frozen.model(input_ids=ids, attention_mask=mask).last_hidden_state.float().half()
            for j, i in enumerate(rows):
                out[i] = states[j, : len(sequences[i])]
    return out


def test_frozen_token_states_stable_do_not_depend_on_the_other_texts(frozen):
    sequences = _sequences(frozen, 40, seed=4)
    assert frozen.max_positions == 64
    reference = dict(zip(BASE, frozen.encode_ids([sequences[i] for i in BASE], BATCH, stable=True)))
    for case, ids in CASES.items():
        store = frozen.encode_store(ids, [sequences[i] for i in ids], BATCH, stable=True)
        for i in set(ids) & set(BASE):
            assert store.get(i).dtype == torch.float16 and store.get(i).shape == (len(sequences[i]), frozen.dim)
            assert torch.equal(store.get(i), reference[i]), (case, i)
    old = _old_encode_ids(frozen, [sequences[i] for i in BASE], BATCH)
    for i, states in zip(BASE, old):
        torch.testing.assert_close(reference[i].float(), states.float(), atol=2e-3, rtol=2e-3)


def test_frozen_token_states_default_are_unchanged(frozen):
    sequences = _sequences(frozen, 40, seed=4)
    ids = CASES["superset"]
    new = frozen.encode_store(ids, [sequences[i] for i in ids], BATCH)
    old = _old_encode_ids(frozen, [sequences[i] for i in ids], BATCH)
    assert all(torch.equal(new.get(i), states) for i, states in zip(ids, old))


def test_the_cli_page_gives_the_committed_figures():
    """docs/cli.md's "Keeping an index current" reads its figures from benchmarks/stable_batches.json."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    bench = json.loads((root / "benchmarks" / "stable_batches.json").read_text(encoding="utf-8"))
    page = (root / "docs" / "cli.md").read_text(encoding="utf-8")
    section = " ".join(page.split("### Keeping an index current")[1].split("\n## ")[0].split())
    default, stable = bench["variants"]["default"], bench["variants"]["stable_32"]
    pad = bench["padding_by_corpus"]
    for figure in (
        f"{default['identical'][0]} kept the same bits",
        f"{stable['identical'][0]} of {stable['identical'][1]} in stable ones",
        f"{stable['articles_per_s']} articles/s against {default['articles_per_s']}, {stable['ratio']}×",
        f"{pad['2760']['stable_32']} against {pad['2760']['default']} for the whole sample",
        f"{pad['20']['stable_32']} against {pad['20']['default']} for 20",
    ):
        assert figure in section, figure

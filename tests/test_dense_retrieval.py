"""Dense retrieval: exact cosine top-k against a brute-force numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lexgraph.core.errors import LexgraphError
from lexgraph.encoding.embed import save_embeddings
from lexgraph.methods.dense import DenseRetriever
from lexgraph.systems.registry import load_retriever


class FixedEncoder:
    """A stand-in query encoder: question ``"q<i>"`` -> row ``i`` of a fixed matrix."""

    def __init__(self, vectors: np.ndarray) -> None:
        self.vectors = torch.tensor(vectors, dtype=torch.float32)

    def encode(self, texts, batch_size=64, show_progress=False):
        return self.vectors[[int(t[1:]) for t in texts]]


def brute_force(queries: np.ndarray, articles: np.ndarray, ids: np.ndarray, k: int):
    """Reference: cosine scores, ranked by (-score, id) with a full lexsort per query."""
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    a = articles / np.linalg.norm(articles, axis=1, keepdims=True)
    # per-pair sums, not a matrix product: BLAS may round the same dot product differently
    # at different positions in the matrix, which would break the exact ties tested here
    scores = (q[:, None, :] * a[None, :, :]).sum(axis=-1, dtype=np.float32)  # (nq, na)
    out_ids, out_scores = [], []
    for row in scores:
        order = np.lexsort((ids, -row))[:k]
        out_ids.append(ids[order])
        out_scores.append(row[order])
    return np.array(out_ids), np.array(out_scores)


def test_top_k_equals_brute_force_with_ties():
    rng = np.random.default_rng(0)
    articles = rng.normal(size=(300, 24)).astype(np.float32)
    articles[50:60] = articles[7]  # exact ties with article row 7
    articles[100] = 4.0 * articles[7]  # same direction (power-of-two scale: bit-identical cosine)
    ids = rng.permutation(np.arange(1000, 1300)).astype(np.int64)  # ids not in row order
    queries = rng.normal(size=(40, 24)).astype(np.float32)
    queries[0] = articles[7]  # a query whose best hits are all tied
    retriever = DenseRetriever(FixedEncoder(queries), ids, torch.tensor(articles), name="test")
    for k in (1, 15, 200, 500):
        got_ids, got_scores = retriever.search([f"q{i}" for i in range(len(queries))], k)
        want_ids, want_scores = brute_force(queries, articles, ids, min(k, 300))
        assert got_ids.dtype == np.int64 and got_scores.dtype == np.float32
        assert got_ids.shape == (40, min(k, 300))
        np.testing.assert_array_equal(got_ids, want_ids)
        np.testing.assert_allclose(got_scores, want_scores, atol=1e-5)
    tied = sorted(ids[[7, *range(50, 60), 100]].tolist())
    assert retriever.search(["q0"], 12)[0][0].tolist() == tied  # ties broken by lower id


def test_empty_query_list():
    retriever = DenseRetriever(FixedEncoder(np.ones((1, 4))), [3, 1], torch.ones(2, 4))
    ids, scores = retriever.search([], 5)
    assert ids.shape == (0, 2) and scores.shape == (0, 2)


def test_rejects_mismatched_embeddings():
    with pytest.raises(LexgraphError):
        DenseRetriever(FixedEncoder(np.ones((1, 4))), [1, 2, 3], torch.ones(2, 4))
    with pytest.raises(LexgraphError):
        DenseRetriever(FixedEncoder(np.ones((1, 4))), [1, 1], torch.ones(2, 4))


def test_load_dsr_needs_the_embed_stage(tmp_path):
    with pytest.raises(LexgraphError, match="dvc repro embed"):
        load_retriever("dsr", tmp_path, "cpu")
    (tmp_path / "models/dsr/query_encoder").mkdir(parents=True)
    with pytest.raises(LexgraphError, match="articles.safetensors.*dvc repro embed"):
        load_retriever("dsr", tmp_path, "cpu")


def test_missing_inputs_of_the_dense_loaders_are_named_in_order(tmp_path):
    """``load_dsr`` is ``load_dense`` with DSR's wording and its query encoder checked first;
    the other systems (``load_dense``) check their article embeddings first."""
    from lexgraph.methods.dense import load_dense

    query_dir, emb_path = tmp_path / "models/dsr/query_encoder", tmp_path / "data/embed/articles.safetensors"
    with pytest.raises(LexgraphError) as dsr:
        load_retriever("dsr", tmp_path, "cpu")
    assert str(dsr.value) == f"{query_dir}: the trained DSR query encoder not found; run `dvc repro embed` first"
    with pytest.raises(LexgraphError) as dense:
        load_dense("hprior", query_dir, emb_path, "hprior", "cpu")
    assert str(dense.value) == f"{emb_path}: the hprior article embeddings not found; run `dvc repro hprior` first"
    query_dir.mkdir(parents=True)
    with pytest.raises(LexgraphError) as dsr:
        load_retriever("dsr", tmp_path, "cpu")
    assert str(dsr.value) == f"{emb_path}: the DSR article embeddings not found; run `dvc repro embed` first"
    query_dir.rmdir()
    emb_path.parent.mkdir(parents=True)
    emb_path.write_bytes(b"")
    with pytest.raises(LexgraphError) as dense:
        load_dense("gdsr", query_dir, emb_path, "train_gnn_gdsr", "cpu")
    assert str(dense.value) == f"{query_dir}: the gdsr query encoder not found; run `dvc repro train_gnn_gdsr` first"


def test_embeddings_file_round_trip(tmp_path):
    from lexgraph.encoding.embed import load_embeddings

    emb = torch.randn(5, 3)
    save_embeddings(tmp_path / "x.safetensors", [9, 8, 7, 6, 5], emb)
    ids, loaded = load_embeddings(tmp_path / "x.safetensors")
    assert ids.tolist() == [9, 8, 7, 6, 5] and ids.dtype == np.int64
    assert torch.equal(loaded, emb)


@pytest.fixture
def query_encoder_dir(tmp_path, tiny_model_dir):
    """A saved query encoder on the tiny BERT (as models/dsr/query_encoder)."""
    from lexgraph.models.encoders import QueryEncoder

    directory = tmp_path / "query_encoder"
    QueryEncoder.from_pretrained(tiny_model_dir, token_pooling="mean").save_pretrained(directory)
    return directory


def test_shared_query_encoders_load_once_and_encode_each_question_list_once(query_encoder_dir, monkeypatch):
    """dsr, hprior and gdsr read one query encoder: within shared_query_encoders it is
    loaded once and a list of questions is encoded once, with the numbers (ids and score
    bits) that separate encoders give; outside the block nothing is shared."""
    from lexgraph.methods.dense import load_query_encoder, shared_query_encoders
    from lexgraph.models.encoders import QueryEncoder

    ids, emb = np.arange(10, 16), torch.randn(6, 16, generator=torch.Generator().manual_seed(0))
    questions = ["le bail", "la loi du contrat de mariage", "divorce", "enfant"]
    alone = [DenseRetriever(load_query_encoder(query_encoder_dir), ids, e).search(questions, 4) for e in (emb, emb * 2)]
    assert load_query_encoder(query_encoder_dir) is not load_query_encoder(query_encoder_dir)

    calls = []
    encode = QueryEncoder.encode
    monkeypatch.setattr(
        QueryEncoder, "encode", lambda self, texts, **kw: calls.append(list(texts)) or encode(self, texts, **kw)
    )
    with shared_query_encoders():
        first = load_query_encoder(query_encoder_dir)
        with shared_query_encoders():  # nested: the same sharing
            assert load_query_encoder(str(query_encoder_dir) + "/") is first
        a, b = (
            DenseRetriever(first, ids, emb, name="a"),
            DenseRetriever(load_query_encoder(query_encoder_dir), ids, emb * 2),
        )
        shared = [a.search(questions, 4), b.search(questions, 4)]
        a.encode(questions).zero_()  # callers get a copy
        again = a.search(questions, 4)
        a.search(questions[:2], 4)
    assert calls == [questions, questions[:2]]
    for (got_ids, got_scores), (want_ids, want_scores) in zip([*shared, again], [*alone, alone[0]]):
        np.testing.assert_array_equal(got_ids, want_ids)
        assert got_scores.tobytes() == want_scores.tobytes()
    calls.clear()
    a.search(questions, 4)  # after the block: encoded again
    assert calls == [questions] and load_query_encoder(query_encoder_dir) is not first


def test_only_shared_encoders_are_memoised(query_encoder_dir):
    """An encoder not loaded through load_query_encoder in the block (a stand-in, zeroshot's
    base model) encodes every time."""
    from lexgraph.methods.dense import shared_query_encoders

    class Counting(FixedEncoder):
        calls = 0

        def encode(self, texts, batch_size=64, show_progress=False):
            Counting.calls += 1
            return super().encode(texts, batch_size, show_progress)

    retriever = DenseRetriever(Counting(np.eye(3, 4)), [1, 2, 3], torch.eye(3, 4))
    with shared_query_encoders():
        first = retriever.search(["q0", "q2"], 2)
        second = retriever.search(["q0", "q2"], 2)
    assert Counting.calls == 2 and np.array_equal(first[0], second[0])

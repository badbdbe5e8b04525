"""Dense statute retriever: hierarchical encoder, InfoNCE loss, training, persistence.

Every model here is a tiny randomly initialised BERT built locally (no hub access).
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import torch

from conftest import TINY_WORDS as WORDS  # noqa: E402
from helpers_config import sample_section
from helpers_dsr import CORPUS, _config, _fresh_dsr
from lexgraph.core.errors import ConfigError
from lexgraph.encoding.embed import embed_all, load_embeddings
from lexgraph.losses import InfoNCELoss
from lexgraph.models.article_encoder import HierarchicalArticleEncoder
from lexgraph.models.dsr import DSR
from lexgraph.models.encoders import QueryEncoder
from lexgraph.models.packing import chunk_token_ids, collate_chunks
from lexgraph.training.dsr import train_dsr
from lexgraph.training.dsr_config import DSRConfig
from lexgraph.training.dsr_data import TrainingData, build_pairs


def _article_encoder(path, **kw) -> HierarchicalArticleEncoder:
    settings = dict(max_chunk_length=16, max_document_length=64, pooling="max", num_layers=2, num_heads=2)
    settings.update(kw)
    torch.manual_seed(1)
    return HierarchicalArticleEncoder.from_pretrained(path, **settings)


ARTICLES = [
    "le contrat de bail " * 12,  # long: several chunks
    "article du mariage",
    "la loi du divorce et de l'enfant " * 3,
]


# ---------------------------------------------------------------------------
# Hierarchical article encoder
# ---------------------------------------------------------------------------


def test_hierarchical_encoder_shapes(tiny_model_dir):
    enc = _article_encoder(tiny_model_dir)
    batch = enc.tokenize(ARTICLES)
    assert batch["input_ids"].shape == batch["attention_mask"].shape
    assert batch["input_ids"].shape[0] == 3 and batch["input_ids"].shape[1] == 4  # first article fills 4 chunks
    assert batch["input_ids"].shape[2] <= 16
    out = enc(**batch)
    assert out.shape == (3, 16)
    assert enc.encode(ARTICLES, batch_size=2, show_progress=False).shape == (3, 16)


@pytest.mark.parametrize("pooling,token_pooling", [("max", "cls"), ("mean", "cls"), ("max", "mean")])
def test_empty_chunks_do_not_change_the_embedding(tiny_model_dir, pooling, token_pooling):
    enc = _article_encoder(tiny_model_dir, pooling=pooling, token_pooling=token_pooling).eval()
    for text, n_real in [("article du mariage", 1), ("la loi du divorce " * 5, 2)]:
        chunks = enc.chunk([text])
        assert len(chunks[0]) == n_real
        plain = collate_chunks(chunks, pad_id=0)
        extra = 4 - n_real  # empty chunks: padding ids, all-zero attention mask
        padded = {k: torch.cat([v, torch.zeros(1, extra, v.size(2), dtype=v.dtype)], dim=1) for k, v in plain.items()}
        assert padded["input_ids"].shape[1] == 4
        with torch.no_grad():
            a, b = enc(**plain), enc(**padded)
        assert a.shape == (1, 16)
        assert torch.allclose(a, b, atol=1e-6)


def test_chunking_truncates_long_articles(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = " ".join(WORDS[i % len(WORDS)] for i in range(300))  # 300 whole-word tokens
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 300
    chunks = chunk_token_ids(tok, [text, "loi du bail"], max_chunk_length=16, max_document_length=64)
    long, short = chunks
    assert len(long) == 64 // 16  # exactly max_document_length // max_chunk_length chunks
    assert all(len(c) == 16 for c in long)
    for c in long + short:
        assert c[0] == tok.cls_token_id and c[-1] == tok.sep_token_id
        assert tok.cls_token_id not in c[1:-1] and tok.sep_token_id not in c[1:-1]
    body = [t for c in long for t in c[1:-1]]
    assert body == ids[: 4 * 14]  # truncated: the first 56 content tokens, in order
    assert short == [[tok.cls_token_id, *tok("loi du bail", add_special_tokens=False)["input_ids"], tok.sep_token_id]]
    # paper sizes: 128-token chunks, 1024 tokens -> 8 chunks of 126 content tokens
    text = " ".join(WORDS[i % len(WORDS)] for i in range(2000))
    (paper,) = chunk_token_ids(tok, [text], max_chunk_length=128, max_document_length=1024)
    assert len(paper) == 8 and all(len(c) == 128 for c in paper)
    assert sum(len(c) for c in paper) == 1024
    # 20 tokens with 14 per chunk -> 2 chunks (14 + 6)
    (two,) = chunk_token_ids(tok, [" ".join(["loi"] * 20)], 16, 64)
    assert [len(c) for c in two] == [16, 8]


def test_bad_chunk_heads_is_a_config_error(tiny_model_dir):
    with pytest.raises(ConfigError):
        _article_encoder(tiny_model_dir, num_heads=3)


# ---------------------------------------------------------------------------
# InfoNCE
# ---------------------------------------------------------------------------


def _cos(u, v):
    return sum(a * b for a, b in zip(u, v)) / (math.sqrt(sum(a * a for a in u)) * math.sqrt(sum(b * b for b in v)))


def _nll(logits, target):
    return -(logits[target] - math.log(sum(math.exp(x) for x in logits)))


def test_infonce_matches_hand_computation():
    tau = 0.5
    q = [[1.0, 0.0], [0.6, 0.8]]
    p = [[0.8, 0.6], [0.0, 1.0]]
    n = [[1.0, 1.0]]
    columns = p + n  # 2 positives (diagonal) + 1 hard negative = 3 articles
    expected = 0.0
    for i in range(2):
        logits = [_cos(q[i], a) / tau for a in columns]
        expected += _nll(logits, i) / 2
    loss = InfoNCELoss(temperature=tau)(torch.tensor(q), torch.tensor(p), torch.tensor(n))
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_infonce_masks_shared_positives():
    tau = 0.1
    q = [[1.0, 0.2], [0.3, 1.0]]
    p = [[1.0, 0.5], [1.0, 0.5]]  # both questions cite article 7
    n = [[-1.0, 0.4]]
    mask = InfoNCELoss.shared_positive_mask([{7}, {7, 3}], [7, 7, 9])
    assert mask.tolist() == [[False, True, False], [True, False, False]]
    expected = 0.0
    for i in range(2):
        kept = [p[i], n[0]]  # the other copy of article 7 is dropped from the denominator
        expected += _nll([_cos(q[i], a) / tau for a in kept], 0) / 2
    loss_fn = InfoNCELoss(temperature=tau)
    masked = loss_fn(torch.tensor(q), torch.tensor(p), torch.tensor(n), other_positives=mask)
    unmasked = loss_fn(torch.tensor(q), torch.tensor(p), torch.tensor(n))
    assert masked.item() == pytest.approx(expected, abs=1e-5)
    assert unmasked.item() > masked.item() + 0.1
    # a hard negative that is gold for another query is masked too
    assert InfoNCELoss.shared_positive_mask([{1}, {2, 5}], [1, 2, 5, 1]).tolist() == [
        [False, False, False, True],
        [False, False, True, False],
    ]


# ---------------------------------------------------------------------------
# Training and persistence
# ---------------------------------------------------------------------------


def _data() -> TrainingData:
    questions = pl.DataFrame(
        {
            "id": [1, 2, 3, 4],
            "question": ["bail contrat ?", "mariage enfant ?", "divorce loi ?", "contrat loi ?"],
            "article_ids": [[1, 4], [2], [3, 5], [4]],
            "split": ["train"] * 4,
        }
    )
    negatives = pl.DataFrame(
        {
            "question_id": [1, 2, 3],
            "split": ["train"] * 3,
            "negative_ids": [[2, 3], [6, 1, 2], [1]],
        }
    )
    pairs = build_pairs(questions, negatives, set(CORPUS))
    assert len(pairs) == 6 and pairs[0].negatives == (2, 3) and pairs[2].negatives == (6, 1)  # gold dropped
    synthetic = pl.DataFrame(
        {
            "id": [100, 101, 102],
            "question": ["le contrat", "la loi du divorce", "les articles"],
            "article_ids": [[1], [3], [6]],
            "split": ["synthetic"] * 3,
        }
    )
    synthetic_pairs = build_pairs(synthetic, negatives, set(CORPUS))
    assert [p.negatives for p in synthetic_pairs] == [(), (), ()]  # no negatives: random non-gold ones
    return TrainingData(
        pairs=pairs,
        article_ids=list(CORPUS),
        article_texts=list(CORPUS.values()),
        synthetic_pairs=synthetic_pairs,
        dev_questions=["bail ?", "enfant ?"],
        dev_qrels={10: {1}, 11: {2, 5}},
        dev_ids=[10, 11],
    )


def test_training_is_deterministic_on_cpu(tiny_model_dir):
    config = _config(synthetic_per_epoch=2)
    texts = list(CORPUS.values())
    runs = []
    for _ in range(2):
        torch.manual_seed(123)
        model = _fresh_dsr(tiny_model_dir, config)
        before = model.encode_articles(texts, show_progress=False)
        result = train_dsr(model, _data(), config, torch.device("cpu"), seed=7)
        assert [h["epoch"] for h in result.history] == [0, 1, 2]  # epoch 0: the untrained model
        assert result.best_epoch in (0, 1, 2) and 0.0 <= result.dev_metrics["recall@200"] <= 1.0
        assert result.n_pairs == 6 + 2
        runs.append(
            (
                model.encode_articles(texts, show_progress=False),
                model.encode_queries(["bail ?"]),
                before,
                result.best_epoch,
            )
        )
    (a1, q1, b1, best1), (a2, q2, _, best2) = runs
    assert torch.equal(a1, a2) and torch.equal(q1, q2) and best1 == best2
    # the selected model is the untrained one exactly when epoch 0 won
    assert torch.equal(a1, b1) == (best1 == 0)


def test_save_load_round_trip(tiny_model_dir, tmp_path):
    config = _config(pooling="mean", token_pooling="mean")
    model = _fresh_dsr(tiny_model_dir, config).eval()
    model.save(tmp_path / "dsr")
    assert {p.name for p in (tmp_path / "dsr").iterdir()} == {"query_encoder", "article_encoder", "dsr.json"}
    assert (tmp_path / "dsr/article_encoder/hierarchical.safetensors").is_file()
    loaded = DSR.load(tmp_path / "dsr")
    texts = list(CORPUS.values())
    assert loaded.temperature == config.temperature and loaded.article_encoder.pooling == "mean"
    assert loaded.query_encoder.token_pooling == "mean" and loaded.article_encoder.token_pooling == "mean"
    assert torch.equal(
        model.encode_articles(texts, show_progress=False), loaded.encode_articles(texts, show_progress=False)
    )
    assert torch.equal(
        model.encode_queries(["bail ?", "loi"], show_progress=False),
        loaded.encode_queries(["bail ?", "loi"], show_progress=False),
    )
    sim = loaded.similarity(torch.randn(2, 16), torch.randn(3, 16))
    assert sim.shape == (2, 3)


def test_embed_writes_raw_float32_embeddings(tiny_model_dir, tmp_path):
    model = _fresh_dsr(tiny_model_dir, _config()).eval()
    articles = pl.DataFrame({"id": list(CORPUS), "article": list(CORPUS.values())})
    headings = pl.DataFrame({"heading_id": [0, 1], "text": ["Code civil", "Titre du mariage"]})
    questions = pl.DataFrame({"id": [5, 9, 2], "question": ["bail ?", "loi ?", "enfant ?"]})
    counts = embed_all(model, articles, headings, questions, tmp_path, batch_size=2)
    assert counts == {"articles": 6, "headings": 2, "questions": 3}
    ids, emb = load_embeddings(tmp_path / "articles.safetensors")
    assert ids.dtype == np.int64 and ids.tolist() == list(CORPUS) and emb.shape == (6, 16)
    assert torch.equal(emb, model.encode_articles(list(CORPUS.values()), batch_size=2, show_progress=False))
    ids, emb = load_embeddings(tmp_path / "questions.safetensors")
    assert ids.tolist() == [5, 9, 2] and emb.dtype == torch.float32
    assert torch.equal(emb, model.encode_queries(["bail ?", "loi ?", "enfant ?"], batch_size=2, show_progress=False))


def test_config_validation():
    params = sample_section("dsr")
    assert DSRConfig.from_params({**params, "lr": "1e-4"}).lr == pytest.approx(1e-4)
    with pytest.raises(ConfigError, match="dsr.pooling"):
        DSRConfig.from_params({**params, "pooling": "sum"})
    with pytest.raises(ConfigError, match="unknown keys"):
        DSRConfig.from_params({**params, "epoch": 3})
    with pytest.raises(ConfigError, match="max_document_length"):
        DSRConfig.from_params({**params, "max_document_length": 64})


@pytest.mark.parametrize("token_pooling", ["cls", "mean"])
def test_query_encoder_loads_in_sentence_transformers(tiny_model_dir, tmp_path, token_pooling):
    """The saved query encoder is a sentence-transformers model giving the same vectors."""
    from sentence_transformers import SentenceTransformer

    enc = QueryEncoder.from_pretrained(tiny_model_dir, max_length=32, token_pooling=token_pooling)
    enc.save_pretrained(tmp_path / "q")
    texts = ["le mur mitoyen", "qui paie la réparation du mur entre deux jardins"]
    ours = enc.encode(texts, show_progress=False).numpy()
    st = SentenceTransformer(str(tmp_path / "q"), device="cpu")
    theirs = st.encode(texts, convert_to_numpy=True)
    assert st.max_seq_length == 32
    np.testing.assert_allclose(theirs, ours, atol=1e-5)

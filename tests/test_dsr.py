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
from lexgraph.methods.dsr.config import DSRConfig
from lexgraph.methods.dsr.data import TrainingData, build_pairs
from lexgraph.methods.dsr.train import train_dsr
from lexgraph.models.article_encoder import HierarchicalArticleEncoder
from lexgraph.models.dsr import DSR
from lexgraph.models.encoders import QueryEncoder
from lexgraph.models.packing import chunk_token_ids, collate_chunks


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


def fairseq_sinusoid(position: int, dim: int) -> list[float]:
    """Row ``position`` of fairseq's sinusoidal table, written from the formula (gdsr
    ``src/models/bert.py``, ``HierBERT.sinusoidal_init``): ``h = dim // 2`` frequencies
    ``10000 ** (-j / (h - 1))``, the sines then the cosines, a zero last column if ``dim`` is odd."""
    half = dim // 2
    freqs = [math.exp(-j * math.log(10000) / (half - 1)) for j in range(half)]
    row = [math.sin(position * f) for f in freqs] + [math.cos(position * f) for f in freqs]
    return row + [0.0] * (dim % 2)


def test_chunk_positions_start_as_the_authors_sinusoidal_table_and_learn(tiny_model_dir):
    """G-DSR's code (HierBERT) starts its learnable chunk-position embeddings at fairseq's
    sinusoidal table, row 0 the padding row and real chunks 1, 2, …: lexgraph's chunk i (from 0)
    starts at row i + 1. identity_init (and no chunk layers) keeps zeros."""
    from lexgraph.models.article_encoder import sinusoidal_positions

    enc = _article_encoder(tiny_model_dir)  # width 16, 64 // 16 = 4 chunks
    weight = enc.chunk_positions.weight
    want = torch.tensor([fairseq_sinusoid(i + 1, 16) for i in range(4)])
    assert weight.shape == (4, 16) and weight.requires_grad
    assert torch.allclose(weight.detach(), want, atol=1e-6)
    assert weight[0, 0].item() == pytest.approx(math.sin(1.0)) and weight[0, 8].item() == pytest.approx(math.cos(1.0))
    # an odd width: the zero last column
    assert torch.allclose(sinusoidal_positions(3, 7), torch.tensor([fairseq_sinusoid(p, 7) for p in (1, 2, 3)]))
    for kw in ({"identity_init": True}, {"num_layers": 0}):
        assert not _article_encoder(tiny_model_dir, **kw).chunk_positions.weight.any(), kw
    # the start is the table, whatever the seed
    torch.manual_seed(7)
    other = HierarchicalArticleEncoder.from_pretrained(
        tiny_model_dir, max_chunk_length=16, max_document_length=64, pooling="max", num_layers=2, num_heads=2
    )
    assert torch.equal(other.chunk_positions.weight, weight)


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
    with pytest.raises(ConfigError) as info:
        DSRConfig.from_params({**params, "max_document_length": 64})
    assert str(info.value) == (
        f"params.yaml: 'dsr.max_document_length' = 64, expected an integer >= 'dsr.max_chunk_length' "
        f"({params['max_chunk_length']})"
    )


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


# ---------------------------------------------------------------------------
# dsr.similarity: cosine (G-DSR's DSR) or the dot product (QABISAR's first stage)
# ---------------------------------------------------------------------------


def _dot(u, v):
    return sum(a * b for a, b in zip(u, v))


def _stable_nll(logits, target):
    top = max(logits)
    return -(logits[target] - top - math.log(sum(math.exp(x - top) for x in logits)))


def test_a_dot_product_dsr_trains_on_the_infonce_of_dot_over_tau(tiny_model_dir):
    """QABISAR §2.1: L = -log exp(f(q,p)/tau) / sum_c exp(f(q,c)/tau) with f(q,p) = E_q(q) . E_p(p),
    the batch's other articles and its BM25 negatives as c. One training step of a ``similarity:
    dot`` DSR on a toy batch against that formula computed here from the encoders' vectors
    (raw dot products, a shared gold article left out of the other query's denominator)."""
    import copy

    from lexgraph.methods.dsr.data import sample_negatives
    from lexgraph.methods.dsr.train import DSRTask
    from lexgraph.training.engine import Runtime

    tau = 0.5
    losses = {}
    for similarity in ("dot", "cosine"):
        config = _config(similarity=similarity, temperature=tau)
        model = _fresh_dsr(tiny_model_dir, config).eval()  # eval: no dropout, the step's vectors are ours
        data = _data()
        task = DSRTask(model, data, config, Runtime(torch.device("cpu")), seed=5)
        batch = next(iter(task.batches(1)))
        negatives = sample_negatives(batch, data.article_ids, copy.deepcopy(task.rng))  # the step's own draw
        with torch.no_grad():
            losses[similarity] = task.step(batch).item()
        columns = [p.positive for p in batch] + negatives
        q = model.encode_queries([p.query for p in batch], show_progress=False).tolist()
        a = model.encode_articles([CORPUS[c] for c in columns], show_progress=False).tolist()
        score = _dot if similarity == "dot" else _cos
        expected = 0.0
        for i, pair in enumerate(batch):
            kept = [j for j, c in enumerate(columns) if j == i or c not in pair.gold]
            expected += _stable_nll([score(q[i], a[j]) / tau for j in kept], kept.index(i)) / len(batch)
        assert losses[similarity] == pytest.approx(expected, rel=1e-4, abs=1e-4), similarity
    assert abs(losses["dot"] - losses["cosine"]) > 1e-3  # the raw vectors are not unit-norm: two objectives


def test_evaluate_dsr_ranks_by_the_dsrs_own_score(tiny_model_dir, monkeypatch):
    """Dev selection ranks as the DSR scores: three articles whose cosine and dot-product orders
    differ; the gold one is first by the dot product (AP 1) and last by cosine (AP 1/3)."""
    from lexgraph.methods.dsr.train import evaluate_dsr

    articles = torch.tensor([[10.0, 10.0], [1.0, 0.1], [0.9, 0.05]])  # dot with q: 10, 1, 0.9
    assert [round(_cos([1.0, 0.0], a), 3) for a in articles.tolist()] == [0.707, 0.995, 0.998]
    data = TrainingData([], [1, 2, 3], ["a", "b", "c"], dev_questions=["q"], dev_qrels={7: {1}}, dev_ids=[7])
    aps = {}
    for similarity in ("dot", "cosine"):
        model = _fresh_dsr(tiny_model_dir, _config(similarity=similarity))
        monkeypatch.setattr(model, "encode_articles", lambda texts, **kw: articles[: len(texts)])
        monkeypatch.setattr(model, "encode_queries", lambda texts, **kw: torch.tensor([[1.0, 0.0]]))
        aps[similarity] = evaluate_dsr(model, data, batch_size=2)["map"]
    assert aps["dot"] == pytest.approx(1.0) and aps["cosine"] == pytest.approx(1 / 3)


def test_dsr_json_records_the_similarity_and_load_restores_it(tiny_model_dir, tmp_path):
    import json

    for similarity in ("cosine", "dot"):
        model = _fresh_dsr(tiny_model_dir, _config(similarity=similarity))
        model.save(tmp_path / similarity)
        saved = json.loads((tmp_path / similarity / "dsr.json").read_text(encoding="utf-8"))
        # key order as before the key existed (a cosine DSR's dsr.json is byte-identical to earlier runs')
        assert list(saved) == ["format_version", "temperature", "dim", "similarity", "normalized_embeddings"]
        assert saved["similarity"] == similarity
        assert DSR.load(tmp_path / similarity).similarity_name == similarity
        q, a = torch.tensor([[3.0, 4.0]]), torch.tensor([[3.0, 4.0]])
        assert DSR.load(tmp_path / similarity).similarity(q, a).item() == pytest.approx(
            (25.0 if similarity == "dot" else 1.0) / 0.05
        )


def test_qabisars_first_stage_is_the_dsr_recipe_with_its_own_keys():
    """dsr_qabisar lists only what QABISAR's first stage changes (§2.1's dot product, App. A's
    lack of augmentation); everything else is the dsr section's, in both profiles."""
    from helpers_config import ROOT
    from lexgraph.core.config import EXTENDS, load_params, read_params
    from lexgraph.methods.dsr.config import QabisarDSRConfig, QabisarDSRSettings

    assert EXTENDS == {"dsr_qabisar": "dsr"}
    for profile, enabled in (("params.yaml", False), ("profiles/paper.yaml", True)):
        params = read_params(ROOT / profile)
        assert set(params["dsr_qabisar"]) == {"enabled", "similarity", "synthetic"}
        assert params["dsr"]["similarity"] == "cosine"  # G-DSR §4.2
        _, sections = load_params("dsr_qabisar", ROOT / profile)
        assert sections == {"dsr": params["dsr"], "dsr_qabisar": params["dsr_qabisar"]}
        settings = QabisarDSRSettings.from_sections(sections)
        assert settings.enabled is enabled and settings.recipe.similarity == "dot" and not settings.recipe.synthetic
        gdsr = DSRConfig.from_params(params["dsr"])
        assert {k: v for k, v in settings.recipe.model_dump().items() if k not in ("similarity", "synthetic")} == {
            k: v for k, v in gdsr.model_dump().items() if k not in ("similarity", "synthetic")
        }
    own = read_params(ROOT / "params.yaml")["dsr_qabisar"]
    with pytest.raises(ConfigError, match=r"'dsr_qabisar\.similarity' = 'euclid', expected one of cosine, dot"):
        QabisarDSRConfig.from_params({**own, "similarity": "euclid"})
    with pytest.raises(ConfigError, match=r"'dsr\.lr' = 'fast'"):  # the recipe's keys are checked as dsr's
        QabisarDSRSettings.from_sections({"dsr": {**sample_section("dsr"), "lr": "fast"}, "dsr_qabisar": own})


def test_switched_off_first_stage_and_its_embed_write_placeholders_in_seconds(tmp_path):
    """dsr_qabisar.enabled: false (the sample): train_dsr_qabisar writes a placeholder model,
    {"enabled": false} metrics and the curve's header, and embed on it a placeholder too, without
    reading any input; DSR.load refuses the placeholder in one line."""
    import json
    import time

    from conftest import ROOT
    from helpers_dvc import run_stage_in_process

    start = time.monotonic()
    absent = tmp_path / "absent"
    inputs = ["articles", "questions", "synthetic", "negatives", "pretrained", "chunks"]
    argv = ["--params", str(ROOT / "params.yaml"), *(a for name in inputs for a in (f"--{name}", absent / name))]
    out = tmp_path / "models" / "dsr_qabisar"
    argv += ["--out", out, "--metrics", tmp_path / "m.json", "--plot", tmp_path / "c.csv"]
    assert run_stage_in_process(ROOT / "stages" / "train_dsr_qabisar.py", *argv) == 0
    assert sorted(p.name for p in out.iterdir()) == ["disabled.json", "provenance.json"]
    assert json.loads((out / "disabled.json").read_text()) == {"enabled": False}
    assert json.loads((tmp_path / "m.json").read_text()) == {"enabled": False}
    assert (tmp_path / "c.csv").read_text() == "epoch,loss,dev_recall@200\n"
    embed = tmp_path / "data" / "embed_qabisar"
    argv = ["--params", str(ROOT / "params.yaml"), "--dsr", out, "--out", embed]
    argv += [a for name in ("chunks", "articles", "headings", "questions", "synthetic") for a in (f"--{name}", absent)]
    assert run_stage_in_process(ROOT / "stages" / "embed.py", *argv) == 0
    assert json.loads((embed / "disabled.json").read_text()) == {"enabled": False}
    assert time.monotonic() - start < 30
    with pytest.raises(ConfigError, match=r"dsr_qabisar: a switched-off stage's placeholder .*train_dsr_qabisar"):
        DSR.load(out)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_switched_off_first_stage_still_refuses_a_device_the_machine_lacks(tmp_path, capsys):
    """``base.device: cuda`` without CUDA is refused in one line naming the key, also when
    ``train_dsr_qabisar`` would only write its placeholder (as every torch stage refuses it), and
    nothing is written."""
    import yaml

    from conftest import ROOT
    from helpers_dvc import run_stage_in_process
    from lexgraph.core.config import read_params

    params = read_params(ROOT / "params.yaml")
    params["base"]["device"] = "cuda"
    assert params["dsr_qabisar"]["enabled"] is False
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    absent = tmp_path / "absent"
    inputs = ["articles", "questions", "synthetic", "negatives", "pretrained", "chunks"]
    argv = ["--params", str(tmp_path / "params.yaml"), *(a for name in inputs for a in (f"--{name}", absent / name))]
    out = tmp_path / "models" / "dsr_qabisar"
    argv += ["--out", out, "--metrics", tmp_path / "m.json", "--plot", tmp_path / "c.csv"]
    assert run_stage_in_process(ROOT / "stages" / "train_dsr_qabisar.py", *argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("lexgraph train_dsr_qabisar: error: ")
    assert "'base.device' = 'cuda' but no CUDA device is available" in err[0]
    assert not out.exists() and not (tmp_path / "m.json").exists()

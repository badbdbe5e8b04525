"""MVCL as published (``rerank.mvcl``) next to lexgraph's re-ranker (``rerank.xrerank``):
each piece against an independent reference. MVCL's word-level alignment against
``h_a . h_b / sqrt(d)`` computed entry by entry, the ReLU attention pooling against a hand
computation, a fine-tuned PLM (a tiny random XLM-R made here) that gets gradients from the
training step, the re-ranked list alone without fusion, the fine-tuned PLM saved with the
network and loaded by the search side, and the ``rerank`` section's params rule (shared keys
+ one mapping per re-ranker, equal to what dvc.yaml tracks)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from lexgraph.core.config import ConfigError
from lexgraph.encoding.rerank_features import TokenStore
from lexgraph.models.rerank import AttentionPooling, InteractionModel, fuse_list, rerank_scores
from lexgraph.training.rerank_config import ENCODE_KEYS, VARIANTS, RerankConfig
from lexgraph.training.rerank_io import build_model

ROOT = Path(__file__).resolve().parents[1]


def _params(path: str = "params.yaml") -> dict:
    return yaml.safe_load((ROOT / path).read_text(encoding="utf-8"))


def _config(variant: str, shared: dict | None = None, own: dict | None = None, profile: str = "params.yaml"):
    section = copy.deepcopy(_params(profile)["rerank"])
    section.update(shared or {})
    section[variant].update(own or {})
    return RerankConfig.from_params(section, variant)


def _lstm_input(model, q, d):
    """The strengthened query tokens ``[h; h~; h - h~; h * h~]`` the BiLSTM receives."""
    from torch.nn.utils.rnn import pad_packed_sequence

    captured = []
    handle = model.lstm.register_forward_hook(lambda mod, inp, out: captured.append(inp[0]))
    ones_q = torch.ones(q.shape[:2], dtype=torch.bool)
    ones_d = torch.ones(d.shape[:2], dtype=torch.bool)
    model.match(q, ones_q, d, ones_d)
    handle.remove()
    return pad_packed_sequence(captured[0], batch_first=True)[0]  # (1, Lq, 4 * hidden)


# ---------------------------------------------------------------------------
# MVCL's alignment and pooling, by hand
# ---------------------------------------------------------------------------


def test_mvcl_alignment_is_h_a_dot_h_b_over_sqrt_d_of_the_plm_states():
    """e_ij = h_a_i . h_b_j / sqrt(d) with h the PLM's states (d = 3 here); the aligned vector of
    query token i is sum_j softmax_j(e_ij) (W h_b_j + b), all computed by hand."""
    torch.manual_seed(0)
    hidden, dim = 4, 3
    model = InteractionModel(input_dim=dim, hidden=hidden, dropout=0.0, alignment="scaled_dot").eval()
    q, d = torch.randn(1, 2, dim), torch.randn(1, 3, dim)
    mq = _lstm_input(model, q, d)
    W, b = model.proj.weight.detach().tolist(), model.proj.bias.detach().tolist()
    qa, da = q[0].tolist(), d[0].tolist()
    hd = [[sum(W[o][i] * x[i] for i in range(dim)) + b[o] for o in range(hidden)] for x in da]
    for i in range(2):
        e = [sum(x * y for x, y in zip(qa[i], da[j])) / math.sqrt(dim) for j in range(3)]
        w = [math.exp(x) / sum(math.exp(y) for y in e) for x in e]
        aligned = [sum(w[j] * hd[j][o] for j in range(3)) for o in range(hidden)]
        assert mq[0, i, hidden : 2 * hidden].tolist() == pytest.approx(aligned, abs=1e-5)
        unscaled = [math.exp(x * math.sqrt(dim)) / sum(math.exp(y * math.sqrt(dim)) for y in e) for x in e]
        assert max(abs(x - y) for x, y in zip(w, unscaled)) > 1e-3  # the 1 / sqrt(d) shows
    # the sample's and the paper profile's mvcl use it; xrerank keeps the cosine
    for profile in ("params.yaml", "profiles/paper.yaml"):
        assert build_model(dim, _config("mvcl", profile=profile)).alignment == "scaled_dot"
        assert build_model(dim, _config("xrerank", profile=profile)).alignment == "cosine"


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_attention_pooling_matches_a_hand_computation(activation):
    """v = sum_t alpha_t h_t, alpha = softmax_t(w . act(h_t)) over the unmasked tokens, h = W x + b."""
    proj = torch.nn.Linear(2, 2)
    with torch.no_grad():
        proj.weight.copy_(torch.tensor([[1.0, -1.0], [0.5, 2.0]]))
        proj.bias.copy_(torch.tensor([0.0, -1.0]))
    pool = AttentionPooling(proj, 2, activation)
    with torch.no_grad():
        pool.score.weight.copy_(torch.tensor([[2.0, 1.0]]))
    x = torch.tensor([[[1.0, 2.0], [2.0, 0.5], [-1.0, 1.0], [9.0, 9.0]]])  # the last token is padding
    mask = torch.tensor([[True, True, True, False]])
    act = (lambda v: max(v, 0.0)) if activation == "relu" else math.tanh
    h = [[r[0] - r[1], 0.5 * r[0] + 2 * r[1] - 1] for r in x[0, :3].tolist()]  # W x + b by hand
    s = [2 * act(a) + act(c) for a, c in h]
    alpha = [math.exp(v) / sum(math.exp(u) for u in s) for v in s]
    expected = [sum(a * t[o] for a, t in zip(alpha, h)) for o in range(2)]
    assert pool(x, mask)[0].tolist() == pytest.approx(expected, abs=1e-6)
    # the two activations differ on these tokens (h has negative entries)
    other = AttentionPooling(proj, 2, "tanh" if activation == "relu" else "relu")
    other.score.weight.data.copy_(pool.score.weight.data)
    assert not torch.allclose(other(x, mask), pool(x, mask))


def test_mvcl_pools_with_relu_and_xrerank_with_tanh():
    x, mask = torch.randn(2, 5, 6), torch.ones(2, 5, dtype=torch.bool)
    for variant, act in (("mvcl", torch.relu), ("xrerank", torch.tanh)):
        model = build_model(6, _config(variant))
        assert model.pool.activation is act
        assert model.pool(x, mask).shape == (2, model.hidden)


# ---------------------------------------------------------------------------
# The re-ranked list alone (fusion: false)
# ---------------------------------------------------------------------------


def test_without_fusion_the_list_is_the_networks_order_then_the_first_stages_tail():
    ids = np.array([10, 11, 12, 13, 14, 15, -1])
    first = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.0])
    net = np.array([0.2, 5.0, -1.0, 0.2])  # 10 and 13 tie: the first stage's order breaks it
    out, scores = fuse_list(ids, first, net, None, k=4)
    assert out.tolist() == [11, 10, 13, 12, 14, 15, -1]
    assert scores[:4].tolist() == pytest.approx([5.0, 0.2, 0.2, -1.0])  # the network's own scores
    assert scores[3] > scores[4] > scores[5]  # the tail stays below, in its order
    # whatever the first stage's scores say (fusion would move 10 up at any alpha < 1)
    assert fuse_list(ids, first * 100, net, None, k=4)[0].tolist() == out.tolist()


class _First:
    """A first stage with fixed lists (question i: articles i, i+1, ... of a ring of 12)."""

    name = "stub"

    def __init__(self, n=12):
        self.article_ids = np.arange(n)

    def search(self, questions, k):
        n = len(self.article_ids)
        ids = np.array([[(int(q.split()[-1]) + j) % n for j in range(min(k, n))] for q in questions])
        return ids, np.tile(np.linspace(1, 0, ids.shape[1]), (len(questions), 1))


def test_mvcl_search_without_fusion_orders_by_the_network(one_thread):
    from lexgraph.systems.rerank import MvclRetriever

    torch.manual_seed(0)
    model = InteractionModel(4, 4, 0.0).eval()
    articles = TokenStore.from_list(list(range(12)), [torch.randn(3, 4).half() for _ in range(12)], 4)
    states = [torch.randn(2, 4).half(), torch.randn(3, 4).half()]

    class Encoder:
        def encode_queries(self, texts, max_length, batch_size):
            return states[: len(texts)]

    settings = {
        "first_stage": "bm25",
        "k": 6,
        "alpha": None,
        "config": {"max_query_length": 8, "encode_batch_size": 4, "eval_batch_size": 4},
    }
    retriever = MvclRetriever("mvcl", _First(), model, Encoder(), articles, settings, torch.device("cpu"), "x")
    ids, _ = retriever.search(["q 0", "q 5"], 8)
    for i, start in enumerate((0, 5)):
        cands = [(start + j) % 12 for j in range(6)]
        net = rerank_scores(model, states[i], cands, articles, torch.device("cpu"))
        expected = [cands[j] for j in np.lexsort((np.arange(6), -net))]
        assert ids[i, :6].tolist() == expected
        assert ids[i, 6:].tolist() == [(start + 6) % 12, (start + 7) % 12]


# ---------------------------------------------------------------------------
# The fine-tuned PLM
# ---------------------------------------------------------------------------


def _tiny_xlmr(vocab=40):
    from transformers import XLMRobertaConfig, XLMRobertaModel

    torch.manual_seed(0)
    config = XLMRobertaConfig(
        vocab_size=vocab,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=40,
        pad_token_id=1,
    )
    return XLMRobertaModel(config, add_pooling_layer=False)


def _token_lists(n_articles=12, n_questions=16):
    """Token ids: article i holds its 'topic' tokens; question q shares its gold's."""
    g = np.random.default_rng(0)
    arts = [[0] + [4 + (i % 6) * 5 + int(t) for t in g.integers(0, 5, 8)] + [2] for i in range(n_articles)]
    qs = [[0] + [4 + (q % 6) * 5 + int(t) for t in g.integers(0, 5, 4)] + [2] for q in range(n_questions)]
    return arts, qs


def test_a_finetuned_plm_gets_gradients_from_the_training_step(one_thread):
    """plm: finetune: token ids go into the PLM inside the step, so the losses' gradients reach it
    (today's frozen path takes cached states and has no PLM to train)."""
    from lexgraph.training.rerank import Lists, train
    from lexgraph.training.rerank_plm import PLMTokens

    plm = _tiny_xlmr()
    before = {k: v.clone() for k, v in plm.state_dict().items()}
    arts, qs = _token_lists()
    articles = PLMTokens(range(12), arts, plm, pad_id=1)
    queries = PLMTokens(range(100, 116), qs, plm, pad_id=1)
    views = PLMTokens(range(12), [a[:5] + [3] * 4 + a[-1:] for a in arts], plm, pad_id=1)

    def lists(qids):
        ids = np.array([[(q - 100 + j) % 12 for j in range(6)] for q in qids])
        return Lists(
            list(qids), {q: [(q - 100) % 12] for q in qids}, ids, np.tile(np.linspace(1, 0, 6), (len(qids), 1))
        )

    config = _config("mvcl", {"k": 6, "hidden": 8, "batch_size": 8, "eval_batch_size": 8}, {"epochs": 1})
    assert config.plm == "finetune" and not config.fusion
    model, report = train(
        config,
        articles,
        queries,
        views,
        lists(range(100, 112)),
        lists(range(112, 116)),
        torch.device("cpu"),
        seed=13,
        plm=plm,
    )
    assert report["plm"] == "finetune" and report["steps"] == 2  # 12 pairs, batch 8
    assert report["plm_grad_norm_first_step"] > 0
    changed = [k for k, v in plm.state_dict().items() if not torch.equal(v, before[k])]
    assert "encoder.layer.0.attention.self.query.weight" in changed and "embeddings.word_embeddings.weight" in changed
    # no fusion: the kept lists are the re-ranker's alone
    assert report["alpha"] is None and "dev_by_alpha" not in report and report["dev"] == report["dev_mvcl_only"]


def test_the_finetuned_plm_is_saved_with_the_network_and_search_loads_it(tmp_path, tiny_model_dir, one_thread):
    """The rerank stage's path for mvcl (run_rerank): the PLM trains, models/mvcl/plm holds it,
    and the search side scores with it (its article states encoded by the saved PLM)."""
    import json

    import polars as pl

    from lexgraph.core.io import write_parquet
    from lexgraph.systems.rerank import load_mvcl
    from lexgraph.training.rerank import RerankPaths, run_rerank

    words = ["loi", "contrat", "bail", "mariage", "enfant", "divorce"]
    articles = pl.DataFrame(
        {"id": list(range(12)), "article": [f"la {words[i % 6]} {words[(i + 1) % 6]} de l'article." for i in range(12)]}
    )
    questions = pl.DataFrame(
        {
            "id": list(range(100, 116)),
            "question": [f"le {words[q % 6]} ?" for q in range(16)],
            "article_ids": [[q % 12] for q in range(16)],
            "split": ["train"] * 12 + ["dev"] * 4,
        }
    )
    (tmp_path / "data/clean").mkdir(parents=True)
    write_parquet(articles, tmp_path / "data/clean/articles.parquet")
    write_parquet(questions, tmp_path / "data/clean/questions.parquet")
    config = _config(
        "mvcl",
        {
            "k": 6,
            "hidden": 8,
            "batch_size": 8,
            "eval_batch_size": 8,
            "encode_batch_size": 8,
            "del_token": "[MASK]",
            "first_stage": "bm25",
        },
        {"epochs": 1, "enabled": True, "max_query_length": 16, "max_article_length": 24},
    )
    paths = RerankPaths(
        tmp_path / "data/clean/questions.parquet",
        tmp_path / "data/clean/articles.parquet",
        tmp_path / "data/rerank",
        Path(tiny_model_dir),
        tmp_path,
        tmp_path / "models/mvcl",
        tmp_path / "rerank_mvcl.json",
        tmp_path / "rerank_mvcl_curve.csv",
    )

    class First(_First):
        def search(self, texts, k):
            index = {t: i for i, t in enumerate(questions["question"].to_list())}
            return super().search([f"q {index[t] % 12}" for t in texts], k)

    run_rerank(paths, config, torch.device("cpu"), 13, First)
    report = json.loads(paths.metrics.read_text())
    assert report["plm_grad_norm_first_step"] > 0 and report["steps"] == 2
    curve = paths.plot.read_text().splitlines()  # the training curve: one row per epoch of the report's history
    assert curve[0] == "epoch,loss,dev_map" and len(curve) == 1 + len(report["history"])
    assert (paths.out / "plm" / "config.json").is_file() and (paths.out / "mvcl.json").is_file()
    retriever = load_mvcl(tmp_path, "cpu", load=lambda name, workspace, device, corpus=None: First())
    assert retriever.encoder.model.config.hidden_size == 16 and retriever.alpha is None
    ids, scores = retriever.search(["le bail ?", "le loi ?"], 8)
    assert ids.shape == (2, 8) and sorted(ids[0, :6].tolist()) == sorted(
        First().search(["le bail ?"], 6)[0][0].tolist()
    )


# ---------------------------------------------------------------------------
# The params rule: shared keys + one mapping per re-ranker; what DVC tracks
# ---------------------------------------------------------------------------


def test_dvc_tracks_each_shared_key_and_the_variants_own_mapping():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    rerank = stages["rerank"]
    assert rerank["foreach"] == ["mvcl", "xrerank"] and set(VARIANTS) == set(rerank["foreach"])
    assert rerank["do"]["params"] == ["base", *(f"rerank.{k}" for k in RerankConfig.shared_keys()), "rerank.${item}"]
    assert stages["encode_rerank"]["params"] == ["base", *(f"rerank.{k}" for k in ENCODE_KEYS)]
    for profile in ("params.yaml", "profiles/paper.yaml"):
        section = _params(profile)["rerank"]
        assert set(section) == {*RerankConfig.shared_keys(), *VARIANTS}, profile


def test_a_key_the_variant_would_not_read_is_refused_not_ignored():
    with pytest.raises(ConfigError, match=r"'rerank\.mvcl\.align_temperature' is read only with alignment: cosine"):
        _config("mvcl", own={"align_temperature": 0.05})
    with pytest.raises(ConfigError, match=r"'rerank\.xrerank\.plm_lr' is read only with plm: finetune"):
        _config("xrerank", own={"plm_lr": 1e-5})
    with pytest.raises(ConfigError, match=r"'rerank\.mvcl\.interpolation' is read only with fusion: true"):
        _config("mvcl", own={"interpolation": [0.5]})
    with pytest.raises(ConfigError, match=r"missing key 'rerank\.xrerank\.plm_lr'"):
        _config("xrerank", own={"plm": "finetune"})
    with pytest.raises(
        ConfigError, match=r"'rerank\.first_stage' = 'xrerank', expected a retrieval system other than a re-ranker"
    ):
        _config("mvcl", {"first_stage": "xrerank"})


def test_the_sample_keeps_xrerank_as_todays_recipe_and_mvcl_as_published():
    x = _config("xrerank")
    assert (
        x.enabled,
        x.plm,
        x.alignment,
        x.align_temperature,
        x.pooling,
        x.match_features,
        x.warm_start,
        x.fusion,
        x.lr,
        x.weight_decay,
        x.epochs,
        x.max_query_length,
        x.max_article_length,
    ) == (True, "frozen", "cosine", 0.05, "tanh", True, True, True, 3e-4, 0.01, 5, 64, 128)
    for profile, enabled in (("params.yaml", False), ("profiles/paper.yaml", True)):
        m = _config("mvcl", profile=profile)
        assert (
            m.enabled,
            m.plm,
            m.plm_lr,
            m.alignment,
            m.pooling,
            m.match_features,
            m.warm_start,
            m.fusion,
            m.lr,
            m.weight_decay,
            m.max_query_length,
            m.max_article_length,
            m.batch_size,
            m.warmup_ratio,
            m.lambda_case,
            m.lambda_ele,
        ) == (
            enabled,
            "finetune",
            2e-5,
            "scaled_dot",
            "relu",
            False,
            False,
            False,
            2e-5,
            0.0,
            512,
            512,
            16,
            0.1,
            0.01,
            0.01,
        ), profile
    assert not _config("xrerank", profile="profiles/paper.yaml").enabled

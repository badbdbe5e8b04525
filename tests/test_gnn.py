"""Graph encoders, distillation, subgraph sampling and GNN training (lexgraph.models.gnn,
lexgraph.losses, lexgraph.training.gnn, lexgraph.retrieval.gnn)."""

from __future__ import annotations

import json
import math
from collections import deque

import numpy as np
import polars as pl
import pytest
import torch

from lexgraph.errors import ConfigError
from lexgraph.graph import EdgeType, GraphConfig, build_graph
from lexgraph.losses import DistillationLoss, InfoNCELoss, QabisarLoss
from lexgraph.models.gnn import MODELS, GraphEncoder, GraphEncoderConfig
from lexgraph.training import gnn as training
from lexgraph.training.gnn import GNNSettings, batch_subgraph, prepare_training_set, train_graph_encoder

from test_graph import ARTICLES, HEADINGS, QUESTIONS

DIM = 8
TRAIN, DEV, TEST_AND_SYNTHETIC = {1, 2, 6}, {3}, {4, 5}


def graph(**config):
    return build_graph(ARTICLES, HEADINGS, QUESTIONS, GraphConfig(**config))[0]


def feature(kind: str, ident: int) -> torch.Tensor:
    """A distinct, recognisable vector per (kind, id)."""
    g = torch.Generator().manual_seed({"a": 1000, "h": 2000, "q": 3000}[kind] + ident)
    return torch.randn(DIM, generator=g)


def embeddings():
    art = ARTICLES["id"].to_numpy()
    head = HEADINGS["heading_id"].to_numpy()
    ques = QUESTIONS["id"].to_numpy()  # every split, as the embed stage writes them
    return {
        "articles": (art, torch.stack([feature("a", int(i)) for i in art])),
        "headings": (head, torch.stack([feature("h", int(i)) for i in head])),
        "questions": (ques, torch.stack([feature("q", int(i)) for i in ques])),
    }


NEGATIVES = pl.DataFrame(
    {"question_id": [1, 2, 6, 4], "split": ["train", "train", "train", "test"],
     "negative_ids": [[20, 21], [10, 11, 12], [30], [10]]},
    schema={"question_id": pl.Int64, "split": pl.Utf8, "negative_ids": pl.List(pl.Int64)},
)

BASE_PARAMS = {
    "model": "gatv2", "layers": 1, "hidden": None, "heads": 2, "dropout": 0.0, "residual": True, "edge_dim": None,
    "qabisar": {"edge_dim": 4}, "hard_negatives": 1, "batch_size": 3, "lr": 1e-2, "weight_decay": 0.1,
    "max_grad_norm": 1.0, "epochs_lge": 2, "epochs_qabisar": 2, "temperature": 0.05, "encoder_lr": 1e-3,
    "kd": {"weight": 0.3, "mode": "score"}, "bipartite": True, "structure": True,
}


def settings(variant: str, **overrides) -> GNNSettings:
    return GNNSettings.from_params({**BASE_PARAMS, **overrides}, variant)


# ---------------------------------------------------------------------------
# GraphEncoder
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("edge_dim", [None, 4])
@pytest.mark.parametrize("hidden", [None, 12])
def test_forward_shapes(model, edge_dim, hidden):
    data = graph(consecutive=True)
    x = torch.randn(data.num_nodes, DIM)  # (nodes, dim)
    config = dict(in_dim=DIM, model=model, layers=2, hidden=hidden, heads=2, edge_dim=edge_dim)
    if edge_dim is not None and model not in ("gatv2", "gat"):
        with pytest.raises(ConfigError, match="edge_dim"):
            GraphEncoderConfig(**config)
        return
    encoder = GraphEncoder(GraphEncoderConfig(**config))
    out = encoder(x, data.edge_index, data.edge_type)
    assert out.shape == (data.num_nodes, DIM)
    assert len(encoder.convs) == 2
    assert (encoder.edge_embedding is not None) == (edge_dim is not None)
    if edge_dim is not None:
        assert encoder.edge_embedding.weight.shape == (len(EdgeType), edge_dim)


def test_bad_encoder_configs():
    with pytest.raises(ConfigError, match="divisible"):
        GraphEncoderConfig(in_dim=DIM, model="gatv2", heads=3)
    with pytest.raises(ConfigError, match="gnn.model"):
        GraphEncoderConfig(in_dim=DIM, model="gin")
    with pytest.raises(ConfigError, match="gnn.layers"):
        GraphEncoderConfig(in_dim=DIM, layers=0)
    GraphEncoderConfig(in_dim=DIM, model="gcn", heads=3)  # heads are ignored by non-attention models


@pytest.mark.parametrize("model", MODELS)
def test_identity_init_starts_as_identity_and_learns(model):
    data = graph(consecutive=True)
    edge_dim = 4 if model in ("gatv2", "gat") else None
    encoder = GraphEncoder(GraphEncoderConfig(in_dim=DIM, model=model, layers=2, heads=2, edge_dim=edge_dim,
                                              identity_init=True))
    x = torch.randn(data.num_nodes, DIM)
    out = encoder(x, data.edge_index, data.edge_type)
    assert torch.equal(out, x)
    out.pow(2).sum().backward()  # any loss: the zeroed message weights still get gradients
    for conv in encoder.convs:  # no branch is dead: each conv gets a non-zero gradient
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in conv.parameters())
    with pytest.raises(ConfigError, match="identity_init"):
        GraphEncoderConfig(in_dim=DIM, model=model, residual=False, identity_init=True)


# ---------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------

TEACHER = [[1.0, 0.0], [0.6, 0.8]]
STUDENT = [[0.8, 0.6], [0.0, 2.0]]
CANDIDATES = [[1.0, 0.0], [0.0, 1.0], [-1.0, 1.0]]


def _cos(u, v):
    return sum(a * b for a, b in zip(u, v)) / math.sqrt(sum(a * a for a in u) * sum(b * b for b in v))


def _softmax(xs):
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    return [v / sum(e) for v in e]


def _kl_by_hand(tau, keep):
    total = 0.0
    for t, s, row_keep in zip(TEACHER, STUDENT, keep):
        cands = [c for c, k in zip(CANDIDATES, row_keep) if k]
        p = _softmax([_cos(t, c) / tau for c in cands])
        r = _softmax([_cos(s, c) / tau for c in cands])
        total += sum(pi * (math.log(pi) - math.log(ri)) for pi, ri in zip(p, r))
    return total / len(TEACHER)


def test_distillation_score_mode_by_hand():
    tau = 0.5
    loss = DistillationLoss("score", tau)(torch.tensor(TEACHER), torch.tensor(STUDENT), torch.tensor(CANDIDATES))
    assert loss.item() == pytest.approx(_kl_by_hand(tau, [[1, 1, 1], [1, 1, 1]]), rel=1e-5)

    mask = torch.tensor([[False, False, True], [False, True, False]])
    masked = DistillationLoss("score", tau)(torch.tensor(TEACHER), torch.tensor(STUDENT), torch.tensor(CANDIDATES), mask)
    assert masked.item() == pytest.approx(_kl_by_hand(tau, [[1, 1, 0], [1, 0, 1]]), rel=1e-5)


def test_distillation_feature_mode_by_hand():
    expected = sum((s - t) ** 2 for tr, sr in zip(TEACHER, STUDENT) for t, s in zip(tr, sr)) / 4
    loss = DistillationLoss("feature")(torch.tensor(TEACHER), torch.tensor(STUDENT))
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_distillation_teacher_is_detached_and_masked_grads_are_finite():
    teacher = torch.tensor(TEACHER, requires_grad=True)
    student = torch.tensor(STUDENT, requires_grad=True)
    cands = torch.tensor(CANDIDATES, requires_grad=True)
    mask = torch.tensor([[False, False, True], [False, True, False]])
    DistillationLoss("score", 0.1)(teacher, student, cands, mask).backward()
    assert teacher.grad is None
    assert torch.isfinite(student.grad).all() and torch.isfinite(cands.grad).all()


def test_joint_loss_weights():
    torch.manual_seed(0)
    q_graph, q_enc, pos, neg = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4), torch.randn(2, 4)
    mask = torch.zeros(3, 5, dtype=torch.bool)
    mask[0, 1] = True
    nce = InfoNCELoss(0.1)(q_graph, pos, neg, mask)
    kd = DistillationLoss("score", 0.1)(q_graph, q_enc, torch.cat([pos, neg]), mask)
    loss, parts = QabisarLoss(0.1, 0.3, "score")(q_graph, q_enc, pos, neg, mask)
    assert loss.item() == pytest.approx(0.7 * nce.item() + 0.3 * kd.item(), rel=1e-6)
    assert parts == pytest.approx({"contrastive": nce.item(), "kd": kd.item()})
    no_kd, _ = QabisarLoss(0.1, 0.0)(q_graph, None, pos, neg, mask)
    assert no_kd.item() == pytest.approx(nce.item())


# ---------------------------------------------------------------------------
# Subgraph sampling
# ---------------------------------------------------------------------------


def bfs_in_neighbourhood(edge_list, seeds, hops):
    """Nodes from which a seed is reachable in <= hops edges (messages flow src -> dst)."""
    preds = {}
    for s, d in edge_list:
        preds.setdefault(d, set()).add(s)
    dist = {s: 0 for s in seeds}
    queue = deque(seeds)
    while queue:
        node = queue.popleft()
        if dist[node] == hops:
            continue
        for p in preds.get(node, ()):
            if p not in dist:
                dist[p] = dist[node] + 1
                queue.append(p)
    return set(dist)


@pytest.mark.parametrize("directed", [True, False])
@pytest.mark.parametrize("hops", [1, 2, 3])
@pytest.mark.parametrize("seeds", [[0], [2, 5], [13], [6]])
def test_subgraph_is_exact_l_hop_neighbourhood(directed, hops, seeds):
    data = graph(directed=directed, consecutive=True)
    edge_list = [tuple(e) for e in data.edge_index.T.tolist()]
    subset, sub_ei, sub_et = batch_subgraph(data.edge_index, data.edge_type, torch.tensor(seeds), hops, data.num_nodes)
    expected_nodes = bfs_in_neighbourhood(edge_list, seeds, hops)
    assert set(subset.tolist()) == expected_nodes
    got = sorted((int(subset[s]), int(subset[d]), int(t)) for (s, d), t in zip(sub_ei.T.tolist(), sub_et))
    want = sorted((s, d, int(t)) for (s, d), t in zip(edge_list, data.edge_type) if s in expected_nodes and d in expected_nodes)
    assert got == want


def test_cut_questions_removes_their_bipartite_edges_only():
    data = graph()
    q1 = 12  # train question 1 -> articles 10 (node 0) and 12 (node 2)
    subset, sub_ei, sub_et = batch_subgraph(
        data.edge_index, data.edge_type, torch.tensor([0, q1]), 2, data.num_nodes, cut_questions=torch.tensor([q1])
    )
    triples = {(int(subset[s]), int(subset[d]), int(t)) for (s, d), t in zip(sub_ei.T.tolist(), sub_et)}
    assert not any(q1 in (s, d) for s, d, _ in triples)
    assert (14, 0, int(EdgeType.QUESTION_ARTICLE)) in triples  # question 6 still cites article 10
    assert (9, 0, int(EdgeType.HEADING_ARTICLE)) in triples


@pytest.mark.parametrize("model", ["gatv2", "sage"])
def test_subgraph_outputs_equal_full_graph_outputs(model):
    data = graph(consecutive=True)
    torch.manual_seed(0)
    x = torch.randn(data.num_nodes, DIM)
    encoder = GraphEncoder(GraphEncoderConfig(in_dim=DIM, model=model, layers=2, heads=2,
                                              edge_dim=4 if model == "gatv2" else None)).eval()
    full = encoder(x, data.edge_index, data.edge_type)
    seeds = torch.tensor([2, 4, 13])
    subset, sub_ei, sub_et = batch_subgraph(data.edge_index, data.edge_type, seeds, 2, data.num_nodes)
    sub = encoder(x[subset], sub_ei, sub_et)
    torch.testing.assert_close(sub[torch.searchsorted(subset, seeds)], full[seeds], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# Training inputs (leak rule), settings
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["lge", "qabisar"])
def test_training_inputs_hold_train_questions_only(variant):
    ts = prepare_training_set(graph(), QUESTIONS, NEGATIVES, embeddings(), settings(variant))
    assert set(ts.train_ids.tolist()) == TRAIN
    assert set(ts.graph.question_ids.tolist()) == (TRAIN if variant == "qabisar" else set())
    assert set(ts.dev_ids.tolist()) == DEV and set(ts.dev_qrels) == DEV
    assert {int(ts.train_ids[r]) for r in ts.pairs[:, 0].tolist()} == TRAIN
    # no row of any training tensor is a dev/test/synthetic question's embedding
    for qid in DEV | TEST_AND_SYNTHETIC:
        vec = feature("q", qid)
        for tensor in (ts.x, ts.train_queries):
            assert not (tensor == vec).all(dim=1).any(), (qid, variant)
    assert not TEST_AND_SYNTHETIC & set(ts.dev_ids.tolist())
    assert ts.dev_texts == ["q3 dev"]
    assert not {"q3 dev", "q4 test", "q5 synthetic"} & set(ts.train_texts)
    # pairs: every gold article of every train question, by node
    gold_nodes = {(int(ts.train_ids[r]), int(ts.graph.article_ids[a])) for r, a in ts.pairs.tolist()}
    assert gold_nodes == {(1, 10), (1, 12), (2, 20), (6, 10)}
    # BM25 negatives: only train rows, by node
    negs = {int(ts.train_ids[r]): sorted(ts.graph.article_ids[n].tolist()) for r, n in enumerate(ts.negatives)}
    assert negs == {1: [20, 21], 2: [10, 11, 12], 6: [30]}
    if variant == "qabisar":  # question nodes carry their own embeddings
        for r, qid in enumerate(ts.train_ids.tolist()):
            assert torch.equal(ts.x[ts.question_nodes[r]], feature("q", qid))


def test_settings_per_variant_and_errors():
    assert settings("lge").edge_dim is None and settings("qabisar").edge_dim == 4
    assert settings("lge").epochs == 2
    assert settings("qabisar", kd={"weight": 0.0, "mode": "feature"}).kd_weight == 0.0
    with pytest.raises(ConfigError, match="unknown keys"):
        settings("lge", epochs=3)
    with pytest.raises(ConfigError, match="kd.weight"):
        settings("qabisar", kd={"weight": 1.5, "mode": "score"})
    with pytest.raises(ConfigError, match="edge_dim"):
        settings("qabisar", model="gcn").encoder_config(DIM)


def test_qabisar_needs_question_nodes():
    with pytest.raises(ConfigError, match="graph.questions"):
        prepare_training_set(graph(questions=False), QUESTIONS, NEGATIVES, embeddings(), settings("qabisar"))


# ---------------------------------------------------------------------------
# Training end to end (tiny)
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_query_encoder_dir(tmp_path_factory):
    from transformers import BertConfig, BertModel

    from lexgraph.models.encoders import QueryEncoder
    from lexgraph.models.pretrain import train_wordpiece_tokenizer

    texts = QUESTIONS["question"].to_list() + ARTICLES["article"].to_list()
    tokenizer = train_wordpiece_tokenizer(texts * 5, vocab_size=120)
    torch.manual_seed(0)
    backbone = BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=DIM, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=16, max_position_embeddings=64),
                         add_pooling_layer=False)
    path = tmp_path_factory.mktemp("dsr") / "query_encoder"
    QueryEncoder(backbone, tokenizer, max_length=32).save_pretrained(path)
    return path


def test_lge_training_is_deterministic_and_saves(tmp_path, monkeypatch):
    seen_seeds = []
    original = training.batch_subgraph

    def spy(edge_index, edge_type, seeds, *args, **kwargs):
        seen_seeds.append(seeds.clone())
        return original(edge_index, edge_type, seeds, *args, **kwargs)

    monkeypatch.setattr(training, "batch_subgraph", spy)
    s = settings("lge")
    ts = prepare_training_set(graph(), QUESTIONS, NEGATIVES, embeddings(), s)
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        runs.append(train_graph_encoder(ts, s, "cpu", seed=7, show_progress=False))
    a, b = runs
    assert torch.equal(a.article_embeddings, b.article_embeddings)
    assert a.article_embeddings.shape == (7, DIM) and a.encoder is None
    assert len(a.history) == 2 and "dev_recall@200" in a.history[0]
    assert all(int(n) < 7 + 5 for seeds in seen_seeds for n in seeds)  # LGE seeds: articles only

    training.save_trained(a, ts, s, tmp_path / "gnn_lge")
    assert sorted(p.name for p in (tmp_path / "gnn_lge").iterdir()) == [
        "article_embeddings.safetensors", "gnn.json", "gnn.safetensors"]
    reloaded = training.load_graph_encoder(tmp_path / "gnn_lge")
    torch.testing.assert_close(
        reloaded(ts.x, ts.graph.edge_index, ts.graph.edge_type)[:7], a.article_embeddings, rtol=1e-5, atol=1e-6)
    metrics = training.training_metrics(a, ts, s)
    assert metrics["train_pairs"] == 4 and metrics["best_epoch"] in (1, 2)
    json.dumps(metrics)


def test_qabisar_training_and_retrieval(tmp_path, monkeypatch, tiny_query_encoder_dir):
    from lexgraph.embed import save_embeddings
    from lexgraph.models.encoders import QueryEncoder
    from lexgraph.retrieval.gnn import load_gdsr, load_qabisar

    cuts = []
    original = training.batch_subgraph

    def spy(edge_index, edge_type, seeds, num_hops, num_nodes, cut_questions=None):
        cuts.append((seeds.clone(), cut_questions.clone()))
        return original(edge_index, edge_type, seeds, num_hops, num_nodes, cut_questions=cut_questions)

    monkeypatch.setattr(training, "batch_subgraph", spy)
    s = settings("qabisar")
    ts = prepare_training_set(graph(), QUESTIONS, NEGATIVES, embeddings(), s)
    encoder = QueryEncoder.from_pretrained(tiny_query_encoder_dir)
    before = {k: v.clone() for k, v in encoder.state_dict().items()}
    result = train_graph_encoder(ts, s, "cpu", seed=3, query_encoder=encoder, show_progress=False)
    assert any(not torch.equal(before[k], v) for k, v in result.encoder.state_dict().items())  # encoder trained
    for seeds, cut in cuts:  # every batch question is seeded and has its bipartite edges cut
        assert cut.numel() and set(cut.tolist()) <= set(seeds.tolist())
        assert set(cut.tolist()) <= {12, 13, 14}

    workspace = tmp_path / "ws"
    training.save_trained(result, ts, s, workspace / "models" / "gnn_qabisar")
    assert (workspace / "models" / "gnn_qabisar" / "query_encoder" / "config.json").is_file()
    QueryEncoder.from_pretrained(tiny_query_encoder_dir).save_pretrained(workspace / "models/dsr/query_encoder")
    (workspace / "models/gnn_lge").mkdir(parents=True)
    save_embeddings(workspace / "models/gnn_lge/article_embeddings.safetensors", ts.article_ids, result.article_embeddings)
    for load in (load_gdsr, load_qabisar):
        retriever = load(workspace, "cpu")
        ids, scores = retriever.search(["Qui paie le mur ?", "bail"], 3)
        assert ids.shape == (2, 3) and set(ids.ravel().tolist()) <= set(ARTICLES["id"].to_list())
        assert np.all(np.diff(scores, axis=1) <= 1e-6)

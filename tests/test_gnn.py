"""Graph encoders, distillation, subgraph sampling and GNN training (lexgraph.methods.gnn.model,
lexgraph.losses, lexgraph.methods.gnn.train*, lexgraph.methods.gnn.system)."""

from __future__ import annotations

import json
import math
from collections import deque

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers_graph import (
    AQ,
    ARTICLES,
    DIM,
    NEGATIVES,
    QA,
    QUESTIONS,
    embeddings,
    feature,
    graph,
    settings,
)
from lexgraph.core.errors import ConfigError
from lexgraph.graph.build import EdgeType
from lexgraph.losses import DistillationLoss, InfoNCELoss, QabisarLoss
from lexgraph.methods.gnn import io as gnn_io
from lexgraph.methods.gnn import train as training
from lexgraph.methods.gnn.data import batch_subgraph, prepare_training_set
from lexgraph.methods.gnn.model import MODELS, GraphEncoder, GraphEncoderConfig, architecture_problem
from lexgraph.methods.gnn.train import train_graph_encoder

TRAIN, DEV, TEST_AND_SYNTHETIC = {1, 2, 6}, {3}, {4, 5}


#: every GraphEncoderConfig field without a default, at a plain setting
ENCODER = dict(
    in_dim=DIM,
    model="gatv2",
    layers=1,
    hidden=None,
    heads=1,
    concat_heads=True,
    dropout=0.1,
    residual=True,
    edge_dim=None,
    init="random",
    attention_dropout=None,
    self_loops=None,
    projections="linear",
    activation="elu",
)


def encoder_config(**overrides) -> GraphEncoderConfig:
    return GraphEncoderConfig(**{**ENCODER, **overrides})


# ---------------------------------------------------------------------------
# GraphEncoder
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("edge_dim", [None, 4])
@pytest.mark.parametrize("hidden", [None, 12])
@pytest.mark.parametrize("concat_heads", [True, False])
def test_forward_shapes(model, edge_dim, hidden, concat_heads):
    data = graph(consecutive=True)
    x = torch.randn(data.num_nodes, DIM)  # (nodes, dim)
    config = dict(ENCODER, model=model, layers=2, hidden=hidden, heads=2, concat_heads=concat_heads, edge_dim=edge_dim)
    if edge_dim is not None and model not in ("gatv2", "gat"):
        assert architecture_problem(GraphEncoderConfig(**config))[0] == "edge_dim"
        return
    encoder = GraphEncoder(GraphEncoderConfig(**config))
    out = encoder(x, data.edge_index, data.edge_type)
    assert out.shape == (data.num_nodes, DIM)
    assert len(encoder.convs) == 2 and all(len(layer) == 1 for layer in encoder.convs)  # one edge group
    assert (encoder.edge_embedding is not None) == (edge_dim is not None)
    if edge_dim is not None:
        assert encoder.edge_embedding.weight.shape == (len(EdgeType), edge_dim)


def test_bad_encoder_configs():
    with pytest.raises(TypeError, match="init"):  # the architecture keys have no defaults
        GraphEncoderConfig(
            in_dim=DIM,
            model="gatv2",
            layers=1,
            hidden=None,
            heads=1,
            concat_heads=True,
            dropout=0.1,
            residual=True,
            edge_dim=None,
            attention_dropout=None,
            self_loops=None,
            projections="linear",
            activation="elu",
        )
    assert architecture_problem(encoder_config(model="gatv2", heads=3))[:2] == ("heads", 3)  # 3 does not divide 8
    assert architecture_problem(encoder_config(model="gatv2", heads=3, concat_heads=False)) is None  # full width each
    assert architecture_problem(encoder_config(model="gcn", init="prior"))[:2] == ("init", "prior")
    assert architecture_problem(encoder_config(residual=False, init="identity"))[:2] == ("init", "identity")
    assert architecture_problem(encoder_config(hidden=4, init="identity"))[:2] == ("hidden", 4)  # the input is 8 wide
    assert architecture_problem(encoder_config(hidden=4, projections="convolutions"))[0] == "projections"
    qabisar = dict(layer="qabisar", residual=False, self_loops=True, edge_dim=4, edge_groups=((0,),))
    assert architecture_problem(encoder_config(**qabisar)) is None
    assert architecture_problem(encoder_config(**{**qabisar, "residual": True}))[:2] == ("residual", True)
    assert architecture_problem(encoder_config(**{**qabisar, "edge_groups": ((0,), (1,))}))[0] == "edge_attention"
    encoder_config(model="gcn", heads=3)  # heads are ignored by non-attention models


@pytest.mark.parametrize("model", MODELS)
def test_identity_init_starts_as_identity_and_learns(model):
    data = graph(consecutive=True)
    edge_dim = 4 if model in ("gatv2", "gat") else None
    encoder = GraphEncoder(encoder_config(model=model, layers=2, heads=2, edge_dim=edge_dim, init="identity"))
    x = torch.randn(data.num_nodes, DIM)
    out = encoder(x, data.edge_index, data.edge_type)
    assert torch.equal(out, x)
    out.pow(2).sum().backward()  # any loss: the zeroed message weights still get gradients
    for layer in encoder.convs:  # no branch is dead: each conv gets a non-zero gradient
        for conv in layer:
            assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in conv.parameters())
    assert architecture_problem(encoder_config(model=model, residual=False, init="identity"))[0] == "init"


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
    masked = DistillationLoss("score", tau)(
        torch.tensor(TEACHER), torch.tensor(STUDENT), torch.tensor(CANDIDATES), mask
    )
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
    want = sorted(
        (s, d, int(t)) for (s, d), t in zip(edge_list, data.edge_type) if s in expected_nodes and d in expected_nodes
    )
    assert got == want


@pytest.mark.parametrize("directed", [True, False])
@pytest.mark.parametrize(
    "questions, articles, cut",
    [
        # question 1 (node 12) scored against article 10 (node 0): only that pair's two edges go;
        # its other gold article 12 (node 2) stays linked both ways
        ([12], [0], {(12, 0, QA), (0, 12, AQ)}),
        # questions 1 and 6 (node 14), both scored against article 10
        ([12, 14], [0, 0], {(12, 0, QA), (0, 12, AQ), (14, 0, QA), (0, 14, AQ)}),
    ],
)
def test_cut_pairs_removes_the_scored_pairs_edges_only(directed, questions, articles, cut):
    data = graph(directed=directed)
    all_edges = {(s, d, int(t)) for (s, d), t in zip(data.edge_index.T.tolist(), data.edge_type)}
    assert cut <= all_edges
    seeds = torch.tensor([*articles, *questions])
    subset, sub_ei, sub_et = batch_subgraph(
        data.edge_index,
        data.edge_type,
        seeds,
        2,
        data.num_nodes,
        cut_pairs=(torch.tensor(questions), torch.tensor(articles)),
    )
    triples = {(int(subset[s]), int(subset[d]), int(t)) for (s, d), t in zip(sub_ei.T.tolist(), sub_et)}
    kept = all_edges - cut
    # exactly the 2-hop in-neighbourhood of the seeds once the scored pairs' edges are cut
    nodes = bfs_in_neighbourhood([(s, d) for s, d, _ in kept], seeds.tolist(), 2)
    assert set(subset.tolist()) == nodes
    assert triples == {e for e in kept if e[0] in nodes and e[1] in nodes}
    assert not triples & cut
    assert {(12, 2, QA), (2, 12, AQ)} <= triples  # question 1's other gold edge is kept, both ways
    assert (9, 0, int(EdgeType.HEADING_ARTICLE)) in triples
    if 14 not in questions:
        assert {(14, 0, QA), (0, 14, AQ)} <= triples  # question 6 still cites article 10


@pytest.mark.parametrize("model", ["gatv2", "sage"])
def test_subgraph_outputs_equal_full_graph_outputs(model):
    data = graph(consecutive=True)
    torch.manual_seed(0)
    x = torch.randn(data.num_nodes, DIM)
    encoder = GraphEncoder(
        encoder_config(model=model, layers=2, heads=2, edge_dim=4 if model == "gatv2" else None)
    ).eval()
    full = encoder(x, data.edge_index, data.edge_type)
    seeds = torch.tensor([2, 4, 13])
    subset, sub_ei, sub_et = batch_subgraph(data.edge_index, data.edge_type, seeds, 2, data.num_nodes)
    sub = encoder(x[subset], sub_ei, sub_et)
    torch.testing.assert_close(sub[torch.searchsorted(subset, seeds)], full[seeds], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# Training inputs (leak rule), settings
# ---------------------------------------------------------------------------


def unit(v: torch.Tensor) -> torch.Tensor:
    return F.normalize(v, dim=-1)


# the articles under each heading, at any depth (test_graph's hierarchy)
SUBTREES = {0: [10, 11, 12, 13], 1: [10, 11, 12, 13], 2: [10, 11], 3: [12], 4: [20, 21]}


@pytest.mark.parametrize("heading_features", ["articles", "title"])
@pytest.mark.parametrize("variant", ["hgraph", "hgraph_qa"])
def test_training_inputs_hold_train_questions_only(variant, heading_features):
    ts = prepare_training_set(
        graph(), QUESTIONS, NEGATIVES, embeddings(), settings(variant, heading_features=heading_features)
    )
    assert set(ts.train_ids.tolist()) == TRAIN
    assert set(ts.graph.question_ids.tolist()) == (TRAIN if variant == "hgraph_qa" else set())
    assert set(ts.dev_ids.tolist()) == DEV and set(ts.dev_qrels) == DEV
    assert {int(ts.train_ids[r]) for r in ts.pairs[:, 0].tolist()} == TRAIN
    # no row of any training tensor is a dev/test/synthetic question's embedding (raw or normalised)
    for qid in DEV | TEST_AND_SYNTHETIC:
        for vec in (feature("q", qid), unit(feature("q", qid))):
            for tensor in (ts.x, ts.train_queries):
                assert not torch.isclose(tensor, vec, rtol=0, atol=1e-6).all(dim=1).any(), (qid, variant)
    assert not TEST_AND_SYNTHETIC & set(ts.dev_ids.tolist())
    assert ts.dev_texts == ["q3 dev"]
    assert not {"q3 dev", "q4 test", "q5 synthetic"} & set(ts.train_texts)
    # pairs: every gold article of every train question, by node
    gold_nodes = {(int(ts.train_ids[r]), int(ts.graph.article_ids[a])) for r, a in ts.pairs.tolist()}
    assert gold_nodes == {(1, 10), (1, 12), (2, 20), (6, 10)}
    # BM25 negatives: only train rows, by node
    negs = {int(ts.train_ids[r]): sorted(ts.graph.article_ids[n].tolist()) for r, n in enumerate(ts.negatives)}
    assert negs == {1: [20, 21], 2: [10, 11, 12], 6: [30]}
    # node features are L2-normalised: articles their own vectors, headings the mean of the
    # unit vectors of the articles under them (articles) or their own title encoding (title)
    for node, aid in enumerate(ts.graph.article_ids.tolist()):
        torch.testing.assert_close(ts.x[node], unit(feature("a", aid)), rtol=0, atol=1e-6)
    for row, hid in enumerate(ts.graph.heading_ids.tolist()):
        want = (
            torch.stack([unit(feature("a", a)) for a in SUBTREES[hid]]).mean(0)
            if heading_features == "articles"
            else unit(feature("h", hid))
        )
        torch.testing.assert_close(ts.x[ts.num_articles + row], want, rtol=0, atol=1e-6)
    if variant == "hgraph_qa":  # question nodes carry their own (normalised) embeddings
        for r, qid in enumerate(ts.train_ids.tolist()):
            torch.testing.assert_close(ts.x[ts.question_nodes[r]], unit(feature("q", qid)), rtol=0, atol=1e-6)


def test_qabisar_needs_question_nodes():
    with pytest.raises(ConfigError, match="graph.questions"):
        prepare_training_set(graph(questions=False), QUESTIONS, NEGATIVES, embeddings(), settings("hgraph_qa"))


# ---------------------------------------------------------------------------
# Training end to end (tiny)
# ---------------------------------------------------------------------------


def test_hgraph_training_is_deterministic_and_saves(tmp_path, monkeypatch):
    seen_seeds = []
    original = training.batch_subgraph

    def spy(edge_index, edge_type, seeds, *args, **kwargs):
        seen_seeds.append(seeds.clone())
        return original(edge_index, edge_type, seeds, *args, **kwargs)

    monkeypatch.setattr(training, "batch_subgraph", spy)
    s = settings("hgraph")
    ts = prepare_training_set(graph(), QUESTIONS, NEGATIVES, embeddings(), s)
    runs = []
    for select in (True, True, False, False):  # with dev selection, then keeping the last epoch
        torch.manual_seed(7)
        runs.append(train_graph_encoder(ts, s, "cpu", seed=7, show_progress=False, select=select))
    a, b, c, d = runs
    assert torch.equal(a.article_embeddings, b.article_embeddings)
    assert torch.equal(c.article_embeddings, d.article_embeddings)  # the trained model is deterministic too
    assert not torch.equal(a.article_embeddings, c.article_embeddings)  # training moved the embeddings
    assert a.article_embeddings.shape == (7, DIM) and a.encoder is None
    # epoch 0 (the untrained model) is evaluated and may be selected, then the 2 trained epochs; with
    # 7 articles every epoch has dev recall@200 = 1: the tie keeps the earliest, the untrained model
    assert [h["epoch"] for h in a.history] == [0, 1, 2] and all("dev_recall@200" in h for h in a.history)
    assert a.initial_dev_metrics["recall@200"] == a.history[0]["dev_recall@200"]
    assert a.best_epoch == 0
    assert [h["epoch"] for h in c.history] == [1, 2] and c.best_epoch == 2  # no selection: the last epoch
    assert all(int(n) < 7 + 5 for seeds in seen_seeds for n in seeds)  # LGE seeds: articles only

    gnn_io.save_trained(c, ts, s, tmp_path / "gnn_hgraph")
    assert sorted(p.name for p in (tmp_path / "gnn_hgraph").iterdir()) == [
        "article_embeddings.safetensors",
        "gnn.json",
        "gnn.safetensors",
    ]
    reloaded = gnn_io.load_graph_encoder(tmp_path / "gnn_hgraph")
    torch.testing.assert_close(
        reloaded(ts.x, ts.graph.edge_index, ts.graph.edge_type)[:7], c.article_embeddings, rtol=1e-5, atol=1e-6
    )
    metrics = gnn_io.training_metrics(a, ts, s)
    assert metrics["train_pairs"] == 4 and metrics["best_epoch"] == 0
    assert metrics["dev_untrained"]["recall@200"] == round(a.history[0]["dev_recall@200"], 4)
    assert [h["epoch"] for h in metrics["history"]] == [0, 1, 2]
    json.dumps(metrics)


def test_hgraph_qa_training_and_retrieval(tmp_path, monkeypatch, tiny_query_encoder_dir):
    from lexgraph.encoding.embed import save_embeddings
    from lexgraph.methods.gnn.system import load_hgraph, load_hgraph_qa
    from lexgraph.models.encoders import QueryEncoder

    cuts = []
    original = training.batch_subgraph

    def spy(edge_index, edge_type, seeds, num_hops, num_nodes, cut_pairs=None):
        cuts.append((seeds.clone(), cut_pairs[0].clone(), cut_pairs[1].clone()))
        return original(edge_index, edge_type, seeds, num_hops, num_nodes, cut_pairs=cut_pairs)

    monkeypatch.setattr(training, "batch_subgraph", spy)
    s = settings("hgraph_qa")
    ts = prepare_training_set(graph(), QUESTIONS, NEGATIVES, embeddings(), s)
    encoder = QueryEncoder.from_pretrained(tiny_query_encoder_dir)
    before = {k: v.clone() for k, v in encoder.state_dict().items()}
    selected = train_graph_encoder(ts, s, "cpu", seed=3, query_encoder=encoder, show_progress=False)
    # every epoch ties on the 7-article dev set: the untrained model is kept, its query encoder included
    assert selected.best_epoch == 0
    assert all(torch.equal(before[k], v) for k, v in selected.encoder.state_dict().items())
    encoder = QueryEncoder.from_pretrained(tiny_query_encoder_dir)
    result = train_graph_encoder(ts, s, "cpu", seed=3, query_encoder=encoder, show_progress=False, select=False)
    assert result.best_epoch == 2
    assert any(not torch.equal(before[k], v) for k, v in result.encoder.state_dict().items())  # encoder trained
    # every batch question and its scored article are seeded, and exactly that (question, gold
    # article) pair is cut: one pair per batch row
    gold_pairs = {(12, 0), (12, 2), (13, 4), (14, 0)}  # (question node, gold article node)
    for seeds, questions, articles in cuts:
        assert questions.numel() and questions.shape == articles.shape
        assert set(questions.tolist()) | set(articles.tolist()) <= set(seeds.tolist())
        assert set(zip(questions.tolist(), articles.tolist())) <= gold_pairs
    assert {p for _, q, a in cuts for p in zip(q.tolist(), a.tolist())} == gold_pairs  # every pair trained on

    workspace = tmp_path / "ws"
    gnn_io.save_trained(result, ts, s, workspace / "models" / "gnn_hgraph_qa")
    assert (workspace / "models" / "gnn_hgraph_qa" / "query_encoder" / "config.json").is_file()
    QueryEncoder.from_pretrained(tiny_query_encoder_dir).save_pretrained(workspace / "models/dsr/query_encoder")
    (workspace / "models/gnn_hgraph").mkdir(parents=True)
    (workspace / "models/gnn_hgraph/gnn.json").write_text(json.dumps({"similarity": "cosine"}))
    save_embeddings(
        workspace / "models/gnn_hgraph/article_embeddings.safetensors", ts.article_ids, result.article_embeddings
    )
    for load in (load_hgraph, load_hgraph_qa):
        retriever = load(workspace, "cpu")
        ids, scores = retriever.search(["Qui paie le mur ?", "bail"], 3)
        assert ids.shape == (2, 3) and set(ids.ravel().tolist()) <= set(ARTICLES["id"].to_list())
        assert np.all(np.diff(scores, axis=1) <= 1e-6)

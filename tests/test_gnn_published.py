"""G-DSR's LGE and QABISAR as published (``gnn.gdsr``, ``gnn.qabisar``), each against an
independent reference: a hand-built PyG stack, the paper's KD formula by hand, the
learning rate at every step; and the params rule (dvc.yaml lists what each variant reads),
the refit's logs and dev negatives, and what gnn.json records."""

from __future__ import annotations

import copy
import json
import logging
import math
from pathlib import Path

import polars as pl
import pytest
import torch
import torch.nn.functional as F
import yaml
from torch_geometric.nn import GATv2Conv

from helpers_graph import AQ, BASE_PARAMS, GRAPH, NEGATIVES, QA, QUESTIONS, embeddings, graph, settings
from helpers_graph import DIM as TOY_DIM
from lexgraph.core.errors import ConfigError, DataError
from lexgraph.graph.build import NUM_EDGE_TYPES, STRUCTURE_TYPES, EdgeType
from lexgraph.models.gnn import GraphEncoder, GraphEncoderConfig
from lexgraph.training import gnn as training
from lexgraph.training import gnn_io, gnn_stage
from lexgraph.training.gnn_config import ARCH_KEYS, QUESTION_VARIANTS, SHARED_KEYS, VARIANTS, GNNSettings
from lexgraph.training.gnn_data import prepare_training_set

ROOT = Path(__file__).resolve().parents[1]
DIM = 8


def section(profile: str) -> dict:
    return yaml.safe_load((ROOT / profile).read_text(encoding="utf-8"))["gnn"]


def published(variant: str, profile: str = "profiles/paper.yaml", shared: dict | None = None, **own) -> GNNSettings:
    """``variant``'s settings from ``profile``, with toy-sized overrides."""
    params = copy.deepcopy(section(profile))
    params.update(shared or {})
    params[variant].update(own)
    return GNNSettings.from_params(params, variant)


def toy_graph(nodes: int = 6):
    """A small directed graph with every edge type and a node without in-edges."""
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 2], [1, 2, 3, 0, 0, 1, 4, 4]])  # (2, 8)
    edge_type = torch.arange(NUM_EDGE_TYPES)  # (8,)
    x = torch.randn(nodes, DIM, generator=torch.Generator().manual_seed(5))  # (nodes, dim)
    return x, edge_index, edge_type


def test_gdsr_lge_equals_a_hand_built_pyg_gatv2_stack():
    """Paper profile: 3 plain GATv2 layers (eq. 6-7), in -> hidden -> hidden -> in (the public
    code's widths), PyG's defaults (1 head, self-loops, no attention dropout), ReLU + dropout
    between layers, random init, no residual."""
    settings = published("gdsr", hidden=12)
    torch.manual_seed(0)
    model = GraphEncoder(settings.encoder.with_input(DIM)).eval()
    reference = [GATv2Conv(DIM, 12), GATv2Conv(12, 12), GATv2Conv(12, DIM)]  # PyG's defaults
    for conv, layer in zip(reference, model.convs):
        assert len(layer) == 1  # one convolution per layer
        conv.load_state_dict(layer[0].state_dict())
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for c in reference for p in c.parameters())
    x, edge_index, edge_type = toy_graph()
    edge_type = torch.tensor([int(t) for t in STRUCTURE_TYPES] * 2)[: edge_index.size(1)]  # the LGE's graph
    h = x
    for i, conv in enumerate(reference):
        h = conv(h, edge_index)
        if i < 2:
            h = F.dropout(F.relu(h), p=0.1, training=False)
    torch.testing.assert_close(model(x, edge_index, edge_type), h, rtol=1e-5, atol=1e-6)
    assert settings.encoder.init == "random" and settings.encoder.residual is False
    assert (settings.schedule, settings.lr, settings.warmup_ratio, settings.epochs) == ("constant", 2e-4, 0.0, 10)
    assert settings.selection == "fixed" and settings.refit and settings.heading_features == "title"


def test_qabisar_layer_is_one_gatv2_over_every_edge_with_typed_self_loops():
    """Sample params: one GATv2Conv per layer over every edge type at once, edge-type
    embeddings as edge_attr, and a self-loop per node with its own (9th) edge type."""
    settings = published("qabisar", "params.yaml", edge_dim=4, heads=2)
    torch.manual_seed(0)
    model = GraphEncoder(settings.encoder.with_input(DIM)).eval()
    assert len(model.convs) == 1 and len(model.convs[0]) == 1
    assert model.edge_embedding.weight.shape == (NUM_EDGE_TYPES + 1, 4)
    conv = GATv2Conv(DIM, DIM // 2, heads=2, edge_dim=4, add_self_loops=False)
    conv.load_state_dict(model.convs[0][0].state_dict())
    x, edge_index, edge_type = toy_graph()
    nodes = torch.arange(x.size(0))
    full_index = torch.cat([edge_index, torch.stack([nodes, nodes])], dim=1)  # (2, 8 + 6)
    full_type = torch.cat([edge_type, torch.full((x.size(0),), NUM_EDGE_TYPES)])  # (14,)
    expected = x + conv(x, full_index, edge_attr=model.edge_embedding.weight[full_type])  # residual
    torch.testing.assert_close(model(x, edge_index, edge_type), expected, rtol=1e-5, atol=1e-6)
    assert settings.similarity == "dot" and settings.kd_temperature == 1.0 and settings.kd_weight == 0.3


def test_qabisar_kd_loss_is_the_papers_formula_on_three_candidates():
    """L = 0.7 * InfoNCE(f) + 0.3 * KL(softmax f(q_graph, a) || softmax f(q_enc, a)), f = dot,
    no temperature, computed by hand; the teacher's scores get no gradient from the KL."""
    criterion = training.build_criterion(published("qabisar"))
    q_graph = torch.tensor([[0.5, -1.0, 2.0]], requires_grad=True)  # (1, 3)
    q_enc = torch.tensor([[1.0, 0.0, 0.5]], requires_grad=True)  # (1, 3)
    positive = torch.tensor([[1.0, 0.5, 0.0]])  # (1, 3)
    negatives = torch.tensor([[0.0, 1.0, 1.0], [-1.0, 0.0, 2.0]])  # (2, 3)
    candidates = [positive[0].tolist(), *negatives.tolist()]

    def softmax_of_dots(q):
        dots = [sum(a * b for a, b in zip(q, c)) for c in candidates]
        z = sum(math.exp(d) for d in dots)
        return [math.exp(d) / z for d in dots]

    p, r = softmax_of_dots(q_graph[0].tolist()), softmax_of_dots(q_enc[0].tolist())
    contrastive = -math.log(p[0])
    kl = sum(pi * (math.log(pi) - math.log(ri)) for pi, ri in zip(p, r))
    loss, parts = criterion(q_graph, q_enc, positive, negatives)
    assert loss.item() == pytest.approx(0.7 * contrastive + 0.3 * kl, rel=1e-5)
    assert parts["kd"] == pytest.approx(kl, rel=1e-5)
    loss.backward()  # the teacher's gradient is the contrastive term's alone (detached in the KL)
    teacher_only = q_graph.detach().clone().requires_grad_(True)
    (0.7 * criterion.contrastive(teacher_only, positive, negatives)).backward()
    torch.testing.assert_close(q_graph.grad, teacher_only.grad)
    assert q_enc.grad.abs().sum() > 0


@pytest.mark.parametrize("variant,constant", [("gdsr", True), ("hgraph", False)])
def test_schedule_constant_keeps_the_lr_at_every_step(monkeypatch, variant, constant):
    """gdsr: constant 2e-4... here at the toy lr; hgraph: lexgraph's linear warm-up and decay."""
    seen = []
    original = training.build_scheduler

    def spy(optimizer, schedule, warmup, total):
        scheduler = original(optimizer, schedule, warmup, total)
        step = scheduler.step

        def recorded(*args, **kwargs):
            seen.append(optimizer.param_groups[0]["lr"])
            return step(*args, **kwargs)

        scheduler.step = recorded
        return scheduler

    monkeypatch.setattr(training, "build_scheduler", spy)
    own = dict(heading_features="articles", epochs=3, lr=1e-2)
    if variant == "hgraph":
        own["init"] = "random"
    settings = published(variant, "params.yaml", **own)
    ts = prepare_training_set(graph(), QUESTIONS, NEGATIVES, embeddings(), settings)
    training.train_graph_encoder(ts, settings, "cpu", seed=1, show_progress=False)
    steps = math.ceil(ts.pairs.size(0) / settings.batch_size) * 3
    assert len(seen) == steps and steps >= 3
    assert (seen == [1e-2] * steps) == constant


def test_dvc_params_of_each_train_gnn_item_are_what_its_settings_read():
    """dvc.yaml's params list for train_gnn@<v> = base + each shared key + gnn.<v>; a change
    inside another variant's mapping leaves <v>'s settings unchanged, a shared key changes all."""
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]["train_gnn"]
    assert stage["foreach"] == list(VARIANTS)
    for variant in VARIANTS:
        listed = [p.replace("${item}", variant) for p in stage["do"]["params"]]
        assert listed == GNNSettings.dvc_params(variant)
    params = section("params.yaml")
    for variant in VARIANTS:
        before = GNNSettings.from_params(params, variant)
        for other in set(VARIANTS) - {variant}:
            changed = copy.deepcopy(params)
            changed[other]["lr"] = 0.123
            changed[other]["epochs"] = 7
            assert GNNSettings.from_params(changed, variant) == before, (variant, other)
        for key, value in (("layers", 2), ("batch_size", 5), ("dropout", 0.3)):
            assert key in SHARED_KEYS
            assert GNNSettings.from_params({**params, key: value}, variant) != before


def test_refit_decisions_are_logged(caplog):
    caplog.set_level(logging.INFO, logger="lexgraph.training.gnn")
    gdsr = published("gdsr", "params.yaml")
    assert gnn_stage.refit_epochs(gdsr, 20) == 0 and "gnn.gdsr.refit is false" in caplog.text
    caplog.clear()
    assert gnn_stage.refit_epochs(published("gdsr"), 4) == 10  # the full fixed schedule, not a chosen epoch
    assert "full fixed schedule (10 epochs)" in caplog.text
    caplog.clear()
    hgraph = published("hgraph")
    assert gnn_stage.refit_epochs(hgraph, 0) == 0 and "refit skipped: dev chose the untrained" in caplog.text
    caplog.clear()
    assert gnn_stage.refit_epochs(hgraph, 3) == 3 and "the 3 epoch(s) dev chose" in caplog.text


def test_refit_trains_dev_questions_with_their_bm25_negatives():
    settings = published("gdsr", "params.yaml", heading_features="articles")
    with pytest.raises(DataError, match="dev question 3 has no BM25 negatives.*negatives.splits"):
        prepare_training_set(graph(), QUESTIONS, NEGATIVES, embeddings(), settings, train_splits=("train", "dev"))
    dev_row = pl.DataFrame({"question_id": [3], "split": ["dev"], "negative_ids": [[20, 30]]}, schema=NEGATIVES.schema)
    ts = prepare_training_set(
        graph(), QUESTIONS, pl.concat([NEGATIVES, dev_row]), embeddings(), settings, train_splits=("train", "dev")
    )
    row = ts.train_ids.tolist().index(3)
    assert sorted(ts.graph.article_ids[ts.negatives[row]].tolist()) == [20, 30]


def test_gnn_json_records_the_architecture(tmp_path):
    settings = published("gdsr", "params.yaml", heading_features="articles", epochs=1)
    ts = prepare_training_set(graph(), QUESTIONS, NEGATIVES, embeddings(), settings)
    result = training.train_graph_encoder(ts, settings, "cpu", seed=1, show_progress=False)
    gnn_io.save_trained(result, ts, settings, tmp_path / "gnn_gdsr")
    saved = json.loads((tmp_path / "gnn_gdsr" / "gnn.json").read_text())
    assert saved["graph_encoder"]["heads"] == 1 and saved["graph_encoder"]["layers"] == 1
    assert saved["settings"]["heads"] == 1 and saved["settings"]["activation"] == "relu"
    assert saved["selection"] == "fixed epochs" and saved["variant"] == "gdsr"
    assert set(QUESTION_VARIANTS) == {"qabisar", "hgraph_qa"}


def test_settings_per_variant_and_errors():
    assert settings("hgraph").encoder.edge_dim is None and settings("hgraph_qa").encoder.edge_dim == 4
    assert settings("hgraph", epochs=3).epochs == 3 and settings("hgraph_qa").epochs == 2  # each its own
    assert settings("hgraph_qa").kd_temperature == 0.1 and settings("hgraph_qa").temperature == 0.05
    no_kd = {"weight": 0.0, "mode": "feature", "temperature": 0.1, "student_contrastive": False}
    assert settings("hgraph_qa", kd=no_kd).kd_weight == 0.0
    with pytest.raises(ConfigError, match="unknown key.*'gnn.hgraph.kd'"):  # a question key on a graph variant
        settings("hgraph", kd=no_kd)
    with pytest.raises(ConfigError, match="unknown key.*'gnn.identity_init'"):
        GNNSettings.from_params({**BASE_PARAMS, "identity_init": True}, "hgraph")
    with pytest.raises(ConfigError, match="'gnn.hgraph.layers'.*a shared key"):
        GNNSettings.from_params({**BASE_PARAMS, "hgraph": {**GRAPH, "layers": 2}}, "hgraph")
    with pytest.raises(ConfigError, match="gnn.hgraph_qa.kd.weight"):
        settings("hgraph_qa", kd={"weight": 1.5, "mode": "score", "temperature": 0.1, "student_contrastive": False})
    # no defaults: a missing key is an error naming it
    for key in ("init", "concat_heads", "heading_features", "warmup_ratio", "similarity", "refit", "schedule"):
        params = {**BASE_PARAMS, "hgraph": {k: v for k, v in GRAPH.items() if k != key}}
        with pytest.raises(ConfigError, match=f"missing key.*'gnn.hgraph.{key}'"):
            GNNSettings.from_params(params, "hgraph")
    with pytest.raises(ConfigError, match="missing key.*'gnn.adam_epsilon'"):
        GNNSettings.from_params({k: v for k, v in BASE_PARAMS.items() if k != "adam_epsilon"}, "hgraph")
    with pytest.raises(ConfigError, match="missing key.*'gnn.hgraph_qa.kd.temperature'"):
        settings("hgraph_qa", kd={"weight": 0.3, "mode": "score"})
    with pytest.raises(ConfigError, match="gnn.hgraph.heading_features"):
        settings("hgraph", heading_features="text")
    with pytest.raises(ConfigError, match="gnn.hgraph.similarity"):
        settings("hgraph", similarity="euclid")
    with pytest.raises(ConfigError, match="gnn.hgraph.warmup_ratio"):
        settings("hgraph", warmup_ratio=1.0)
    with pytest.raises(ConfigError, match="'gnn.gdsr.warmup_ratio' = 0.1, expected 0 with .*constant"):
        settings("gdsr", schedule="constant")
    with pytest.raises(ConfigError, match="'gnn.hgraph.hidden' = 12 is not divisible by 'gnn.hgraph.heads' = 5"):
        settings("hgraph", hidden=12, heads=5)
    # hgraph: one convolution per layer over the statute edges; hgraph_qa: a second one for question-article
    # edges; qabisar (edge_attention: joint): one over every edge type
    assert settings("hgraph").encoder.edge_groups == ((0, 1, 3, 4, 5, 7),)
    assert settings("hgraph_qa").encoder.edge_groups == ((0, 1, 3, 4, 5, 7), (QA, AQ))
    assert settings("qabisar", edge_attention="joint").encoder.edge_groups == (tuple(range(len(EdgeType))),)
    with pytest.raises(ConfigError, match="edge_dim"):  # refused when params are read, before any data
        settings("hgraph_qa", model="gcn")
    # the settings embed the encoder's config: the architecture keys live there only
    arch = settings("hgraph").encoder
    assert isinstance(arch, GraphEncoderConfig) and arch.in_dim is None
    assert not set(ARCH_KEYS) & set(GNNSettings.__dataclass_fields__)
    assert arch.with_input(TOY_DIM, prior_weight=1.5).in_dim == TOY_DIM
    assert arch.with_input(TOY_DIM, prior_weight=1.5).prior_weight == (1.5 if arch.init == "prior" else 0.0)
    with pytest.raises(ValueError, match="with_input"):
        GraphEncoder(arch)
    # gnn.json records them flat (the architecture inline); a graph variant has no question keys
    record = settings("hgraph_qa").to_dict()
    assert "encoder" not in record and record["edge_dim"] == 4 and record["variant"] == "hgraph_qa"
    assert set(record) == {"model", "layers", "dropout", *ARCH_KEYS} | set(GNNSettings.__dataclass_fields__) - {
        "encoder"
    }
    assert "kd_weight" not in settings("hgraph").to_dict()


def test_the_papers_node_features_are_the_embed_stages_vectors_as_they_are():
    """gdsr/qabisar (normalize_features: false) read the embed stage's vectors unscaled, so a
    dot product keeps the encoder's scale; lexgraph's recipes L2-normalise them."""
    raw = embeddings()
    for variant, normalized in (("gdsr", False), ("hgraph", True)):
        settings = published(variant, "params.yaml", heading_features="title")
        ts = prepare_training_set(graph(), QUESTIONS, NEGATIVES, raw, settings)
        ids, vectors = raw["articles"]
        for node, aid in enumerate(ts.graph.article_ids.tolist()):
            want = vectors[ids.tolist().index(aid)]
            want = F.normalize(want, dim=-1) if normalized else want
            torch.testing.assert_close(ts.x[node], want, rtol=0, atol=1e-6)


def test_qabisar_trains_its_graph_and_query_encoder_end_to_end(tiny_query_encoder_dir):
    """The sample's qabisar on the toy graph: joint attention with typed self-loops over sampled
    subgraphs, a KD term in every epoch's loss, and a query encoder that moved."""
    from lexgraph.models.encoders import QueryEncoder

    settings = published("qabisar", "params.yaml", edge_dim=4, heads=2, epochs=2)
    ts = prepare_training_set(graph(), QUESTIONS, NEGATIVES, embeddings(), settings)
    encoder = QueryEncoder.from_pretrained(tiny_query_encoder_dir)
    before = {k: v.clone() for k, v in encoder.state_dict().items()}
    result = training.train_graph_encoder(ts, settings, "cpu", seed=3, query_encoder=encoder, show_progress=False)
    assert result.best_epoch == 2 and [h["epoch"] for h in result.history] == [1, 2]  # fixed: no epoch 0
    assert all(h["kd"] > 0 and math.isfinite(h["loss"]) for h in result.history)
    assert any(not torch.equal(before[k], v) for k, v in result.encoder.state_dict().items())
    full = GraphEncoder(result.model.config).eval()
    full.load_state_dict(result.model.state_dict())
    torch.testing.assert_close(
        full(ts.x, ts.graph.edge_index, ts.graph.edge_type)[: ts.num_articles], result.article_embeddings
    )

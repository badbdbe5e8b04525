"""G-DSR's LGE and QABISAR as their papers state them (``gnn.gdsr``, ``gnn.qabisar``), each
against a hand computation written from the paper's equation (not from lexgraph's code): G-DSR
eq. 7, QABISAR §2.2's layer, its loss and its KL; the papers' constants, named below with the
words that state them, against both profiles, so that a silent fallback to lexgraph's recipe
fails here; and the params rule (dvc.yaml lists what each variant reads), the refit's logs and
dev negatives, the synthetic pairs, and what gnn.json records.
"""

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

from helpers_graph import AQ, BASE_PARAMS, GRAPH, NEGATIVES, QA, QUESTIONS, SYNTHETIC, embeddings, graph, settings
from helpers_graph import DIM as TOY_DIM
from lexgraph.core.errors import ConfigError, DataError
from lexgraph.graph.build import NUM_EDGE_TYPES, STRUCTURE_TYPES, EdgeType
from lexgraph.methods.gnn import io as gnn_io
from lexgraph.methods.gnn import stage as gnn_stage
from lexgraph.methods.gnn import train as training
from lexgraph.methods.gnn.config import ARCH_KEYS, QUESTION_VARIANTS, SHARED_KEYS, VARIANTS, GNNSettings
from lexgraph.methods.gnn.data import prepare_training_set
from lexgraph.methods.gnn.model import GraphEncoder, GraphEncoderConfig

ROOT = Path(__file__).resolve().parents[1]
DIM = 8

# The papers' constants, each with the words that state it (docs/papers.md quotes them in full).
# G-DSR (Louis, van Dijck & Spanakis, EACL 2023):
GDSR_LAYERS = 3  # §3.2: "We propose to use a 3-layer GATv2 network"; Table 5 "#Layers 3"
GDSR_HEADS = 1  # not stated: maastrichtlawtech/gdsr src/pl_modules/gnn_module.py passes none (PyG's 1)
GDSR_SIMILARITY, GDSR_TEMPERATURE = "cosine", 0.01  # Table 5: "Temperature 0.01 0.01", "Similarity cos cos"
GDSR_BATCH, GDSR_LR, GDSR_EPOCHS = 512, 2e-4, 10  # §4.2: "10 epochs with a batch size of 512", "2e-4"
GDSR_SCHEDULE = "constant"  # §4.2: "a constant learning rate of 2e-4"
GDSR_SYNTHETIC = True  # §4.2: "an augmented training set of around 122.5k question-article pairs"
GDSR_REFIT = True  # App. B: "re-train the models combining both train and development sets"
# QABISAR (Santosh, Sarwat & Grabmair, COLING 2025):
QABISAR_SIMILARITY = "dot"  # §2.1: "the relevance score is computed using dot product"
QABISAR_KD_WEIGHT = 0.3  # App. A: "weights of 0.7 and 0.3 to the contrastive loss and KD loss"
QABISAR_BATCH, QABISAR_LR, QABISAR_EPOCHS = 512, 2e-4, 20  # App. A: "20 epochs ... batch size of 512 ... 2e-4"


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


def in_neighbours(edge_index: torch.Tensor, i: int) -> list[tuple[int, int]]:
    """``[(edge, j)]``: the edges j -> i."""
    return [(e, int(edge_index[0, e])) for e in range(edge_index.size(1)) if int(edge_index[1, e]) == i]


def leaky(v: torch.Tensor) -> torch.Tensor:
    return torch.where(v > 0, v, 0.2 * v)


@pytest.mark.parametrize("profile", ["profiles/paper.yaml", "params.yaml"])
def test_gdsr_lge_is_eq_7_by_hand(profile):
    """G-DSR §3.2, eq. 7: h_i^(l+1) = σ( Σ_{j ∈ N(i)} α_ij^(l) W^(l) h_j^(l) ), with eq. 8's
    α_ij = softmax_j(att(h_i, h_j)), "a 3-layer GATv2 network". GATv2's attention (Brody et al.):
    att(h_i, h_j) = a^T LeakyReLU(W_r h_i + W_l h_j), the message W_l h_j; the public code's
    PyG layers add each node to its own neighbourhood and a bias, and put σ = ReLU between the
    layers only (maastrichtlawtech/gdsr src/models/gnn.py). Computed node by node, no PyG."""
    settings = published("gdsr", profile, hidden=12)
    assert settings.encoder.layers == GDSR_LAYERS and settings.encoder.heads == GDSR_HEADS
    assert not settings.encoder.residual and settings.encoder.init == "random"
    torch.manual_seed(0)
    model = GraphEncoder(settings.encoder.with_input(DIM)).eval()
    x, edge_index, _ = toy_graph()
    edge_type = torch.tensor([int(t) for t in STRUCTURE_TYPES] * 2)[: edge_index.size(1)]  # the LGE's edges
    h = x
    for layer, (conv,) in enumerate(model.convs):
        w_l, b_l = conv.lin_l.weight, conv.lin_l.bias  # the message side W (source j)
        w_r, b_r = conv.lin_r.weight, conv.lin_r.bias  # the receiving side (node i)
        a = conv.att.reshape(-1)
        out = []
        for i in range(h.size(0)):
            terms = [j for _, j in in_neighbours(edge_index, i)] + [i]  # N(i) and i itself (PyG's self-loop)
            logits = torch.stack([a @ leaky(w_r @ h[i] + b_r + w_l @ h[j] + b_l) for j in terms])
            alpha = torch.softmax(logits, dim=0)
            out.append(sum(alpha[t] * (w_l @ h[j] + b_l) for t, j in enumerate(terms)) + conv.bias)
        h = torch.stack(out)
        if layer < GDSR_LAYERS - 1:
            h = torch.relu(h)  # σ between the layers; dropout is off in eval mode
    torch.testing.assert_close(model(x, edge_index, edge_type), h, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("profile", ["profiles/paper.yaml", "params.yaml"])
def test_qabisar_layer_is_section_2_2_by_hand(profile):
    """QABISAR §2.2: x'_i = ||_{k=1..K} σ( α^k_ii W^k_s x_i + Σ_{j ∈ N(i)} α^k_ij W^k_t x_j ),
    α^k_ij = Softmax((a^k)^T LeakyReLU([W^k_s x_i || W^k_t x_j || W^k_e e_ij])) with e_ij the
    edge's type embedding "with dimension equal to node features" (App. A). Read as GATv2's
    sum inside the LeakyReLU (docs/papers.md), the self term's edge an own type, σ = ELU after
    every layer, no bias, no other skip. Computed node by node and head by head, no PyG."""
    settings = published("qabisar", profile, edge_dim=DIM, heads=2)
    assert settings.encoder.layer == "qabisar" and not settings.encoder.residual
    torch.manual_seed(0)
    model = GraphEncoder(settings.encoder.with_input(DIM)).eval()
    x, edge_index, edge_type = toy_graph()
    embed = model.edge_embedding.weight  # (types + 1, DIM): the last row is the self term's type
    heads, width = 2, DIM // 2
    h = x
    for (conv,) in model.convs:
        w_s, w_t, w_e = conv.lin_s.weight, conv.lin_t.weight, conv.lin_e.weight
        out = torch.zeros_like(h)
        for i in range(h.size(0)):
            terms = [(int(edge_type[e]), j, w_t) for e, j in in_neighbours(edge_index, i)]
            terms.append((NUM_EDGE_TYPES, i, w_s))  # the self term: α_ii W_s x_i
            for k in range(heads):
                rows = slice(k * width, (k + 1) * width)
                a = conv.att[0, k]
                logits = [a @ leaky(w_s[rows] @ h[i] + w_t[rows] @ h[j] + w_e[rows] @ embed[t]) for t, j, _ in terms]
                alpha = torch.softmax(torch.stack(logits), dim=0)
                message = sum(alpha[n] * (w[rows] @ h[j]) for n, (_, j, w) in enumerate(terms))
                out[i, rows] = F.elu(message)  # σ inside the concatenation
        h = out
    torch.testing.assert_close(model(x, edge_index, edge_type), h, rtol=1e-5, atol=1e-5)


def test_qabisar_loss_and_kl_are_section_2_2_by_hand():
    """QABISAR: L = 0.7 L_contrastive + 0.3 L_KD (App. A); §2.1's contrastive term
    -log exp(f(q,p)/τ) / Σ_{c ∈ {p} ∪ P'_q} exp(f(q,c)/τ), f the dot product, τ the bi-encoder's
    (§2.2: "the same contrastive learning used to train bi-encoder"); §2.2's
    L_KD = Σ_{q, p ∈ P} s(q^g, p^g) log(s(q^g, p^g) / s(q^b, p^g)), s = softmax over the
    candidates P of e^f, no temperature. Two pairs of one question: its other gold article
    leaves its contrastive denominator (it is not in P'_q) but stays a KD candidate."""
    params = yaml.safe_load((ROOT / "profiles/paper.yaml").read_text(encoding="utf-8"))
    qabisar = published("qabisar")
    tau = params["dsr"]["temperature"]
    assert qabisar.temperature == tau and qabisar.similarity == QABISAR_SIMILARITY
    assert qabisar.kd_weight == QABISAR_KD_WEIGHT and qabisar.kd_temperature == 1.0
    criterion = training.build_criterion(qabisar)
    q_graph = torch.tensor([[0.05, -0.1, 0.2], [0.05, -0.1, 0.2]], requires_grad=True)  # (2, 3): one question
    q_enc = torch.tensor([[1.0, 0.0, 0.5], [1.0, 0.0, 0.5]], requires_grad=True)
    positives = torch.tensor([[1.0, 0.5, 0.0], [0.0, 2.0, 1.0]])  # its two gold articles
    negatives = torch.tensor([[0.0, 1.0, 1.0]])
    columns = [*positives.tolist(), *negatives.tolist()]
    other = torch.tensor([[False, True, False], [True, False, False]])  # each row's other gold article

    def dots(q):
        return [sum(a * b for a, b in zip(q, c)) for c in columns]

    def softmax(values):
        z = sum(math.exp(v) for v in values)
        return [math.exp(v) / z for v in values]

    contrastive, kl = 0.0, 0.0
    for row in range(2):
        f = dots(q_graph[row].tolist())
        kept = [row, 2]  # its own positive and the negative (P'_q); the other gold article is out
        contrastive += -math.log(math.exp(f[row] / tau) / sum(math.exp(f[c] / tau) for c in kept)) / 2
        p, r = softmax(f), softmax(dots(q_enc[row].tolist()))  # over every candidate, no temperature
        kl += sum(pi * (math.log(pi) - math.log(ri)) for pi, ri in zip(p, r)) / 2
    loss, parts = criterion(q_graph, q_enc, positives, negatives, other)
    assert parts["contrastive"] == pytest.approx(contrastive, rel=1e-5)
    assert parts["kd"] == pytest.approx(kl, rel=1e-5)
    assert loss.item() == pytest.approx(0.7 * contrastive + 0.3 * kl, rel=1e-5)
    loss.backward()  # the teacher's gradient is the contrastive term's alone (detached in the KL)
    teacher_only = q_graph.detach().clone().requires_grad_(True)
    (0.7 * criterion.contrastive(teacher_only, positives, negatives, other)).backward()
    torch.testing.assert_close(q_graph.grad, teacher_only.grad)
    assert q_enc.grad.abs().sum() > 0


@pytest.mark.parametrize("profile", ["profiles/paper.yaml", "params.yaml"])
def test_both_profiles_hold_the_papers_constants(profile):
    """The published recipes keep the papers' words in both profiles; only the budget keys the
    sample scales (docs/papers.md, "The sample") differ: gdsr's refit, qabisar's student depth."""
    params = yaml.safe_load((ROOT / profile).read_text(encoding="utf-8"))
    gdsr, qabisar = published("gdsr", profile), published("qabisar", profile)
    assert (gdsr.encoder.model, gdsr.encoder.layers, gdsr.encoder.heads) == ("gatv2", GDSR_LAYERS, GDSR_HEADS)
    assert (gdsr.similarity, gdsr.temperature) == (GDSR_SIMILARITY, GDSR_TEMPERATURE)
    assert (gdsr.batch_size, gdsr.lr, gdsr.epochs, gdsr.schedule) == (GDSR_BATCH, GDSR_LR, GDSR_EPOCHS, GDSR_SCHEDULE)
    assert gdsr.synthetic == GDSR_SYNTHETIC and gdsr.encoder.init == "random" and not gdsr.encoder.residual
    assert gdsr.heading_features == "title" and not gdsr.normalize_features and gdsr.selection == "fixed"
    assert gdsr.refit == (GDSR_REFIT if profile == "profiles/paper.yaml" else False)
    assert (qabisar.encoder.layer, qabisar.edge_attention, qabisar.similarity) == ("qabisar", "joint", "dot")
    assert qabisar.encoder.edge_dim == (768 if profile == "profiles/paper.yaml" else 384)  # the node width
    assert (qabisar.batch_size, qabisar.lr, qabisar.epochs) == (QABISAR_BATCH, QABISAR_LR, QABISAR_EPOCHS)
    assert qabisar.kd_weight == QABISAR_KD_WEIGHT and qabisar.kd_mode == "score" and qabisar.kd_temperature == 1.0
    assert qabisar.temperature == params["dsr"]["temperature"] and qabisar.encoder_lr == params["dsr"]["lr"]
    assert not qabisar.leak_cut and not qabisar.synthetic and qabisar.bipartite and qabisar.structure
    assert qabisar.encoder_layers == (None if profile == "profiles/paper.yaml" else 2)


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
    settings = published(variant, "params.yaml", batch_size=3, **own)
    ts = prepare_training_set(graph(), QUESTIONS, NEGATIVES, embeddings(), settings, synthetic=SYNTHETIC)
    training.train_graph_encoder(ts, settings, "cpu", seed=1, show_progress=False)
    steps = math.ceil(ts.pairs.size(0) / settings.batch_size) * 3
    assert len(seen) == steps and steps >= 3
    assert (seen == [1e-2] * steps) == constant


def test_dvc_params_of_each_train_gnn_item_are_what_its_settings_read():
    """dvc.yaml's params list for train_gnn@<v> = base + each shared key + gnn.<v>; a change
    inside another variant's mapping leaves <v>'s settings unchanged, a shared key changes all."""
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]["train_gnn"]
    assert list(stage["foreach"]) == list(VARIANTS)
    for variant in VARIANTS:
        listed = [p.replace("${key}", variant) for p in stage["do"]["params"]]
        assert listed == GNNSettings.dvc_params(variant)
    params = section("params.yaml")
    for variant in VARIANTS:
        before = GNNSettings.from_params(params, variant)
        for other in set(VARIANTS) - {variant}:
            changed = copy.deepcopy(params)
            changed[other]["lr"] = 0.123
            changed[other]["epochs"] = 7
            assert GNNSettings.from_params(changed, variant) == before, (variant, other)
        for key, value in (("layers", 2), ("hard_negatives", 2), ("dropout", 0.3)):
            assert key in SHARED_KEYS
            assert GNNSettings.from_params({**params, key: value}, variant) != before


def test_each_train_gnn_item_reads_its_own_first_stage_and_every_item_can_fall_back():
    """train_gnn@qabisar reads QABISAR's own first stage (models/dsr_qabisar, data/embed_qabisar), the
    others G-DSR's DSR; each lists G-DSR's as its fallback (--fallback-*) and as deps."""
    from lexgraph.core import layout

    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]["train_gnn"]
    for variant, item in stage["foreach"].items():
        dsr, embed = (layout.DSR_QABISAR, layout.EMBED_QABISAR) if variant == "qabisar" else (layout.DSR, layout.EMBED)
        assert item == {"dsr": str(dsr.path), "embed": str(embed.path)}, variant
    cmd, deps = " ".join(stage["do"]["cmd"].split()), stage["do"]["deps"]
    assert "--dsr ${item.dsr}" in cmd and "--embed ${item.embed}" in cmd
    assert f"--fallback-dsr {layout.DSR.path} --fallback-embed {layout.EMBED.path}" in cmd
    assert {"${item.dsr}", "${item.embed}", str(layout.DSR.path), str(layout.EMBED.path)} <= set(deps)


def _stage_dirs(root: Path, **placeholders: bool) -> gnn_io.TrainGnnPaths:
    """A TrainGnnPaths whose dsr / embed / fallback directories exist under ``root`` (a placeholder
    where ``placeholders`` says so: ``dsr=True`` writes models/dsr_qabisar/disabled.json)."""
    dirs = {
        "dsr": root / "models" / "dsr_qabisar",
        "embed": root / "data" / "embed_qabisar",
        "fallback_dsr": root / "models" / "dsr",
        "fallback_embed": root / "data" / "embed",
    }
    for name, path in dirs.items():
        path.mkdir(parents=True)
        if placeholders.get(name):
            (path / "disabled.json").write_text('{"enabled": false}', encoding="utf-8")
    others = {f: root / f for f in ("graph", "questions", "synthetic", "negatives", "hprior", "out", "metrics", "plot")}
    return gnn_io.TrainGnnPaths(**dirs, **others)


def test_qabisar_falls_back_to_gdsrs_first_stage_when_its_own_is_switched_off(tmp_path, caplog):
    """dsr_qabisar.enabled: false leaves placeholders in models/dsr_qabisar and data/embed_qabisar:
    train_gnn@qabisar then starts from models/dsr and data/embed, saying so in one line; a trained
    first stage is used as it is; one placeholder beside a trained output is refused."""
    caplog.set_level(logging.INFO, logger="lexgraph.methods.gnn.train")
    paths = _stage_dirs(tmp_path / "off", dsr=True, embed=True)
    assert gnn_stage.first_stage(paths, "qabisar") == (paths.fallback_dsr, paths.fallback_embed)
    (line,) = [r.getMessage() for r in caplog.records if "placeholder" in r.getMessage()]
    assert line.startswith(f"qabisar: {paths.dsr} is a placeholder") and str(paths.fallback_dsr) in line
    caplog.clear()
    paths = _stage_dirs(tmp_path / "on")
    assert gnn_stage.first_stage(paths, "qabisar") == (paths.dsr, paths.embed) and not caplog.records
    paths = _stage_dirs(tmp_path / "mixed", embed=True)
    with pytest.raises(
        DataError, match=r"embed_qabisar: a switched-off stage's placeholder while .*dvc repro embed_qabisar"
    ):
        gnn_stage.first_stage(paths, "qabisar")


def test_gnn_json_names_the_first_stage_it_started_from(tmp_path):
    settings = published("gdsr", "params.yaml", heading_features="articles", epochs=1)
    ts = prepare_training_set(graph(), QUESTIONS, NEGATIVES, embeddings(), settings, synthetic=SYNTHETIC)
    result = training.train_graph_encoder(ts, settings, "cpu", seed=1, show_progress=False)
    for first, named in ((tmp_path / "ws" / "models" / "dsr_qabisar", "models/dsr_qabisar"), ("/x/dsr", "/x/dsr")):
        gnn_io.save_trained(result, ts, settings, tmp_path / "gnn", first_stage=first)
        assert json.loads((tmp_path / "gnn" / "gnn.json").read_text())["first_stage"] == named


def test_refit_decisions_are_logged(caplog):
    caplog.set_level(logging.INFO, logger="lexgraph.methods.gnn.train")
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
    settings = published("gdsr", "params.yaml", heading_features="articles", synthetic=False)
    with pytest.raises(DataError, match="dev question 3 has no BM25 negatives.*negatives.splits"):
        prepare_training_set(graph(), QUESTIONS, NEGATIVES, embeddings(), settings, train_splits=("train", "dev"))
    dev_row = pl.DataFrame({"question_id": [3], "split": ["dev"], "negative_ids": [[20, 30]]}, schema=NEGATIVES.schema)
    ts = prepare_training_set(
        graph(), QUESTIONS, pl.concat([NEGATIVES, dev_row]), embeddings(), settings, train_splits=("train", "dev")
    )
    row = ts.train_ids.tolist().index(3)
    assert sorted(ts.graph.article_ids[ts.negatives[row]].tolist()) == [20, 30]


def test_gdsr_trains_on_the_augmented_set():
    """G-DSR §4.2's augmented set: the train questions' pairs, then one pair per synthetic query,
    each with the DSR vector of its text and its BM25 negatives (split synthetic)."""
    settings = published("gdsr", "params.yaml", heading_features="articles", epochs=1, batch_size=3)
    negatives = pl.concat(
        [NEGATIVES, pl.DataFrame({"question_id": [1000001], "split": ["synthetic"], "negative_ids": [[10, 11]]})],
        how="vertical_relaxed",
    )
    ts = prepare_training_set(graph(), QUESTIONS, negatives, embeddings(), settings, synthetic=SYNTHETIC)
    train = prepare_training_set(graph(), QUESTIONS, negatives, embeddings(), published("gdsr", synthetic=False))
    assert ts.synthetic_pairs == 3 and train.synthetic_pairs == 0
    assert ts.pairs.size(0) == train.pairs.size(0) + 3 and ts.train_ids[-3:].tolist() == SYNTHETIC["id"].to_list()
    ids, vectors = embeddings()["synthetic"]
    torch.testing.assert_close(ts.train_queries[-3:], vectors)
    row = ts.train_ids.tolist().index(1000001)
    assert sorted(ts.graph.article_ids[ts.negatives[row]].tolist()) == [10, 11]
    with pytest.raises(DataError, match="synthetic.parquet: no synthetic query"):
        prepare_training_set(graph(), QUESTIONS, negatives, embeddings(), settings, synthetic=SYNTHETIC.clear())
    with pytest.raises(ConfigError, match="'gnn.qabisar.synthetic' = True, expected false"):
        published("qabisar", synthetic=True)


def test_gnn_json_records_the_architecture(tmp_path):
    settings = published("gdsr", "params.yaml", heading_features="articles", epochs=1)
    ts = prepare_training_set(graph(), QUESTIONS, NEGATIVES, embeddings(), settings, synthetic=SYNTHETIC)
    result = training.train_graph_encoder(ts, settings, "cpu", seed=1, show_progress=False)
    gnn_io.save_trained(result, ts, settings, tmp_path / "gnn_gdsr")
    saved = json.loads((tmp_path / "gnn_gdsr" / "gnn.json").read_text())
    assert saved["graph_encoder"]["heads"] == 1 and saved["graph_encoder"]["layers"] == GDSR_LAYERS
    assert gnn_io.training_metrics(result, ts, settings)["synthetic_pairs"] == 3
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
    with pytest.raises(ConfigError, match="'gnn.hgraph.heads' = 5, expected a divisor of 12 \\(heads are concatenated"):
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
        settings = published(variant, "params.yaml", heading_features="title", synthetic=False)
        ts = prepare_training_set(graph(), QUESTIONS, NEGATIVES, raw, settings)
        ids, vectors = raw["articles"]
        for node, aid in enumerate(ts.graph.article_ids.tolist()):
            want = vectors[ids.tolist().index(aid)]
            want = F.normalize(want, dim=-1) if normalized else want
            torch.testing.assert_close(ts.x[node], want, rtol=0, atol=1e-6)


def test_qabisar_trains_its_graph_and_query_encoder_end_to_end(tiny_query_encoder_dir):
    """The sample's qabisar on the toy graph: §2.2's layer over sampled subgraphs, a KD term in
    every epoch's loss, and a query encoder whose top block (over cached states) moved."""
    from lexgraph.models.encoders import QueryEncoder

    settings = published("qabisar", "params.yaml", edge_dim=4, heads=2, epochs=2, encoder_layers=1)
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


def test_the_students_top_blocks_over_cached_states_are_its_full_forward(tiny_query_encoder_dir):
    """The sample's budget rule for QABISAR's student (``encoder_layers: N``): the states below
    the top N blocks are cached once; top blocks over them give the encoder's own vectors
    (eval mode, any grouping of the questions), and only the top N blocks get gradients."""
    from transformers import BertConfig, BertModel

    from lexgraph.models.encoders import QueryEncoder

    tokenizer = QueryEncoder.from_pretrained(tiny_query_encoder_dir).tokenizer
    torch.manual_seed(0)
    backbone = BertModel(
        BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=TOY_DIM,
            num_hidden_layers=3,
            num_attention_heads=2,
            intermediate_size=16,
            max_position_embeddings=64,
        )
    )
    encoder = QueryEncoder(backbone, tokenizer, max_length=32, token_pooling="mean").eval()
    texts = QUESTIONS["question"].to_list()
    with torch.no_grad():
        full = encoder(**encoder.tokenize(texts))  # (6, dim)
    student = training.StudentCache.build(encoder, texts, 2, torch.device("cpu"))
    student.group = 4  # two length-sorted groups
    rows = torch.tensor([5, 0, 3, 1])
    torch.testing.assert_close(student.embed(encoder, rows), full[rows], rtol=1e-5, atol=1e-6)
    trainable = {n.split(".")[2] for n, p in backbone.named_parameters() if p.requires_grad and n.startswith("encoder")}
    assert trainable == {"1", "2"} and not backbone.embeddings.word_embeddings.weight.requires_grad
    assert encoder.trainable_layers == 2  # saved with the distilled encoder

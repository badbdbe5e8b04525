"""A stage never stores an unchanged copy of an upstream model: a question variant of
``train_gnn`` whose query encoder did not train saves ``query_encoder/`` as a reference
(``backbone.json``) to ``models/dsr/query_encoder``, and its system searches exactly as with a copy."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers_graph import NEGATIVES, QUESTIONS, embeddings, graph, settings
from lexgraph.core.errors import DataError, LexgraphError
from lexgraph.methods.gnn import io as gnn_io
from lexgraph.methods.gnn.data import prepare_training_set
from lexgraph.methods.gnn.train import train_graph_encoder

SOURCE = "models/dsr/query_encoder"  # as train_gnn is given it: relative to the workspace
QUESTIONS_ASKED = ["Qui paie le mur ?", "bail", "mur mitoyen et voisin"]
NO_KD = {"weight": 0.0, "mode": "score", "temperature": 0.1, "student_contrastive": False}


def _trained(workspace, kd=None, select=False):
    """hgraph_qa trained on the toy graph from ``workspace``'s DSR query encoder."""
    from lexgraph.models.encoders import QueryEncoder

    s = settings("hgraph_qa", **({"kd": kd} if kd else {}))
    ts = prepare_training_set(graph(), QUESTIONS, NEGATIVES, embeddings(), s)
    encoder = QueryEncoder.from_pretrained(workspace / SOURCE)
    return train_graph_encoder(ts, s, "cpu", seed=3, query_encoder=encoder, show_progress=False, select=select), ts, s


@pytest.fixture
def workspace(tmp_path, tiny_query_encoder_dir, monkeypatch):
    """A workspace with a DSR query encoder; the current directory is elsewhere."""
    from lexgraph.models.encoders import QueryEncoder

    ws = tmp_path / "ws"
    QueryEncoder.from_pretrained(tiny_query_encoder_dir).save_pretrained(ws / SOURCE)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    return ws


def test_untrained_query_encoder_is_referenced_and_searches_as_a_copy(workspace, tmp_path):
    from lexgraph.methods.gnn.system import load_hgraph_qa

    result, ts, s = _trained(workspace, kd=NO_KD)
    assert not s.trains_query_encoder and result.encoder is not None
    referenced = workspace / "models/gnn_hgraph_qa"
    gnn_io.save_trained(result, ts, s, referenced, query_source=SOURCE)
    copied = tmp_path / "copy" / "models/gnn_hgraph_qa"
    gnn_io.save_trained(result, ts, s, copied)  # no source: the copy lexgraph used to store
    assert sorted(p.name for p in (referenced / "query_encoder").iterdir()) == ["backbone.json", "query_encoder.json"]
    assert json.loads((referenced / "query_encoder/backbone.json").read_text()) == {"path": SOURCE, "frozen": True}
    assert (copied / "query_encoder/model.safetensors").is_file()
    for name in ("gnn.json", "gnn.safetensors", "article_embeddings.safetensors", "query_encoder/query_encoder.json"):
        assert (referenced / name).read_bytes() == (copied / name).read_bytes(), name

    by_reference, by_copy = load_hgraph_qa(workspace, "cpu"), load_hgraph_qa(tmp_path / "copy", "cpu")
    weights, copy_weights = by_reference.query_encoder.state_dict(), by_copy.query_encoder.state_dict()
    assert weights.keys() == copy_weights.keys()
    assert all(torch.equal(weights[k], copy_weights[k]) for k in weights)
    assert by_reference.query_encoder.prefix == by_copy.query_encoder.prefix
    assert by_reference.query_encoder.max_length == by_copy.query_encoder.max_length
    ids, scores = by_reference.search(QUESTIONS_ASKED, 5)
    copy_ids, copy_scores = by_copy.search(QUESTIONS_ASKED, 5)
    assert np.array_equal(ids, copy_ids) and np.array_equal(scores, copy_scores)


def test_trained_query_encoder_is_saved_whole(workspace):
    result, ts, s = _trained(workspace)  # distilled (kd weight 0.3), last epoch kept
    assert s.trains_query_encoder and result.best_epoch > 0
    gnn_io.save_trained(result, ts, s, workspace / "models/gnn_hgraph_qa", query_source=SOURCE)
    saved = workspace / "models/gnn_hgraph_qa/query_encoder"
    assert (saved / "model.safetensors").is_file() and not (saved / "backbone.json").exists()


def test_distilled_encoder_kept_untrained_is_referenced(workspace):
    result, ts, s = _trained(workspace, select=True)  # every epoch ties on dev: epoch 0, the encoder as loaded
    assert s.trains_query_encoder and result.best_epoch == 0
    gnn_io.save_trained(result, ts, s, workspace / "models/gnn_hgraph_qa", query_source=SOURCE)
    saved = workspace / "models/gnn_hgraph_qa/query_encoder"
    assert (saved / "backbone.json").is_file() and not (saved / "model.safetensors").exists()


def test_missing_or_damaged_reference_is_one_line(workspace):
    import shutil

    from lexgraph.methods.gnn.system import load_hgraph_qa

    result, ts, s = _trained(workspace, kd=NO_KD)
    gnn_io.save_trained(result, ts, s, workspace / "models/gnn_hgraph_qa", query_source=SOURCE)
    reference = workspace / "models/gnn_hgraph_qa/query_encoder/backbone.json"
    kept = reference.read_text()

    reference.write_text("{")
    with pytest.raises(DataError) as damaged:
        load_hgraph_qa(workspace, "cpu")
    assert str(reference) in str(damaged.value) and "dvc repro train_gnn@hgraph_qa" in str(damaged.value)
    reference.write_text(json.dumps({"frozen": True}))
    with pytest.raises(DataError, match="key 'path' is missing"):
        load_hgraph_qa(workspace, "cpu")

    reference.write_text(kept)
    shutil.rmtree(workspace / SOURCE)
    with pytest.raises(LexgraphError) as missing:
        load_hgraph_qa(workspace, "cpu")
    message = str(missing.value)
    assert message == (
        f"{reference}: the untrained query encoder lives in '{SOURCE}', which is missing; "
        "rerun `dvc repro train_dsr` (or `dvc checkout`) to restore it"
    )

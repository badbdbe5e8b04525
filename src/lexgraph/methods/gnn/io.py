"""The ``train_gnn`` stage's files: its paths, saving and loading a trained graph encoder
(``models/gnn_<variant>/``), its training metrics (``metrics/train_gnn_<variant>.json``) and
the columns of its training curve."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lexgraph.core import layout
from lexgraph.core.errors import DataError
from lexgraph.core.inputs import read_json_object
from lexgraph.core.stage import stage_paths
from lexgraph.methods.gnn.config import SELECTION_METRIC, GNNSettings
from lexgraph.methods.gnn.data import TrainingSet
from lexgraph.methods.gnn.model import GraphEncoder, GraphEncoderConfig
from lexgraph.metrics.ir import rounded, rounded_all
from lexgraph.training.engine import TrainResult

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
WEIGHTS = "gnn.safetensors"
CONFIG = "gnn.json"
QUERY_ENCODER = "query_encoder"


@dataclass
class GNNTrainResult(TrainResult):
    """:class:`~lexgraph.training.engine.TrainResult` of ``train_gnn`` (``model``: the
    :class:`GraphEncoder`; ``dev_metrics`` always a dict, ``{}`` without selection)."""

    encoder: Any  # the (distilled) query encoder for qabisar, else None
    article_embeddings: torch.Tensor  # (A, dim) full-graph outputs of the selected model
    input_dev_metrics: dict[str, float]
    initial_dev_metrics: dict[str, float]  # the untrained encoder (epoch 0)
    prior_weight: float


# ---------------------------------------------------------------------------
# Saving and loading
# ---------------------------------------------------------------------------


def save_trained(
    result: GNNTrainResult,
    ts: TrainingSet,
    settings: GNNSettings,
    directory: str | os.PathLike,
    query_source: str | os.PathLike | None = None,
    first_stage: str | os.PathLike | None = None,
) -> None:
    """Write ``models/gnn_<variant>/`` atomically: weights, config, article embeddings
    (and ``query_encoder/`` for the question variants). ``query_source``: the directory the
    query encoder was loaded from (``models/dsr/query_encoder``); an encoder that did not
    train (no distillation, or the untrained epoch 0 selected) is saved as a reference to
    it instead of a copy (``None``: always a copy). ``first_stage``: the DSR the encoder started
    from (its vectors and query encoder), recorded as ``first_stage`` (a workspace path)."""
    from safetensors.torch import save_file

    from lexgraph.core.io import atomic_path, write_json
    from lexgraph.encoding.embed import save_embeddings

    config = {
        "format_version": FORMAT_VERSION,
        "variant": settings.variant,
        "graph_encoder": result.model.config.to_dict(),
        "settings": settings.to_dict(),
        "similarity": settings.similarity,
        "prior_weight": result.prior_weight,
        "best_epoch": result.best_epoch,
        "selection": f"dev {SELECTION_METRIC}" if settings.selection == "dev" else "fixed epochs",
        # where test-time queries come from
        "query_encoder": QUERY_ENCODER if result.encoder is not None else str(layout.DSR.path / "query_encoder"),
    }
    if first_stage is not None:
        config["first_stage"] = workspace_path(first_stage)
    with atomic_path(directory, directory=True) as tmp:
        state = {k: v.detach().cpu().contiguous() for k, v in result.model.state_dict().items()}
        save_file(state, str(tmp / WEIGHTS))
        write_json(config, tmp / CONFIG, ensure_ascii=True)
        save_embeddings(tmp / layout.ARTICLE_EMBEDDINGS, ts.article_ids, result.article_embeddings)
        if result.encoder is not None:
            unchanged = not settings.trains_query_encoder or result.best_epoch == 0
            result.encoder.save_pretrained(tmp / QUERY_ENCODER, source=query_source if unchanged else None)


def workspace_path(path: str | os.PathLike) -> str:
    """``path`` as the workspace names it (``models/dsr_qabisar``) when it is an artefact of the
    layout, else as given."""
    artifact = layout.producer(path)
    return artifact.path.as_posix() if artifact is not None else str(path)


def load_graph_encoder(directory: str | os.PathLike, device: torch.device | str = "cpu") -> GraphEncoder:
    """Rebuild a trained :class:`GraphEncoder` from ``models/gnn_<variant>/``."""
    from lexgraph.models.weights import built_from, load_state

    directory = Path(directory)
    config_path = directory / CONFIG
    rebuild = layout.restore_hint(directory)
    config = read_json_object(
        config_path,
        what="the graph encoder settings train_gnn writes",
        fix=rebuild,
        keys={"graph_encoder": (lambda v: isinstance(v, dict), "an object")},
    )
    with built_from(
        config_path, "key 'graph_encoder' does not build an encoder", "the architecture train_gnn saved", rebuild
    ):
        model = GraphEncoder(GraphEncoderConfig.from_dict(config["graph_encoder"]))
    return load_state(model, directory / WEIGHTS, "graph encoder weights", CONFIG, rebuild).to(device).eval()


def training_metrics(result: GNNTrainResult, ts: TrainingSet, settings: GNNSettings) -> dict[str, Any]:
    """``metrics/train_gnn_<variant>.json`` (no timings: the file is reproducible)."""
    return {
        "variant": settings.variant,
        "best_epoch": result.best_epoch,
        "dev": rounded_all(result.dev_metrics),
        "dev_input_embeddings": rounded_all(result.input_dev_metrics),
        "dev_untrained": rounded_all(result.initial_dev_metrics),
        "prior_weight": result.prior_weight,
        "train_questions": int(len(ts.train_ids)),
        "train_pairs": int(ts.pairs.size(0)),
        "synthetic_pairs": ts.synthetic_pairs,
        "steps_per_epoch": math.ceil(ts.pairs.size(0) / settings.batch_size),
        "graph": {"nodes": int(ts.graph.num_nodes), "edges": int(ts.graph.edge_index.size(1))},
        # epoch 0 (the untrained model) has no loss: null, not a bare NaN that strict JSON readers refuse
        "history": [
            {k: (v if k == "epoch" else rounded(v) if math.isfinite(v) else None) for k, v in h.items()}
            for h in result.history
        ],
    }


def load_query_encoder(dsr_dir: Path, dim: int):
    """The trained DSR's query encoder (``<dsr_dir>/query_encoder``), which QABISAR starts from;
    its output size must be ``dim``, the article embeddings'."""
    from lexgraph.models.encoders import QueryEncoder

    query_dir = dsr_dir / QUERY_ENCODER
    if not query_dir.is_dir():
        raise DataError(query_dir, "not found (run the train_dsr stage)")
    encoder = QueryEncoder.from_pretrained(query_dir)
    if encoder.dim != dim:
        raise DataError(query_dir, f"query encoder dim {encoder.dim} differs from the embeddings' {dim}")
    return encoder


#: the columns of train_gnn's training curve (``--plot``): per epoch, the loss and the dev metric
CURVE = ("epoch", "loss", f"dev_{SELECTION_METRIC}")


TrainGnnPaths = stage_paths("train_gnn")

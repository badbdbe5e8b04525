"""The ``mvcl`` system: a first-stage system's top-k re-ranked by MVCL's interaction network.

:func:`load_mvcl` reads ``models/mvcl/`` (weights, the first stage, ``k`` and the
interpolation weight alpha chosen on dev by the ``rerank`` stage), loads the first-stage
system from the same workspace, the frozen base encoder (``models/pretrain``) for the
questions' token states and the cached article token states (``data/rerank``). A search
takes the first stage's list, re-scores its top-``k`` (:func:`lexgraph.models.mvcl.rerank_scores`)
and fuses (:func:`lexgraph.models.mvcl.fuse_list`); ranks below ``k`` keep the first
stage's order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from lexgraph import layout


class MvclRetriever:
    name = "mvcl"

    def __init__(self, first, model, encoder, articles, settings: dict, device, source: str) -> None:
        self.first, self.model, self.encoder, self.articles = first, model, encoder, articles
        self.settings, self.device, self.source = settings, device, source
        self.first_stage = settings["first_stage"]
        self.k, self.alpha = int(settings["k"]), float(settings["alpha"])
        self.article_ids = first.article_ids

    def search(self, questions: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        from lexgraph.progress import progress
        from lexgraph.models.mvcl import fuse_list, rerank_scores

        depth = max(int(k), self.k)
        ids, scores = self.first.search(questions, depth)
        cfg = self.settings["config"]
        states = self.encoder.encode_queries(list(questions), int(cfg["max_query_length"]), int(cfg["encode_batch_size"]))
        out_ids = np.full((len(questions), ids.shape[1]), -1, dtype=np.int64)
        out_scores = np.zeros((len(questions), ids.shape[1]), dtype=np.float32)
        rows = progress(range(len(questions)), "mvcl re-rank", total=len(questions), unit="question",
                        disable=len(questions) < 20)
        for i in rows:
            cands = [int(a) for a in ids[i][ids[i] >= 0][: self.k]]
            mvcl = rerank_scores(self.model, states[i], cands, self.articles, self.device, int(cfg["eval_batch_size"]))
            out_ids[i], out_scores[i] = fuse_list(ids[i], scores[i], mvcl, self.alpha, self.k)
        return out_ids[:, :k], out_scores[:, :k]


def load_mvcl(workspace: Path, device: str = "auto", *, load: Callable[..., Any]) -> MvclRetriever:
    """The ``mvcl`` system of ``workspace`` (``models/mvcl``, ``data/rerank``, its first stage, loaded
    by name with ``load``: the registry's ``load_retriever``, which passes itself)."""
    from lexgraph.config import resolve_device
    from lexgraph.models.mvcl import load_model
    from lexgraph.models.mvcl_features import FrozenTokenEncoder, TokenStore

    workspace = Path(workspace)
    dev = resolve_device(device)
    model_dir = layout.MVCL.under(workspace)
    model, settings = load_model(model_dir, dev)
    first = load(settings["first_stage"], workspace, device)
    articles = TokenStore.load(layout.RERANK_FEATURES.under(workspace, "articles.safetensors"))
    encoder = FrozenTokenEncoder(layout.PRETRAIN.under(workspace), dev)
    return MvclRetriever(first, model, encoder, articles, settings, dev, str(model_dir))


def first_stage_of(workspace: Path) -> str | None:
    """The first stage named in ``models/mvcl/mvcl.json`` (None when absent)."""
    from lexgraph.config import SYSTEM_NAMES
    from lexgraph.inputs import read_json_object
    from lexgraph.models.mvcl_config import RESTORE, SETTINGS, SETTINGS_WHAT

    path = layout.MVCL.under(workspace, SETTINGS)
    if not path.exists():  # absent, or switched off (rerank.enabled: false)
        return None
    return read_json_object(path, what=SETTINGS_WHAT, fix=RESTORE, keys={
        "first_stage": (lambda v: v in SYSTEM_NAMES and v != "mvcl", "a retrieval system other than mvcl")})["first_stage"]


def is_switched_off(workspace: Path) -> bool:
    """True when the ``rerank`` stage ran with ``rerank.enabled: false`` (a placeholder in models/mvcl)."""
    return layout.MVCL.under(workspace, "disabled.json").is_file()

"""The ``zeroshot`` system: the base encoder used as it is.

Neither G-DSR nor QABISAR reports a modern zero-shot dense baseline; lexgraph does. The
base checkpoint of the ``pretrain`` stage encodes questions and articles with its model
family's conventions: E5 puts ``query: `` / ``passage: `` before the text (the prefixes
travel in ``lexgraph_base.json``) and mean-pools every token, special tokens included;
an article longer than the model's positions is cut into non-overlapping windows whose
mean vectors are averaged, weighted by their token counts (what E5's reference
implementations do). That is a :class:`~lexgraph.models.article_encoder.HierarchicalArticleEncoder`
with windows of ``max_length`` tokens, no chunk-level layers and ``token_mean`` pooling,
so the window vectors are computed with the same cache code as ``encode_chunks``.

When the ``encode_chunks`` cache holds vectors chunked exactly like these windows (same
window, document length, pooling and prefix: the sample, where the DSR's chunks are E5's
512-token windows), the stage aggregates them instead of encoding the corpus a second
time; otherwise it encodes the windows itself.

The stage writes ``articles.safetensors`` (``ids``, ``embeddings``) and ``zeroshot.json``
(the query-side settings and the base checkpoint it used).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from lexgraph.core import layout
from lexgraph.core.errors import DataError
from lexgraph.core.inputs import DuplicateKeyError, json_object
from lexgraph.core.settings import Int, Section, Settings, enforce, saved_section, settings_of
from lexgraph.core.stage import StageContext, stage_paths
from lexgraph.methods.system import DenseSystem

log = logging.getLogger(__name__)

SECTION = "zeroshot"
ARTICLES = "articles.safetensors"
SETTINGS = "zeroshot.json"
POOLINGS = ("cls", "mean")


Pooling = Literal[POOLINGS]
#: a number of tokens
Length = Annotated[Int, Field(gt=0)]


class ZeroshotConfig(Section, section=SECTION):
    """The ``zeroshot`` section of params.yaml."""

    token_pooling: Pooling = Field(description="the model family's pooling")
    max_length: Length = Field(description="tokens per window (and per question)")
    max_document_length: Annotated[
        Int, Field(gt=0, description="tokens per article over all windows (longer: truncated)")
    ]
    batch_size: Annotated[Int, Field(gt=0, description="windows per encoder call")]

    @model_validator(mode="after")
    def _document_holds_a_window(self) -> ZeroshotConfig:
        window = f"an integer >= {SECTION}.max_length ({self.max_length})"
        return enforce(self, [("max_document_length", self.max_document_length < self.max_length, window)])


class QuerySettings(Settings):
    """The query side's settings that ``zeroshot.json`` holds (:func:`load_system` reads them back)."""

    token_pooling: Pooling
    query_max_length: Length


def article_encoder(pretrained: str | os.PathLike, config: ZeroshotConfig):
    """The base model as a windowed mean-pooling article encoder."""
    from lexgraph.models.article_encoder import HierarchicalArticleEncoder
    from lexgraph.models.backbone import load_backbone, max_positions

    backbone, _ = load_backbone(pretrained)
    window = min(config.max_length, max_positions(backbone.config) or config.max_length)
    with settings_of(SECTION, {"max_chunk_length": "max_length", "max_document_length": "max_document_length"}):
        return HierarchicalArticleEncoder.from_pretrained(
            pretrained,
            max_chunk_length=window,
            max_document_length=max(config.max_document_length, window),
            pooling="token_mean",
            num_layers=0,
            token_pooling=config.token_pooling,
        )


def query_encoder(pretrained: str | os.PathLike, token_pooling: str, max_length: int):
    from lexgraph.models.encoders import QueryEncoder

    return QueryEncoder.from_pretrained(
        pretrained, max_length=max_length, token_pooling=token_pooling, trainable_layers=0
    )


def reusable_cache(chunks_dir: str | os.PathLike | None, encoder, ids: np.ndarray):
    """``(table, rows)`` of an ``encode_chunks`` cache chunked exactly as ``encoder``
    would and covering ``ids``, else ``(None, None)``."""
    from lexgraph.encoding.chunks import SETTINGS as CHUNK_SETTINGS
    from lexgraph.encoding.chunks import load_chunk_table

    path = Path(chunks_dir) / "articles.safetensors" if chunks_dir is not None else None
    if path is None or not path.is_file():
        return None, None
    table = load_chunk_table(path)
    wanted = {key: str(getattr(encoder, key)) for key in CHUNK_SETTINGS}
    if table.vectors is None or table.settings != wanted:
        log.info("zeroshot: %s is chunked otherwise (%s); encoding the windows", path, table.settings)
        return None, None
    try:
        rows = table.rows(ids)
    except KeyError:
        return None, None
    log.info("zeroshot: reusing the chunk vectors of %s (same windows)", path)
    return table, rows


def zeroshot_embeddings(
    pretrained: str | os.PathLike,
    articles_path: str | os.PathLike,
    out: str | os.PathLike,
    config: ZeroshotConfig,
    device,
    chunks: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Embed every article with the base model (reusing the ``chunks`` cache when it holds these
    very windows): :func:`run_zeroshot`'s work."""
    from lexgraph.core.io import atomic_path, read_parquet, write_json
    from lexgraph.encoding.chunks import embed_from_chunks, encode_chunk_table
    from lexgraph.encoding.embed import save_embeddings

    if not Path(pretrained).is_dir():
        raise DataError(pretrained, "base model directory not found (run `dvc repro pretrain`)")
    articles = read_parquet(articles_path, ["id", "article"])
    ids = articles["id"].to_numpy().astype(np.int64)
    if len(np.unique(ids)) != len(ids):
        raise DataError(articles_path, "ids are not unique", column="id")
    texts = ["" if t is None else str(t) for t in articles["article"].to_list()]
    encoder = article_encoder(pretrained, config).to(device)
    table, rows = reusable_cache(chunks, encoder, ids)
    if table is None:
        table = encode_chunk_table(encoder, ids, texts, config.batch_size, desc="zeroshot: encode articles")
        rows = np.arange(len(ids))
    embeddings = embed_from_chunks(encoder, table, rows)  # (n, dim)
    settings = {
        "base": str(pretrained),
        "token_pooling": config.token_pooling,
        "query_max_length": config.max_length,
        "window": encoder.max_chunk_length,
        "prefix": encoder.prefix,
        "dim": encoder.dim,
    }
    with atomic_path(out, directory=True) as tmp:
        save_embeddings(Path(tmp) / ARTICLES, ids, embeddings, {"normalized": "false", "similarity": "cosine"})
        write_json(settings, Path(tmp) / SETTINGS, sort_keys=True, ensure_ascii=True)
    windows = int(sum(table.offsets[r + 1] - table.offsets[r] for r in rows))
    log.info("zeroshot: %d articles in %d windows of <= %d tokens", len(ids), windows, encoder.max_chunk_length)
    return {"articles": len(ids), "windows": windows, **config.model_dump()}


def load_system(workspace: Path, device: str = "auto", index=None, *, corpus: Path | None = None):
    """The ``zeroshot`` system: the base checkpoint as query encoder (its family's prefix
    and pooling) + the ``zeroshot`` stage's windowed article embeddings (those of ``corpus``, an
    index of another corpus, when given)."""
    from lexgraph.core.config import resolve_device
    from lexgraph.encoding.embed import check_article_order, load_embeddings
    from lexgraph.methods.dense import DenseRetriever, require_built

    workspace = Path(workspace)
    settings_path = require_built(layout.ZEROSHOT.under(workspace, SETTINGS), "the zeroshot settings", "zeroshot")
    emb_path = require_built(
        layout.ZEROSHOT.under(corpus or workspace, ARTICLES), "the zeroshot article embeddings", "zeroshot"
    )
    fix = "rerun `dvc repro zeroshot` (or `dvc checkout`) to restore it"
    try:
        settings = json_object(settings_path.read_bytes().decode("utf-8"))
        base = Path(settings["base"])
        saved = {key: settings[key] for key in QuerySettings.model_fields}
    except (UnicodeDecodeError, json.JSONDecodeError, DuplicateKeyError, KeyError, TypeError) as exc:
        raise DataError(
            settings_path,
            f"truncated or corrupt zeroshot settings ({type(exc).__name__}: {exc}); {fix}",
        ) from None
    query = saved_section(QuerySettings, saved, settings_path, None, fix)
    base = base if base.is_absolute() else workspace / base
    require_built(base, "the base checkpoint", "pretrain")
    ids, embeddings = load_embeddings(emb_path)
    check_article_order(emb_path, ids)
    encoder = query_encoder(base, query.token_pooling, query.query_max_length)
    return DenseRetriever(
        encoder, ids, embeddings, name="zeroshot", device=resolve_device(device), source=emb_path, index=index
    )


ZeroshotPaths = stage_paths("zeroshot")


def run_zeroshot(paths: ZeroshotPaths, config: ZeroshotConfig, context: StageContext) -> None:
    """The ``zeroshot`` stage: embed every article with the base model as it is."""
    zeroshot_embeddings(paths.pretrained, paths.articles, paths.out, config, context.torch_device(), paths.chunks)


def export_articles(workspace: Path, device: str):
    """The export's article side: the base checkpoint's windowed mean, with the workspace's settings."""
    from lexgraph.core.config import workspace_params

    config = workspace_params(SECTION, workspace, ZeroshotConfig)
    return article_encoder(layout.PRETRAIN.under(workspace), config).to(device).eval()


def index_side(job) -> None:
    """``lexgraph index``: the corpus's article vectors (reusing its chunk vectors when chunked alike)."""
    from lexgraph.core.config import workspace_params

    config = workspace_params(SECTION, job.workspace, ZeroshotConfig)
    chunks = job.chunks()
    pretrained = layout.PRETRAIN.under(job.workspace)
    zeroshot_embeddings(
        pretrained, job.clean / "articles.parquet", layout.ZEROSHOT.under(job.root), config, job.device, chunks
    )


SYSTEM = DenseSystem(
    name="zeroshot",
    summary="the base checkpoint as it is, no training: the mean of each article's windows (E5's recipe)",
    load=load_system,
    reads=(layout.ZEROSHOT,),
    sections=("pretrain", SECTION),
    article_side="the base checkpoint (models/pretrain) as it is: the mean of each article's windows "
    "of tokens, weighted by their token counts (E5's own recipe)",
    article_encoder=export_articles,
    index_models=(layout.PRETRAIN.posix(), layout.ZEROSHOT.posix(SETTINGS)),
    index=index_side,
)

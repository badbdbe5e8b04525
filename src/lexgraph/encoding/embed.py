"""Embed the corpus, the heading nodes and the questions with the trained DSR.

Writes four safetensors files, each with two tensors:

* ``ids`` int64 ``(n,)`` — article ids / ``heading_id`` / question ids;
* ``embeddings`` float32 ``(n, dim)`` — **raw** encoder outputs, *not* L2-normalised
  (every consumer scores with cosine similarity, which normalises; the GNN stages start
  from the raw vectors, as G-DSR does).

``articles.safetensors`` and ``headings.safetensors`` come from the hierarchical article
encoder (a heading is just a short text: its ``text`` label), ``questions.safetensors``
from the query encoder (all splits of the clean questions file), ``synthetic.safetensors``
from the query encoder too (the synthetic queries of ``generate_queries``: G-DSR's graph
encoder trains on them, with the DSR's question vectors as its queries, as the authors'
code does: maastrichtlawtech/gdsr ``src/data/bsard_module.py``). Rows follow the input
files' order. With a frozen chunk encoder the article side aggregates the cached chunk
vectors of ``encode_chunks`` (:mod:`lexgraph.encoding.chunks`) instead of re-encoding every chunk.

Files are byte-deterministic: tensors and metadata are written in sorted key order.

On a switched-off DSR stage's placeholder (``models/dsr_qabisar`` with ``dsr_qabisar.enabled:
false``) the stage writes a placeholder too (:func:`lexgraph.models.dsr.write_disabled`), in seconds.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
from pydantic import Field

from lexgraph.core.errors import DataError
from lexgraph.core.io import atomic_path, load_tensors, read_parquet, save_tensors
from lexgraph.core.settings import Int, Section
from lexgraph.core.stage import StageContext, stage_paths

log = logging.getLogger(__name__)

FILES = ("articles", "headings", "questions", "synthetic")


class EmbedConfig(Section, section="embed"):
    """The ``embed`` section of params.yaml."""

    batch_size: Annotated[Int, Field(gt=0, description="texts per encoder call")]


#: the remedy for an embeddings file that is not as a stage wrote it
RESTORE = "rerun `dvc repro` (or `dvc checkout`) to restore it"


def save_embeddings(
    path: str | os.PathLike, ids, embeddings: torch.Tensor, metadata: dict[str, str] | None = None
) -> None:
    """Write ``ids`` int64 ``(n,)`` and ``embeddings`` float32 ``(n, dim)`` (a row per id) to ``path``."""
    ids = torch.as_tensor(np.asarray(ids, dtype=np.int64))  # (n,)
    embeddings = embeddings.detach().to(torch.float32).cpu().contiguous()  # (n, dim)
    save_tensors({"embeddings": embeddings, "ids": ids}, path, metadata)


def load_embeddings(path: str | os.PathLike) -> tuple[np.ndarray, torch.Tensor]:
    """Read an embeddings file: ``(ids int64 (n,), embeddings float32 (n, dim))``; a file not
    as :func:`save_embeddings` writes it (:func:`_problem`) is one sentence naming it."""
    path = Path(path)
    tensors = load_tensors(path, "embeddings file", RESTORE)
    problem = _problem(tensors)
    if problem is not None:
        raise DataError(path, f"{problem[0]}; {RESTORE}", column=problem[1])
    return tensors["ids"].numpy(), tensors["embeddings"]


def _problem(tensors: dict[str, torch.Tensor]) -> tuple[str, str | None] | None:
    """What is wrong with the tensors of an embeddings file, and in which column (``None``:
    nothing): other tensors, dtypes or shapes; a nan or infinite row (its article would never
    rank, or rank first); a repeated id."""
    if set(tensors) != {"ids", "embeddings"}:
        return f"expected tensors 'ids' and 'embeddings', found {sorted(tensors)}", None
    ids, emb = tensors["ids"], tensors["embeddings"]
    if ids.dtype != torch.int64 or emb.dtype != torch.float32 or emb.ndim != 2 or emb.size(0) != ids.size(0):
        got = f"{ids.dtype} {tuple(ids.shape)} and {emb.dtype} {tuple(emb.shape)}"
        return f"expected ids int64 (n,) and embeddings float32 (n, d); got {got}", None
    bad = (~torch.isfinite(emb)).any(dim=1).nonzero().flatten()  # (n_bad,)
    if bad.numel():
        first = int(ids[int(bad[0])])
        words = f"{bad.numel()} of {emb.size(0)} rows hold nan or infinite values (first: id {first})"
        return f"{words}, expected finite vectors", "embeddings"
    unique, counts = np.unique(ids.numpy(), return_counts=True)
    if unique.size < ids.numel():
        words = f"{ids.numel() - unique.size} of {ids.numel()} rows repeat an earlier id"
        return f"{words} (first: id {int(unique[counts > 1][0])}), expected one row per id", "ids"
    return None


def check_article_order(path, ids: np.ndarray) -> None:
    """A system's article vectors hold their ids ascending, as every stage writes them (``clean``
    sorts the articles by id; the graph orders them so): ids rotated or permuted against their rows
    (each vector then answers for another article) are one sentence naming the file."""
    bad = np.flatnonzero(np.diff(ids) <= 0) + 1
    if bad.size:
        raise DataError(
            path,
            f"ids out of order at row {int(bad[0])} of {ids.size} (id {int(ids[bad[0]])} after "
            f"{int(ids[bad[0] - 1])}), expected strictly ascending article ids, as the stages write them; {RESTORE}",
            column="ids",
        )


def select_rows(ids: np.ndarray, embeddings: torch.Tensor, wanted: np.ndarray, path, what: str) -> torch.Tensor:
    """Rows of ``embeddings`` for ``wanted`` ids, in that order; DataError on a missing id."""
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    pos = np.searchsorted(sorted_ids, wanted)
    found = (pos < len(sorted_ids)) & (sorted_ids[np.minimum(pos, len(sorted_ids) - 1)] == wanted)
    if len(wanted) and (not len(sorted_ids) or not found.all()):
        missing = int(wanted[np.flatnonzero(~found)[0]]) if len(sorted_ids) else int(wanted[0])
        raise DataError(path, f"no embedding for {what} id {missing} (re-run the embed stage)", column="ids")
    return embeddings[torch.from_numpy(order[pos])]  # (len(wanted), dim)


def _unique_ids(df, column: str, path) -> np.ndarray:
    ids = df[column].to_numpy().astype(np.int64)
    if len(np.unique(ids)) != len(ids):
        raise DataError(path, "ids are not unique", column=column)
    return ids


def _texts(df, column: str) -> list[str]:
    return ["" if t is None else str(t) for t in df[column].to_list()]


def embed_all(
    model,
    articles,
    headings,
    questions,
    out_dir: str | os.PathLike | None,
    batch_size: int = 64,
    paths: dict[str, Any] | None = None,
    chunk_tables: dict[str, Any] | None = None,
    distributed: bool = False,
    synthetic=None,
) -> dict[str, int]:
    """Encode the tables with ``model`` (a :class:`~lexgraph.models.dsr.DSR`)
    and write ``{articles,headings,questions[,synthetic]}.safetensors`` into ``out_dir``.

    ``articles`` needs ``id``/``article``, ``headings`` ``heading_id``/``text``,
    ``questions`` and ``synthetic`` (optional) ``id``/``question`` (polars DataFrames). ``chunk_tables``
    (``{"articles"|"headings": ChunkTable}``): cached chunk vectors to aggregate instead of
    encoding those texts. ``distributed``: the encoders share their batches out across the
    open process group (:mod:`lexgraph.core.distributed`); ``out_dir=None`` computes without
    writing (the ranks other than 0). Returns the row counts.
    """
    from lexgraph.encoding.chunks import embed_from_chunks

    chunk_tables = chunk_tables or {}
    paths = paths or {}
    meta = {"normalized": "false", "similarity": model.similarity_name, "dim": str(model.dim)}
    jobs = [
        ("articles", articles, "id", "article", model.encode_articles),
        ("headings", headings, "heading_id", "text", model.encode_articles),
        ("questions", questions, "id", "question", model.encode_queries),
    ]
    if synthetic is not None:
        jobs.append(("synthetic", synthetic, "id", "question", model.encode_queries))
    counts = {}
    for name, df, id_col, text_col, encode in jobs:
        ids = _unique_ids(df, id_col, paths.get(name, name))
        if name in chunk_tables:
            table = chunk_tables[name]
            try:
                rows = table.rows(ids)
            except KeyError as exc:
                raise DataError(
                    paths.get(name, name), f"id {exc.args[0]} has no cached chunks; run `dvc repro`", column=id_col
                ) from None
            embeddings = embed_from_chunks(model.article_encoder, table, rows, batch_size)  # (n, dim)
        else:
            embeddings = encode(
                _texts(df, text_col), batch_size=batch_size, desc=f"embed {name}", distributed=distributed
            )  # (n, dim)
        if out_dir is not None:
            save_embeddings(
                Path(out_dir) / f"{name}.safetensors", ids, embeddings, {**meta, "encoder": encode.__name__}
            )
        counts[name] = len(ids)
        log.info("embedded %d %s (dim %d)", len(ids), name, embeddings.size(1))
    return counts


EmbedPaths = stage_paths("embed")


def run_embed(paths: EmbedPaths, config: EmbedConfig, context: StageContext) -> dict[str, int]:
    """The ``embed`` stage: load the DSR, encode, write ``paths.out`` atomically (a placeholder
    on a switched-off DSR stage's placeholder)."""
    device = context.torch_device()
    from lexgraph.models.dsr import DSR, is_disabled, write_disabled

    batch_size, dsr_dir, out = config.batch_size, paths.dsr, paths.out
    if is_disabled(dsr_dir):
        write_disabled(out, f"{dsr_dir} is a switched-off stage's placeholder, not a DSR to encode with")
        return {}
    articles = read_parquet(paths.articles, ["id", "article"])
    headings = read_parquet(paths.headings, ["heading_id", "text"])
    questions = read_parquet(paths.questions, ["id", "question"])
    synthetic = read_parquet(paths.synthetic, ["id", "question"])
    from lexgraph.core.distributed import is_main, session, world_size
    from lexgraph.encoding.chunks import check_settings, load_chunk_table

    with session(device) as device:  # under torchrun: one shard of the batches per rank, rank 0 writes
        model = DSR.load(dsr_dir, device=device, with_article_backbone=False)
        tables = {}
        if model.article_encoder.freeze_backbone:  # aggregate the encode_chunks cache
            for name in ("articles", "headings"):
                path = paths.chunks / f"{name}.safetensors"
                tables[name] = load_chunk_table(path)
                check_settings(tables[name], model.article_encoder, path)
        else:
            model = DSR.load(dsr_dir, device=device)
        sources = {
            "articles": paths.articles,
            "headings": paths.headings,
            "questions": paths.questions,
            "synthetic": paths.synthetic,
        }
        if not is_main():
            return embed_all(
                model,
                articles,
                headings,
                questions,
                None,
                batch_size=batch_size,
                paths=sources,
                chunk_tables=tables,
                distributed=True,
                synthetic=synthetic,
            )
        with atomic_path(out, directory=True) as tmp:
            counts = embed_all(
                model,
                articles,
                headings,
                questions,
                tmp,
                batch_size=batch_size,
                paths=sources,
                chunk_tables=tables,
                distributed=True,
                synthetic=synthetic,
            )
        log.info(
            "wrote %s%s",
            ", ".join(f"{out}/{name}.safetensors" for name in FILES),
            f" ({world_size()} processes)" if world_size() > 1 else "",
        )
    return counts

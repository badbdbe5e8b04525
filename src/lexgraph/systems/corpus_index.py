"""``lexgraph index``: encode a corpus of one's own with a trained workspace's models, for every
system to search it (``lexgraph search --index DIR``), without questions and without training.

:func:`index_corpus` reads the corpus file (:func:`lexgraph.data.corpus.read_corpus`: JSON lines,
CSV or Parquet, string ids, heading paths of any depth), cleans it with the workspace's ``clean``
settings (:func:`lexgraph.data.clean.clean_articles`, as the ``clean`` stage does; what was dropped
is logged), and writes ``DIR`` with the workspace's layout for the corpus side only:

* ``data/clean/{articles,headings,keys}.parquet`` (``keys``: the user's ids);
* ``models/bm25/``: BM25 refitted with the workspace index's ``k1``, ``b`` and analyzer;
* ``data/chunks/{articles,headings}.safetensors``: chunk vectors by the workspace's base encoder
  with its chunk cache's settings, in shape-stable batches (:mod:`lexgraph.encoding.stable_batches`)
  and resumable blocks (:mod:`lexgraph.encoding.chunk_blocks`, under ``DIR/.partial/``); a text an
  earlier index in ``DIR`` already holds, made alike, is taken from it (:mod:`lexgraph.encoding.reuse`),
  so an update of an amended corpus encodes what changed and equals a fresh index;
* ``data/zeroshot/``: the ``zeroshot`` system's article vectors
  (:func:`lexgraph.methods.zeroshot.system.zeroshot_embeddings`);
* ``data/embed/{articles,headings}.safetensors``: the DSR article encoder over those chunks (and
  ``data/embed_qabisar/`` with QABISAR's own first stage, for a ``qabisar`` trained on it);
* ``models/hprior`` and ``models/gnn_<variant>/article_embeddings.safetensors``: the graph systems
  applied inductively over the corpus's own hierarchy (:mod:`lexgraph.methods.gnn.inductive`, when present);
* ``data/rerank/articles.safetensors``: the frozen re-ranker's article token states;
* ``index.json`` (:mod:`lexgraph.systems.index_record`): the corpus file's digest, the systems built,
  the digests of the workspace models each used, and the index's own files with their SHA-256
  (checked before every search).

Before any encoding, the workspace's artefacts are checked as ``lexgraph search`` checks them
(:func:`lexgraph.core.staleness.check_built_from`: a model built from inputs the workspace no longer
holds is refused in one line), and ``DIR`` must be new, empty, or provably an earlier index
(:func:`check_out`). Every vector written is finite and below :data:`ABSURD` in magnitude
(:func:`check_vectors`). ``DIR`` is replaced as a whole at the end (:func:`lexgraph.core.io.atomic_path`):
a failed run leaves an earlier index as it was (and its finished blocks, which the next run reuses).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from lexgraph.core import layout
from lexgraph.core.config import workspace_params
from lexgraph.core.errors import DataError, LexgraphError
from lexgraph.systems.index_record import (
    FORMAT,
    INDEX_FILE,
    check_replaceable,
    index_record,
    model_digests,
    own_files,
)

log = logging.getLogger(__name__)

PARTIAL = ".partial"
#: what an interrupted run leaves under ``DIR/.partial``: ``<fingerprint>/<name>-<first row>.safetensors``
#: and their ``SHA256SUMS`` (:func:`lexgraph.encoding.chunk_blocks.encode_in_blocks`), and a killed
#: writer's temporary of one
_BLOCK = r"((articles|headings)-[0-9]{10}\.safetensors|SHA256SUMS)"
_BLOCKS = re.compile(rf"{re.escape(PARTIAL)}(/[0-9a-f]{{32}}(/({_BLOCK}|\.{_BLOCK}\.[^/]+\.tmp))?)?")
#: the clean tables an index encodes, with their id and text columns
TEXTS = {"articles": ("id", "article"), "headings": ("heading_id", "text")}
#: the largest magnitude a value of an index's vectors may have: far beyond what an encoder gives, far
#: below float32's overflow when a row is squared and summed (a vector scaled by 1e30 vanishes then)
ABSURD = 1e6


# --- which systems -------------------------------------------------------------------------------


def available_systems(workspace: Path) -> list[str]:
    """The systems the workspace has built (their artefacts present, not switched off)."""
    from lexgraph.methods.catalog import systems

    have = []
    for name, spec in systems().items():
        if why := spec.off_in(workspace):
            log.info("index: %s is switched off in the workspace (%s); not indexed", name, why)
        elif all(artifact.under(workspace).exists() for artifact in spec.reads):
            have.append(name)
    return have


def closure(systems: list[str], workspace: Path) -> set[str]:
    """``systems`` and every system they search through, transitively (a re-ranker over the hybrid)."""
    from lexgraph.methods.catalog import declared

    todo, closed = list(systems), set()
    while todo:
        system = todo.pop()
        if system not in closed:
            closed.add(system)
            todo.extend(declared(system).uses(workspace))
    return closed


def resolve_systems(asked: list[str] | None, workspace: Path) -> list[str]:
    """The systems to index (default: every one the workspace has built), with the systems they
    search through, in the registry's order."""
    from lexgraph.methods.catalog import declared, names

    have = available_systems(workspace)
    for system in asked or ():
        declared(system, label="--systems")
        if system not in have:
            raise LexgraphError(
                f"--systems {system}: the workspace {workspace} has no {system} built (run `dvc repro` there); "
                f"it has {', '.join(have) or 'none'}"
            )
    closed = closure(list(asked or have), workspace)
    return [s for s in names() if s in closed]


# --- the corpus side, step by step ----------------------------------------------------------------


def clean_corpus(corpus: Path, workspace: Path) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(articles, headings, keys) of the corpus file, cleaned as the workspace's ``clean`` stage does."""
    from lexgraph.data.clean import CleanConfig, clean_articles, kept_keys
    from lexgraph.data.corpus import keys_table, read_corpus

    raw, _, user_ids, versions = read_corpus(corpus)
    config = workspace_params("clean", workspace, CleanConfig)
    articles, headings, stats, _ = clean_articles(raw, corpus, config.min_words, config.drop_repealed)
    if articles.height == 0:
        raise DataError(
            corpus,
            f"cleaning dropped all {raw.height} articles ({stats['dropped']}) with the workspace's 'clean' settings; "
            "expected articles with text",
        )
    if stats["dropped"]:
        log.info(
            "index: cleaning dropped %d of %d articles: %s", raw.height - articles.height, raw.height, stats["dropped"]
        )
    no_questions = pl.DataFrame({"id": []}, schema={"id": pl.Int64})
    keys = kept_keys(keys_table(user_ids, [], versions), articles, no_questions)
    log.info("index: %s: %d articles, %d headings", corpus, articles.height, headings.height)
    return articles, headings, keys


def _cache_settings(path: Path, extra: tuple[str, ...] = ()) -> dict[str, str]:
    """The chunk settings and ``vectors`` flag of a chunk cache file (its metadata only), and the
    ``extra`` keys it has."""
    from safetensors import SafetensorError, safe_open

    from lexgraph.encoding.chunks import SETTINGS

    try:
        with safe_open(str(path), framework="pt") as fh:
            metadata = fh.metadata() or {}
    except (SafetensorError, OSError) as exc:
        raise DataError(path, f"not a readable chunk cache ({exc}); {layout.restore_hint(path)}") from None
    if any(key not in metadata for key in SETTINGS):
        raise DataError(path, f"not a chunk cache (no settings {SETTINGS}); {layout.restore_hint(path)}")
    return {key: metadata[key] for key in (*SETTINGS, "vectors", *extra) if key in metadata}


def write_chunks(articles, headings, job: IndexJob, out: Path) -> bool:
    """The chunk vectors of articles and headings, as the workspace's ``encode_chunks`` made its own
    (its base encoder and chunk settings), in shape-stable batches and resumable blocks; the texts
    an earlier index at the same place already holds, encoded under the same key, are taken from
    it (:mod:`lexgraph.encoding.reuse`). False when the workspace's chunk encoder is fine-tuned (its
    cache holds no vectors: nothing to write)."""
    from lexgraph.core.provenance import identity
    from lexgraph.encoding.chunk_blocks import block_fingerprint, encode_in_blocks
    from lexgraph.encoding.chunks import check_settings, save_chunk_table
    from lexgraph.encoding.reuse import assemble, reuse_key
    from lexgraph.encoding.stable_batches import batching
    from lexgraph.methods.dsr.config import SECTION, DSRConfig
    from lexgraph.models.article_encoder import HierarchicalArticleEncoder
    from lexgraph.models.precision import cast_backbone

    cache = layout.CHUNKS.under(job.workspace, "articles.safetensors")
    settings = _cache_settings(cache)
    if settings.get("vectors") != "true":
        log.info("index: %s holds no chunk vectors (dsr.chunk_encoder: finetune); encoding the texts whole", cache)
        return False
    pretrained = layout.PRETRAIN.under(job.workspace)
    encoder = HierarchicalArticleEncoder.from_pretrained(
        pretrained,
        max_chunk_length=int(settings["max_chunk_length"]),
        max_document_length=int(settings["max_document_length"]),
        token_pooling=settings["token_pooling"],
        num_layers=0,
    ).to(job.device)
    cast_backbone(encoder.backbone, job.precision)
    check_settings(type("Cached", (), {"settings": settings})(), encoder, cache)
    batch_size = workspace_params(SECTION, job.workspace, DSRConfig).eval_batch_size
    chunking = {k: v for k, v in settings.items() if k != "vectors"}
    made = f"{batching(batch_size, job.device, encoder.backbone.config)} precision={job.precision}"
    key = reuse_key(chunking, identity(pretrained), made)
    sources = {name: (table[i], table[t]) for (name, (i, t)), table in zip(TEXTS.items(), (articles, headings))}
    for name, (ids, texts) in sources.items():
        ids, texts = ids.to_numpy().astype(np.int64), [str(t) for t in texts.to_list()]
        earlier, found = _earlier_rows(job.earlier, name, texts, key)
        new = np.flatnonzero(found < 0)
        new_ids, new_texts = ids[new], [texts[i] for i in new]
        run = {**settings, "block": job.block, "batch_size": batch_size, "file": name, "batching": key["batching"]}
        folder = job.partial / block_fingerprint(new_ids, new_texts, identity(pretrained), run)
        fresh = encode_in_blocks(
            encoder, name, new_ids, new_texts, batch_size=batch_size, block=job.block, folder=folder, stable=True
        )
        table = assemble(ids, found, earlier, fresh) if earlier is not None and (found >= 0).any() else fresh
        table.settings = dict(key)
        if job.earlier is not None:
            log.info(
                "index: %s: %d of %d reused from the earlier index, %d encoded",
                name,
                len(ids) - len(new),
                len(ids),
                len(new),
            )
        save_chunk_table(table, out / f"{name}.safetensors")
    return True


def _earlier_rows(earlier: Path | None, name: str, texts: list[str], key: dict[str, str]) -> tuple[Any, np.ndarray]:
    """``(table, found)``: the earlier index's chunk table of ``name`` and, for each of ``texts``, the
    row of that table holding the same text (-1: to encode), when the table was made under ``key``;
    ``(None, all -1)`` when there is no earlier index or it was made otherwise."""
    from lexgraph.encoding.chunks import load_chunk_table
    from lexgraph.encoding.reuse import KEY_FIELDS, reuse_rows

    none = np.full(len(texts), -1, dtype=np.int64)
    if earlier is None:
        return None, none
    path = layout.CHUNKS.under(earlier, f"{name}.safetensors")
    made = {**_cache_settings(path, extra=KEY_FIELDS)}
    made.pop("vectors", None)
    if made != key:
        log.info("index: the earlier %s were encoded otherwise (%s); encoding them anew", name, path)
        return None, none
    table = load_chunk_table(path)
    column, text = TEXTS[name]
    clean = pl.read_parquet(layout.CLEAN.under(earlier, f"{name}.parquet"), columns=[column, text])
    by_id = dict(zip(clean[column].to_list(), clean[text].to_list()))
    return table, reuse_rows(texts, [str(by_id[int(i)]) for i in table.ids])


def write_embed(
    articles, headings, chunks: Path | None, workspace: Path, out: Path, device, dsr: layout.Artifact = layout.DSR
) -> None:
    """The DSR article encoder's vectors of articles and headings (``data/embed``; ``dsr``: G-DSR's
    DSR, or QABISAR's own first stage for ``data/embed_qabisar``), from the chunk vectors with a
    frozen chunk encoder (as the ``embed`` stage), else from the texts."""
    from lexgraph.encoding.chunks import check_settings, embed_from_chunks, load_chunk_table
    from lexgraph.encoding.embed import EmbedConfig, save_embeddings
    from lexgraph.models.dsr import DSR

    batch_size = workspace_params("embed", workspace, EmbedConfig).batch_size
    frozen = chunks is not None
    model = DSR.load(dsr.under(workspace), device=device, with_article_backbone=not frozen)
    meta = {
        "normalized": "false",
        "similarity": model.similarity_name,
        "dim": str(model.dim),
        "encoder": "encode_articles",
    }
    sources = {name: (table[i], table[t]) for (name, (i, t)), table in zip(TEXTS.items(), (articles, headings))}
    for name, (ids, texts) in sources.items():
        ids = ids.to_numpy().astype(np.int64)
        if frozen:
            table = load_chunk_table(chunks / f"{name}.safetensors")
            check_settings(table, model.article_encoder, chunks / f"{name}.safetensors")
            vectors = embed_from_chunks(model.article_encoder, table, table.rows(ids), batch_size)  # (n, dim)
        else:
            vectors = model.encode_articles([str(t) for t in texts.to_list()], batch_size=batch_size, desc=name)
        save_embeddings(out / f"{name}.safetensors", ids, vectors, meta)
    log.info("index: DSR vectors of %d articles and %d headings", articles.height, headings.height)


class IndexJob:
    """One ``lexgraph index`` run as each system's side of it sees it (:attr:`System.index
    <lexgraph.methods.system.System.index>`): the cleaned corpus (``articles``, ``headings``), the
    ``workspace`` whose models encode it, the index being written (``root``) and the work several
    sides share, each done once, on first need: the chunk vectors (:meth:`chunks`), each DSR's
    vectors of the corpus (:meth:`embed`, :meth:`embeddings`) and the corpus's statute graph (:meth:`graph`)."""

    def __init__(
        self,
        articles,
        headings,
        workspace: Path,
        root: Path,
        partial: Path,
        device,
        block: int,
        earlier: Path | None,
        precision: str = "fp32",
    ) -> None:
        self.articles, self.headings, self.workspace, self.root = articles, headings, workspace, root
        self.partial, self.device, self.block = partial, device, block
        #: the chunk encoder's number format, resolved (:mod:`lexgraph.models.precision`): fp32 or bf16
        self.precision = precision
        #: an earlier index whose vectors may be reused (:func:`earlier_index`), or None
        self.earlier = earlier
        self._chunks: tuple[Path | None] | None = None
        self._embeddings: dict[layout.Artifact, dict] = {}
        self._graph = None

    @property
    def clean(self) -> Path:
        """The index's clean tables (``data/clean``: articles, headings, keys)."""
        return layout.CLEAN.under(self.root)

    def chunks(self) -> Path | None:
        """The corpus's chunk vectors (``data/chunks``), as the workspace's ``encode_chunks`` made its
        own; None when its chunk encoder is fine-tuned (the texts are then encoded whole)."""
        if self._chunks is None:
            out = layout.CHUNKS.under(self.root)
            out.mkdir(parents=True)
            built = write_chunks(self.articles, self.headings, self, out)
            self._chunks = (out if built else None,)
        return self._chunks[0]

    def embed(self, dsr: layout.Artifact = layout.DSR) -> Path:
        """The folder of the corpus's vectors by DSR ``dsr`` (``data/embed``, or ``data/embed_qabisar``
        for QABISAR's own first stage), written on first need."""
        out = {layout.DSR: layout.EMBED, layout.DSR_QABISAR: layout.EMBED_QABISAR}[dsr].under(self.root)
        if not out.is_dir():
            chunks = self.chunks()
            out.mkdir(parents=True)
            write_embed(self.articles, self.headings, chunks, self.workspace, out, self.device, dsr=dsr)
        return out

    def embeddings(self, dsr: layout.Artifact = layout.DSR) -> dict:
        """``{"articles"|"headings": (ids, vectors)}`` of :meth:`embed`'s folder, loaded once."""
        from lexgraph.encoding.embed import load_embeddings

        if dsr not in self._embeddings:
            out = self.embed(dsr)
            self._embeddings[dsr] = {n: load_embeddings(out / f"{n}.safetensors") for n in ("articles", "headings")}
        return self._embeddings[dsr]

    def graph(self):
        """The corpus's own statute graph (no question nodes: :func:`lexgraph.methods.gnn.inductive.corpus_graph`)."""
        from lexgraph.methods.gnn.inductive import corpus_graph

        if self._graph is None:
            self._graph = corpus_graph(self.articles, self.headings, self.workspace)
        return self._graph

    def save_graph_vectors(self, system: str, artifact: layout.Artifact, vectors) -> None:
        """``system``'s article vectors over :meth:`graph` -> ``<artifact>/article_embeddings.safetensors``."""
        from lexgraph.encoding.embed import save_embeddings

        out = artifact.under(self.root, layout.ARTICLE_EMBEDDINGS)
        out.parent.mkdir(parents=True, exist_ok=True)
        save_embeddings(out, self.graph().article_ids.numpy(), vectors)
        log.info("index: %s over the corpus's graph (%d articles)", system, self.graph().article_ids.numel())


# --- the whole index ------------------------------------------------------------------------------


def _our_blocks(rel: str, entry: os.DirEntry) -> bool:
    """An interrupted run's finished blocks under ``DIR/.partial`` (:data:`_BLOCKS`), which the next
    run reuses: a folder or a regular file, no link."""
    if entry.is_symlink() or not _BLOCKS.fullmatch(rel):
        return False
    return entry.is_dir(follow_symlinks=False) if rel.count("/") < 2 else entry.is_file(follow_symlinks=False)


def check_out(out: Path, workspace: Path) -> None:
    """Refuse an ``--out`` that is not a directory, a directory that is not provably an earlier index
    (:func:`lexgraph.systems.index_record.check_replaceable`: ``index.json`` with the index's format
    marker, and only the files it lists, besides an interrupted run's blocks), or a path DVC owns.
    Nothing is deleted."""
    from lexgraph.core.inputs import shown_path
    from lexgraph.core.tracked import dvc_owner

    out = Path(out)
    if out.exists() and not out.is_dir():
        what = "a file" if out.is_file() else "not a directory"
        raise LexgraphError(f"--out {shown_path(out)} is {what}; expected a new directory or an earlier index")
    check_replaceable(
        out, record=INDEX_FILE, marker=FORMAT, label="--out", what="an earlier index", allowed=_our_blocks
    )
    owner = dvc_owner(out, workspace)
    if owner:
        raise LexgraphError(f"--out {shown_path(out)} {owner}; refusing to write there, expected a path outside")


def check_workspace_current(systems: list[str], workspace: Path) -> None:
    """Refuse, before any encoding, a workspace whose artefacts for ``systems`` (and those they are
    built on) were built from inputs it no longer holds: what ``lexgraph search --index`` would refuse
    after the whole index was written (:func:`lexgraph.core.staleness.check_built_from`)."""
    from lexgraph.core.staleness import check_built_from
    from lexgraph.methods.catalog import declared

    check_built_from([artifact.under(workspace) for s in systems for artifact in declared(s).reads], workspace)


def earlier_index(out: Path) -> Path | None:
    """``out`` when it holds an earlier index whose tables and chunk vectors still match its record
    (an update reuses them), else None: a damaged one is said in one log line, and every text is
    encoded anew (always correct)."""
    from lexgraph.systems.index_record import read_verified

    if not (out / INDEX_FILE).is_file():
        return None
    try:
        read_verified(out, (layout.CHUNKS.posix(),))
    except LexgraphError as exc:
        log.info("index: nothing of the earlier index in %s is reused (%s); encoding every text", out, exc)
        return None
    return out if layout.CHUNKS.under(out).is_dir() else None


def check_vectors(root: Path, shown: Path) -> None:
    """Refuse (one line naming the file as ``shown``, the tensor and its row) a safetensors file under
    ``root`` holding a value that is not finite or beyond :data:`ABSURD` in magnitude: a model gave
    an unusable vector, which the search would rank wrongly or drop. Read in blocks of rows."""
    import math

    import torch
    from safetensors import safe_open

    for path in sorted(root.rglob("*.safetensors")):
        name = shown / path.relative_to(root)
        with safe_open(str(path), framework="pt") as fh:
            for key in sorted(fh.keys()):
                sliced = fh.get_slice(key)
                if not sliced.get_dtype().startswith(("F", "BF")):
                    continue  # ids, offsets, token counts
                shape = sliced.get_shape()
                if not shape:
                    blocks = [(0, fh.get_tensor(key).reshape(1, 1))]
                else:
                    width = max(1, math.prod(shape[1:]))
                    step = max(1, (1 << 22) // width)
                    blocks = ((start, sliced[start : start + step]) for start in range(0, shape[0], step))
                for start, block in blocks:
                    rows = block.reshape(block.shape[0], -1).float()  # (rows, width)
                    bad = (~torch.isfinite(rows) | (rows.abs() > ABSURD)).any(dim=1)  # (rows,)
                    if bad.any():
                        row = int(bad.nonzero()[0])
                        values = rows[row][~torch.isfinite(rows[row]) | (rows[row].abs() > ABSURD)]
                        raise DataError(
                            name,
                            f"tensor '{key}', row {start + row} holds {float(values[0])!r}, expected finite values "
                            f"of magnitude at most {ABSURD:g}: a workspace model gave an unusable vector (check its "
                            "training, or the corpus text of that row); the index was not written",
                        )


def index_corpus(
    corpus: str | os.PathLike,
    out: str | os.PathLike,
    workspace: str | os.PathLike = ".",
    systems: list[str] | None = None,
    device: str = "cpu",
    block: int | None = None,
    snapshot: str | None = None,
    precision: str = "fp32",
) -> dict[str, Any]:
    """Index the corpus file ``corpus`` into ``out`` with the models of ``workspace`` for
    ``systems`` (default: every system the workspace has built), encoding ``block`` articles per
    resumable block (None: all in one); ``snapshot``: the date the file's law is in force on
    (:mod:`lexgraph.data.versions`; recorded, and searches as of an earlier date refused);
    ``precision``: the chunk encoder's on the CPU (:mod:`lexgraph.models.precision`; ``auto``
    resolved from the CPU's flags, the result recorded). Returns ``index.json``'s content."""
    import torch

    from lexgraph.core.io import atomic_path, write_json
    from lexgraph.core.provenance import digest_path
    from lexgraph.data.readers import file_problem
    from lexgraph.methods.catalog import declared
    from lexgraph.models.precision import resolve_precision

    corpus, out, workspace, device = Path(corpus), Path(out), Path(workspace), torch.device(device)
    precision = resolve_precision(precision, device)
    problem = file_problem(corpus)  # a directory, a pipe, /dev/null: said as what it is, before anything else
    if problem:
        raise DataError(corpus, f"{problem}; expected a JSON-lines, CSV or Parquet file")
    check_out(out, workspace)
    todo = resolve_systems(systems, workspace)
    log.info("index: %s -> %s with %s's %s (encoding in %s)", corpus, out, workspace, ", ".join(todo), precision)
    check_workspace_current(todo, workspace)  # what `search --index` checks, before any encoding
    articles, headings, keys = clean_corpus(corpus, workspace)
    earlier = earlier_index(out)
    with atomic_path(out, directory=True) as tmp:
        clean = layout.CLEAN.under(tmp)
        clean.mkdir(parents=True)
        for name, table in (("articles", articles), ("headings", headings), ("keys", keys)):
            table.write_parquet(clean / f"{name}.parquet", statistics=False)
        size = block or max(articles.height, 1)
        job = IndexJob(articles, headings, workspace, Path(tmp), out / PARTIAL, device, size, earlier, precision)
        for system in todo:
            spec = declared(system)
            if spec.index is not None:  # a system built on others: their sides are its own
                spec.index(job)
        check_vectors(Path(tmp), out)
        counts = {"articles": articles.height, "headings": headings.height, "precision": precision}
        models = {s: model_digests(s, workspace) for s in todo}
        if snapshot is not None:
            counts["snapshot"] = snapshot
        record = index_record(corpus, digest_path(corpus), counts, models, own_files(Path(tmp), INDEX_FILE))
        write_json(record, Path(tmp) / INDEX_FILE, sort_keys=True, ensure_ascii=True)
    log.info("index: wrote %s (%s)", out, ", ".join(todo))
    return record

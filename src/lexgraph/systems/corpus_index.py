"""``lexgraph index``: encode a corpus of one's own with a trained workspace's models, for every
system to search it (``lexgraph search --index DIR``), without questions and without training.

:func:`index_corpus` reads the corpus file (:func:`lexgraph.data.corpus.read_corpus`: JSON lines,
CSV or Parquet, string ids, heading paths of any depth), cleans it with the workspace's ``clean``
settings (:func:`lexgraph.data.clean.clean_articles`, as the ``clean`` stage does; what was dropped
is logged), and writes ``DIR`` with the workspace's layout for the corpus side only:

* ``data/clean/{articles,headings,keys}.parquet`` (``keys``: the user's ids);
* ``models/bm25/``: BM25 refitted with the workspace index's ``k1``, ``b`` and analyzer;
* ``data/chunks/{articles,headings}.safetensors``: chunk vectors by the workspace's base encoder
  with its chunk cache's settings, encoded in resumable blocks (:mod:`lexgraph.encoding.chunk_blocks`,
  under ``DIR/.partial/``);
* ``data/zeroshot/``: the ``zeroshot`` system's article vectors (:func:`lexgraph.systems.zeroshot.run_zeroshot`);
* ``data/embed/{articles,headings}.safetensors``: the DSR article encoder over those chunks (and
  ``data/embed_qabisar/`` with QABISAR's own first stage, for a ``qabisar`` trained on it);
* ``models/hprior`` and ``models/gnn_<variant>/article_embeddings.safetensors``: the graph systems
  applied inductively over the corpus's own hierarchy (:mod:`lexgraph.systems.inductive`, when present);
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
#: the largest magnitude a value of an index's vectors may have: far beyond what an encoder gives, far
#: below float32's overflow when a row is squared and summed (a vector scaled by 1e30 vanishes then)
ABSURD = 1e6
#: systems built on others: their own side of the index is their components'
COMPOSED = ("hybrid", "xrerank", "mvcl")
GRAPH_SYSTEMS = ("hprior", *layout.GNN)
DENSE_ON_DSR = ("dsr", *GRAPH_SYSTEMS)


def workspace_params(section: str, workspace: Path, config_class):
    """The typed ``section`` of the workspace's params.yaml (the settings its models were built with)."""
    from lexgraph.core.config import load_params

    path = workspace / "params.yaml"
    if not path.is_file():
        raise DataError(path, "not found; expected the workspace's params.yaml (its models' settings)")
    return config_class.from_params(load_params(section, path)[1])


# --- which systems -------------------------------------------------------------------------------


def available_systems(workspace: Path) -> list[str]:
    """The systems the workspace has built (their artefacts present, a re-ranker not switched off)."""
    from lexgraph.core.config import SYSTEM_NAMES
    from lexgraph.systems.registry import READS
    from lexgraph.systems.rerank import is_switched_off

    have = []
    for system in SYSTEM_NAMES:
        if system in layout.RERANKERS and is_switched_off(workspace, system):
            log.info("index: %s is switched off in the workspace (a placeholder); not indexed", system)
        elif all(artifact.under(workspace).exists() for artifact in READS[system]):
            have.append(system)
    return have


def components(system: str, workspace: Path) -> list[str]:
    """The systems ``system`` searches through (hybrid: BM25 and its dense system; a re-ranker: its
    first stage), from the workspace's settings."""
    from lexgraph.systems.hybrid import SETTINGS, read_settings
    from lexgraph.systems.rerank import first_stage_of

    if system == "hybrid":
        settings = read_settings(layout.HYBRID.under(workspace, SETTINGS))
        return [settings["sparse"], settings["dense"]]
    if system in layout.RERANKERS:
        first = first_stage_of(workspace, system)
        return [first] if first else []
    return []


def closure(systems: list[str], workspace: Path) -> set[str]:
    """``systems`` and every system they search through, transitively (a re-ranker over the hybrid)."""
    todo, closed = list(systems), set()
    while todo:
        system = todo.pop()
        if system not in closed:
            closed.add(system)
            todo.extend(components(system, workspace))
    return closed


def resolve_systems(asked: list[str] | None, workspace: Path) -> list[str]:
    """The systems to index (default: every one the workspace has built), with the systems they
    search through, in the registry's order."""
    from lexgraph.core.config import SYSTEM_NAMES

    have = available_systems(workspace)
    for system in asked or ():
        if system not in SYSTEM_NAMES:
            raise LexgraphError(f"--systems: unknown system '{system}'; expected some of {', '.join(SYSTEM_NAMES)}")
        if system not in have:
            raise LexgraphError(
                f"--systems {system}: the workspace {workspace} has no {system} built (run `dvc repro` there); "
                f"it has {', '.join(have) or 'none'}"
            )
    closed = closure(list(asked or have), workspace)
    return [s for s in SYSTEM_NAMES if s in closed]


# --- the corpus side, step by step ----------------------------------------------------------------


def clean_corpus(corpus: Path, workspace: Path) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(articles, headings, keys) of the corpus file, cleaned as the workspace's ``clean`` stage does."""
    from lexgraph.data.clean import CleanConfig, clean_articles, kept_keys
    from lexgraph.data.corpus import keys_table, read_corpus

    raw, _, user_ids = read_corpus(corpus)
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
    keys = kept_keys(keys_table(user_ids, []), articles, no_questions)
    log.info("index: %s: %d articles, %d headings", corpus, articles.height, headings.height)
    return articles, headings, keys


def write_bm25(articles: pl.DataFrame, workspace: Path, out: Path) -> None:
    """BM25 of the corpus with the workspace index's settings (k1, b, idf, floor, analyzer); warns of idf-0 terms."""
    from lexgraph.search.bm25 import BM25
    from lexgraph.search.bm25_kernels import DEFAULT_IDF_FLOOR

    own = BM25.load(layout.BM25.under(workspace))
    bm25 = BM25(**own.settings()).fit_texts(articles["article"].to_list(), articles["id"].to_list())
    bm25.save(out)
    log.info("index: bm25 (k1=%.2f, b=%.2f, idf %s) over %d articles", own.k1, own.b, own.idf_variant, articles.height)
    if zero := int((bm25.idf == 0.0).sum()):
        log.warning(
            "index: %d term(s) of the corpus are each in at least half of its articles and get idf 0 under the "
            "workspace BM25's idf_floor %r: a question of only such terms gets no results; rebuild the "
            "workspace's BM25 (`dvc repro bm25`) for the default floor %r, then index again",
            zero,
            own.idf_floor,
            DEFAULT_IDF_FLOOR,
        )


def _cache_settings(path: Path) -> dict[str, str]:
    """The chunk settings and ``vectors`` flag of a chunk cache file (its metadata only)."""
    from safetensors import SafetensorError, safe_open

    from lexgraph.encoding.chunks import SETTINGS

    try:
        with safe_open(str(path), framework="pt") as fh:
            metadata = fh.metadata() or {}
    except (SafetensorError, OSError) as exc:
        raise DataError(path, f"not a readable chunk cache ({exc}); {layout.restore_hint(path)}") from None
    if any(key not in metadata for key in SETTINGS):
        raise DataError(path, f"not a chunk cache (no settings {SETTINGS}); {layout.restore_hint(path)}")
    return {key: metadata[key] for key in (*SETTINGS, "vectors") if key in metadata}


def write_chunks(articles, headings, workspace: Path, out: Path, partial: Path, device, block: int) -> bool:
    """The chunk vectors of articles and headings, as the workspace's ``encode_chunks`` made its own
    (its base encoder and chunk settings), in resumable blocks; False when the workspace's chunk
    encoder is fine-tuned (its cache holds no vectors: nothing to write)."""
    from lexgraph.core.provenance import identity
    from lexgraph.encoding.chunk_blocks import block_fingerprint, encode_in_blocks
    from lexgraph.encoding.chunks import check_settings, save_chunk_table
    from lexgraph.models.article_encoder import HierarchicalArticleEncoder
    from lexgraph.training.dsr_config import DSRConfig

    cache = layout.CHUNKS.under(workspace, "articles.safetensors")
    settings = _cache_settings(cache)
    if settings.get("vectors") != "true":
        log.info("index: %s holds no chunk vectors (dsr.chunk_encoder: finetune); encoding the texts whole", cache)
        return False
    pretrained = layout.PRETRAIN.under(workspace)
    encoder = HierarchicalArticleEncoder.from_pretrained(
        pretrained,
        max_chunk_length=int(settings["max_chunk_length"]),
        max_document_length=int(settings["max_document_length"]),
        token_pooling=settings["token_pooling"],
        num_layers=0,
    ).to(device)
    check_settings(type("Cached", (), {"settings": settings})(), encoder, cache)
    batch_size = workspace_params("dsr", workspace, DSRConfig).eval_batch_size
    sources = {
        "articles": (articles["id"], articles["article"]),
        "headings": (headings["heading_id"], headings["text"]),
    }
    for name, (ids, texts) in sources.items():
        ids, texts = ids.to_numpy().astype(np.int64), [str(t) for t in texts.to_list()]
        run = {**settings, "block": block, "batch_size": batch_size, "file": name}
        folder = partial / block_fingerprint(ids, texts, identity(pretrained), run)
        table = encode_in_blocks(encoder, name, ids, texts, batch_size=batch_size, block=block, folder=folder)
        save_chunk_table(table, out / f"{name}.safetensors")
    return True


def write_zeroshot(clean: Path, chunks: Path, workspace: Path, out: Path, device) -> None:
    """The zeroshot system's article vectors (reusing the chunk vectors when chunked alike)."""
    from lexgraph.systems.zeroshot import ZeroshotConfig, run_zeroshot

    config = workspace_params("zeroshot", workspace, ZeroshotConfig)
    run_zeroshot(layout.PRETRAIN.under(workspace), clean / "articles.parquet", out, config, device, chunks)


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
    sources = {
        "articles": (articles["id"], articles["article"]),
        "headings": (headings["heading_id"], headings["text"]),
    }
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


def first_stage(system: str, workspace: Path) -> layout.Artifact:
    """The DSR whose vectors ``system``'s graph encoder was trained on: QABISAR's own first stage
    where its ``gnn.json`` names it (``first_stage``), else G-DSR's DSR (hprior's too)."""
    from lexgraph.core.inputs import read_json_object

    if system not in layout.GNN:
        return layout.DSR
    path = layout.GNN[system].under(workspace, "gnn.json")
    saved = read_json_object(
        path,
        what="the graph encoder settings train_gnn writes",
        optional={"first_stage": (lambda v: isinstance(v, str), "a workspace path")},
        fix=layout.restore_hint(path),
    )
    return layout.DSR_QABISAR if saved.get("first_stage") == layout.DSR_QABISAR.path.as_posix() else layout.DSR


def write_graph(systems: list[str], articles, headings, chunks: Path | None, workspace: Path, root: Path, device):
    """hprior's and the graph encoders' article vectors, applied inductively over the corpus's own
    statute graph (no question nodes: :mod:`lexgraph.systems.inductive`), each on the vectors of its
    own first stage: ``data/embed`` under ``root`` (written before), or ``data/embed_qabisar``,
    written here for a graph encoder trained on QABISAR's own first stage (:func:`first_stage`)."""
    from lexgraph.encoding.embed import ARTICLE_EMBEDDINGS, load_embeddings, save_embeddings
    from lexgraph.systems.inductive import corpus_graph, graph_vectors, hprior_vectors

    graph = corpus_graph(articles, headings, workspace)
    vectors_of = {layout.DSR: layout.EMBED.under(root), layout.DSR_QABISAR: layout.EMBED_QABISAR.under(root)}
    loaded: dict[layout.Artifact, dict] = {}
    for i, system in enumerate(systems, 1):
        dsr = first_stage(system, workspace)
        if dsr not in loaded:
            if not vectors_of[dsr].is_dir():
                vectors_of[dsr].mkdir(parents=True)
                write_embed(articles, headings, chunks, workspace, vectors_of[dsr], device, dsr=dsr)
            loaded[dsr] = {n: load_embeddings(vectors_of[dsr] / f"{n}.safetensors") for n in ("articles", "headings")}
        embeddings = loaded[dsr]
        if system == "hprior":
            vectors = hprior_vectors(workspace, graph, *embeddings["articles"])  # (A, dim)
            out = layout.HPRIOR.under(root, ARTICLE_EMBEDDINGS)
        else:
            vectors = graph_vectors(system, workspace, graph, embeddings, device)  # (A, dim)
            out = layout.GNN[system].under(root, ARTICLE_EMBEDDINGS)
        out.parent.mkdir(parents=True, exist_ok=True)
        save_embeddings(out, graph.article_ids.numpy(), vectors)
        log.info(
            "index: %s over the corpus's graph (%d articles; %d of %d)",
            system,
            graph.article_ids.numel(),
            i,
            len(systems),
        )


def write_rerank(articles, workspace: Path, systems: list[str], out: Path, device) -> None:
    """The article token states of the re-rankers on the frozen base encoder (``data/rerank``, what
    their loader reads when the length is theirs; a fine-tuned PLM encodes the articles as it loads)."""
    from lexgraph.encoding.rerank_features import FrozenTokenEncoder
    from lexgraph.systems.rerank import article_states
    from lexgraph.training.rerank_config import RerankConfig
    from lexgraph.training.rerank_io import load_model

    configs = [RerankConfig(**load_model(layout.RERANKERS[s].under(workspace), device)[1]["config"]) for s in systems]
    frozen = [config for config in configs if config.plm == "frozen"]
    if not frozen:
        return
    encoder = FrozenTokenEncoder(layout.PRETRAIN.under(workspace), device)
    store = article_states(encoder, articles, frozen[0])
    out.mkdir(parents=True)
    store.save(out / "articles.safetensors", {"max_article_length": str(frozen[0].max_article_length)})
    log.info("index: re-ranker token states of %d articles", articles.height)


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
    from lexgraph.systems.registry import READS

    check_built_from([artifact.under(workspace) for system in systems for artifact in READS[system]], workspace)


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
) -> dict[str, Any]:
    """Index the corpus file ``corpus`` into ``out`` with the models of ``workspace`` for
    ``systems`` (default: every system the workspace has built), encoding ``block`` articles per
    resumable block (None: all in one); returns ``index.json``'s content."""
    import torch

    from lexgraph.core.io import atomic_path, write_json
    from lexgraph.core.provenance import digest_path
    from lexgraph.data.readers import file_problem

    corpus, out, workspace, device = Path(corpus), Path(out), Path(workspace), torch.device(device)
    problem = file_problem(corpus)  # a directory, a pipe, /dev/null: said as what it is, before anything else
    if problem:
        raise DataError(corpus, f"{problem}; expected a JSON-lines, CSV or Parquet file")
    check_out(out, workspace)
    todo = resolve_systems(systems, workspace)
    log.info("index: %s -> %s with %s's %s", corpus, out, workspace, ", ".join(todo))
    check_workspace_current(todo, workspace)  # what `search --index` checks, before any encoding
    articles, headings, keys = clean_corpus(corpus, workspace)
    dense = [s for s in todo if s not in COMPOSED and s != "bm25"]
    with atomic_path(out, directory=True) as tmp:
        clean = layout.CLEAN.under(tmp)
        clean.mkdir(parents=True)
        for name, table in (("articles", articles), ("headings", headings), ("keys", keys)):
            table.write_parquet(clean / f"{name}.parquet", statistics=False)
        if "bm25" in todo:
            write_bm25(articles, workspace, layout.BM25.under(tmp))
        chunks = None
        block = block or max(articles.height, 1)
        if dense:
            layout.CHUNKS.under(tmp).mkdir(parents=True)
            built = write_chunks(articles, headings, workspace, layout.CHUNKS.under(tmp), out / PARTIAL, device, block)
            chunks = layout.CHUNKS.under(tmp) if built else None
        if "zeroshot" in todo:
            write_zeroshot(
                clean,
                chunks,
                workspace,
                layout.ZEROSHOT.under(tmp),
                device,
            )
        if any(s in DENSE_ON_DSR for s in todo):
            layout.EMBED.under(tmp).mkdir(parents=True)
            write_embed(articles, headings, chunks, workspace, layout.EMBED.under(tmp), device)
        graph = [s for s in todo if s in GRAPH_SYSTEMS]
        if graph:
            write_graph(graph, articles, headings, chunks, workspace, Path(tmp), device)
        rerankers = [s for s in todo if s in layout.RERANKERS]
        if rerankers:
            write_rerank(articles, workspace, rerankers, layout.RERANK_FEATURES.under(tmp), device)
        check_vectors(Path(tmp), out)
        counts = {"articles": articles.height, "headings": headings.height}
        models = {s: model_digests(s, workspace) for s in todo}
        record = index_record(corpus, digest_path(corpus), counts, models, own_files(Path(tmp), INDEX_FILE))
        write_json(record, Path(tmp) / INDEX_FILE, sort_keys=True, ensure_ascii=True)
    log.info("index: wrote %s (%s)", out, ", ".join(todo))
    return record

"""Dense retrieval over precomputed article embeddings (cosine top-k through FAISS).

:class:`DenseRetriever` pairs a query encoder with a fixed matrix of article
embeddings; it is the shared machinery of every dense system:

:func:`load_dense` loads one from its query encoder directory and its own final article
embeddings, each checked to exist first: ``dsr`` (:mod:`lexgraph.methods.dsr.system`), ``hprior``,
``gdsr``, ``qabisar``, ``hgraph``, ``hgraph_qa``.

Scores are cosine similarities; ties are broken by the lower article id, so rankings
are deterministic.

Within :func:`shared_query_encoders` (the ``hybrid`` and ``evaluate`` stages), systems
whose query encoder comes from the same directory share one loaded encoder and encode
a list of questions once: ``dsr``, ``hprior`` and ``gdsr`` all read
``models/dsr/query_encoder``, and the ``hybrid`` system's dense half is one of them.

Search goes through :class:`lexgraph.search.index.DenseIndex` (exact ``IndexFlatIP``
by default, IVF/HNSW at scale, per ``evaluate.index``); :func:`lexgraph.metrics.ir.exact_top_k` is the torch
reference it is tested against, also used by the training loops' dev evaluation (small
corpora, on the training device).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lexgraph.core.errors import LexgraphError

if TYPE_CHECKING:  # torch loads with a dense system, not with the catalogue that declares it
    import torch

log = logging.getLogger(__name__)


class _Shared:
    """What :func:`shared_query_encoders` shares: loaded encoders by directory, and their
    encodings by ``(encoder, batch size, device, questions)``."""

    def __init__(self) -> None:
        self.encoders: dict[str, object] = {}
        self.encodings: dict[tuple, torch.Tensor] = {}

    def holds(self, encoder) -> bool:
        return any(encoder is shared for shared in self.encoders.values())


_SHARED: _Shared | None = None


@contextmanager
def shared_query_encoders() -> Iterator[None]:
    """Within the block, :func:`load_query_encoder` returns one encoder per directory and
    :meth:`DenseRetriever.encode` encodes a given list of questions once per shared
    encoder, batch size and device (later calls get a copy of the first result, the very
    numbers a new encoding would give). For stages that only search: an encoder must not
    be trained inside the block. Blocks nest (the outermost one's sharing is used)."""
    global _SHARED
    outer = _SHARED
    _SHARED = outer or _Shared()
    try:
        yield
    finally:
        _SHARED = outer


def load_query_encoder(directory: str | Path, root: str | Path = "."):
    """``QueryEncoder.from_pretrained(directory, root=root)`` (``root``: the workspace, where a
    saved reference's relative path starts); within :func:`shared_query_encoders` the encoder
    already loaded from that directory, if any."""
    from lexgraph.models.encoders import QueryEncoder

    if _SHARED is None:
        return QueryEncoder.from_pretrained(directory, root=root)
    key = str(Path(directory).resolve())
    if key not in _SHARED.encoders:
        _SHARED.encoders[key] = QueryEncoder.from_pretrained(directory, root=root)
    return _SHARED.encoders[key]


class DenseRetriever:
    """Exact cosine search of encoded questions over fixed article embeddings.

    Args:
        query_encoder: anything with ``encode(texts, batch_size=..., show_progress=...)
            -> (n, dim)`` float tensor, e.g. :class:`lexgraph.models.encoders.QueryEncoder`.
        article_ids: int64 ``(na,)`` article ids.
        article_embeddings: ``(na, dim)`` embeddings, row ``i`` for ``article_ids[i]``.
        name: system name (``dsr``, ``gdsr``, …).
        device: where queries are encoded and scored (the encoder is moved there).
        batch_size: query-encoding batch size.
        source: the artefact the article embeddings come from (named in errors).
        index: :class:`lexgraph.search.index.IndexConfig` (``evaluate.index``); the
            FAISS index is built on the first search.
        normalize: cosine scores; ``False``: dot product (a model trained with it).
    """

    def __init__(
        self,
        query_encoder,
        article_ids: np.ndarray | torch.Tensor | Sequence[int],
        article_embeddings: torch.Tensor | np.ndarray,
        name: str = "dsr",
        device: torch.device | str = "cpu",
        batch_size: int = 64,
        source: str | Path = "",
        index=None,
        normalize: bool = True,
    ) -> None:
        import torch

        ids = np.asarray(article_ids.cpu() if isinstance(article_ids, torch.Tensor) else article_ids, dtype=np.int64)
        emb = torch.as_tensor(article_embeddings, dtype=torch.float32)  # (na, dim)
        if ids.ndim != 1 or emb.ndim != 2 or emb.size(0) != ids.shape[0]:
            raise LexgraphError(
                f"{name}: {ids.shape[0]} article ids but embeddings of shape {tuple(emb.shape)}; expected (n, dim)"
            )
        if len(np.unique(ids)) != len(ids):
            raise LexgraphError(f"{name}: duplicate article ids in the embedding matrix")
        order = np.argsort(ids, kind="stable")
        self.name = name
        self.source = str(source)
        self.device = torch.device(device)
        self.batch_size = int(batch_size)
        self.query_encoder = query_encoder
        if hasattr(query_encoder, "to"):
            query_encoder.to(self.device)
            query_encoder.eval()
        self.article_ids = ids[order]  # (na,)
        self.article_embeddings = emb[torch.from_numpy(order)]  # (na, dim), on the CPU for FAISS
        self.index_config = index
        self.normalize = normalize
        self._index = None

    @property
    def index(self):
        """The :class:`~lexgraph.search.index.DenseIndex` (built on first use)."""
        if self._index is None:
            from lexgraph.search.index import DenseIndex

            self._index = DenseIndex(
                self.article_ids, self.article_embeddings.numpy(), self.index_config, normalize=self.normalize
            )
        return self._index

    @property
    def dim(self) -> int:
        return int(self.article_embeddings.size(1))

    def encode(self, questions: Sequence[str], show_progress: bool = False) -> torch.Tensor:
        """Questions -> float32 ``(n, dim)`` query embeddings (encoded once per list of
        questions within :func:`shared_query_encoders`, when the encoder is shared)."""
        texts = list(questions)
        shared = _SHARED
        if shared is None or not shared.holds(self.query_encoder):
            return self.query_encoder.encode(texts, batch_size=self.batch_size, show_progress=show_progress)
        key = (id(self.query_encoder), self.batch_size, str(self.device), tuple(texts))
        if key not in shared.encodings:
            shared.encodings[key] = self.query_encoder.encode(
                texts, batch_size=self.batch_size, device=self.device, show_progress=show_progress
            )
        return shared.encodings[key].clone()

    def search_embeddings(self, query_embeddings: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k for already encoded queries ``(n, dim)``: ``(ids, scores)`` each ``(n, k)``."""
        if query_embeddings.size(-1) != self.dim:
            raise LexgraphError(
                f"{self.name}: query embeddings have dim {query_embeddings.size(-1)}, articles {self.dim}; "
                "the article embeddings were made by another model"
            )
        return self.index.search(query_embeddings.detach().float().cpu().numpy(), k)

    def search(self, questions: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Encode ``questions`` and return int64 ids / float32 cosine scores ``(n, k)``; a
        blank question gets a row of padding (ids ``-1``, scores 0)."""
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise LexgraphError(f"{self.name}.search: k = {k!r}, expected a positive integer")
        k = min(int(k), len(self.article_ids))
        ids = np.full((len(questions), k), -1, dtype=np.int64)  # (n, k)
        scores = np.zeros((len(questions), k), dtype=np.float32)  # (n, k)
        # a blank question has nothing to match: no results (as BM25), not the articles
        # nearest to the encoding of an empty text
        rows = [i for i, q in enumerate(questions) if str(q).strip()]
        if rows:
            texts = [questions[i] for i in rows]
            ids[rows], scores[rows] = self.search_embeddings(self.encode(texts, show_progress=len(texts) > 1000), k)
        return ids, scores


def require_built(path: Path, what: str, stage: str) -> Path:
    """``path`` if it exists; else a :class:`LexgraphError` naming it, ``what`` it is and the stage to run."""
    if not path.exists():
        raise LexgraphError(f"{path}: {what} not found; run `dvc repro {stage}` first")
    return path


def load_dense(
    name: str,
    query_dir: Path,
    emb_path: Path,
    stage: str,
    device: str = "auto",
    index=None,
    normalize: bool = True,
    *,
    embeddings_what: str | None = None,
    workspace: str | Path = ".",
) -> DenseRetriever:
    """The system ``name``: the query encoder in ``query_dir`` + the article embeddings in
    ``emb_path``, both made by ``stage`` (the embeddings are checked first; a missing one is
    "the <name> article embeddings", or ``embeddings_what``, "not found; run `dvc repro <stage>` first").
    ``workspace``: where a query encoder saved by reference finds its source."""
    from lexgraph.core.config import resolve_device
    from lexgraph.encoding.embed import check_article_order, load_embeddings

    require_built(emb_path, embeddings_what or f"the {name} article embeddings", stage)
    require_built(query_dir, f"the {name} query encoder", stage)
    ids, embeddings = load_embeddings(emb_path)
    check_article_order(emb_path, ids)
    encoder = load_query_encoder(query_dir, root=workspace)
    return DenseRetriever(
        encoder,
        ids,
        embeddings,
        name=name,
        device=resolve_device(device),
        source=emb_path,
        index=index,
        normalize=normalize,
    )

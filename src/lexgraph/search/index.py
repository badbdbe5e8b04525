"""Dense top-k search through FAISS: exact inner product by default, IVF or HNSW at scale.

Every dense system (``zeroshot``, ``dsr``, ``gdsr``, ``qabisar`` and hybrid's dense side)
searches its article embeddings through a :class:`DenseIndex`, in ``evaluate`` and in
``lexgraph search`` alike; the settings are the ``evaluate.index`` keys of params.yaml
(:class:`IndexConfig`).

Contract:

* Cosine similarity = inner product of L2-normalised float32 vectors: articles are
  normalised once when the index is built, queries at every search.
* ``type: flat`` (``faiss.IndexFlatIP``) is exact: the same ranking as the torch matmul
  reference :func:`lexgraph.metrics.ir.exact_top_k`, up to float rounding of
  near-equal scores. ``type: ivf`` (``IndexIVFFlat``, ``nlist`` inverted lists, default
  ``4 * sqrt(n)``, ``nprobe`` of them visited per query) and ``type: hnsw``
  (``IndexHNSWFlat``, ``hnsw_m`` links per node, ``ef_construction`` at build,
  ``ef_search`` at query time) are approximate; ``benchmarks/scale.py`` measures their
  recall@100 against flat. ``type: auto`` uses flat below ``exact_below`` articles and
  ``ann`` (ivf or hnsw) from there on.
* Results are ``(ids int64 (n, k), scores float32 (n, k))``, best first; equal scores are
  ordered by lower article id (the index fetches a few extra neighbours, re-sorts by
  ``(-score, id)`` and cuts); IVF's k-means trains on a seeded sample of at most
  40 points per list. A row shorter than ``k`` (an ANN index that found fewer
  neighbours) is padded with id ``-1`` and score 0, as BM25 pads; the index then logs one
  warning naming its settings and "returned n of k" (once per index).
* Flat is deterministic. IVF's k-means is seeded (``seed``). HNSW inserts vectors with
  several threads, so its graph, hence its approximate results, may vary from run to
  run; flat's never do.

``faiss`` is imported lazily: BM25-only code paths never load it.
"""

from __future__ import annotations

import copy
import logging
import math
from typing import Annotated, Literal

import numpy as np
from pydantic import AfterValidator, Field, create_model
from pydantic_core import PydanticUndefined

from lexgraph.core.settings import Int, Settings

log = logging.getLogger(__name__)

TYPES = ("auto", "flat", "ivf", "hnsw")
ANN_TYPES = ("ivf", "hnsw")
#: extra neighbours fetched beyond k so that ties at the cut-off are broken by lower id
TIE_MARGIN = 8
#: IVF k-means trains on at most this many points per list
TRAIN_PER_LIST = 40


class IndexConfig(Settings):
    """``evaluate.index`` in params.yaml: how dense systems search their article embeddings. The
    one section config with defaults (params.yaml's values): ``lexgraph search`` in a workspace
    without params.yaml searches with ``IndexConfig()``; ``evaluate`` reads the keys as
    :data:`IndexKeys`, each required."""

    type: Literal[TYPES] = Field(
        "auto",
        description="flat: exact (IndexFlatIP); ivf (IndexIVFFlat), hnsw (IndexHNSWFlat): approximate; auto: flat "
        "below exact_below articles, ann from there on",
    )
    exact_below: Annotated[Int, Field(ge=0)] = Field(200_000, description="auto: flat below this many articles")
    ann: Literal[ANN_TYPES] = Field("ivf", description="what auto uses at scale")
    nlist: Annotated[Int, Field(ge=0)] = Field(0, description="IVF lists; 0 = 4 * sqrt(n)")
    nprobe: Annotated[Int, Field(ge=1)] = Field(128, description="IVF lists visited per query")
    hnsw_m: Annotated[Int, Field(ge=2)] = Field(32, description="HNSW links per node")
    ef_construction: Annotated[Int, Field(ge=1)] = Field(80, description="HNSW build beam")
    ef_search: Annotated[Int, Field(ge=1)] = Field(256, description="HNSW query beam; raised to k")

    def resolve(self, n: int) -> str:
        """The index type used for a corpus of ``n`` articles (``auto`` resolved)."""
        if self.type != "auto":
            return self.type
        return "flat" if n < self.exact_below else self.ann

    def lists(self, n: int) -> int:
        """IVF lists for ``n`` vectors: ``nlist``, or ``4 * sqrt(n)``; never more than ``n``."""
        return max(1, min(n, self.nlist or int(round(4 * math.sqrt(n)))))


def _every_key_required(model: type[Settings]) -> type[Settings]:
    """``model``'s fields, each required (no default): a mapping read from params.yaml sets every key."""
    fields = {}
    for name, f in model.model_fields.items():
        required = copy.copy(f)
        required.default = PydanticUndefined
        fields[name] = (f.annotation, required)
    return create_model(f"{model.__name__}Keys", __base__=Settings, __doc__=model.__doc__, **fields)


#: ``evaluate.index`` as params.yaml gives it: :class:`IndexConfig`'s keys, every one required (no
#: silent default), read as an :class:`IndexConfig`
IndexKeys = Annotated[_every_key_required(IndexConfig), AfterValidator(lambda keys: IndexConfig(**dict(keys)))]


def normalise(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` ``(n, d)`` scaled to unit L2 norm, as C-contiguous float32 (zero rows stay 0)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)  # (n, 1)
    return np.ascontiguousarray(x / np.maximum(norms, 1e-12), dtype=np.float32)


def _faiss():
    """The faiss module, its loader quiet: at import, ``faiss.loader`` logs at INFO each
    instruction set it tries (with the ModuleNotFoundError of those the wheel lacks); only
    its warnings and errors (no faiss library loads at all) reach the log."""
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    import faiss

    return faiss


class DenseIndex:
    """A FAISS index over article embeddings with id-aware, tie-stable top-k.

    Args:
        article_ids: int64 ``(n,)`` distinct ids, row ``i`` of ``embeddings`` is ``article_ids[i]``.
        embeddings: ``(n, d)`` article embeddings (any scale: normalised here).
        config: :class:`IndexConfig` (default: exact below 200k articles).
        seed: IVF k-means seed.
        normalize: cosine scores (rows and queries normalised); ``False``: plain inner
            product, for a system trained with dot-product scoring.
    """

    def __init__(
        self,
        article_ids: np.ndarray,
        embeddings: np.ndarray,
        config: IndexConfig | None = None,
        seed: int = 13,
        normalize: bool = True,
    ) -> None:
        faiss = _faiss()
        self.config = config or IndexConfig()
        ids = np.asarray(article_ids, dtype=np.int64)
        order = np.argsort(ids, kind="stable")  # rows in id order: FAISS row -> ascending id
        self.article_ids = ids[order]  # (n,)
        self.normalize = normalize
        x = np.asarray(embeddings)[order]  # (n, d)
        x = normalise(x) if normalize else np.ascontiguousarray(x, dtype=np.float32)
        n, d = x.shape
        self.dim = d
        self.kind = self.config.resolve(n)
        cfg = self.config
        if self.kind == "flat":
            index = faiss.IndexFlatIP(d)
        elif self.kind == "ivf":
            quantizer = faiss.IndexFlatIP(d)
            index = faiss.IndexIVFFlat(quantizer, d, cfg.lists(n), faiss.METRIC_INNER_PRODUCT)
            index.cp.seed = int(seed)
            # k-means on a seeded sample of TRAIN_PER_LIST points per list (FAISS asks >= 39)
            sample = min(n, TRAIN_PER_LIST * index.nlist)
            rows = np.sort(np.random.default_rng(seed).choice(n, sample, replace=False)) if sample < n else slice(None)
            index.train(x[rows])
            index.nprobe = min(cfg.nprobe, index.nlist)
        else:
            index = faiss.IndexHNSWFlat(d, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = cfg.ef_construction
        index.add(x)
        self.index = index
        self._warned = False  # a search returned fewer than k articles (said once)
        log.info("dense index: %s over %d articles (dim %d)%s", self.kind, n, d, self.settings())

    def settings(self) -> str:
        """The approximate index's settings, as a log line words them (empty for flat)."""
        if self.kind == "ivf":
            nlist, asked = self.index.nlist, self.config.nlist
            clipped = f" (evaluate.index.nlist {asked}: at most one per article)" if asked > nlist else ""
            return f", nlist {nlist}{clipped}, nprobe {self.index.nprobe}"
        return f", M {self.config.hnsw_m}, efSearch {self.config.ef_search}" if self.kind == "hnsw" else ""

    def __len__(self) -> int:
        return int(self.article_ids.size)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` (clipped to the corpus size) of each query ``(nq, d)``: ids int64 and
        cosine scores float32, each ``(nq, k)``, best first, ties by lower id; rows an ANN
        index could not fill are padded with id ``-1`` / score 0."""
        n = len(self)
        k = min(int(k), n)
        if k < 1:
            raise ValueError(f"k must be positive, got {k}")
        q = normalise(queries) if self.normalize else np.ascontiguousarray(queries, dtype=np.float32)  # (nq, d)
        fetch = min(n, k + TIE_MARGIN)
        if self.kind == "hnsw":
            self.index.hnsw.efSearch = max(self.config.ef_search, fetch)
        scores, rows = self.index.search(q, fetch)  # (nq, fetch) each; row -1 = not found
        found = rows >= 0
        ids = np.where(found, self.article_ids[np.where(found, rows, 0)], -1)  # (nq, fetch)
        # re-sort by (-score, id) with the missing ones last, then cut to k
        key_score = np.where(found, scores, -np.inf)
        key_id = np.where(found, ids, np.iinfo(np.int64).max)
        order = np.lexsort((key_id, -key_score), axis=-1)[:, :k]  # (nq, k)
        ids = np.take_along_axis(ids, order, axis=1)
        scores = np.where(ids >= 0, np.take_along_axis(scores, order, axis=1), 0.0).astype(np.float32)
        self._say_short((ids >= 0).sum(axis=1), k)
        return ids.astype(np.int64, copy=False), scores

    def _say_short(self, found: np.ndarray, k: int) -> None:
        """One warning line (once per index) when an approximate index's settings cannot reach
        ``k`` articles for some questions (``found``: ``(nq,)`` articles returned per question)."""
        short = found < k
        if self._warned or not short.any():
            return
        self._warned = True
        settings, remedy = self.settings(), "raise evaluate.index.nprobe or lower evaluate.index.nlist"
        if self.kind == "hnsw":  # efSearch was raised to k: only a better connected graph helps
            settings = f", M {self.config.hnsw_m}, efConstruction {self.config.ef_construction}, efSearch "
            settings += f"{self.index.hnsw.efSearch} (evaluate.index.ef_search {self.config.ef_search}, raised to k)"
            remedy = "raise evaluate.index.hnsw_m or evaluate.index.ef_construction"
        log.warning(
            "dense index %s%s: returned %d of %d articles for %d of %d questions (the rest padded with -1); %s",
            self.kind,
            settings,
            int(found.min()),
            k,
            int(short.sum()),
            found.size,
            remedy,
        )

    @property
    def nbytes(self) -> int:
        """Size of the serialised FAISS index in bytes (vectors + structure)."""
        return int(_faiss().serialize_index(self.index).nbytes)

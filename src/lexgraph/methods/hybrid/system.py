"""The ``hybrid`` system: BM25 fused with a dense system, or one of them alone, as chosen on dev.

The fusion methods are :mod:`lexgraph.search.fusion`'s (RRF and weighted score sums,
:func:`ranx.fuse`'s scores to the last bit); choosing one on dev is
:mod:`lexgraph.methods.hybrid.tune`'s (the ``hybrid`` stage). This module holds the
``hybrid`` section of params.yaml, the grid of candidates it defines, the retriever and
the settings file.

The stage writes ``models/hybrid/hybrid.json`` (the choice and the whole grid with its
dev scores; no timestamps, sorted keys); :func:`load_hybrid` reads it back and builds
:class:`HybridRetriever` from the workspace's ``bm25`` and dense systems.
When the choice is one system alone (``fusion.method`` ``bm25`` or ``dense``), only that
system is loaded and the ``hybrid`` system returns its ranking unchanged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lexgraph.core import layout
from lexgraph.core.config import bad_value, expectation, params_error, refuse_held_out, section_config
from lexgraph.core.conform import saved_value
from lexgraph.core.errors import DataError, LexgraphError
from lexgraph.core.inputs import DuplicateKeyError, json_object
from lexgraph.data.schema import SPLITS
from lexgraph.methods.system import System
from lexgraph.metrics.ir import DEEPEST, METRICS
from lexgraph.search.fusion import ALONE, NORMS, Fusion, fuse

log = logging.getLogger(__name__)

SECTION = "hybrid"
SPARSE = "bm25"

SETTINGS = "hybrid.json"
FORMAT = "lexgraph-hybrid"
FORMAT_VERSION = 1


def dense_systems() -> tuple[str, ...]:
    """The systems ``hybrid.dense`` may name (``best``: the best of them on dev), in the registry's order."""
    from lexgraph.methods.catalog import names

    return names("dense")


# ---------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class HybridConfig:
    """The ``hybrid`` section of params.yaml."""

    split: str = field(metadata={"expected": "dev (or train)"})
    metric: str = field(metadata={"expected": f"one of {', '.join(METRICS)}"})
    dense: str = field(metadata={"expected": "a dense system (lexgraph systems lists them) or best"})
    depth: int = field(metadata={"expected": f"an integer >= {DEEPEST} (articles fused per system)"})
    rrf_k: list[int] = field(metadata={"expected": "a list of distinct integers >= 0"})
    norms: list[str] = field(metadata={"expected": f"a list of distinct normalisations among {', '.join(NORMS)}"})
    weights: list[float] = field(metadata={"expected": "a list of distinct numbers in [0, 1] (BM25's weight)"})
    #: also try BM25 alone and the dense system alone (last in the grid: a tie goes to a fusion)
    alone: bool = field(metadata={"expected": "true or false"})

    @classmethod
    def from_params(cls, params: dict[str, Any] | None) -> HybridConfig:
        return section_config(cls, params, SECTION)

    def validate(self) -> None:
        def bad(key: str) -> Exception:
            return bad_value(SECTION, key, getattr(self, key), expectation(HybridConfig, key))

        refuse_held_out(SECTION, "split", self.split, expectation(HybridConfig, "split"))
        if self.split not in SPLITS:
            raise bad("split")
        if self.metric not in METRICS:
            raise bad("metric")
        if self.dense not in (*dense_systems(), "best"):
            raise bad_value(SECTION, "dense", self.dense, f"one of {', '.join(dense_systems())} or best")
        if not depth_ok(self.depth):
            raise bad("depth")
        if any(k < 0 for k in self.rrf_k) or len(set(self.rrf_k)) < len(self.rrf_k):
            raise bad("rrf_k")
        if any(n not in NORMS for n in self.norms) or len(set(self.norms)) < len(self.norms):
            raise bad("norms")
        if any(not 0.0 <= w <= 1.0 for w in self.weights) or len(set(self.weights)) < len(self.weights):
            raise bad("weights")
        if not self.rrf_k and not (self.norms and self.weights):
            raise params_error(
                f"'{SECTION}.rrf_k' = {self.rrf_k!r} and '{SECTION}.norms' = {self.norms!r}, "
                f"'{SECTION}.weights' = {self.weights!r} leave no fusion to try; expected a non-empty "
                f"'{SECTION}.rrf_k', or non-empty '{SECTION}.norms' and '{SECTION}.weights'"
            )
        if bool(self.norms) != bool(self.weights):  # a weighted sum needs both: one alone would be ignored silently
            raise params_error(
                f"'{SECTION}.norms' = {self.norms!r} and '{SECTION}.weights' = {self.weights!r}: a weighted sum "
                f"needs a normalisation and a weight; expected both non-empty, or both empty (RRF only)"
            )


def depth_ok(depth: int) -> bool:
    """``hybrid.depth``'s range, in params.yaml and read back from ``hybrid.json`` alike."""
    return depth >= DEEPEST


def grid(config: HybridConfig) -> list[Fusion]:
    """The candidates of ``config``, in grid (and tie-breaking) order: RRF by ``k``, then
    ``wsum`` per normalisation (config order) by weight, then (``hybrid.alone``) BM25 alone
    and the dense system alone, so that one system wins only when it beats every fusion."""
    rrf = [Fusion("rrf", k=int(k)) for k in sorted(config.rrf_k)]
    wsum = [Fusion("wsum", norm=n, weight=float(w)) for n in config.norms for w in sorted(config.weights)]
    return rrf + wsum + ([Fusion(method) for method in ALONE] if config.alone else [])


# ---------------------------------------------------------------------------
# The retriever
# ---------------------------------------------------------------------------


class HybridRetriever:
    """BM25 and a dense system, each searched to ``depth``, fused with ``fusion``; or, when
    ``fusion`` is one system alone, that system's own ranking (the other may be None).

    Args:
        sparse: the BM25 retriever (None when the choice is the dense system alone).
        dense: the dense retriever (any :class:`lexgraph.methods.system.Retriever`; None when the
            choice is BM25 alone).
        fusion: the fusion method (chosen on dev by the ``hybrid`` stage).
        depth: articles each system contributes per question (a positive integer: checked
            where it enters, :func:`read_settings`).
        name: system name.
        source: where the fusion settings come from (named in errors).
    """

    def __init__(
        self, sparse, dense, fusion: Fusion, depth: int, name: str = "hybrid", source: str | Path = ""
    ) -> None:
        needed = {"bm25": ("sparse",), "dense": ("dense",)}.get(fusion.method, ("sparse", "dense"))
        missing = [side for side in needed if {"sparse": sparse, "dense": dense}[side] is None]
        if missing:
            raise LexgraphError(f"{name}: {fusion.label} needs the {' and '.join(missing)} system")
        a = np.asarray((sparse if sparse is not None else dense).article_ids, dtype=np.int64)
        b = np.asarray((dense if dense is not None else sparse).article_ids, dtype=np.int64)
        if a.shape != b.shape or not np.array_equal(np.sort(a), np.sort(b)):
            raise LexgraphError(
                f"{name}: {sparse.name} ranks {a.size} articles and {dense.name} {b.size} other ones; expected both "
                "built on the same corpus (run `dvc repro`)"
            )
        self.sparse, self.dense, self.fusion, self.depth = sparse, dense, fusion, depth
        self.name = name
        self.source = str(source)
        self.article_ids = np.sort(a)  # (na,)

    def search(self, questions: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` fused articles: ids int64 / scores float32, both ``(n, k)`` (``k`` clipped
        to the corpus size; ``-1`` padding past the fused list of at most ``2 * depth``). A
        single-system choice returns that system's own top-``k``, unchanged."""
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise LexgraphError(f"{self.name}.search: k = {k!r}, expected a positive integer")
        k = min(int(k), self.article_ids.size)
        questions = list(questions)
        if self.fusion.alone:
            return (self.sparse if self.fusion.method == "bm25" else self.dense).search(questions, k)
        sparse = self.sparse.search(questions, self.depth)  # (n, depth) each
        dense = self.dense.search(questions, self.depth)
        return fuse(sparse, dense, self.fusion, k)


def read_settings(path: str | Path) -> dict[str, Any]:
    """The stage's ``hybrid.json``, checked (format, systems, fusion, depth)."""
    path = Path(path)
    restore = "rerun `dvc repro hybrid` (or `dvc checkout`) to restore it"
    if not path.is_file():
        raise LexgraphError(f"{path}: the hybrid fusion settings not found; run `dvc repro hybrid` first")
    try:
        settings = json_object(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, DuplicateKeyError) as exc:
        raise DataError(path, f"truncated or corrupt hybrid settings ({exc}); {restore}") from None
    if not isinstance(settings, dict) or settings.get("format") != FORMAT or settings.get("version") != FORMAT_VERSION:
        raise DataError(path, f"not a hybrid settings file (expected format {FORMAT!r} v{FORMAT_VERSION}); {restore}")
    try:
        Fusion.from_dict(settings["fusion"])
        if settings["dense"] not in dense_systems() or settings["sparse"] != SPARSE:
            raise ValueError(f"systems {settings['sparse']!r} + {settings['dense']!r}")
        if "depth" not in settings:
            raise KeyError("depth")
    except (KeyError, TypeError, ValueError, AttributeError, LexgraphError) as exc:
        raise DataError(path, f"inconsistent hybrid settings ({exc}); {restore}") from None
    saved_value(HybridConfig, "depth", settings["depth"], path, restore, ok=depth_ok)
    return settings


def load_hybrid(
    workspace: Path, device: str = "auto", index=None, *, load: Callable[..., Any], corpus: Path | None = None
) -> HybridRetriever:
    """The ``hybrid`` system: BM25 + the dense system of ``models/hybrid/hybrid.json``, fused as chosen there
    (a single-system choice loads that system only); ``load`` loads a component by name (the registry's
    ``load_retriever``, which passes itself), over ``corpus`` (an index of another corpus) when given."""
    workspace = Path(workspace)
    path = layout.HYBRID.under(workspace, SETTINGS)
    settings = read_settings(path)
    fusion = Fusion.from_dict(settings["fusion"])
    sparse = load(settings["sparse"], workspace, device, corpus=corpus) if fusion.method != "dense" else None
    dense = load(settings["dense"], workspace, device, index=index, corpus=corpus) if fusion.method != "bm25" else None
    if fusion.alone:
        log.info(
            "hybrid: %s chose %s alone (%s)",
            path,
            settings["sparse"] if sparse is not None else settings["dense"],
            "dev said fusion loses",
        )
    return HybridRetriever(sparse, dense, fusion, settings["depth"], source=path)


def components(workspace: Path) -> list[str]:
    """The systems the workspace's hybrid fuses (``models/hybrid/hybrid.json``)."""
    settings = read_settings(layout.HYBRID.under(workspace, SETTINGS))
    return [settings["sparse"], settings["dense"]]


SYSTEMS = (
    System(
        name="hybrid",
        kind="composed",
        summary="BM25 fused with a dense system (the fusion, its weight and the dense system chosen on dev)",
        load=load_hybrid,
        reads=(layout.HYBRID,),
        stage=layout.HYBRID.stage,
        index_models=(layout.HYBRID.path.as_posix() + "/" + SETTINGS,),  # its systems are checked as themselves
        components=components,
    ),
)

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
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from lexgraph.core import layout
from lexgraph.core.config import HELD_OUT_SPLIT
from lexgraph.core.errors import DataError, LexgraphError
from lexgraph.core.inputs import DuplicateKeyError, json_object
from lexgraph.core.settings import Bool, Expect, Float, Int, Section, Settings, Str, enforce, saved_section
from lexgraph.data.schema import SPLITS
from lexgraph.methods.system import ComposedSystem
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


#: ``hybrid.depth``'s domain, in params.yaml and read back from ``hybrid.json`` alike
Depth = Annotated[Int, Field(ge=DEEPEST)]
#: the splits the fusion may be chosen on: never the held-out one
TUNING_SPLITS = tuple(s for s in SPLITS if s != HELD_OUT_SPLIT)
SPLIT = "dev (or train)"
RRF_K = "a list of distinct integers >= 0"
NORM_NAMES = f"a list of distinct normalisations among {', '.join(NORMS)}"
WEIGHTS = "a list of distinct numbers in [0, 1] (BM25's weight)"


class HybridConfig(Section, section=SECTION):
    """The ``hybrid`` section of params.yaml."""

    split: Annotated[
        Literal[TUNING_SPLITS], Expect(f"{SPLIT}; the '{HELD_OUT_SPLIT}' split is held out for evaluation")
    ] = Field(description="the fusion is chosen on this split only (test refused)")
    metric: Literal[METRICS] = Field(description="the fusion is chosen by this metric (ties: the first in grid order)")
    dense: Annotated[Str, Expect("a dense system (lexgraph systems lists them) or best")] = Field(
        description="the dense system fused with BM25, or best: the one with the best metric on the split"
    )
    depth: Depth = Field(description="articles fused per system")
    rrf_k: Annotated[list[Annotated[Int, Field(ge=0)]], Expect(RRF_K)] = Field(
        description="reciprocal rank fusion 1/(k + rank)"
    )
    norms: Annotated[list[Literal[NORMS]], Expect(NORM_NAMES)] = Field(
        description="weighted score sums w * norm(bm25) + (1 - w) * norm(dense), per question"
    )
    weights: Annotated[list[Annotated[Float, Field(ge=0, le=1)]], Expect(WEIGHTS)] = Field(
        description="BM25's weight w"
    )
    alone: Bool = Field(
        description="also try BM25 alone and the dense system alone (last in the grid: a tie goes to a fusion)"
    )

    @model_validator(mode="after")
    def _rules(self) -> HybridConfig:
        def twice(values: list) -> bool:
            return len(set(values)) < len(values)

        # a weighted sum needs both a normalisation and a weight: one alone would be ignored silently
        empty, other = ("norms", "weights") if not self.norms else ("weights", "norms")
        dense = dense_systems()
        rules = (
            ("dense", self.dense not in (*dense, "best"), f"one of {', '.join(dense)} or best"),
            ("rrf_k", twice(self.rrf_k), RRF_K),
            ("norms", twice(self.norms), NORM_NAMES),
            ("weights", twice(self.weights), WEIGHTS),
            (
                "rrf_k",
                not self.rrf_k and not (self.norms and self.weights),
                f"a non-empty list, or non-empty '{SECTION}.norms' and '{SECTION}.weights' (no fusion is left to try)",
            ),
            (
                empty,
                bool(self.norms) != bool(self.weights),
                f"a non-empty list to go with '{SECTION}.{other}' = {getattr(self, other)!r} (a weighted sum needs "
                "a normalisation and a weight), or both empty (RRF only)",
            ),
        )
        return enforce(self, rules)


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


class SavedDepth(Settings):
    """What ``hybrid.json`` holds of the section's own keys: the depth, checked as ``hybrid.depth`` is."""

    depth: Depth


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
    settings["depth"] = saved_section(SavedDepth, {"depth": settings["depth"]}, path, None, restore).depth
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


SYSTEM = ComposedSystem(
    name="hybrid",
    summary="BM25 fused with a dense system (the fusion, its weight and the dense system chosen on dev)",
    load=load_hybrid,
    reads=(layout.HYBRID,),
    index_models=(layout.HYBRID.posix(SETTINGS),),  # its systems are checked as themselves
    components=components,
)

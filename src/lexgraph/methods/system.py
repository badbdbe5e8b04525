"""What a retrieval system is to lexgraph: one :class:`System` declaration, written once next to
the system's code, from which every command finds it.

A system's module declares ``SYSTEM = DenseSystem(...)`` (a family of variants: ``SYSTEMS``), in
the class of its kind; :mod:`lexgraph.methods.catalog` collects lexgraph's own and those other
packages declare under the ``lexgraph.systems`` entry-point group (docs/systems.md: adding a
system). ``lexgraph search`` and the ``evaluate`` stage load it (:attr:`System.load`, after checking
:attr:`System.reads`), ``lexgraph export`` writes it when it is dense
(:attr:`DenseSystem.article_side`, :attr:`DenseSystem.article_encoder`), ``lexgraph index`` builds
its side of an index of another corpus (:attr:`System.index`, recorded by
:attr:`System.index_models`, verified by :attr:`System.index_side`) and ``lexgraph serve`` serves
it. No table elsewhere is keyed by a system's name: each is a query on the registry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

import numpy as np

from lexgraph.core.layout import Artifact

#: sparse: a term index; dense: a query encoder and fixed article vectors (exportable); composed: a
#: fusion of other systems; reranker: a first stage's candidates re-scored
Kind = Literal["sparse", "dense", "composed", "reranker"]
KINDS: tuple[str, ...] = ("sparse", "dense", "composed", "reranker")


class Retriever(Protocol):
    """What a loaded system is: a name, the article ids it ranks, where it was loaded from, and a search."""

    name: str
    article_ids: np.ndarray
    source: str

    def search(self, questions: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(frozen=True)
class System:
    """One retrieval system, as every command sees it; declared as the class of its kind
    (:class:`SparseSystem`, :class:`DenseSystem`, :class:`ComposedSystem`, :class:`Reranker`)."""

    #: what it is, fixed by the class of its declaration
    kind: ClassVar[Kind]
    #: the name ``--system``, ``evaluate.systems`` and ``serve.systems`` give
    name: str
    #: one line: what it is (``lexgraph systems``; export's refusal of a system that is not dense)
    summary: str
    #: ``(workspace: Path, device: str)`` plus, when the loader declares them, ``index`` (how a dense
    #: system searches its vectors), ``load`` (``load_retriever``, for a system built on others) and
    #: ``corpus`` (an index of another corpus) -> a :class:`Retriever`
    load: Callable[..., Retriever]
    #: the workspace artefacts it reads itself: all present means it is built; their provenance is
    #: checked before it loads (those it is built on are followed through their records)
    reads: tuple[Artifact, ...]
    #: the dvc.yaml stage (``name@item`` for a foreach entry) that builds it; by default (None) the
    #: stage of the first artefact in :attr:`reads`, the one its stage writes
    stage: str | None = None
    #: the workspace artefacts (relative paths, :meth:`Artifact.posix`) its side of an index is made
    #: with: ``index.json`` records their digests, and a search over the index refuses when they changed
    index_models: tuple[str, ...] = ()
    #: the folders of an index that it reads when searched (verified against ``index.json``); by
    #: default (None), for a system with an :attr:`index`, the artefact of :attr:`reads` its
    #: stage writes: an index holds a system's side where the workspace holds it
    index_side: tuple[str, ...] | None = None
    #: ``(job: lexgraph.systems.corpus_index.IndexJob) -> None``: writes its side of an index of another
    #: corpus; None for a system built on others (their sides are its side)
    index: Callable[[Any], None] | None = None
    #: composed, reranker: ``(workspace) -> [system, ...]``, the systems it searches through
    components: Callable[[Path], list[str]] | None = None
    #: ``(workspace) -> str``: why it is switched off there (a placeholder artefact), or ""
    switched_off: Callable[[Path], str] | None = None

    def __post_init__(self) -> None:
        if getattr(type(self), "kind", None) not in KINDS:
            raise TypeError(
                f"system '{self.name}' is declared as a {type(self).__name__}; expected the class of its kind: "
                "SparseSystem, DenseSystem, ComposedSystem or Reranker"
            )
        if self.stage is None:
            if not self.reads:
                raise TypeError(f"system '{self.name}' reads no artefact: its declaration gives its stage")
            object.__setattr__(self, "stage", self.reads[0].stage)
        if self.index_side is None:
            built = [a.posix() for a in self.reads if a.stage == self.stage] if self.index is not None else []
            object.__setattr__(self, "index_side", tuple(built[:1]))

    @property
    def dense(self) -> bool:
        return self.kind == "dense"

    @property
    def graph_side(self) -> bool:
        """Its article vectors come from a pass over the statute graph, not from article texts."""
        return False

    def off_in(self, workspace: Path) -> str:
        """Why it is switched off in ``workspace``, or ""."""
        return self.switched_off(workspace) if self.switched_off is not None else ""

    def uses(self, workspace: Path) -> list[str]:
        """The systems it searches through in ``workspace`` (none but composed ones and re-rankers)."""
        return self.components(workspace) if self.components is not None else []


@dataclass(frozen=True)
class SparseSystem(System):
    """A term index."""

    kind: ClassVar[Kind] = "sparse"


@dataclass(frozen=True)
class DenseSystem(System):
    """A query encoder and fixed article vectors: what ``lexgraph export`` writes (its model card
    reads the fields below)."""

    kind: ClassVar[Kind] = "dense"
    #: the params.yaml sections its artefacts are built from (the export's model card)
    sections: tuple[str, ...] = ()
    #: where its article vectors come from, in words (the export's model card)
    article_side: str = ""
    #: ``(workspace, device) -> module`` encoding article texts as its stage did (the export's
    #: ``encode_document``); None when its vectors need the statute graph (``encode_document`` refuses)
    article_encoder: Callable[[Path, str], Any] | None = None

    @property
    def graph_side(self) -> bool:
        """No text encoder gives its article vectors: they come from a pass over the statute graph."""
        return self.article_encoder is None


@dataclass(frozen=True)
class ComposedSystem(System):
    """A fusion of other systems (:attr:`components`)."""

    kind: ClassVar[Kind] = "composed"


@dataclass(frozen=True)
class Reranker(System):
    """A first stage's candidates re-scored (the first stage: :attr:`components`)."""

    kind: ClassVar[Kind] = "reranker"

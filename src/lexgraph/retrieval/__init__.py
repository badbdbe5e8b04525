"""Retrieval systems behind one interface.

A system is anything with ``search(questions, k) -> (ids, scores)`` over the cleaned
corpus; ``ids`` is an int64 array ``(n_questions, k)`` of article ids, best first, and
``scores`` the float32 scores ``(n_questions, k)``. Systems are loaded from the
artefacts that ``dvc repro`` wrote in a workspace, by name, so the ``evaluate`` stage
and ``lexgraph search`` share exactly the same code path.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from lexgraph.errors import LexgraphError

# system name -> "module:function"; the function takes (workspace: Path, device: str)
# and returns a Retriever. Imported lazily so BM25 never pays for torch imports.
SYSTEMS: dict[str, str] = {
    "bm25": "lexgraph.retrieval.bm25:load_system",
    "zeroshot": "lexgraph.zeroshot:load_system",
    "dsr": "lexgraph.retrieval.dense:load_dsr",
    "gdsr": "lexgraph.retrieval.gnn:load_gdsr",
    "qabisar": "lexgraph.retrieval.gnn:load_qabisar",
}


class Retriever(Protocol):
    name: str

    def search(self, questions: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]: ...


def load_retriever(system: str, workspace: str | Path = ".", device: str = "auto") -> Retriever:
    """Load system ``system`` from the artefacts under ``workspace``."""
    if system not in SYSTEMS:
        raise LexgraphError(f"unknown system '{system}'; expected one of {', '.join(SYSTEMS)}")
    module, func = SYSTEMS[system].split(":")
    return getattr(importlib.import_module(module), func)(Path(workspace), device)

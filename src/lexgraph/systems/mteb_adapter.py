"""A dense system of a workspace as an MTEB 2 model, and the workspace's own split as an MTEB task.

:class:`MTEBEncoder` implements mteb 2's ``EncoderProtocol`` (``mteb.models.models_protocols``):
``encode(inputs: DataLoader, *, task_metadata, hf_split, hf_subset, prompt_type)``,
``similarity``, ``similarity_pairwise`` and ``mteb_model_meta``. Both sides are the system's own:

* ``prompt_type`` ``query`` (or none, for tasks without sides): the system's query encoder (its
  prefix, pooling and truncation);
* ``prompt_type`` ``document``: the system's article text encoder (:func:`lexgraph.systems.export.article_side`:
  DSR's hierarchical encoder, zeroshot's windowed mean), on the texts MTEB gives (a corpus entry's
  title and text, joined by MTEB); a system whose article vectors come from the statute graph
  (``hprior``, the graph encoders) has no text encoder, so it returns its own vector of each
  document *id*, and a corpus holding an id it has no vector for is one line.

Vectors are float32, L2-normalised for a cosine system, so the dot product (``similarity``) is the
system's score.

:func:`workspace_task` is the workspace's own labelled split as an MTEB ``Retrieval`` task (the
articles of ``data/clean`` as the corpus, ids as strings), so ``mteb.evaluate`` runs offline on
data lexgraph made; ``lexgraph mteb`` (:mod:`lexgraph.cli.mteb`) runs it, or any task of MTEB's
registry such as ``BSARDRetrieval.v2`` on a machine that reaches the Hugging Face hub.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from lexgraph.core.errors import LexgraphError

log = logging.getLogger(__name__)

#: the workspace task's name (``lexgraph mteb --task workspace``)
WORKSPACE_TASK = "workspace"


class MTEBEncoder:
    """A loaded dense system (``retriever``) and its article text encoder (``articles``, ``None``
    for a graph system) as an MTEB 2 encoder (module docstring)."""

    def __init__(self, system: str, retriever, articles, batch_size: int = 16) -> None:
        self.system, self.retriever, self.articles = system, retriever, articles
        self.batch_size = int(batch_size)
        self.normalize = bool(retriever.normalize)
        self._rows = {str(int(i)): row for row, i in enumerate(retriever.article_ids)}

    @classmethod
    def load(cls, system: str, workspace: str | os.PathLike = ".", device: str = "cpu") -> MTEBEncoder:
        from lexgraph.systems.export import article_side, check_system
        from lexgraph.systems.registry import load_retriever

        check_system(system)
        workspace = Path(workspace)
        retriever = load_retriever(system, workspace, device)
        return cls(system, retriever, article_side(system, workspace, device))

    def encode(self, inputs, *, task_metadata=None, hf_split=None, hf_subset=None, prompt_type=None, **kwargs: Any):
        """float32 ``(n, dim)`` vectors of every input of the ``DataLoader`` ``inputs``, in order."""
        from lexgraph.search.index import normalise

        batches = list(inputs)
        texts = [str(text) for batch in batches for text in batch["text"]]
        if str(getattr(prompt_type, "value", prompt_type)) == "document":
            vectors = self._documents(texts, [str(i) for batch in batches for i in batch.get("id", [])])
        else:
            encoder = self.retriever.query_encoder
            vectors = encoder.encode(texts, batch_size=self.batch_size, show_progress=False).numpy()  # (n, dim)
        return normalise(vectors) if self.normalize else np.ascontiguousarray(vectors, dtype=np.float32)

    def _documents(self, texts: list[str], ids: list[str]) -> np.ndarray:
        if self.articles is not None:
            return self.articles.encode(texts, batch_size=self.batch_size, show_progress=False).numpy()  # (n, dim)
        unknown = next((i for i in ids if i not in self._rows), None) if len(ids) == len(texts) else "(no ids)"
        if unknown is not None:
            raise LexgraphError(
                f"{self.system} gets its article vectors from the statute graph, not from texts, and has none for "
                f"corpus id {unknown!r}; index that corpus with `lexgraph index`, or evaluate dsr or zeroshot"
            )
        vectors = self.retriever.article_embeddings.numpy()  # (n_articles, dim)
        return np.ascontiguousarray(vectors[[self._rows[i] for i in ids]], dtype=np.float32)  # (n, dim)

    def similarity(self, embeddings1, embeddings2):
        """The system's score: the dot product of :meth:`encode`'s vectors ``(n1, n2)``."""
        import torch

        first, second = torch.as_tensor(np.asarray(embeddings1)), torch.as_tensor(np.asarray(embeddings2))
        return first.reshape(-1, first.shape[-1]) @ second.reshape(-1, second.shape[-1]).T  # (n1, n2)

    def similarity_pairwise(self, embeddings1, embeddings2):
        """The dot product of corresponding rows ``(n,)``."""
        import torch

        return (torch.as_tensor(np.asarray(embeddings1)) * torch.as_tensor(np.asarray(embeddings2))).sum(-1)  # (n,)

    @property
    def mteb_model_meta(self):
        from mteb.models.model_meta import ModelMeta, ScoringFunction

        return ModelMeta.create_empty(
            overwrites={
                "name": f"lexgraph/{self.system}",
                "revision": "workspace",
                "languages": ["fra-Latn"],
                "embed_dim": int(self.retriever.article_embeddings.shape[1]),
                "similarity_fn_name": ScoringFunction.DOT_PRODUCT,
                "framework": ["PyTorch"],
            }
        )


def workspace_task(workspace: str | os.PathLike, split: str = "test"):
    """The workspace's labelled ``split`` as an MTEB 2 retrieval task (module docstring)."""
    from datasets import Dataset
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData
    from mteb.abstasks.task_metadata import TaskMetadata

    from lexgraph.core.io import read_parquet
    from lexgraph.data.schema import split_questions

    clean = Path(workspace) / "data" / "clean"
    articles = read_parquet(clean / "articles.parquet", ["id", "article"])
    qids, texts, qrels = split_questions(read_parquet(clean / "questions.parquet"), split)
    if not qids:
        raise LexgraphError(f"{clean / 'questions.parquet'} has no '{split}' questions; expected a labelled split")
    data = RetrievalSplitData(
        queries=Dataset.from_dict({"id": [str(q) for q in qids], "text": list(texts)}),
        corpus=Dataset.from_dict({"id": [str(i) for i in articles["id"]], "text": articles["article"].to_list()}),
        relevant_docs={str(q): {str(a): 1 for a in qrels[q]} for q in qids},
        top_ranked=None,
    )
    metadata = TaskMetadata(
        name=f"LexgraphWorkspace.{split}",
        description=f"the lexgraph workspace {Path(workspace).resolve().name}'s '{split}' questions over its articles",
        reference=None,
        dataset={"path": str(Path(workspace).resolve()), "revision": "workspace"},
        type="Retrieval",
        category="t2t",
        modalities=["text"],
        eval_splits=[split],
        eval_langs=["fra-Latn"],
        main_score="ndcg_at_10",
        date=None,
        domains=["Legal"],
        task_subtypes=[],
        license="not specified",
        annotations_creators="expert-annotated",
        dialect=[],
        sample_creation="found",
        bibtex_citation="",
    )

    class WorkspaceRetrieval(AbsTaskRetrieval):
        def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
            self.dataset = {"default": {split: data}}
            self.data_loaded = True

    WorkspaceRetrieval.metadata = metadata
    return WorkspaceRetrieval()

"""The runs ``evaluate`` wrote, for the inspector: each split's questions with their gold articles
and every evaluated system's ranking, named by the ids users see.

Read from the workspace as ``evaluate`` left it: ``data/runs/<system>/<split>.trec`` (each system's
ranking to ``evaluate.k``) and ``data/clean/questions.parquet`` (the gold articles). A system's
recall of a question is ``|gold ∩ top-k| / |gold|`` over its run, what
``metrics/per_query/<split>.csv`` holds for ``k = 100``.

Every run is read whole by :meth:`Runs.read`, with the rest of a catalogue (on the server's load
thread): a damaged run is a :class:`lexgraph.core.errors.DataError` naming its file and line there,
which refuses the load, never an error under a request; and what the inspector shows is the runs as
they were when its generation loaded.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from lexgraph.core import layout


def registered() -> tuple[str, ...]:
    """The registry's system names, in its order (imported here: the registry loads torch)."""
    from lexgraph.methods.catalog import names

    return names()


@dataclass(frozen=True)
class Question:
    """One question of a split: the id users see, its text and its gold articles' ids."""

    key: str
    text: str
    gold: tuple[str, ...]


class Runs:
    """The evaluated splits of a workspace, their questions and every system's rankings."""

    def __init__(
        self,
        questions: dict[str, dict[str, Question]],
        rankings: dict[tuple[str, str], dict[str, list[str]]],
    ) -> None:
        self.questions = questions  # split -> question key -> Question (in id order)
        self.rankings = rankings  # (system, split) -> question key -> article keys, best first
        self._means: dict[tuple[str, str, int], float] = {}  # mean_recall's, computed once each

    @classmethod
    def read(cls, workspace: Path, corpus, sharing: dict[str, object] | None = None) -> Runs | None:
        """The runs of ``workspace`` (``corpus``: its :class:`lexgraph.serve.searcher.Corpus`), or None
        when ``evaluate`` has not written any. ``sharing``: a mapping whose keys are the article keys
        (the catalogue's articles), so that a run's millions of entries share their strings."""
        from lexgraph.core.io import read_parquet
        from lexgraph.data.schema import split_questions

        root = layout.RUNS.under(workspace)
        path = layout.CLEAN.under(workspace, "questions.parquet")
        if not root.is_dir() or not path.is_file():
            return None
        table = read_parquet(path, ["id", "question", "article_ids", "split"])
        akeys = corpus.keys.articles if corpus.keys is not None else None
        qkeys = corpus.keys.questions if corpus.keys is not None else None
        shared = {key: key for key in (sharing or {})}
        questions: dict[str, dict[str, Question]] = {}
        rankings: dict[tuple[str, str], dict[str, list[str]]] = {}
        for split in sorted(set(table["split"].to_list())):
            systems = [s for s in registered() if (root / s / f"{split}.trec").is_file()]
            if not systems:
                continue
            qids, texts, qrels = split_questions(table, split)
            questions[split] = {
                _name(qkeys, q): Question(_name(qkeys, q), t, tuple(_name(akeys, a) for a in sorted(qrels[q])))
                for q, t in zip(qids, texts)
            }
            for system in systems:
                rankings[system, split] = _read_run(root / system / f"{split}.trec", akeys, shared)
        return cls(questions, rankings) if questions else None

    def systems(self, split: str) -> list[str]:
        """The systems with a run on ``split``, in the registry's order."""
        return [s for s in registered() if (s, split) in self.rankings]

    def ranking(self, system: str, split: str) -> dict[str, list[str]]:
        """``{question key: [article key, ...]}`` of ``system``'s run on ``split``, best first."""
        return self.rankings.get((system, split), {})

    def recall(self, system: str, split: str, question: Question, k: int) -> float:
        """``|gold ∩ top-k| / |gold|`` of ``system``'s run for ``question``."""
        top = set(self.ranking(system, split).get(question.key, [])[:k])
        return sum(g in top for g in question.gold) / len(question.gold)

    def mean_recall(self, system: str, split: str, k: int) -> float:
        """The mean of :meth:`recall` over the split's questions (0 for a split without questions)."""
        key = (system, split, k)
        if key not in self._means:
            questions = self.questions.get(split, {}).values()
            recalls = [self.recall(system, split, q, k) for q in questions]
            self._means[key] = sum(recalls) / len(recalls) if recalls else 0.0
        return self._means[key]

    def rank(self, system: str, split: str, question: Question, article: str) -> int | None:
        """``article``'s rank (1-based) in ``system``'s run for ``question``; None beyond the run."""
        ranked = self.ranking(system, split).get(question.key, [])
        return ranked.index(article) + 1 if article in ranked else None


def _read_run(path: Path, names, shared: dict[str, str]) -> dict[str, list[str]]:
    """One run, as :func:`lexgraph.evaluation.trec.read_trec` reads it (a damaged line is one
    :class:`lexgraph.core.errors.DataError` naming it), its article ids the keys users see."""
    from lexgraph.evaluation.trec import read_trec

    docids = None if names is None else {key: i for i, key in names.items()}
    run = read_trec(path, qid_type=str, docids=docids)
    out: dict[str, list[str]] = {}
    for qid, ids in run.items():
        keys = []
        for a in ids:
            key = _name(names, a)
            keys.append(shared.setdefault(key, key))
        out[sys.intern(qid)] = keys
    return out


def _name(keys, i: int) -> str:
    return keys.get(i, str(i)) if keys is not None else str(i)

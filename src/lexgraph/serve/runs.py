"""The runs ``evaluate`` wrote, for the inspector: each split's questions with their gold articles
and every evaluated system's ranking, named by the ids users see.

Read from the workspace as ``evaluate`` left it: ``data/runs/<system>/<split>.trec`` (each system's
ranking to ``evaluate.k``) and ``data/clean/questions.parquet`` (the gold articles). A system's
recall of a question is ``|gold ∩ top-k| / |gold|`` over its run, what
``metrics/per_query/<split>.csv`` holds for ``k = 100``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from lexgraph.core import layout
from lexgraph.core.config import SYSTEM_NAMES


@dataclass(frozen=True)
class Question:
    """One question of a split: the id users see, its text and its gold articles' ids."""

    key: str
    text: str
    gold: tuple[str, ...]


class Runs:
    """The evaluated splits of a workspace, their questions and every system's rankings."""

    def __init__(self, root: Path, questions: dict[str, dict[str, Question]], article_keys, question_keys) -> None:
        self.root = root
        self.questions = questions  # split -> question key -> Question (in id order)
        self.article_keys, self.question_keys = article_keys, question_keys
        self.ranking = cache(self._ranking)

    @classmethod
    def read(cls, workspace: Path, corpus) -> Runs | None:
        """The runs of ``workspace`` (``corpus``: its :class:`lexgraph.serve.searcher.Corpus`), or None
        when ``evaluate`` has not written any."""
        from lexgraph.core.io import read_parquet
        from lexgraph.data.schema import split_questions

        root = layout.RUNS.under(workspace)
        path = layout.CLEAN.under(workspace, "questions.parquet")
        if not root.is_dir() or not path.is_file():
            return None
        table = read_parquet(path, ["id", "question", "article_ids", "split"])
        akeys = corpus.keys.articles if corpus.keys is not None else None
        qkeys = corpus.keys.questions if corpus.keys is not None else None
        questions: dict[str, dict[str, Question]] = {}
        for split in sorted(set(table["split"].to_list())):
            qids, texts, qrels = split_questions(table, split)
            if not any((root / s / f"{split}.trec").is_file() for s in SYSTEM_NAMES):
                continue
            questions[split] = {
                _name(qkeys, q): Question(_name(qkeys, q), t, tuple(_name(akeys, a) for a in sorted(qrels[q])))
                for q, t in zip(qids, texts)
            }
        return cls(root, questions, akeys, qkeys) if questions else None

    def systems(self, split: str) -> list[str]:
        """The systems with a run on ``split``, in the registry's order."""
        return [s for s in SYSTEM_NAMES if (self.root / s / f"{split}.trec").is_file()]

    def _ranking(self, system: str, split: str) -> dict[str, list[str]]:
        """``{question key: [article key, ...]}`` of ``system``'s run on ``split``, best first."""
        from lexgraph.evaluation.trec import read_trec

        names = self.article_keys
        docids = None if names is None else {key: i for i, key in names.items()}
        run = read_trec(self.root / system / f"{split}.trec", qid_type=str, docids=docids)
        return {qid: [_name(names, a) for a in ids] for qid, ids in run.items()}

    def recall(self, system: str, split: str, question: Question, k: int) -> float:
        """``|gold ∩ top-k| / |gold|`` of ``system``'s run for ``question``."""
        top = set(self.ranking(system, split).get(question.key, [])[:k])
        return sum(g in top for g in question.gold) / len(question.gold)

    def rank(self, system: str, split: str, question: Question, article: str) -> int | None:
        """``article``'s rank (1-based) in ``system``'s run for ``question``; None beyond the run."""
        ranked = self.ranking(system, split).get(question.key, [])
        return ranked.index(article) + 1 if article in ranked else None


def _name(keys, i: int) -> str:
    return keys[i] if keys is not None else str(i)

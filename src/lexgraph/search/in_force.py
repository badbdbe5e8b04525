"""A search "as in force on a date": any system's ranking, kept to the article versions in force.

Every version of an article is indexed on its own (:mod:`lexgraph.data.versions`); a search as of
a date asks the system for more articles than wanted and keeps those in force, in the system's
order, asking again for four times as many until each question has ``k`` of them or the whole
corpus was ranked. A dense system's ranking of the versions in force is thus exactly its ranking
over the law of that date; BM25 weighs terms by their frequency over every version indexed, so its
scores (not the articles it can find) differ slightly from those of an index of that date alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: the first request asks for this many times ``k`` (plus :data:`EXTRA`), a later one four times more
FIRST, EXTRA, GROWTH = 2, 16, 4


def search_in_force(retriever, questions: Sequence[str], k: int, in_force: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, scores)``, each ``(n, k)``: ``retriever``'s ranking of ``questions`` kept to the
    articles whose id is True in ``in_force`` (``(max id + 1,)`` bool), best first, padded with id
    ``-1`` and score 0 where fewer are in force."""
    total = int(in_force.size)
    fetch = min(total, FIRST * k + EXTRA)
    while True:
        ids, scores = retriever.search(list(questions), max(fetch, 1))  # (n, fetch) each
        ids = np.asarray(ids)
        keep = (ids >= 0) & (ids < total)
        keep[keep] = in_force[ids[keep]]  # (n, fetch)
        if fetch >= total or (keep.sum(axis=1) >= k).all():
            break
        fetch = min(total, fetch * GROWTH)
    out_ids = np.full((len(questions), k), -1, dtype=np.int64)
    out_scores = np.zeros((len(questions), k), dtype=np.asarray(scores).dtype)
    for row in range(len(questions)):
        kept = np.flatnonzero(keep[row])[:k]
        out_ids[row, : kept.size] = ids[row, kept]
        out_scores[row, : kept.size] = np.asarray(scores)[row, kept]
    return out_ids, out_scores

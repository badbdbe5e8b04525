"""lexgraph.serve.searcher.Searcher.search: a micro-batch is searched in length order, at most
SEARCH_CHUNK questions a call, and each question gets its own results back in the batch's order."""

from __future__ import annotations

import numpy as np

from lexgraph.serve.searcher import SEARCH_CHUNK, Searcher


class Recorder:
    """A retriever whose results name the question (its length as the id, k columns) and that
    records the questions of each call."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def search(self, questions, k):
        self.calls.append(list(questions))
        ids = np.array([[len(q) * 100 + j for j in range(k)] for q in questions], dtype=np.int64)
        return ids, (ids / 1000).astype(np.float32)


def test_a_batch_is_searched_in_length_order_by_chunks_and_answered_in_its_order():
    questions = ["x" * n for n in (7, 3, 25, 1, 9, 14, 2, 30, 5, 11, 4, 19, 8, 6, 13, 21, 17, 10, 12, 16)]
    retriever = Recorder()
    ids, scores = Searcher("dsr", retriever, display=None).search(questions, 3)
    assert ids.shape == scores.shape == (len(questions), 3)
    assert ids[:, 0].tolist() == [len(q) * 100 for q in questions]
    assert np.allclose(scores, ids / 1000)
    assert [len(call) for call in retriever.calls] == [SEARCH_CHUNK, SEARCH_CHUNK, len(questions) - 2 * SEARCH_CHUNK]
    flat = [len(q) for call in retriever.calls for q in call]
    assert flat == sorted(flat)


def test_a_small_batch_is_one_call_as_it_came():
    questions = ["bbbb", "a", "ccc"]
    retriever = Recorder()
    ids, _ = Searcher("bm25", retriever, display=None).search(questions, 2)
    assert retriever.calls == [questions] and ids[:, 0].tolist() == [400, 100, 300]

"""What spans the retrieval systems: loading one by name
(:func:`~lexgraph.systems.registry.load_retriever`, over the catalogue of
:mod:`lexgraph.methods.catalog`), export, the index of a corpus of one's own, the MTEB adapter.

A system is anything with ``search(questions, k) -> (ids, scores)`` over the cleaned
corpus; ``ids`` is an int64 array ``(n_questions, k)`` of article ids, best first, and
``scores`` the float32 scores ``(n_questions, k)``; an id of ``-1`` is padding (a row
of ``-1`` means no article matches the question at all: BM25 when no term of the
question occurs in the corpus). A system also exposes ``article_ids`` (the ids it
ranks) and ``source`` (the artefact they come from).

This package file imports nothing, so importing one of its modules (``lexgraph.systems.export``)
does not pull in every other.
"""

"""A weak legal element indicator for statutes, and MVCL's element view.

MVCL (Zhaowei Wang, "Legal Element-oriented Modeling with Multi-view Contrastive Learning
for Legal Case Retrieval", IJCNN 2022, arXiv:2210.05188) trains a classifier of the
sentences of a *case* that hold a legal element, on labelled data. Statutes have no such
labels; lexgraph marks a sentence of an article as holding a legal element when it states
one of the five things a rule is made of, found by French patterns (case- and
accent-insensitive, on whole words):

* **obligation**: ``doit``, ``doivent``, ``est tenu(e)(s)``, ``sont tenus``, ``oblig…``
  (obligé, obligation), ``il incombe``;
* **right or permission**: ``peut``, ``peuvent``, ``a le droit``, ``ont droit``,
  ``droit de``, ``faculté``, ``autoris…``;
* **prohibition**: ``il est interdit``, ``nul ne``, ``ne peut``, ``interdi…``;
* **condition or exception**: ``si``, ``lorsque``/``lorsqu'``, ``sauf``, ``à moins
  que``, ``en cas de``, ``à condition``, ``dans le cas où``, ``pourvu que``;
* **sanction or consequence**: ``à peine de``, ``puni…``, ``amende``, ``nullité``,
  ``déchu…``, ``dommages et intérêts``, ``responsable``, ``réputé``.

:func:`split_sentences` cuts an article into sentences (after ``.``, ``;``, ``!``,
``?`` or a line break); :func:`element_sentences` flags each. :func:`element_view`
builds the positive view T+ of a tokenised text as MVCL's Section III-D does: a **random
subset of the non-element sentences, totalling at most L1 tokens**, is deleted, every
token of a deleted sentence replaced by the ``[DEL]`` token (one for one, so T+ keeps T's
positions and length). :func:`deleted_sentences` draws that subset: the non-element
sentences (those with at least one token in the tokenised text) in a random order from
``numpy.random.default_rng([seed, text_id])``, each deleted when its tokens fit in what is
left of L1 (first fit), so the deleted total is at most L1; the same seed and text id give
the same view, byte for byte. A text keeps at least one sentence: when it holds no element
sentence, the last sentence of the random order is never deleted.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

#: Pattern families of the indicator (on lower-cased, accent-stripped text).
PATTERNS: dict[str, tuple[str, ...]] = {
    "obligation": (r"doit", r"doivent", r"est tenue?s?", r"sont tenue?s", r"oblig\w*", r"il incombe"),
    "right": (r"peut", r"peuvent", r"a le droit", r"ont (?:le )?droit", r"droit de", r"faculte", r"autoris\w*"),
    "prohibition": (r"il est interdit", r"nul ne", r"ne (?:peut|peuvent)", r"interdi\w*"),
    "condition": (
        r"si",
        r"s'il",
        r"s'ils",
        r"lorsque",
        r"lorsqu'\w*",
        r"sauf",
        r"a moins que",
        r"en cas d\w*",
        r"a condition",
        r"dans le cas ou",
        r"pourvu que",
    ),
    "sanction": (
        r"a peine d\w*",
        r"puni\w*",
        r"amendes?",
        r"nullite",
        r"dechu\w*",
        r"dommages(?:-| et )interets",
        r"responsables?",
        r"repute\w*",
    ),
}
_FAMILIES = {name: re.compile(r"(?<!\w)(?:" + "|".join(p) + r")(?!\w)") for name, p in PATTERNS.items()}
_SENTENCE_END = re.compile(r"(?<=[.;!?])\s+|\n+")


def _fold(text: str) -> str:
    """Lower-cased, accents stripped, typographic apostrophes made plain."""
    text = unicodedata.normalize("NFKD", text.replace("\u2019", "'").lower())
    return "".join(ch for ch in text if not unicodedata.combining(ch))


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Character spans ``(start, end)`` of the non-blank sentences of ``text``."""
    spans, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        if text[start : match.start()].strip():
            spans.append((start, match.start()))
        start = match.end()
    if text[start:].strip():
        spans.append((start, len(text)))
    return spans


def element_families(sentence: str) -> list[str]:
    """The pattern families (:data:`PATTERNS`) that ``sentence`` matches."""
    folded = _fold(sentence)
    return [name for name, pattern in _FAMILIES.items() if pattern.search(folded)]


def element_sentences(text: str) -> list[tuple[int, int, bool]]:
    """``(start, end, is_element)`` for every sentence of ``text``."""
    return [(s, e, bool(element_families(text[s:e]))) for s, e in split_sentences(text)]


def token_sentences(
    offsets: Sequence[tuple[int, int]], sentences: Sequence[tuple[int, int, bool]], text_start: int = 0
) -> list[int | None]:
    """For every token (its character ``offsets`` in the tokenised string), the index of the
    sentence of ``sentences`` it lies in, or None: special tokens, a prefix such as
    ``passage: ``. ``text_start`` is where the text begins in the tokenised string."""
    out: list[int | None] = []
    for start, end in offsets:
        index = None
        if end > start and start >= text_start:
            pos = start - text_start
            index = next((i for i, (s, e, _) in enumerate(sentences) if s <= pos < e), None)
        out.append(index)
    return out


def deleted_sentences(
    lengths: Sequence[int], is_element: Sequence[bool], budget: int, seed: int, text_id: int
) -> list[int]:
    """Indices (ascending) of the sentences the element view deletes.

    ``lengths[i]`` is sentence i's number of tokens in the tokenised text, ``is_element[i]``
    its flag, ``budget`` L1. The candidates are the non-element sentences with
    ``lengths[i] > 0``, in sentence order; ``numpy.random.default_rng([seed, text_id])``
    permutes them, and each in turn is deleted when its length fits in what is left of the
    budget. With no element sentence among the text's tokens, the last candidate of the
    permutation is never deleted (the view keeps a sentence).
    """
    import numpy as np

    if len(lengths) != len(is_element):
        raise ValueError(f"got {len(is_element)} flags for {len(lengths)} sentences")
    if budget < 1:
        raise ValueError(f"the element view's deletion budget L1 must be >= 1, got {budget}")
    candidates = [i for i, (n, flag) in enumerate(zip(lengths, is_element)) if not flag and n > 0]
    if not candidates:
        return []
    order = [candidates[j] for j in np.random.default_rng([int(seed), int(text_id)]).permutation(len(candidates))]
    if not any(flag and n > 0 for n, flag in zip(lengths, is_element)):  # no element sentence in the tokens
        order = order[:-1]
    left, out = int(budget), []
    for i in order:
        if lengths[i] <= left:
            out.append(i)
            left -= lengths[i]
    return sorted(out)


def element_view(
    input_ids: Sequence[int],
    sentence_of: Sequence[int | None],
    is_element: Sequence[bool],
    del_id: int,
    budget: int,
    seed: int,
    text_id: int,
) -> tuple[list[int], list[int]]:
    """MVCL's positive view T+ of a tokenised text (special tokens included), and the
    indices of the sentences it deleted.

    ``sentence_of`` gives each token's sentence (:func:`token_sentences`; None: a special
    token or a prefix, always kept), ``is_element`` each sentence's flag. The tokens of the
    sentences :func:`deleted_sentences` picks (at most ``budget`` = L1 tokens in all)
    become ``del_id``; every other token stays, so T+ has T's length.
    """
    if len(input_ids) != len(sentence_of):
        raise ValueError(f"got {len(sentence_of)} sentence indices for {len(input_ids)} tokens")
    lengths = [0] * len(is_element)
    for index in sentence_of:
        if index is not None:
            lengths[index] += 1
    deleted = deleted_sentences(lengths, is_element, budget, seed, text_id)
    gone = set(deleted)
    view = [del_id if index in gone else t for t, index in zip(input_ids, sentence_of)]
    return view, deleted

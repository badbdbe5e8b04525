"""A weak legal element indicator for statutes, and MVCL's element view.

MVCL (Wang et al., "Legal Element-oriented Modeling with Multi-view Contrastive Learning
for Legal Case Retrieval", IJCNN 2022, arXiv:2210.05188) trains a classifier of the
sentences of a *case* that hold a legal element, on labelled data. Statutes have no such
labels; lexgraph marks a sentence of an article as holding a legal element when it states
one of the four things a rule is made of, found by French patterns (case- and
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
builds the positive view T+ of a tokenised text: every token of a non-element sentence is
replaced by the ``[DEL]`` token (one for one, so T+ keeps T's positions), then the view
is cut to ``L1`` tokens in total with the final separator kept. A text in which no
sentence is flagged keeps all its tokens (an all-``[DEL]`` view would carry nothing).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Sequence

#: Pattern families of the indicator (on lower-cased, accent-stripped text).
PATTERNS: dict[str, tuple[str, ...]] = {
    "obligation": (r"doit", r"doivent", r"est tenue?s?", r"sont tenue?s", r"oblig\w*", r"il incombe"),
    "right": (r"peut", r"peuvent", r"a le droit", r"ont (?:le )?droit", r"droit de", r"faculte", r"autoris\w*"),
    "prohibition": (r"il est interdit", r"nul ne", r"ne (?:peut|peuvent)", r"interdi\w*"),
    "condition": (r"si", r"s'il", r"s'ils", r"lorsque", r"lorsqu'\w*", r"sauf", r"a moins que", r"en cas d\w*",
                  r"a condition", r"dans le cas ou", r"pourvu que"),
    "sanction": (r"a peine d\w*", r"puni\w*", r"amendes?", r"nullite", r"dechu\w*", r"dommages(?:-| et )interets",
                 r"responsables?", r"repute\w*"),
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
        if text[start:match.start()].strip():
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


@dataclass(frozen=True)
class ViewStats:
    sentences: int
    element_sentences: int
    tokens: int
    deleted_tokens: int


def token_sentence_flags(offsets: Sequence[tuple[int, int]], sentences: Sequence[tuple[int, int, bool]],
                         text_start: int = 0) -> list[bool | None]:
    """For every token (its character ``offsets`` in the tokenised string), whether it lies
    in an element sentence (True), a non-element one (False), or in none (None: special
    tokens, a prefix such as ``passage: ``). ``text_start`` is where the text begins in the
    tokenised string."""
    flags: list[bool | None] = []
    for start, end in offsets:
        if end <= start or start < text_start:
            flags.append(None)
            continue
        pos = start - text_start
        flag = None
        for s, e, is_element in sentences:
            if s <= pos < e:
                flag = is_element
                break
        flags.append(flag)
    return flags


def element_view(input_ids: Sequence[int], flags: Sequence[bool | None], del_id: int, budget: int) -> list[int]:
    """MVCL's positive view T+ of a tokenised text (special tokens included).

    Tokens flagged ``False`` (in a sentence without a legal element) become ``del_id``;
    tokens flagged ``True`` or ``None`` stay. When no token is flagged ``True`` the text
    is kept as it is. The view is then cut to ``budget`` (L1) tokens, its last token
    (the separator) kept at the end.
    """
    if len(input_ids) != len(flags):
        raise ValueError(f"got {len(flags)} flags for {len(input_ids)} tokens")
    if budget < 2:
        raise ValueError(f"the view's token budget must be >= 2, got {budget}")
    ids = list(input_ids)
    if any(f is True for f in flags):
        ids = [del_id if f is False else t for t, f in zip(ids, flags)]
    if len(ids) > budget:
        ids = ids[: budget - 1] + [ids[-1]]
    return ids

"""What ``lexgraph search`` shows: hits with their article number, reference, heading path,
score and a snippet around the question's terms, as text for a person or as JSON.

Matching terms. A word of the article is *matched* when the project's
:class:`~lexgraph.text.analyzer.FrenchAnalyzer` (the BM25 analyzer: elisions, stopwords, Snowball
stemming) gives it the same term as a word of the question, so the question's "murs"
marks the article's "mur" and "mitoyenneté" is not marked by "mitoyen" (other stems).
Words that carry no weight are never marked (:data:`UNMARKED`: the analyzer's stopwords and the
modal verb forms "peut", "doit", "faut", … that BM25 keeps as terms). Dense systems rank without
terms; their hits are marked the same way, and a hit that shares no term with the question shows
the article's opening.

Snippet. The window of about ``width`` characters that holds the most distinct matched
terms (then the most matched words, then the earliest), cut at spaces, with ``…`` where
the article goes on. In text output matched words are wrapped in ``**`` (or shown in
bold with ANSI codes when the output is a terminal); in JSON the snippet is plain text and
``highlights`` gives the ``[start, end)`` character offsets of its matched words.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO

import numpy as np

from lexgraph.core.errors import LexgraphError
from lexgraph.text.analyzer import ELISIONS, FRENCH_STOPWORDS, FrenchAnalyzer

#: Same tokens as the analyzer's (runs of letters and digits).
_TOKEN_RE = re.compile(r"[^\W_]+")
_APOSTROPHES = "'\u2019\u02bc"
#: "Art. 655, Code civil (Livre II, Titre IV)" -> "Art. 655"; "Article 1.1.2 du Code …" -> "Article 1.1.2".
_ARTICLE_RE = re.compile(r"^\s*(art(?:icle)?\.?\s*[^\s,;:(]+(?:\s+(?:bis|ter|quater|quinquies))?)", re.IGNORECASE)
PATH_SEPARATOR = " › "
BOLD, RESET = "\x1b[1m", "\x1b[0m"
#: C0 controls, DEL and C1 controls: what a terminal may obey (ESC, CSI, OSC, BEL, NUL, CR, ...);
#: and the bidirectional embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069), which
#: make a terminal show text in another order than it is ("Trojan Source"); the marks (LRM,
#: RLM) reorder nothing and stay
_CONTROLS = [*range(0x20), 0x7F, *range(0x80, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
#: the text output shows a whitespace control as a space (the snippet collapses them already)
#: and any other control as its escape, ``\x1b`` as the four characters ``\x1b`` (as ``ls -b``),
#: U+202E as ``\u202e``
_VISIBLE = {c: " " if chr(c).isspace() else f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" for c in _CONTROLS}
#: JSON escapes C0 itself; DEL, C1 and the bidi controls pass raw with ``ensure_ascii=False``: ``\u007f`` etc.
_JSON_VISIBLE = {c: f"\\u{c:04x}" for c in _CONTROLS if c >= 0x7F}


def visible(text: str) -> str:
    """``text`` (from the corpus, the workspace or a question) safe for a terminal: no control
    character (C0, DEL, C1) reaches it, so an article's ``ESC[5m``, OSC 8 or BEL is shown, not
    obeyed (issue 28). Whitespace controls become a space, the others an escape (``\\x1b``)."""
    return text.translate(_VISIBLE)


def article_number(reference: str | None) -> str:
    """The article number at the start of a reference ("Art. 655, Code civil (…)" ->
    "Art. 655"); the whole reference when it does not start with one."""
    reference = " ".join((reference or "").split())
    match = _ARTICLE_RE.match(reference)
    return match.group(1) if match else reference


def _reference_rest(reference: str, number: str) -> str:
    """What a reference says after its article number ("Code civil (Livre II, Titre IV)")."""
    reference = " ".join((reference or "").split())
    if number and reference.startswith(number):
        return reference[len(number) :].lstrip(" ,;:–—-")
    return "" if reference == number else reference


#: The modal verbs' conjugated forms (pouvoir, devoir, falloir): the BM25 analyzer keeps them as
#: terms (dropping them would change every metric), but in a hit they mark nothing of interest: in
#: "Qui peut demander le divorce ?", every article that "peut" something. The forms of *être* and
#: *avoir* are stopwords already; the infinitives "pouvoir" and "devoir" and the participle "due"
#: are left out, being nouns and an adjective of the law too (le pouvoir de représentation, le
#: devoir de secours, la somme due).
MODAL_FORMS: frozenset[str] = frozenset(
    """
    peut peuvent peux pouvons pouvez pourra pourront pourrait pourraient pourrai pourras pourrez
    pourrions pourriez pouvait pouvaient pouvant puisse puissent puisses puissions puissiez pu
    doit doivent dois devons devez devra devront devrait devraient devrai devras devrez devrions
    devriez devait devaient doive doives
    faut faudra faudrait fallait fallu
    """.split()
)
#: The words never marked in a hit, whatever the analyzer (lower case, NFC): the analyzer's
#: stopwords and :data:`MODAL_FORMS`. Declared here once; the analyzer's own terms are unchanged.
UNMARKED: frozenset[str] = FRENCH_STOPWORDS | MODAL_FORMS


def unmarked(word: str) -> bool:
    """Whether ``word`` (as written) is one of :data:`UNMARKED`, never marked in a hit."""
    return unicodedata.normalize("NFC", word).lower() in UNMARKED


class TermMatcher:
    """The analyzer's term of every word of a text, with the word's character span."""

    def __init__(self, analyzer: FrenchAnalyzer | None = None) -> None:
        self.analyzer = analyzer if analyzer is not None else FrenchAnalyzer()
        self._cache: dict[str, str | None] = {}

    def term(self, word: str) -> str | None:
        """The index term of one word (``None`` for a stopword)."""
        if word not in self._cache:
            terms = self.analyzer(word)
            self._cache[word] = terms[0] if terms else None
        return self._cache[word]

    def words(self, text: str) -> list[tuple[int, int, str]]:
        """``(start, end, term)`` of each word of ``text`` that has a term, in order; an elided
        article or pronoun (the ``l`` of ``l'entrée``) is skipped, as the analyzer does."""
        out = []
        for m in _TOKEN_RE.finditer(text):
            start, end = m.span()
            if (
                end + 1 < len(text)
                and text[end] in _APOSTROPHES
                and (text[end + 1].isalnum())
                and m.group().lower() in ELISIONS
                and (start == 0 or not text[start - 1].isalnum())
            ):
                continue
            term = self.term(m.group())
            if term is not None:
                out.append((start, end, term))
        return out


@dataclass
class Hit:
    """One retrieved article, as shown (``snippet`` is plain; ``highlights`` its matched words)."""

    rank: int
    id: int
    article: str
    reference: str
    path: list[str]
    score: float
    snippet: str
    highlights: list[list[int]] = field(default_factory=list)
    matched_terms: list[str] = field(default_factory=list)
    #: on a corpus of versions (:mod:`lexgraph.data.versions`): ``valid_from``, ``valid_to``, ``act``
    version: dict[str, str | None] | None = None


def hit_fields(hit: Hit) -> dict:
    """A hit's fields as JSON gives them: ``version`` only on a corpus of versions."""
    fields = dict(vars(hit))
    if fields["version"] is None:
        del fields["version"]
    return fields


def version_words(version: Mapping[str, str | None]) -> str:
    """A version's line in a hit: ``in force from 2006-04-05 to 2013-05-19 · Loi n°2006-399 …``."""
    start, end, act = version.get("valid_from"), version.get("valid_to"), version.get("act")
    span = " ".join(part for part in (f"from {start}" if start else "", f"to {end}" if end else "") if part)
    return " · ".join(part for part in (f"in force {span}" if span else "undated", act or "") if part)


def _best_window(length: int, spans: Sequence[tuple[int, int, str]], width: int) -> int:
    """The start ``lo`` of the window ``[lo, lo + width]`` with the most distinct terms of
    ``spans`` wholly inside it, then the most spans, then the earliest, among the windows that
    keep ``width // 5`` characters before one of the spans (clamped to the text). One sweep
    in ``lo`` order: a span joins when the window's end reaches its end and leaves when the
    window's start passes its start, so the cost is linear in the number of spans (after
    sorting), not quadratic (issue 28: one 1 MB article took 28 s)."""
    lead = width // 5  # context kept before the first matched word of the window
    starts = sorted({max(0, min(anchor - lead, length - width)) for anchor, _, _ in spans})
    by_end = sorted(range(len(spans)), key=lambda i: spans[i][1])
    by_start = sorted(range(len(spans)), key=lambda i: spans[i][0])
    counted = [False] * len(spans)
    terms: dict[str, int] = {}
    inside = joined = left = 0
    best: tuple[tuple[int, int, int], int] | None = None
    for lo in starts:
        while joined < len(spans) and spans[by_end[joined]][1] <= lo + width:
            i = by_end[joined]
            joined += 1
            if spans[i][0] >= lo:  # else it began before this window: never inside a later one
                counted[i] = True
                terms[spans[i][2]] = terms.get(spans[i][2], 0) + 1
                inside += 1
        while left < len(spans) and spans[by_start[left]][0] < lo:
            i = by_start[left]
            left += 1
            if counted[i]:
                counted[i] = False
                terms[spans[i][2]] -= 1
                if not terms[spans[i][2]]:
                    del terms[spans[i][2]]
                inside -= 1
        key = (len(terms), inside, -lo)
        if best is None or key > best[0]:
            best = (key, lo)
    return best[1] if best is not None else 0


def make_snippet(text: str, spans: Sequence[tuple[int, int, str]], width: int = 240) -> tuple[str, list[list[int]]]:
    """``(snippet, highlights)``: the ``width``-character window of ``text`` (whitespace
    already collapsed) with the most distinct matched terms of ``spans``, ``…`` marking
    cut ends; ``highlights`` are the snippet offsets of the matched words inside it."""
    if len(text) <= width:
        start, end = 0, len(text)
    elif not spans:
        start, end = 0, width
    else:
        start = _best_window(len(text), spans, width)
        end = min(len(text), start + width)
    inside = [(s, e) for s, e, _ in spans if s >= start and e <= end]
    if start > 0 and not text[start - 1].isspace():  # do not start mid-word (nor after a matched word)
        nxt = text.find(" ", start, end)
        if 0 <= nxt and (not inside or nxt < inside[0][0]):
            start = nxt + 1
        else:
            start = text.rfind(" ", 0, start) + 1
    if end < len(text) and not text[end].isspace():  # do not end mid-word (nor before a matched word)
        prev = text.rfind(" ", start, end)
        if prev > start and (not inside or prev >= inside[-1][1]):
            end = prev
        else:
            nxt = text.find(" ", end)
            end = nxt if nxt >= 0 else len(text)
    body = text[start:end].strip()
    offset = start + (len(text[start:end]) - len(text[start:end].lstrip()))
    prefix = "… " if start > 0 else ""
    suffix = " …" if end < len(text) else ""
    highlights = [
        [s - offset + len(prefix), e - offset + len(prefix)]
        for s, e, _ in spans
        if s >= offset and e <= offset + len(body)
    ]
    return prefix + body + suffix, highlights


def mark(snippet: str, highlights: Sequence[Sequence[int]], style: str = "plain") -> str:
    """``snippet`` with each highlighted word wrapped in ``**`` (``plain``) or ANSI bold (``ansi``),
    its own control characters made :func:`visible` (the markers alone reach a terminal as codes)."""
    before, after = ("**", "**") if style == "plain" else (BOLD, RESET)
    out, pos = [], 0
    for start, end in highlights:
        out += [visible(snippet[pos:start]), before, visible(snippet[start:end]), after]
        pos = end
    out.append(visible(snippet[pos:]))
    return "".join(out)


#: why a question gets no results when nothing more precise is known (a dense system: a blank
#: question; BM25: none of its terms is in the corpus)
NO_MATCH = "no article matches any term of the question"


def ranked_entries(ids, scores, drop_zero: bool = False) -> np.ndarray:
    """``(n, k)`` bool: which entries of a system's results ``ids``/``scores`` (both ``(n, k)``)
    are results. An id of ``-1`` is padding (a row of them: nothing matches the question);
    with ``drop_zero`` (a term-matching system: BM25) an entry scoring exactly 0 is padding
    too: the article matches no term of the question and only fills the ``k`` asked for, in
    article-id order. The one rule for it: the hybrid fusion fuses only these
    (``lexgraph.methods.hybrid.system``), and ``lexgraph search`` shows only these."""
    ids = np.asarray(ids)
    keep = ids >= 0  # (n, k)
    if drop_zero:
        keep &= np.asarray(scores) != 0
    return keep


class Display:
    """Builds :class:`Hit` lists for a system's results over the clean articles table."""

    def __init__(self, articles, analyzer: FrenchAnalyzer | None = None, width: int = 240, versions=None) -> None:
        self.by_id = {
            row["id"]: row for row in articles.select("id", "article", "reference", "path").iter_rows(named=True)
        }
        self.matcher = TermMatcher(analyzer)
        self.width = width
        #: the corpus's :class:`lexgraph.data.versions.Versions` (its ``version(id)``), or None
        self.versions = versions

    def hits(self, question: str, ids, scores) -> list[Hit]:
        """The hits of one question (``ids``/``scores`` one row of a system's results,
        best first, ``-1`` padding dropped)."""
        query = [(s, e, t) for s, e, t in self.matcher.words(question) if not unmarked(question[s:e])]
        query_terms = {t for _, _, t in query}
        out = []
        for rank, (aid, score) in enumerate(zip(list(ids), list(scores)), 1):
            aid = int(aid)
            if aid < 0:
                break
            art = self.by_id.get(aid)
            if art is None:
                raise LexgraphError(
                    f"article {aid} of the results is not in the corpus (data/clean/articles.parquet); run `dvc repro`"
                )
            text = " ".join(art["article"].split())
            spans = [s for s in self.matcher.words(text) if s[2] in query_terms and not unmarked(text[s[0] : s[1]])]
            found = {t for _, _, t in spans}
            matched, seen = [], set()
            for s, e, t in query:  # the question's words that the article has, in question order
                if t in found and t not in seen:
                    seen.add(t)
                    matched.append(question[s:e].lower())
            snippet, highlights = make_snippet(text, spans, self.width)
            reference = art["reference"] or ""
            out.append(
                Hit(
                    rank=rank,
                    id=aid,
                    article=article_number(reference),
                    reference=reference,
                    path=list(art["path"] or []),
                    score=round(float(score), 6),
                    snippet=snippet,
                    highlights=highlights,
                    matched_terms=matched,
                    version=self.versions.version(aid) if self.versions is not None else None,
                )
            )
        return out


def use_ansi(stream: IO[str]) -> bool:
    """Bold on a terminal (unless ``NO_COLOR`` is set); plain ``**`` markers elsewhere."""
    try:
        return stream.isatty() and not os.environ.get("NO_COLOR")
    except (AttributeError, ValueError):
        return False


def render_text(
    question: str, hits: Sequence[Hit], style: str = "plain", line_width: int = 92, why: str = NO_MATCH
) -> str:
    """The human output of one question: a block per hit (rank, article number, the rest of
    the reference, score and id; the heading path; the marked snippet), every text from the
    corpus or the question made :func:`visible`; no hits: ``no results: <why>`` (the system's
    reason, e.g. :meth:`lexgraph.search.bm25.BM25.no_match_reason`)."""
    lines = ["", visible(question)]
    if not hits:
        lines += [""] + textwrap.wrap(
            visible(f"no results: {why}"),
            line_width,
            initial_indent="     ",
            subsequent_indent="       ",
            break_on_hyphens=False,
            break_long_words=False,
        )
    for hit in hits:
        rest = _reference_rest(hit.reference, hit.article)
        title = visible(f"{hit.article} · {rest}" if rest else hit.article)
        if style == "ansi":
            title = f"{BOLD}{title}{RESET}"
        lines += ["", f"{hit.rank:>3}. {title}   (score {hit.score:.4f}, id {hit.id})"]
        if hit.path:
            lines += textwrap.wrap(
                visible(PATH_SEPARATOR.join(hit.path)),
                line_width,
                initial_indent="     ",
                subsequent_indent="       ",
                break_on_hyphens=False,
                break_long_words=False,
            )
        if hit.version is not None:
            lines.append("     " + visible(version_words(hit.version)))
        lines += textwrap.wrap(
            mark(hit.snippet, hit.highlights, style),
            line_width,
            initial_indent="     ",
            subsequent_indent="     ",
            break_on_hyphens=False,
            break_long_words=False,
        )
    return "\n".join(lines) + "\n"


def render_json(question: str, hits: Sequence[Hit], qid: str | None = None, system: str | None = None) -> str:
    """One line of JSON: ``{"id", "question", "system", "hits": [{rank, id, article,
    reference, path, score, snippet, highlights, matched_terms[, version]}, ...]}``."""
    record: Mapping = {"id": qid, "question": question, "system": system, "hits": [hit_fields(h) for h in hits]}
    return json.dumps(record, ensure_ascii=False).translate(_JSON_VISIBLE)  # only strings hold them: still JSON


__all__ = [
    "Display",
    "Hit",
    "MODAL_FORMS",
    "NO_MATCH",
    "TermMatcher",
    "UNMARKED",
    "article_number",
    "make_snippet",
    "mark",
    "ranked_entries",
    "render_json",
    "render_text",
    "hit_fields",
    "unmarked",
    "version_words",
    "use_ansi",
    "visible",
]

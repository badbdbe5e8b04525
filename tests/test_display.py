"""What `lexgraph search` shows (lexgraph.text.display): matched words by the analyzer's stems,
snippets around them, article numbers, the text and JSON renderings (issue 10, item 4)."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import polars as pl
import pytest

from conftest import ROOT
from lexgraph.text.analyzer import FrenchAnalyzer
from lexgraph.text.display import (
    BOLD,
    Display,
    TermMatcher,
    article_number,
    make_snippet,
    mark,
    render_json,
    render_text,
    use_ansi,
)

ARTICLE = (
    "Le mur mitoyen est réparé aux frais des propriétaires ; la mitoyenneté cesse par l'abandon. "
    "Les murailles de la maison ne sont pas concernées."
)
QUESTION = "Qui répare les murs mitoyens de la maison ?"


def marked_words(question: str, text: str, analyzer=None) -> list[str]:
    articles = pl.DataFrame({"id": [1], "article": [text], "reference": ["Art. 1"], "path": [[]]})
    hit = Display(articles, analyzer).hits(question, [1], [1.0])[0]
    return [hit.snippet[s:e] for s, e in hit.highlights]


def test_marks_the_words_sharing_a_stem_with_the_question():
    # "murs" marks "mur", "répare" marks "réparé", "maison" marks "maison"; not "mitoyenneté"
    # (stem mitoyennet), "murailles" (muraill), nor the stopwords "les", "de", "la" of the question
    assert marked_words(QUESTION, ARTICLE) == ["mur", "mitoyen", "réparé", "maison"]
    assert marked_words("LES MURS", "Le mur. Les murs. La muraille.") == ["mur", "murs"]
    assert marked_words("bail commercial", ARTICLE) == []


def test_modal_verbs_and_stopwords_are_never_marked():
    """Issue 41, item 5d: the question's "peut" marked every "peut" of the hits. BM25 keeps it as a
    term (its metrics unchanged), the display marks only the words that carry weight."""
    assert FrenchAnalyzer()("peut") == ["peut"]  # a term of the index: the display alone skips it
    question = "Peut-on demander le divorce ? Qui doit payer ?"
    text = "Chacun des époux peut demander le divorce ; le juge doit entendre les époux et peut refuser."
    assert marked_words(question, text) == ["demander", "divorce"]
    articles = pl.DataFrame({"id": [1], "article": [text], "reference": ["Art. 1"], "path": [[]]})
    (hit,) = Display(articles).hits(question, [1], [1.0])
    assert hit.matched_terms == ["demander", "divorce"]
    raw = FrenchAnalyzer(stem=False, stopwords=False)  # an analyzer keeping stopwords: still not marked
    assert marked_words("le divorce des époux", text, raw) == ["époux", "divorce", "époux"]  # not "des", "le", "les"
    assert marked_words("Le pouvoir du juge", "Le juge a le pouvoir de refuser ; il peut refuser.") == [
        "juge",
        "pouvoir",
    ]  # the noun "pouvoir" carries weight


def test_elided_words_are_not_terms_even_without_stopwords():
    raw = FrenchAnalyzer(stem=False, stopwords=False)
    text = "L'entrée du mur, jusqu'à l'abandon d'aujourd'hui"
    words = TermMatcher(raw).words(text)
    assert [text[s:e] for s, e, _ in words] == ["entrée", "du", "mur", "à", "abandon", "aujourd", "hui"]
    assert [t for _, _, t in words] == raw(text)
    assert marked_words("l'entrée", text, raw) == ["entrée"]  # not the "l" of "L'entrée" or "l'abandon"


@pytest.mark.parametrize("options", [{}, {"stem": False, "stopwords": False}, {"stopwords": False}])
def test_word_terms_agree_with_the_analyzer_on_the_sample(options):
    """Term by word (with its span) gives exactly the analyzer's terms of the whole text."""
    analyzer = FrenchAnalyzer(**options)
    matcher = TermMatcher(analyzer)
    with open(ROOT / "data" / "sample" / "articles.csv", encoding="utf-8", newline="") as fh:
        texts = [row["article"] for row in csv.DictReader(fh)]
    texts += [QUESTION, ARTICLE, "Qu'il s'en aille lorsqu'on l’exige puisqu'ils l'ont dit"]
    for text in texts:
        assert [t for _, _, t in matcher.words(text)] == analyzer(text), text[:80]


def test_snippet_is_a_window_around_the_matched_words():
    filler = " ".join(f"mot{i}" for i in range(80))
    text = f"{filler} Le mur mitoyen est à la charge des propriétaires. {filler}"
    spans = [s for s in TermMatcher().words(text) if s[2] in {"mur", "mitoyen", "propriétair"}]
    snippet, highlights = make_snippet(text, spans, width=120)
    assert snippet.startswith("… ") and snippet.endswith(" …") and len(snippet) <= 120 + 4
    assert [snippet[s:e] for s, e in highlights] == ["mur", "mitoyen", "propriétaires"]
    assert snippet[2:-2] in text and not snippet[2].isspace()
    assert mark(snippet, highlights).count("**mur** **mitoyen**") == 1
    # a short text is whole; a text without matches shows its opening
    assert make_snippet("Le bail.", [], 120) == ("Le bail.", [])
    opening, none = make_snippet(text, [], 120)
    assert opening.startswith("mot0 mot1") and opening.endswith(" …") and none == []


def test_snippet_prefers_the_window_with_the_most_distinct_terms():
    text = "mur " * 40 + "x " * 100 + "le mur mitoyen réparé " + "y " * 100
    spans = [s for s in TermMatcher().words(text) if s[2] in {"mur", "mitoyen", "répar"}]
    snippet, highlights = make_snippet(text, spans, width=80)
    assert {snippet[s:e] for s, e in highlights} == {"mur", "mitoyen", "réparé"}


@pytest.mark.parametrize(
    ("reference", "number"),
    [
        ("Art. 655, Code civil (Livre II, Titre IV)", "Art. 655"),
        ("Art. 6-1, Code civil", "Art. 6-1"),
        ("Art. 2bis, Code judiciaire", "Art. 2bis"),
        ("Article 1.1.2 du Code wallon", "Article 1.1.2"),
        ("Art. 3", "Art. 3"),
        ("Préambule", "Préambule"),
        (None, ""),
    ],
)
def test_article_number(reference, number):
    assert article_number(reference) == number


def _hits():
    articles = pl.DataFrame(
        {
            "id": [7, 9],
            "article": ["Le locataire paie le loyer au bailleur.", "Le bail est un contrat."],
            "reference": ["Art. 1728, Code civil (Livre III)", "Art. 1709, Code civil (Livre III)"],
            "path": [["Code civil", "Livre III"], ["Code civil", "Livre III"]],
        }
    )
    return Display(articles).hits("Quand payer le loyer ?", np.array([7, 9, -1]), np.array([3.5, 1.25, 0.0]))


def test_text_rendering_plain_and_ansi():
    hits = _hits()
    text = render_text("Quand payer le loyer ?", hits)
    assert "  1. Art. 1728 · Code civil (Livre III)   (score 3.5000, id 7)" in text
    assert "     Code civil › Livre III" in text
    assert "Le locataire **paie** le **loyer** au bailleur." in text
    assert text.index("  1. Art. 1728") < text.index("  2. Art. 1709") and "  3." not in text  # padding dropped
    assert BOLD not in text
    ansi = render_text("Quand payer le loyer ?", hits, style="ansi")
    assert f"{BOLD}loyer" in ansi and "**" not in ansi
    assert "no results" in render_text("xyzzy", [])


def test_ansi_only_on_a_terminal(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert use_ansi(Tty()) and not use_ansi(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_ansi(Tty())


def test_json_rendering():
    record = json.loads(render_json("Quand payer le loyer ?", _hits(), qid="q1", system="bm25"))
    assert record["id"] == "q1" and record["system"] == "bm25" and len(record["hits"]) == 2
    first = record["hits"][0]
    assert first == {
        "rank": 1,
        "id": 7,
        "article": "Art. 1728",
        "reference": "Art. 1728, Code civil (Livre III)",
        "path": ["Code civil", "Livre III"],
        "score": 3.5,
        "snippet": "Le locataire paie le loyer au bailleur.",
        "highlights": [[13, 17], [21, 26]],
        "matched_terms": ["payer", "loyer"],
    }
    assert record["hits"][1]["matched_terms"] == []


def _quadratic_snippet_start(text, spans, width):
    """The window start of ``make_snippet`` before issue 28 (one scan of every span per span),
    kept as the reference for the linear sweep."""
    lead = width // 5
    best = None
    for anchor, _, _ in spans:
        lo = max(0, min(anchor - lead, len(text) - width))
        inside = [s for s in spans if s[0] >= lo and s[1] <= lo + width]
        key = (len({t for _, _, t in inside}), len(inside), -lo)
        if best is None or key > best[0]:
            best = (key, lo)
    return best[1]


def _old_make_snippet(text, spans, width=240):
    """``make_snippet`` as it was before issue 28 (the window by the quadratic scan)."""
    if len(text) <= width:
        start, end = 0, len(text)
    elif not spans:
        start, end = 0, width
    else:
        start = _quadratic_snippet_start(text, spans, width)
        end = min(len(text), start + width)
    inside = [(s, e) for s, e, _ in spans if s >= start and e <= end]
    if start > 0 and not text[start - 1].isspace():
        nxt = text.find(" ", start, end)
        if 0 <= nxt and (not inside or nxt < inside[0][0]):
            start = nxt + 1
        else:
            start = text.rfind(" ", 0, start) + 1
    if end < len(text) and not text[end].isspace():
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


def test_snippets_of_the_sample_are_those_of_the_quadratic_scan():
    """Issue 28: the linear window search picks the window the old quadratic scan picked, on
    the sample's articles, for the terms of its dev questions and for sets of frequent terms."""
    with open(ROOT / "data" / "sample" / "articles.csv", encoding="utf-8", newline="") as fh:
        texts = [" ".join(row["article"].split()) for row in csv.DictReader(fh)]
    with open(ROOT / "data" / "sample" / "questions_dev.csv", encoding="utf-8", newline="") as fh:
        questions = [row["question"] for row in csv.DictReader(fh)]
    matcher = TermMatcher()
    rng = np.random.default_rng(0)
    checked = 0
    for text in texts:
        words = matcher.words(text)
        vocab = sorted({t for _, _, t in words})
        queries = [{t for _, _, t in matcher.words(q)} for q in questions[:5]]
        queries += [set(rng.choice(vocab, size=min(len(vocab), n), replace=False)) for n in (1, 3, 8)] if vocab else []
        for terms in queries:
            spans = [s for s in words if s[2] in terms]
            for width in (60, 120, 240):
                assert make_snippet(text, spans, width) == _old_make_snippet(text, spans, width), text[:60]
                checked += bool(spans) and len(text) > width
    assert checked > 50


@pytest.mark.timeout(10)
def test_snippet_of_a_one_megabyte_article_is_linear():
    """Issue 28: every word of a 1 MB article matching made the window scan quadratic (minutes)."""
    text = " ".join(["le mur mitoyen réparé"] * 45_000)  # ~1 MB, ~135,000 matched words
    spans = [s for s in TermMatcher().words(text) if s[2] in {"mur", "mitoyen", "répar"}]
    snippet, highlights = make_snippet(text, spans, width=240)
    assert snippet.startswith("… ") and snippet.endswith(" …") and len(snippet) <= 240 + 4
    assert {snippet[s:e] for s, e in highlights} == {"mur", "mitoyen", "réparé"}


HOSTILE = "\x1b[5mclignote\x1b[0m \x1b]8;;https://evil.example\x07lien\x1b]8;;\x07 \x00nul \x7fdel \x9bcsi \rretour"
HOSTILE += " \u202eesrever\u202c \u2067isole\u2069"  # bidi override and isolate (Trojan Source)


def test_control_characters_of_the_corpus_are_shown_not_obeyed():
    """Issue 28: an article's or heading's ESC, OSC, BEL, NUL, DEL or C1 never reaches the
    terminal, in either style; whitespace controls show as a space, the others as ``\\x..``;
    nor do its bidirectional overrides and isolates (shown as ``\\u202e``)."""
    articles = pl.DataFrame(
        {
            "id": [7],
            "article": [f"Le locataire paie le loyer. {HOSTILE}"],
            "reference": [f"Art. 1728, Code civil {HOSTILE}"],
            "path": [["Code civil", f"Livre {HOSTILE}"]],
        }
    )
    hits = Display(articles).hits(f"le loyer {HOSTILE}", np.array([7]), np.array([1.0]))
    for style in ("plain", "ansi"):
        text = render_text(f"le loyer {HOSTILE}", hits, style=style)
        shown = text.replace(BOLD, "").replace("\x1b[0m", "")  # the ansi style's own bold
        assert not any(ord(c) < 0x20 and c != "\n" or 0x7F <= ord(c) < 0xA0 for c in shown), repr(shown)
        assert "\\x1b[5mclignote" in text and "\\x1b]8;;https://evil.example\\x07lien" in text
        assert "\\x00nul \\x7fdel \\x9bcsi  retour" in text
        assert "\\u202eesrever\\u202c \\u2067isole\\u2069" in text and "\u202e" not in text
    assert "\\x1b[5m" in render_text("q", hits).split("\n")[3]  # the heading path's line
    line = render_json(f"le loyer {HOSTILE}", hits, qid="q1")
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or c in "\u202e\u2067" for c in line), repr(line)
    record = json.loads(line)
    assert record["question"] == f"le loyer {HOSTILE}" and record["hits"][0]["path"][1] == f"Livre {HOSTILE}"

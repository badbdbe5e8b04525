"""FrenchAnalyzer: normalisation, elisions, stopwords, Snowball stemming."""

from __future__ import annotations

import unicodedata

import Stemmer

from lexgraph.text.analyzer import FRENCH_STOPWORDS, FrenchAnalyzer


def test_elisions_are_split_and_dropped_with_both_apostrophes():
    plain = FrenchAnalyzer(stem=False, stopwords=False)
    assert plain("l'usufruit") == ["usufruit"]
    assert plain("l’usufruit") == ["usufruit"]
    assert plain("d'autrui qu'il jusqu'au lorsqu'elle puisqu'on") == ["autrui", "il", "au", "elle", "on"]
    assert plain("J'ai n'est s'il c'est m'a t'a") == ["ai", "est", "il", "est", "a", "a"]


def test_apostrophe_inside_other_words_splits_tokens():
    plain = FrenchAnalyzer(stem=False, stopwords=False)
    # not an elision prefix from the list: the apostrophe just separates tokens
    assert plain("aujourd'hui") == ["aujourd", "hui"]


def test_lowercase_nfc_and_digits():
    plain = FrenchAnalyzer(stem=False, stopwords=False)
    decomposed = unicodedata.normalize("NFD", "Évêque")
    assert decomposed != "Évêque"
    assert plain(decomposed) == ["évêque"]
    assert plain("Article 515-9, alinéa 2") == ["article", "515", "9", "alinéa", "2"]
    assert plain("a_b") == ["a", "b"]


def test_stopwords_are_removed_before_stemming():
    analyzer = FrenchAnalyzer(stem=False)
    assert analyzer("Le propriétaire et les voisins de la maison") == ["propriétaire", "voisins", "maison"]
    assert {"le", "la", "les", "de", "des", "et", "est", "qui", "que"} <= FRENCH_STOPWORDS
    assert "droit" not in FRENCH_STOPWORDS and "loi" not in FRENCH_STOPWORDS
    assert FrenchAnalyzer(stem=False, stopwords=False)("le droit") == ["le", "droit"]


def test_stemming_conflates_inflections():
    analyzer = FrenchAnalyzer()
    assert analyzer("servitudes") == analyzer("servitude")
    assert analyzer("héritiers") == analyzer("héritier")
    # same stems as the reference Snowball French stemmer
    reference = Stemmer.Stemmer("french")
    assert analyzer("propriétaires voisins") == reference.stemWords(["propriétaires", "voisins"])


def test_full_pipeline_example():
    assert FrenchAnalyzer()("L'usufruitier jouit des servitudes.") == ["usufruiti", "jou", "servitud"]
    assert FrenchAnalyzer()("") == []
    assert FrenchAnalyzer()("de la et") == []


def test_analyze_many_equals_one_by_one():
    analyzer = FrenchAnalyzer()
    texts = ["L'usufruitier jouit des servitudes.", "", "Des héritiers renoncent à la succession"] * 700
    assert analyzer.analyze_many(texts, chunk_size=64) == [analyzer(t) for t in texts]
    plain = FrenchAnalyzer(stem=False)
    assert plain.analyze_many(iter(texts[:3])) == [plain(t) for t in texts[:3]]
    assert analyzer.config() == {"stem": True, "stopwords": True}

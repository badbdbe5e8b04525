"""French text analysis for the lexical (BM25) retriever.

:class:`FrenchAnalyzer` turns a string into index terms:

1. Unicode NFC normalisation and lowercasing;
2. elision splitting: a leading elided article/pronoun/conjunction (``l'``, ``d'``,
   ``qu'``, ``j'``, ``n'``, ``s'``, ``c'``, ``m'``, ``t'``, ``jusqu'``, ``lorsqu'``,
   ``puisqu'``; straight ``'`` or typographic ``’`` apostrophe) is removed, so
   ``l'entrée`` gives ``entrée``;
3. tokenisation on runs of letters and digits (``_``, hyphens and punctuation split
   tokens, so the article number ``515-9`` gives ``515`` and ``9``);
4. removal of :data:`FRENCH_STOPWORDS` (surface forms, before stemming);
5. Snowball French stemming (PyStemmer's C implementation).

Steps 4 and 5 can be switched off (``stopwords=False``, ``stem=False``).
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Iterable, Sequence

from lexgraph.core.progress import progress_bar

log = logging.getLogger(__name__)

#: Elided words removed from the front of a token (matched after lowercasing).
ELISIONS: tuple[str, ...] = ("l", "d", "qu", "j", "n", "s", "c", "m", "t", "jusqu", "lorsqu", "puisqu")

_APOSTROPHES = "'\u2019\u02bc"  # ' ’ ʼ
_ELISION_RE = re.compile(
    r"\b(?:" + "|".join(sorted(ELISIONS, key=len, reverse=True)) + r")[" + _APOSTROPHES + r"](?=\w)"
)
_TOKEN_RE = re.compile(r"[^\W_]+")

#: French function words dropped before stemming: articles, pronouns, prepositions,
#: conjunctions, negation particles and the forms of the auxiliaries *être* and
#: *avoir*. Content words that carry legal meaning (``droit``, ``loi``, ``peut``, …)
#: are deliberately kept.
FRENCH_STOPWORDS: frozenset[str] = frozenset(
    """
    a à â afin ai aie aient aies ait as au aucun aucune aupres auprès aura aurai auraient
    aurais aurait auras aurez auriez aurions aurons auront aussi autre autres aux avaient
    avais avait avant avec avez aviez avions avoir avons ayant ayez ayons
    c ça car ce ceci cela celle celles celui cependant ces cet cette ceux chacun chacune
    chaque chez ci comme comment d dans de des dont du durant
    e elle elles en encore entre es est et étaient étais était étant été êtes étiez étions
    être eu eue eues eûmes eurent eus eusse eussent eusses eussiez eussions eut eût eûtes
    eux
    furent fus fusse fussent fusses fussiez fussions fut fût fûtes
    hormis i ici il ils j je jusqu jusque l la là le les leur leurs lequel laquelle lesquels
    lesquelles lors lorsque lorsqu lui
    m ma mais me même mêmes mes moi mon
    n ne ni nos notre nous
    on ont or ou où
    par parce parmi pas pour pourquoi puis puisque puisqu
    qu quand que quel quelle quelles quels qui quoi
    s sa sans se sera serai seraient serais serait seras serez seriez serions serons seront
    ses si soi soient sois soit sommes son sont soyez soyons suis sur
    t ta te tes toi ton tous tout toute toutes très tu
    un une unes uns
    vers via vos votre vous
    y
    """.split()
)


class FrenchAnalyzer:
    """Callable ``str -> list[str]`` producing BM25 index terms for French text.

    >>> FrenchAnalyzer()("L'usufruitier jouit des servitudes.")
    ['usufruiti', 'jou', 'servitud']
    """

    def __init__(self, stem: bool = True, stopwords: bool = True) -> None:
        self.stem = bool(stem)
        self.stopwords = bool(stopwords)
        self._stemmer = None
        if self.stem:
            import Stemmer  # PyStemmer: C Snowball stemmers

            self._stemmer = Stemmer.Stemmer("french")

    def config(self) -> dict[str, bool]:
        """The options, as stored next to an index so a loaded index analyses alike."""
        return {"stem": self.stem, "stopwords": self.stopwords}

    def __repr__(self) -> str:
        return f"FrenchAnalyzer(stem={self.stem}, stopwords={self.stopwords})"

    def tokenize(self, text: str) -> list[str]:
        """Steps 1-4 (normalise, split elisions, tokenise, drop stopwords): no stemming."""
        text = unicodedata.normalize("NFC", text).lower()
        text = _ELISION_RE.sub("", text)
        tokens = _TOKEN_RE.findall(text)
        if self.stopwords:
            tokens = [t for t in tokens if t not in FRENCH_STOPWORDS]
        return tokens

    def __call__(self, text: str) -> list[str]:
        tokens = self.tokenize(text)
        if self._stemmer is not None and tokens:
            tokens = self._stemmer.stemWords(tokens)
        return tokens

    def analyze_many(
        self, texts: Iterable[str], *, chunk_size: int = 2048, progress: bool | None = None, desc: str = "analyze"
    ) -> list[list[str]]:
        """Analyse many texts; stems each chunk of texts with one ``stemWords`` call.

        ``progress=None`` reports progress (:mod:`lexgraph.core.progress`) only for more than 5,000 texts.
        """
        if not isinstance(texts, Sequence):
            texts = list(texts)
        if progress is None:
            progress = len(texts) > 5000
        out: list[list[str]] = []
        with progress_bar(len(texts), desc, unit="text", disable=not progress) as bar:
            for start in range(0, len(texts), chunk_size):
                chunk = [self.tokenize(t) for t in texts[start : start + chunk_size]]
                if self._stemmer is not None:
                    flat = self._stemmer.stemWords([tok for toks in chunk for tok in toks])
                    pos = 0
                    for toks in chunk:
                        out.append(flat[pos : pos + len(toks)])
                        pos += len(toks)
                else:
                    out.extend(chunk)
                bar.update(len(chunk))
        return out

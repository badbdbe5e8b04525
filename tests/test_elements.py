"""The legal element indicator for statutes and MVCL's element view (lexgraph.text.elements):
sentence splitting and flags, the token-to-sentence map, and which sentences a view deletes
for a fixed seed, against hand computations and a brute force over seeds."""

from __future__ import annotations

import numpy as np
import pytest

from lexgraph.text.elements import (
    deleted_sentences,
    element_families,
    element_sentences,
    element_view,
    split_sentences,
    token_sentences,
)

# ---------------------------------------------------------------------------
# The legal element indicator and the element view
# ---------------------------------------------------------------------------

ARTICLE = (
    "Le locataire doit payer le loyer aux termes convenus. Le bail est écrit. "
    "Lorsque le bien est vendu, le bail continue; il est interdit de sous-louer.\nFin du titre."
)


def test_indicator_splits_sentences_and_flags_rule_statements():
    sentences = [ARTICLE[s:e] for s, e in split_sentences(ARTICLE)]
    assert sentences == [
        "Le locataire doit payer le loyer aux termes convenus.",
        "Le bail est écrit.",
        "Lorsque le bien est vendu, le bail continue;",
        "il est interdit de sous-louer.",
        "Fin du titre.",
    ]
    assert [flag for _, _, flag in element_sentences(ARTICLE)] == [True, False, True, True, False]
    assert element_families("Nul ne peut être puni d'une amende s'il ignorait la loi.") == [
        "right",
        "prohibition",
        "condition",
        "sanction",
    ]
    assert element_families("Sinon, le silence vaut refus.") == []  # "si" only as a whole word


def test_token_sentences_follow_sentence_spans_and_skip_prefix_and_specials():
    text = "Il doit. Rien ici."
    prefix = "p: "
    # tokens of "p: Il doit. Rien ici." : <s>, "p:", "Il", "doit.", "Rien", "ici.", </s>
    offsets = [(0, 0), (0, 2), (3, 5), (6, 11), (12, 16), (17, 21), (0, 0)]
    assert token_sentences(offsets, element_sentences(text), text_start=len(prefix)) == [None, None, 0, 0, 1, 1, None]


def test_deleted_sentences_for_a_fixed_seed_by_hand():
    """Six sentences, the 1st and 4th holding an element; the candidates are sentences
    1, 2, 4, 5 (7, 3, 4 and 6 tokens). The seed (13, text 42) orders them 4, 5, 1, 2
    (numpy's permutation [2, 3, 0, 1]); with L1 = 10 the first fit deletes 4 (4 tokens,
    6 left) and 5 (6 tokens, 0 left), and 1 and 2 no longer fit. Text 7 orders them
    2, 4, 1, 5: 2 (3 tokens, 7 left), 4 (4 tokens, 3 left), then neither 1 (7) nor 5 (6) fits."""
    lengths, flags = [5, 7, 3, 9, 4, 6], [True, False, False, True, False, False]
    assert np.random.default_rng([13, 42]).permutation(4).tolist() == [2, 3, 0, 1]
    assert np.random.default_rng([13, 7]).permutation(4).tolist() == [1, 2, 0, 3]
    assert deleted_sentences(lengths, flags, 10, seed=13, text_id=42) == [4, 5]
    assert deleted_sentences(lengths, flags, 10, seed=13, text_id=7) == [2, 4]
    # L1 larger than every non-element sentence together: all of them go (the old view)
    assert deleted_sentences(lengths, flags, 100, seed=13, text_id=42) == [1, 2, 4, 5]
    # L1 smaller than every sentence: nothing goes; an element sentence never goes
    assert deleted_sentences(lengths, flags, 2, seed=13, text_id=42) == []
    # a sentence with no token in the (truncated) text is no candidate
    assert deleted_sentences([5, 7, 3, 9, 4, 0], flags, 100, seed=13, text_id=42) == [1, 2, 4]


def test_deleted_sentences_brute_force_over_seeds():
    """Whatever the seed: only non-element sentences go, at most L1 tokens in all, and no
    remaining candidate would still fit (first fit over the whole order); each candidate
    that fits in L1 goes for some seed and stays for another; the result is the same twice."""
    lengths, flags, budget = [5, 7, 3, 9, 4, 6], [True, False, False, True, False, False], 10
    seen: dict[int, set[bool]] = {i: set() for i in (1, 2, 4, 5)}
    for text_id in range(200):
        gone = deleted_sentences(lengths, flags, budget, seed=0, text_id=text_id)
        assert gone == deleted_sentences(lengths, flags, budget, seed=0, text_id=text_id)
        assert set(gone) <= {1, 2, 4, 5} and sum(lengths[i] for i in gone) <= budget
        left = budget - sum(lengths[i] for i in gone)
        assert all(lengths[i] > left for i in (1, 2, 4, 5) if i not in gone)
        for i in seen:
            seen[i].add(i in gone)
    assert all(v == {True, False} for v in seen.values())


def test_element_view_replaces_the_drawn_sentences_tokens_by_del():
    text = "Il doit payer. Rien ici. Le bail est écrit. Fin du titre."
    prefix = "p: "
    words, offsets, pos = (prefix + text).split(" "), [(0, 0)], 0  # <s>, one token a word, </s>
    for w in words:
        start = (prefix + text).index(w, pos)
        offsets.append((start, start + len(w)))
        pos = start + len(w)
    offsets.append((0, 0))
    ids = list(range(100, 100 + len(offsets)))
    sentences = element_sentences(text)
    assert [f for _, _, f in sentences] == [True, False, False, False]
    sentence_of = token_sentences(offsets, sentences, len(prefix))
    assert sentence_of == [None, None, 0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3, None]
    # candidates 1, 2, 3 (2, 4, 3 tokens); seed (5, 11) orders them by numpy's permutation
    order = [[1, 2, 3][j] for j in np.random.default_rng([5, 11]).permutation(3)]
    left, expected = 5, []  # L1 = 5, first fit by hand
    for i in order:
        if [0, 2, 4, 3][i] <= left:
            expected.append(i)
            left -= [0, 2, 4, 3][i]
    view, gone = element_view(ids, sentence_of, [True, False, False, False], del_id=9, budget=5, seed=5, text_id=11)
    assert gone == sorted(expected) and gone  # something went
    assert view == [9 if s in gone else t for t, s in zip(ids, sentence_of)] and len(view) == len(ids)
    assert view[:5] == ids[:5] and view[-1] == ids[-1]  # specials, prefix and the element sentence stay
    # no element sentence: the last sentence of the random order stays, whatever L1
    view, gone = element_view(ids, sentence_of, [False] * 4, del_id=9, budget=100, seed=5, text_id=11)
    assert len(gone) == 3 and 9 in view and any(t != 9 for t, s in zip(view, sentence_of) if s is not None)
    with pytest.raises(ValueError):
        element_view(ids, sentence_of[:-1], [True, False, False, False], 9, 5, 5, 11)

"""benchmarks/hierarchy.py: the hierarchy figures against a hand computation on 6 articles."""

from __future__ import annotations

import json
from fractions import Fraction as F

import polars as pl
import pytest

from conftest import ROOT, load_benchmark

hierarchy = load_benchmark("hierarchy")


def toy():
    # corpus order = ascending id; deepest headings 0 0 0 1 1 and one article with none (-1);
    # the rows arrive shuffled, as nothing promises they come sorted
    articles = pl.DataFrame({"id": [4, 1, 6, 2, 5, 3], "heading_id": [1, 0, -1, 0, 1, 0]})
    questions = pl.DataFrame(
        {
            "id": [10, 11, 12, 13],
            "article_ids": [[4, 1, 2, 99], [4, 5], [6], [3, 6]],  # 99 is not in the corpus: ignored
        }
    )
    return articles, questions


def test_figures_match_a_hand_computation():
    fig = hierarchy.hierarchy_figures(*toy(), max_gap=2)
    # question 12 has one gold article: left out. Gold headings and modal counts:
    #   10: {1,2,4} -> 0 0 1 -> 2 of 3;  11: {4,5} -> 1 1 -> 2 of 2;  13: {3,6} -> 0, none -> 1 of 2
    assert fig["multi_gold_questions"] == 3 and fig["gold_articles"] == 7
    assert fig["modal_share"]["macro"] == pytest.approx(float((F(2, 3) + 1 + F(1, 2)) / 3))  # 13/18
    assert fig["modal_share"]["micro"] == pytest.approx(5 / 7)
    # blocks over headings [0 0 0 1 1 -1]:
    #   size 3: [000] 3, [001] 2, [011] 2, [11-] 2 -> 9 / (4 x 3) = 3/4
    #   size 2: [00] 2, [00] 2, [01] 1, [11] 2, [1-] 1 -> 8 / (5 x 2) = 4/5
    size3, size2 = F(3, 4), F(4, 5)
    assert fig["block_share"]["macro"] == pytest.approx(float((size3 + size2 + size2) / 3))  # 47/60
    assert fig["block_share"]["micro"] == pytest.approx(float((3 * size3 + 2 * size2 + 2 * size2) / 7))
    # positions = id - 1. All pairs: 10 {0,1,3}: (0,1) 1 yes, (0,3) 3 no, (1,3) 2 yes; 11 {3,4}: yes;
    # 13 {2,5}: 3 no -> 3 of 5. Successive: 10 (0,1) (1,3) both; 11 yes; 13 no -> 3 of 4
    assert fig["gold_pairs"] == 5 and fig["gold_pairs_within"] == pytest.approx(3 / 5)
    assert fig["successive_pairs"] == 4 and fig["successive_pairs_within"] == pytest.approx(3 / 4)
    # all 15 pairs of 6 articles: 5 at distance 1 and 4 at distance 2
    assert fig["corpus_pairs_within"] == pytest.approx(9 / 15)


def test_articles_without_a_heading_share_nothing():
    assert hierarchy.modal_count([-1, -1, -1]) == 1
    assert hierarchy.modal_count([-1, 4, 4]) == 2
    assert hierarchy.block_share([-1, -1], 2) == pytest.approx(1 / 2)


def test_the_gap_is_a_parameter():
    fig = hierarchy.hierarchy_figures(*toy(), max_gap=1)
    # all pairs at distance 1: (0,1) and (3,4) -> 2 of 5; successive: (0,1), (3,4) -> 2 of 4
    assert fig["gold_pairs_within"] == pytest.approx(2 / 5)
    assert fig["successive_pairs_within"] == pytest.approx(2 / 4)
    assert fig["corpus_pairs_within"] == pytest.approx(5 / 15)


def test_the_sample_is_read_through_the_project_loaders(tmp_path):
    out = tmp_path / "h.json"
    hierarchy.main(["--params", str(ROOT / "params.yaml"), "--json", str(out)])
    fig = json.loads(out.read_text(encoding="utf-8"))
    assert fig["articles"] == 2760 and fig["multi_gold_questions"] == 266
    assert fig["modal_share"]["micro"] < fig["block_share"]["micro"]

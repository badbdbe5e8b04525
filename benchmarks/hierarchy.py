"""Benchmark: how much of a question's gold set the statute hierarchy groups together.

    python benchmarks/hierarchy.py [--params params.yaml] [--json OUT.json]

Reads the corpus and questions through the project's own loaders (``lexgraph.data.fetch``
with the ``fetch`` section of ``--params``, then ``lexgraph.data.clean``: the
``data/clean`` tables ``dvc repro`` writes, each article with its deepest heading
``heading_id``) and, on the questions with at least two gold articles (every split), prints:

* **modal heading share**: for a question with gold set G, the largest number of articles of
  G filed under one deepest heading, divided by |G|. Averaged over questions (``macro``) and
  pooled (``micro``: sum of the modal counts over sum of |G|).
* **consecutive-block baseline**: the same share for a block of |G| *consecutive* articles
  (corpus order = ascending article id, as ``clean`` sorts them), averaged over every start
  position of the corpus, then over the questions as above. A block of neighbours is the
  null model for "gold sets come in runs": it shares a heading as often as neighbours do.
* **gold pairs at most 2 apart**: of all unordered pairs of one question's gold articles,
  the share whose positions in corpus order differ by at most 2 (``--max-gap``), beside the
  share among all pairs of articles of the corpus; and of the *successive* pairs only (each
  gold article with the next gold article of the same question in corpus order: |G| - 1
  pairs per question), the share at most 2 apart. ``../shared/README.md``'s "60 % of gold
  pairs are at most 2 article numbers apart" is the successive-pairs figure.

An article with no heading (``heading_id`` -1) counts as its own group: it shares with no
other article. Deterministic (no sampling): every block is enumerated.
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import polars as pl

from lexgraph.core.config import load_params
from lexgraph.core.io import write_json
from lexgraph.data.clean import CleanConfig, clean
from lexgraph.data.fetch import FetchConfig, fetch

log = logging.getLogger("hierarchy")

ROOT = Path(__file__).resolve().parents[1]


def modal_count(headings: Sequence[int]) -> int:
    """The size of the largest group of equal heading ids; a -1 (no heading) is a group of one."""
    counts = Counter(h for h in headings if h >= 0)
    singles = sum(1 for h in headings if h < 0)
    return max(max(counts.values(), default=0), 1 if singles else 0)


def block_share(headings: Sequence[int], size: int) -> float:
    """Mean modal share over every block of ``size`` consecutive articles (``headings`` in corpus order)."""
    n = len(headings)
    if size > n:
        raise ValueError(f"a gold set of {size} articles is larger than the corpus ({n})")
    starts = range(n - size + 1)
    return sum(modal_count(headings[s : s + size]) for s in starts) / (len(starts) * size)


def pairs_within(positions: Sequence[int], max_gap: int) -> tuple[int, int]:
    """``(pairs at most max_gap apart, all pairs)`` of a set of corpus positions."""
    pos = sorted(positions)
    close = sum(1 for i in range(len(pos)) for j in range(i + 1, len(pos)) if pos[j] - pos[i] <= max_gap)
    return close, len(pos) * (len(pos) - 1) // 2


def successive_within(positions: Sequence[int], max_gap: int) -> tuple[int, int]:
    """``(successive pairs at most max_gap apart, successive pairs)``: each position with the next one."""
    pos = sorted(positions)
    return sum(1 for a, b in zip(pos, pos[1:]) if b - a <= max_gap), max(len(pos) - 1, 0)


def hierarchy_figures(articles: pl.DataFrame, questions: pl.DataFrame, max_gap: int = 2) -> dict:
    """The figures of the module docstring from ``articles`` (``id``, ``heading_id``) and
    ``questions`` (``id``, ``article_ids`` list[int]); gold ids missing from ``articles`` are ignored."""
    ordered = articles.sort("id")
    ids = ordered["id"].to_list()
    headings = ordered["heading_id"].to_list()
    position = {a: i for i, a in enumerate(ids)}
    shares, baseline, counts, sizes = [], [], [], []
    close = pairs = s_close = s_pairs = 0
    block_cache: dict[int, float] = {}
    for gold in questions["article_ids"].to_list():
        pos = sorted({position[a] for a in gold if a in position})
        if len(pos) < 2:
            continue
        size = len(pos)
        count = modal_count([headings[p] for p in pos])
        if size not in block_cache:
            block_cache[size] = block_share(headings, size)
        shares.append(count / size)
        counts.append(count)
        sizes.append(size)
        baseline.append(block_cache[size])
        c, p = pairs_within(pos, max_gap)
        close, pairs = close + c, pairs + p
        c, p = successive_within(pos, max_gap)
        s_close, s_pairs = s_close + c, s_pairs + p
    n = len(ids)
    corpus_pairs = n * (n - 1) // 2
    corpus_close = sum(max(0, n - d) for d in range(1, max_gap + 1))
    q = len(shares)
    return {
        "articles": n,
        "multi_gold_questions": q,
        "gold_articles": sum(sizes),
        "modal_share": {"macro": sum(shares) / q if q else None, "micro": sum(counts) / sum(sizes) if q else None},
        "block_share": {
            "macro": sum(baseline) / q if q else None,
            "micro": sum(b * s for b, s in zip(baseline, sizes)) / sum(sizes) if q else None,
        },
        "max_gap": max_gap,
        "gold_pairs": pairs,
        "gold_pairs_within": close / pairs if pairs else None,
        "corpus_pairs_within": corpus_close / corpus_pairs if corpus_pairs else None,
        "successive_pairs": s_pairs,
        "successive_pairs_within": s_close / s_pairs if s_pairs else None,
    }


def load_clean(params: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The clean articles and questions, built from ``params``' fetch and clean sections."""
    base, fetch_section = load_params("fetch", params)
    _, clean_section = load_params("clean", params)
    for key in ("sample_dir", "local_dir"):  # relative to the repository, wherever this runs from
        if fetch_section.get(key) and not Path(fetch_section[key]).is_absolute():
            fetch_section[key] = str(ROOT / fetch_section[key])
    raw_articles, raw_questions, _ = fetch(FetchConfig.from_params(fetch_section), base.seed)
    articles, _, questions, _ = clean(raw_articles, raw_questions, CleanConfig.from_params(clean_section))
    return articles, questions


def table(fig: dict) -> str:
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f} %"  # noqa: E731
    rows = [
        ("gold articles under the modal deepest heading", fig["modal_share"]),
        ("same-size blocks of consecutive articles", fig["block_share"]),
    ]
    lines = [
        f"{fig['multi_gold_questions']} questions with >= 2 gold articles "
        f"({fig['gold_articles']} gold articles, corpus of {fig['articles']})",
        "",
        "| share | per question (macro) | pooled (micro) |",
        "|:---|---:|---:|",
    ]
    lines += [f"| {name} | {pct(v['macro'])} | {pct(v['micro'])} |" for name, v in rows]
    lines += [
        "",
        f"| pairs at most {fig['max_gap']} articles apart | share |",
        "|:---|---:|",
        f"| gold pairs of one question ({fig['gold_pairs']}) | {pct(fig['gold_pairs_within'])} |",
        f"| successive gold pairs of one question ({fig['successive_pairs']}) | "
        f"{pct(fig['successive_pairs_within'])} |",
        f"| all pairs of the corpus | {100 * fig['corpus_pairs_within']:.2f} % |",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    from lexgraph.core.arguments import OneLineParser, positive_int

    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--params",
        type=Path,
        default=ROOT / "params.yaml",
        help="params file whose fetch and clean sections load the data (default: params.yaml)",
    )
    parser.add_argument("--max-gap", type=positive_int, default=2, help="pairs at most this many positions apart")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    articles, questions = load_clean(args.params)
    fig = hierarchy_figures(articles, questions, args.max_gap)
    print(table(fig))
    if args.json:
        write_json(fig, args.json)
        log.info("wrote %s", args.json)


if __name__ == "__main__":
    main()

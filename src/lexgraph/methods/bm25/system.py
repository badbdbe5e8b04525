"""BM25 stage logic: tune k1 x b on a split, build the final index."""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal

import polars as pl
from pydantic import Field, field_validator

from lexgraph.core import layout
from lexgraph.core.config import refuse_held_out
from lexgraph.core.inputs import KeyCheck, finite_number, read_json_object
from lexgraph.core.io import atomic_path, read_parquet, write_json
from lexgraph.core.progress import progress
from lexgraph.core.settings import Expect, Float, Section, bad_value
from lexgraph.core.stage import StageContext, stage_paths
from lexgraph.data.schema import SPLITS, split_questions
from lexgraph.methods.system import SparseSystem
from lexgraph.metrics.ir import METRICS, evaluate_run
from lexgraph.search.bm25 import BM25, load_system
from lexgraph.search.bm25_kernels import DEFAULT_IDF
from lexgraph.text.analyzer import FrenchAnalyzer

log = logging.getLogger(__name__)


#: a split name (``test`` refused by the section's validator: it is held out for evaluation)
Split = Annotated[Literal[SPLITS], Expect("dev (or train)")]


class Bm25TuneConfig(Section, section="bm25_tune"):
    """The ``bm25_tune`` section of params.yaml: the k1 x b grid, searched on one split."""

    split: Split
    metric: Literal[METRICS]
    k1: Annotated[list[Annotated[Float, Field(ge=0)]], Field(min_length=1)]
    b: Annotated[list[Annotated[Float, Field(ge=0, le=1)]], Field(min_length=1)]

    @field_validator("split")
    @classmethod
    def _not_held_out(cls, split: str) -> str:
        refuse_held_out("bm25_tune", "split", split, "dev (or train)")  # its ConfigError passes through pydantic
        return split


class Bm25Config(Section, section="bm25"):
    """The ``bm25`` section of params.yaml: the index's k1 and b, or ``tuned`` (bm25_tune's best)."""

    k1: Annotated[Annotated[Float, Field(ge=0)] | Literal["tuned"], Expect("a number >= 0 or 'tuned'")]
    b: Annotated[Annotated[Float, Field(ge=0, le=1)] | Literal["tuned"], Expect("a number in [0, 1] or 'tuned'")]


def build_index(articles: pl.DataFrame, k1: float, b: float, idf: str = DEFAULT_IDF) -> BM25:
    """BM25 of ``articles`` at ``k1``/``b`` with the idf formula ``idf`` (its default floor)."""
    return BM25(k1=k1, b=b, idf=idf).fit_texts(articles["article"].to_list(), articles["id"].to_list())


def tune_grid(
    articles: pl.DataFrame, questions: pl.DataFrame, config: Bm25TuneConfig, idf: str = DEFAULT_IDF
) -> tuple[list[dict], dict]:
    """Grid search over ``bm25_tune.k1`` x ``bm25_tune.b`` (BM25 with the idf formula ``idf``);
    return (grid rows, best row)."""
    metric, split = config.metric, config.split
    qids, texts, qrels = split_questions(questions, split)
    if not qids:
        raise bad_value("bm25_tune", "split", split, "a split that has questions (this one has none)")
    analyzer = FrenchAnalyzer()
    tokens = {qid: analyzer(text) for qid, text in zip(qids, texts)}
    index = build_index(articles, 1.2, 0.75, idf)
    depth = max(int(metric.split("@")[1]) if "@" in metric else 500, 10)
    grid = tune(
        index,
        tokens,
        qrels,
        config.k1,
        config.b,
        lambda run, q: evaluate_run(run, q)[metric],
        k=min(depth, index.n_docs),
    )
    # best score; ties go to the first pair in grid order (deterministic)
    best = max(grid, key=lambda row: row["score"])
    log.info("bm25_tune: best %s = %.4f at k1=%.2f b=%.2f", metric, best["score"], best["k1"], best["b"])
    return grid, {"metric": metric, "split": split, **best}


def resolve_k1_b(config: Bm25Config, tuned: dict) -> tuple[float, float]:
    """``bm25.k1``/``bm25.b``: the number (checked by :class:`Bm25Config`), or ``tuned`` for
    bm25_tune's best pair (:func:`read_tuned`)."""
    return tuple(float(tuned[key] if getattr(config, key) == "tuned" else getattr(config, key)) for key in ("k1", "b"))


#: what bm25_tune's best pair must hold for the keys the bm25 stage reads
TUNED_KEYS: dict[str, KeyCheck] = {
    "k1": (lambda v: finite_number(v) and v >= 0, "a number >= 0"),
    "b": (lambda v: finite_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
}


def read_tuned(path, config: Bm25Config) -> dict[str, Any]:
    """bm25_tune's best pair (``metrics/bm25_tune.json``), its ``k1``/``b`` checked where
    ``bm25.k1``/``bm25.b`` is ``tuned`` (not read at all when neither is): a truncated,
    empty or wrong-shaped file is one line naming it and the stage to rerun."""
    needed = {key: check for key, check in TUNED_KEYS.items() if getattr(config, key) == "tuned"}
    if not needed:
        return {}
    return read_json_object(
        path,
        what='bm25_tune\'s best pair, an object with k1 and b (e.g. {"k1": 1.0, "b": 0.1, ...})',
        fix="rerun `dvc repro bm25_tune`",
        keys=needed,
    )


def tune(
    bm25: BM25,
    question_tokens: Mapping[Hashable, Sequence[str]],
    qrels: Mapping[Hashable, Iterable[int]],
    k1_grid: Sequence[float],
    b_grid: Sequence[float],
    score_fn: Callable[[dict, Mapping], float],
    k: int = 100,
) -> list[dict[str, float]]:
    """Grid search of ``k1`` x ``b``: ``[{"k1", "b", "score"}, ...]`` in grid order (k1 outer).

    For each pair the index is re-weighted (:meth:`BM25.reweight`), the questions
    ``{qid: tokens}`` are searched to depth ``k`` and ``score_fn(run, qrels)`` scores
    the run ``{qid: [article ids, best first]}``. The index's own ``k1``/``b`` are
    restored afterwards.
    """
    qids = list(question_tokens)
    tokens = [question_tokens[q] for q in qids]
    saved = (bm25.k1, bm25.b)
    results: list[dict[str, float]] = []
    grid = [(float(k1), float(b)) for k1 in k1_grid for b in b_grid]
    try:
        for k1, b in progress(grid, "bm25 tune", unit="pair"):
            bm25.reweight(k1, b)
            ids, _ = bm25.search_tokens(tokens, k, progress=False)
            run = {q: row.tolist() for q, row in zip(qids, ids)}
            results.append({"k1": k1, "b": b, "score": float(score_fn(run, qrels))})
    finally:
        bm25.reweight(*saved)
    return results


Bm25TunePaths = stage_paths("bm25_tune")


def run_bm25_tune(paths: Bm25TunePaths, config: Bm25TuneConfig, context: StageContext) -> None:
    """The ``bm25_tune`` stage: the grid's best pair -> ``paths.best``, the whole grid -> ``paths.grid``."""
    articles = read_parquet(paths.articles, ["id", "article"])
    questions = read_parquet(paths.questions, ["id", "question", "article_ids", "split"])
    grid, best = tune_grid(articles, questions, config)
    write_json(best, paths.best)
    with atomic_path(paths.grid) as tmp:
        pl.DataFrame(grid).write_csv(tmp, float_precision=6)


Bm25Paths = stage_paths("bm25")


def run_bm25(paths: Bm25Paths, config: Bm25Config, context: StageContext) -> None:
    """The ``bm25`` stage: the index at ``config``'s (or the tuned) k1 and b -> ``paths.out``."""
    k1, b = resolve_k1_b(config, read_tuned(paths.tuned, config))
    log.info("bm25: k1=%.2f b=%.2f", k1, b)
    index = build_index(read_parquet(paths.articles, ["id", "article"]), k1, b)
    with atomic_path(paths.out, directory=True) as tmp:
        index.save(tmp)


def index_side(job) -> None:
    """``lexgraph index``: BM25 of the corpus with the workspace index's settings (k1, b, idf, floor,
    analyzer); warns of the terms whose idf is 0."""
    from lexgraph.search.bm25_kernels import DEFAULT_IDF_FLOOR

    own = BM25.load(layout.BM25.under(job.workspace))
    bm25 = BM25(**own.settings()).fit_texts(job.articles["article"].to_list(), job.articles["id"].to_list())
    bm25.save(layout.BM25.under(job.root))
    log.info(
        "index: bm25 (k1=%.2f, b=%.2f, idf %s) over %d articles", own.k1, own.b, own.idf_variant, job.articles.height
    )
    if zero := int((bm25.idf == 0.0).sum()):
        log.warning(
            "index: %d term(s) of the corpus are each in at least half of its articles and get idf 0 under the "
            "workspace BM25's idf_floor %r: a question of only such terms gets no results; rebuild the "
            "workspace's BM25 (`dvc repro bm25`) for the default floor %r, then index again",
            zero,
            own.idf_floor,
            DEFAULT_IDF_FLOOR,
        )


SYSTEM = SparseSystem(
    name="bm25",
    summary="BM25 over the analysed article texts (k1 and b chosen on dev by bm25_tune)",
    load=load_system,
    reads=(layout.BM25,),
    index_models=(layout.BM25.posix(),),  # k1, b and the analyzer
    index=index_side,
)

"""The ``evaluate`` stage's settings and work: every system's runs on every split (written as
TREC files by :mod:`lexgraph.evaluation.trec`, each split's qrels beside them), their metrics
rounded, the Markdown result table and the paired significance tests behind its marks."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from lexgraph.core.config import params_error
from lexgraph.core.io import atomic_path
from lexgraph.core.settings import Expect, Int, Section, Str, enforce
from lexgraph.core.stage import StageContext, stage_paths
from lexgraph.data.keys import keys_of
from lexgraph.data.schema import (
    SPLITS,
    split_questions,
)
from lexgraph.evaluation.trec import read_trec, write_qrels, write_trec
from lexgraph.methods.catalog import BUILTIN, names
from lexgraph.metrics.ir import DEEPEST, METRICS, rounded
from lexgraph.search.index import IndexKeys

log = logging.getLogger(__name__)

SECTION = "evaluate"
#: the splits ``evaluate`` may score: the human questions (synthetic ones are generated training data)
EVALUATED_SPLITS: tuple[str, ...] = tuple(s for s in SPLITS if s != "synthetic")
#: what ``evaluate.splits`` holds
SPLIT_NAMES = (
    f"a non-empty list of distinct split names among {', '.join(EVALUATED_SPLITS)} "
    "(synthetic questions are generated training data, not evaluated)"
)
SYSTEMS = "a non-empty list of distinct systems"


class EvaluateConfig(Section, section=SECTION):
    """The ``evaluate`` section of params.yaml."""

    splits: Annotated[list[Literal[EVALUATED_SPLITS]], Field(min_length=1), Expect(SPLIT_NAMES)]
    k: Annotated[Int, Field(ge=DEEPEST, description=f"articles per question (recall@{DEEPEST} reads that deep)")]
    systems: Annotated[list[Str], Field(min_length=1), Expect(SYSTEMS)] = Field(
        description="names of the registry (``lexgraph systems`` lists them)"
    )
    significance_split: Str = Field(description="one of the splits: the paired tests and their confidence intervals")
    baselines: Annotated[list[Str], Expect("a list of systems")] = Field(
        description="every system is compared with these (each one of 'evaluate.systems')"
    )
    significance_metrics: Annotated[
        list[Literal[METRICS]], Field(min_length=1), Expect(f"a non-empty list of metrics among {', '.join(METRICS)}")
    ]
    index: IndexKeys = Field(description="how dense systems search their article embeddings (a mapping)")

    @model_validator(mode="after")
    def _rules(self) -> EvaluateConfig:
        known = names()
        among = f" among {', '.join(known)}"
        unscored = ", ".join(b for b in self.baselines if b not in self.systems)
        rules = (
            ("splits", len(set(self.splits)) < len(self.splits), SPLIT_NAMES),
            (
                "systems",
                len(set(self.systems)) < len(self.systems) or any(s not in known for s in self.systems),
                SYSTEMS + among,
            ),
            (
                "significance_split",
                self.significance_split not in self.splits,
                "one of the splits in 'evaluate.splits'",
            ),
            ("baselines", any(b not in known for b in self.baselines), "a list of systems" + among),
            # a baseline that is not evaluated would silently give no significance test
            (
                "baselines",
                unscored,
                f"baselines among 'evaluate.systems' = {self.systems!r} (not evaluated: {unscored}; add them there, "
                "or remove them from the baselines)",
            ),
        )
        return enforce(self, rules)


#: Columns of the results table: (header, metric key), laid out like Table 2 of the
#: G-DSR / QABISAR papers, followed by R@10 and nDCG@10.
TABLE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("R@100", "recall@100"),
    ("R@200", "recall@200"),
    ("R@500", "recall@500"),
    ("mAP", "map"),
    ("mRP", "r_precision"),
    ("R@10", "recall@10"),
    ("nDCG@10", "ndcg@10"),
)

_MISSING = "–"

#: ``metrics/<system>.json`` of a system this run did not score: ``evaluate`` writes one of the
#: two for every system of the registry it does not evaluate (each is a declared output), so no
#: earlier run's metrics survive as this run's (``lexgraph regress`` fails on either)
SWITCHED_OFF = {"enabled": False}
NOT_EVALUATED = {"evaluated": False, "reason": "not in evaluate.systems"}


def round_metrics(d: Mapping, ndigits: int = 4) -> dict:
    """Round every float in ``d`` (nested dicts included) to ``ndigits`` decimals."""
    out = {}
    for key, value in d.items():
        if isinstance(value, Mapping):
            out[key] = round_metrics(value, ndigits)
        elif isinstance(value, (float, np.floating)):
            out[key] = rounded(value, ndigits)
        else:
            out[key] = value
    return out


def _percent(value: float | None) -> str:
    """A fraction as a percentage with one decimal, rounding halves up (0.4125 -> 41.3)."""
    if value is None:
        return _MISSING
    value = float(value)
    if not np.isfinite(value):
        return _MISSING
    return str((Decimal(repr(value)) * 100).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


def results_table(
    metrics_by_system: Mapping[str, Mapping[str, Mapping[str, float]]],
    split: str = "test",
    n_questions: int | None = None,
    markers: Mapping[str, Mapping[str, str]] | None = None,
) -> str:
    """A Markdown table of one split: a row per system (in the given order), values in %.

    Columns are R@100, R@200, R@500, mAP, mRP (R-precision), R@10 and nDCG@10; a
    system without this split, or without a metric, shows ``–``. A caption line names
    the split and, when given, the number of questions. ``markers[system][metric]`` is
    appended to that cell (significance superscripts).
    """
    markers = markers or {}
    count = "" if n_questions is None else f" ({n_questions} questions)"
    lines = [
        f"Table: retrieval results on the {split} split{count}, in %.",
        "",
        "| System | " + " | ".join(header for header, _ in TABLE_COLUMNS) + " |",
        "|:---|" + "---:|" * len(TABLE_COLUMNS),
    ]
    for system, by_split in metrics_by_system.items():
        values = by_split.get(split, {})
        cells = [_percent(values.get(key)) + markers.get(system, {}).get(key, "") for _, key in TABLE_COLUMNS]
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def results_markdown(
    metrics_by_system: Mapping[str, Mapping[str, Mapping[str, float]]],
    splits: Iterable[str],
    n_questions: Mapping[str, int] | None = None,
    markers: Mapping[str, Mapping[str, Mapping[str, str]]] | None = None,
    notes: Mapping[str, str] | None = None,
) -> str:
    """A Markdown document with a ``## <split> split`` section and table per split;
    ``markers[split]`` and ``notes[split]`` (a legend under the table) are optional."""
    n_questions, markers, notes = n_questions or {}, markers or {}, notes or {}
    parts = ["# Retrieval results", ""]
    for split in splits:
        parts += [
            f"## {split} split",
            "",
            results_table(metrics_by_system, split, n_questions.get(split), markers.get(split)),
        ]
        if split in notes:
            parts += [notes[split], ""]
    return "\n".join(parts)


def significance_report(
    runs: Mapping[str, Mapping[int, list[int]]],
    qrels: Mapping[int, Iterable[int]],
    baselines: Sequence[str],
    metrics: Sequence[str],
    seed: int,
    n_resamples: int = 10000,
) -> tuple[dict, dict[str, dict[str, str]], str]:
    """Paired tests of every system against ``baselines`` on one split:
    ``(comparisons, markers[system][metric], legend)`` (see :mod:`lexgraph.metrics.significance`).

    The split's tests are one family (one results table): each entry carries its raw
    ``p_value`` and its Holm-adjusted ``p_holm``, and the markers use ``p_holm``."""
    from lexgraph.metrics.significance import compare_systems, marker_legend, significance_markers

    present = [b for b in baselines if b in runs]
    comparisons = compare_systems(
        dict(runs), dict(qrels), present, metrics=tuple(metrics), n_resamples=n_resamples, seed=seed
    )
    markers = {system: {m: significance_markers(comparisons, system, m, present) for m in metrics} for system in runs}
    return comparisons, markers, marker_legend(present) + f" Tested: {', '.join(metrics)}."


def evaluate_systems(
    systems: Sequence[str],
    questions,
    splits: Sequence[str],
    k: int,
    runs_dir: str | os.PathLike,
    workspace: str | os.PathLike = ".",
    device: str = "auto",
    index=None,
    keys=None,
) -> dict[str, dict[str, dict[str, float]]]:
    """Search every split with every system, write TREC runs, return rounded metrics.

    ``questions`` is the clean questions table; runs go to ``runs_dir/<system>/<split>.trec``.
    The systems are loaded with :func:`lexgraph.systems.registry.load_retriever`, exactly as
    ``lexgraph search`` loads them; dense systems search through ``index``
    (:class:`lexgraph.search.index.IndexConfig`, ``evaluate.index``). Systems with the
    same query encoder share it and each split's questions are encoded once per encoder
    (:func:`lexgraph.methods.dense.shared_query_encoders`). ``keys``
    (:class:`lexgraph.data.keys.IdKeys`, ``fetch.source: corpus``): the runs name questions and
    articles by the user's ids.
    """
    from lexgraph.methods.dense import shared_query_encoders
    from lexgraph.metrics.ir import evaluate_run
    from lexgraph.systems.registry import load_retriever

    results: dict[str, dict[str, dict[str, float]]] = {}
    with shared_query_encoders():  # dsr, hprior, gdsr and hybrid: one DSR query encoder, each split encoded once
        for system in systems:
            retriever = load_retriever(system, workspace, device, index=index)
            results[system] = {}
            for split in splits:
                qids, texts, qrels = split_questions(questions, split)
                if not qids:
                    log.warning("no questions in split %s; skipped", split)
                    continue
                ids, scores = retriever.search(texts, k)
                names = [keys.questions[q] for q in qids] if keys is not None else [str(q) for q in qids]
                docids = keys.articles if keys is not None else None
                write_trec(Path(runs_dir) / system / f"{split}.trec", names, ids, scores, system, docids)
                run = {q: row.tolist() for q, row in zip(qids, ids)}
                results[system][split] = round_metrics(evaluate_run(run, qrels))
                log.info("%s/%s: %s", system, split, results[system][split])
    return results


def run_reader(keys):
    """How evaluate reads back the runs it wrote: :func:`read_trec`, with the user's ids mapped
    back to lexgraph's (``keys``: :class:`lexgraph.data.keys.IdKeys`, or None)."""
    if keys is None:
        return read_trec
    question_ids, article_ids = keys.question_ids(), keys.article_ids()

    def question_id(name: str) -> int:
        return question_ids[name]

    return functools.partial(read_trec, qid_type=question_id, docids=article_ids)


def write_split_qrels(questions, splits: Sequence[str], runs_dir: str | os.PathLike, keys=None) -> list[Path]:
    """Write each split's gold articles as TREC qrels, ``runs_dir/<split>.qrels``, beside the
    runs ``runs_dir/<system>/<split>.trec`` (``trec_eval data/runs/test.qrels
    data/runs/bm25/test.trec``); a split without questions gets none, as it gets no run."""
    written = []
    for split in splits:
        qids, _, qrels = split_questions(questions, split)
        if qids:
            written.append(Path(runs_dir) / f"{split}.qrels")
            if keys is not None:  # the user's ids (fetch.source: corpus), as the runs spell them
                qrels = {keys.questions[q]: docs for q, docs in qrels.items()}
            write_qrels(written[-1], qrels, keys.articles if keys is not None else None)
    return written


__all__ = [
    "METRICS",
    "TABLE_COLUMNS",
    "results_markdown",
    "results_table",
    "round_metrics",
    "evaluate_systems",
    "write_split_qrels",
]


EvaluatePaths = stage_paths("evaluate")


def run_evaluate(paths: EvaluatePaths, config: EvaluateConfig, context: StageContext) -> None:
    """The ``evaluate`` stage: every system on every split -> TREC runs and each split's qrels,
    metrics/<system>.json, results.md, the paired significance tests on
    ``config.significance_split`` -> significance.json, per-question results ->
    per_query/<split>.csv and the test recall@k curve."""
    device, seed = str(context.torch_device()), context.seed
    import polars as pl

    from lexgraph.core.io import read_parquet, write_json, write_text
    from lexgraph.core.layout import RERANKERS
    from lexgraph.evaluation.per_query import write_per_query_reports
    from lexgraph.methods.rerank.system import first_stage_of, is_switched_off

    questions = read_parquet(paths.questions, ["id", "question", "article_ids", "split"])
    keys = keys_of(paths.keys)  # fetch.source corpus: the user's ids (None: BSARD's layout)
    reading = run_reader(keys)
    splits, split = config.splits, config.significance_split
    systems = list(config.systems)
    switched_off = [v for v in RERANKERS if v in systems and is_switched_off(paths.workspace, v)]
    for variant in switched_off:  # rerank.<variant>.enabled: false
        if variant in config.baselines:
            raise params_error(
                f"'evaluate.baselines' = {config.baselines!r} names {variant}, which 'rerank.{variant}.enabled: "
                "false' switches off (evaluate skips it); expected baselines among the systems evaluate scores"
            )
        log.warning("%s skipped: the re-ranker is switched off (rerank.%s.enabled: false)", variant, variant)
        systems.remove(variant)
    with atomic_path(paths.runs, directory=True) as runs:
        results = evaluate_systems(
            systems, questions, splits, config.k, runs, paths.workspace, device, index=config.index, keys=keys
        )
        write_split_qrels(questions, splits, runs, keys)
        _, _, qrels = split_questions(questions, split)
        split_runs = {system: reading(Path(runs) / system / f"{split}.trec") for system in results}
        # a re-ranker is also compared with the first stage it re-ranks
        firsts = {v: first_stage_of(paths.workspace, v) for v in RERANKERS if v in results}
        for variant, first in firsts.items():
            if first is not None and first not in results:
                log.warning("%s is not compared with its first stage %s: not in evaluate.systems", variant, first)
        baselines = list(dict.fromkeys([*config.baselines, *(f for f in firsts.values() if f in results)]))
        comparisons, markers, legend = significance_report(
            split_runs,
            qrels,
            baselines,
            config.significance_metrics,
            seed=seed,
        )
    for system, by_split in results.items():
        write_json(by_split, paths.metrics_dir / f"{system}.json")
    # no metrics/<system>.json of an earlier run survives (lexgraph's own: dvc.yaml declares those files)
    for system in (s.name for s in BUILTIN if s.name not in results):
        write_json(SWITCHED_OFF if system in switched_off else NOT_EVALUATED, paths.metrics_dir / f"{system}.json")
    write_json(
        {
            "split": split,
            "adjustment": "holm over every test of the split's table (p_holm; p_value raw)",
            "tests": comparisons,
        },
        paths.metrics_dir / "significance.json",
    )
    counts = dict(questions.filter(pl.col("split").is_in(splits)).group_by("split").len().iter_rows())
    write_text(
        results_markdown(results, splits, counts, {split: markers}, {split: legend}),
        paths.metrics_dir / "results.md",
    )
    write_per_query_reports(
        questions,
        paths.runs,
        list(results),
        splits,
        config.k,
        paths.metrics_dir / "per_query",
        paths.metrics_dir / "recall_curve_test.csv",
        read_run=reading,
        names=keys.questions if keys is not None else None,
    )

"""``hprior``: DSR with its article vectors propagated through the statute hierarchy.

A parameter-free baseline that neither G-DSR nor QABISAR reports, and the start of both
graph encoders (:mod:`lexgraph.graph.hierarchy` gives the propagation,
``v'_a = u_a + weight * mean(u_b : b under the heading `scope` levels above a's deepest)``).
The ``hprior`` stage chooses ``weight`` and ``scope`` on the dev split only (the test
split is refused), by ``hprior.metric`` (ties: the smaller scope, then the smaller
weight; ``weight = 0`` is DSR itself, so the prior is kept only where dev prefers it), and
writes ``models/hprior/``: ``hprior.json`` (the choice and the whole dev grid) and
``article_embeddings.safetensors`` (the propagated vectors). The system scores DSR query
embeddings against those vectors by cosine, like every dense system.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import AfterValidator, Field, field_validator

from lexgraph.core import layout
from lexgraph.core.config import refuse_held_out
from lexgraph.core.errors import DataError
from lexgraph.core.settings import Expect, Float, Int, Section, bad_value, expectation
from lexgraph.core.stage import StageContext, stage_paths
from lexgraph.data.schema import SPLITS, split_questions
from lexgraph.graph.hierarchy import HPRIOR_FORMAT, HPRIOR_SETTINGS, first_best
from lexgraph.methods.dsr.system import DSR_SECTIONS
from lexgraph.methods.system import DenseSystem
from lexgraph.metrics.ir import METRICS, dense_run_metrics, rounded_all

if TYPE_CHECKING:  # torch loads with the stage and the system, not with the catalogue
    import torch

log = logging.getLogger(__name__)

SECTION = "hprior"
SETTINGS = HPRIOR_SETTINGS


def _distinct(values: list) -> list:
    if len(set(values)) < len(values):
        raise ValueError("a value is repeated")
    return values


class HpriorConfig(Section, section=SECTION):
    """The ``hprior`` section of params.yaml."""

    weights: Annotated[
        list[Annotated[Float, Field(ge=0)]],
        Field(min_length=1),
        AfterValidator(_distinct),
        Expect("a non-empty list of distinct numbers >= 0 (0 = DSR)"),
    ]
    scopes: Annotated[
        list[Annotated[Int, Field(ge=0)]],
        Field(min_length=1),
        AfterValidator(_distinct),
        Expect("a non-empty list of distinct integers >= 0 (levels above the deepest heading)"),
    ]
    split: Annotated[Literal[SPLITS], Expect("dev (or train)")]
    metric: Literal[METRICS]

    @field_validator("split")
    @classmethod
    def _not_held_out(cls, split: str) -> str:
        refuse_held_out(SECTION, "split", split, "dev (or train)")  # its ConfigError passes through pydantic
        return split


def check_scopes(config: HpriorConfig, levels: int, graph_path) -> None:
    """Refuse a scope that cannot take effect: beyond the ``levels`` the hierarchy of the graph
    in ``graph_path`` has above an article's deepest heading, it is clamped to the same top headings
    as ``levels`` itself (known once the graph is read)."""
    if max(config.scopes) > levels:
        raise bad_value(
            SECTION,
            "scopes",
            config.scopes,
            f"{expectation(HpriorConfig.model_fields['scopes'])}, each in [0, {levels}] (the hierarchy of "
            f"{graph_path} has at most {levels} level{'s' * (levels != 1)} above an article's deepest heading)",
        )


def dev_grid(
    graph,
    article_ids: np.ndarray,
    article_vectors: torch.Tensor,
    queries: torch.Tensor,
    qids: list[int],
    qrels: dict[int, list[int]],
    config: HpriorConfig,
) -> list[dict[str, Any]]:
    """Every ``(scope, weight)`` of the grid with its metrics on the tuning split, in
    tie-breaking order (scope, then weight, ascending)."""
    from lexgraph.graph.hierarchy import hierarchy_prior

    rows = []
    for scope in sorted(config.scopes):
        for weight in sorted(config.weights):
            vectors = hierarchy_prior(graph, article_vectors, weight, scope)  # (A, dim)
            metrics = dense_run_metrics(queries, vectors, article_ids, qids, qrels)
            rows.append({"scope": scope, "weight": weight, **rounded_all(metrics)})
    return rows


@dataclass
class HpriorResult:
    scope: int
    weight: float
    article_ids: np.ndarray  # (A,)
    article_embeddings: torch.Tensor  # (A, dim)
    report: dict[str, Any]


def tune(
    graph,
    embeddings: dict[str, tuple[np.ndarray, torch.Tensor]],
    questions,
    config: HpriorConfig,
    paths: dict[str, Any],
) -> HpriorResult:
    """Choose the scope and weight on ``config.split`` and propagate the article vectors.

    ``embeddings``: ``{"articles"|"questions": (ids, (n, dim))}`` from the ``embed`` stage
    (DSR); ``paths`` name the files in errors."""
    from lexgraph.encoding.embed import select_rows
    from lexgraph.graph.hierarchy import hierarchy_prior

    qids, _, qrels = split_questions(questions, config.split)
    if not qids:
        raise DataError(
            paths["questions"],
            f"no question with split '{config.split}' to choose the prior on (params.yaml 'hprior.split')",
            column="split",
        )
    article_ids = graph.article_ids.numpy()
    vectors = select_rows(*embeddings["articles"], article_ids, paths["articles"], "article")  # (A, dim)
    queries = select_rows(
        *embeddings["questions"], np.asarray(qids, dtype=np.int64), paths["questions_embeddings"], "question"
    )  # (Q, dim)
    rows = dev_grid(graph, article_ids, vectors, queries, qids, qrels, config)
    best = first_best(rows, config.metric)
    dsr = next((r for r in rows if r["weight"] == 0), None)
    log.info(
        "hprior: scope %d, weight %g on %s (%s %.4f; DSR %s)",
        best["scope"],
        best["weight"],
        config.split,
        config.metric,
        best[config.metric],
        f"{dsr[config.metric]:.4f}" if dsr else "not in the grid",
    )
    report = {
        "format": HPRIOR_FORMAT,
        "scope": best["scope"],
        "weight": best["weight"],
        "chosen_on": config.split,
        "metric": config.metric,
        "config": config.model_dump(),
        "grid": rows,
    }
    return HpriorResult(
        best["scope"],
        best["weight"],
        article_ids,
        hierarchy_prior(graph, vectors, best["weight"], best["scope"]),
        report,
    )


def tune_metrics(report: dict[str, Any]) -> dict[str, Any]:
    """``metrics/hprior_tune.json``: the choice and the dev metrics of the chosen and of DSR."""
    chosen = next(r for r in report["grid"] if r["scope"] == report["scope"] and r["weight"] == report["weight"])
    dsr = next((r for r in report["grid"] if r["weight"] == 0), None)
    strip = ("scope", "weight")
    return {
        "scope": report["scope"],
        "weight": report["weight"],
        report["chosen_on"]: {k: v for k, v in chosen.items() if k not in strip},
        f"{report['chosen_on']}_dsr": {k: v for k, v in dsr.items() if k not in strip} if dsr else None,
    }


def save(result: HpriorResult, out_dir: str | Path) -> None:
    """Write ``out_dir`` (``hprior.json``, ``article_embeddings.safetensors``) atomically."""
    from lexgraph.core.io import atomic_path, write_json
    from lexgraph.encoding.embed import save_embeddings

    with atomic_path(out_dir, directory=True) as tmp:
        write_json(result.report, Path(tmp) / SETTINGS, ensure_ascii=True)
        save_embeddings(Path(tmp) / layout.ARTICLE_EMBEDDINGS, result.article_ids, result.article_embeddings)


def load_hprior(workspace: Path, device: str = "auto", index=None, *, corpus: Path | None = None):
    """The ``hprior`` system: DSR query encoder + the propagated article vectors (those of
    ``corpus``, an index of another corpus, when given)."""
    from lexgraph.methods.dense import load_dense

    workspace = Path(workspace)
    return load_dense(
        "hprior",
        layout.DSR.under(workspace, "query_encoder"),
        layout.HPRIOR.under(corpus or workspace, layout.ARTICLE_EMBEDDINGS),
        "hprior",
        device,
        index,
    )


HpriorPaths = stage_paths("hprior")


def run_hprior(paths: HpriorPaths, config: HpriorConfig, context: StageContext) -> None:
    """The ``hprior`` stage: the weight and scope chosen on dev -> ``paths.out``, the report ->
    ``paths.metrics``."""
    from lexgraph.core.io import read_parquet, write_json
    from lexgraph.encoding.embed import load_embeddings
    from lexgraph.graph.build import load_graph
    from lexgraph.graph.hierarchy import levels_above

    graph = load_graph(paths.graph)
    check_scopes(config, levels_above(graph), paths.graph)
    inputs = {
        "articles": paths.embed / "articles.safetensors",
        "questions_embeddings": paths.embed / "questions.safetensors",
        "questions": paths.questions,
    }
    embeddings = {
        "articles": load_embeddings(inputs["articles"]),
        "questions": load_embeddings(inputs["questions_embeddings"]),
    }
    questions = read_parquet(paths.questions, ["id", "question", "article_ids", "split"])
    result = tune(graph, embeddings, questions, config, inputs)
    save(result, paths.out)
    write_json(tune_metrics(result.report), paths.metrics)


def hprior_vectors(workspace: str | Path, graph, ids: np.ndarray, vectors: torch.Tensor) -> torch.Tensor:
    """``(A, dim)`` hprior vectors of the graph's articles (in its order): the DSR vectors
    ``(ids, vectors)`` propagated with the weight and scope of the workspace's ``hprior`` (for a
    corpus of one's own, :mod:`lexgraph.methods.gnn.inductive`'s graph of it)."""
    from lexgraph.encoding.embed import select_rows
    from lexgraph.graph.hierarchy import hierarchy_prior, read_hprior

    report = read_hprior(layout.HPRIOR.under(workspace))
    ordered = graph.article_ids.numpy()
    u = select_rows(np.asarray(ids, dtype=np.int64), vectors, ordered, "the DSR article vectors", "article").float()
    # a shallower corpus: scope_headings stops at each article's top heading
    return hierarchy_prior(graph, u, float(report["weight"]), int(report["scope"]))


def index_side(job) -> None:
    """``lexgraph index``: DSR's vectors of the corpus propagated through the corpus's own hierarchy."""
    vectors = hprior_vectors(job.workspace, job.graph(), *job.embeddings(layout.DSR)["articles"])  # (A, dim)
    job.save_graph_vectors(SECTION, layout.HPRIOR, vectors)


SYSTEM = DenseSystem(
    name="hprior",
    summary="lexgraph's hierarchy prior: DSR's article vectors propagated through the statute hierarchy",
    load=load_hprior,
    reads=(layout.HPRIOR, layout.DSR),
    sections=(*DSR_SECTIONS, SECTION),
    article_side="DSR's article vectors propagated through the statute hierarchy (the `hprior` stage's "
    "weight and scope, chosen on dev)",
    index_models=(layout.DSR.posix(), layout.HPRIOR.posix(SETTINGS)),
    index=index_side,
)

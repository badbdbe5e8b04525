"""The hierarchy prior: article vectors propagated through the statute hierarchy, without training.

Articles that sit under one heading answer the same questions far more often than
chance: on the sample, 78-82 % of a multi-gold question's gold articles share their
deepest heading. The prior moves each article towards the articles it is filed with::

    u_a     = v_a / ||v_a||                                  (the DSR article vector, normalised)
    m_h     = mean(u_b : b in the subtree of heading h)     (every article under h, at any depth)
    v'_a    = u_a + weight * m_{h_s(a)}

``h_0(a)`` is the article's deepest heading and ``h_s(a)`` the heading ``s`` levels above
it (the ``scope``; clamped at the top of the hierarchy). An article under no heading
keeps ``u_a``. ``weight = 0`` is DSR itself. Scores are cosine similarities, so only the
direction of ``v'_a`` matters.

The same means are the heading features of the graph encoders
(``gnn.heading_features: articles``): a GNN whose heading -> article messages start as
``weight * I`` (:mod:`lexgraph.methods.gnn.model`, ``gnn.init: prior``) then computes exactly
``v'_a`` before any training (``scope`` 0), so training starts from the prior.

Node order follows :mod:`lexgraph.graph.build`: articles ``0..A-1``, then headings; only the
forward structure edges (heading -> subheading, heading -> article) are read, so a
directed or an undirected graph gives the same result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lexgraph.core.errors import DataError
from lexgraph.core.inputs import finite_number, read_json_object
from lexgraph.graph.build import EdgeType, NodeType

if TYPE_CHECKING:  # torch loads with the prior's computation, not with its settings file's names
    import torch

#: the ``hprior`` stage's report (``models/hprior/hprior.json``)
HPRIOR_FORMAT = "lexgraph-hprior/1"
HPRIOR_SETTINGS = "hprior.json"


def hierarchy_links(graph) -> tuple[torch.Tensor, torch.Tensor]:
    """``(article_heading (A,), heading_parent (H,))``: each article's deepest heading and
    each heading's parent, as heading rows ``0..H-1`` (``-1``: none)."""
    import torch

    n_a = int((graph.node_type == NodeType.ARTICLE).sum())
    n_h = int((graph.node_type == NodeType.HEADING).sum())
    src, dst = graph.edge_index  # (E,), (E,)
    article_heading = torch.full((n_a,), -1, dtype=torch.long)  # (A,)
    sel = graph.edge_type == EdgeType.HEADING_ARTICLE
    article_heading[dst[sel]] = src[sel] - n_a
    heading_parent = torch.full((n_h,), -1, dtype=torch.long)  # (H,)
    sel = graph.edge_type == EdgeType.HEADING_SUBHEADING
    heading_parent[dst[sel] - n_a] = src[sel] - n_a
    return article_heading, heading_parent


def levels_above(graph) -> int:
    """The most levels any article's deepest heading has above it: the largest ``scope`` that
    still reaches a heading of its own (a larger one is clamped to the same top headings)."""
    article_heading, heading_parent = hierarchy_links(graph)
    cur, levels = article_heading[article_heading >= 0], 0  # (A',)
    for _ in range(heading_parent.numel()):  # a path is never longer than the number of headings
        cur = heading_parent[cur]
        cur = cur[cur >= 0]
        if not cur.numel():
            break
        levels += 1
    return levels


def subtree_means(graph, article_vectors: torch.Tensor) -> torch.Tensor:
    """``(H, dim)``: the mean of the normalised vectors of every article under each heading
    (its subtree, all depths); a heading with no article below it gets zeros."""
    import torch
    import torch.nn.functional as F

    article_heading, heading_parent = hierarchy_links(graph)
    u = F.normalize(article_vectors.float(), dim=-1)  # (A, dim)
    sums = torch.zeros(heading_parent.numel(), u.size(1))  # (H, dim)
    counts = torch.zeros(heading_parent.numel())  # (H,)
    rows, cur = torch.arange(u.size(0)), article_heading.clone()  # walk every article up to the root
    for _ in range(heading_parent.numel() + 1):  # a path is never longer than the number of headings
        live = cur >= 0
        if not live.any():
            break
        rows, cur = rows[live], cur[live]
        sums.index_add_(0, cur, u[rows])
        counts.index_add_(0, cur, torch.ones(cur.numel()))
        cur = heading_parent[cur]
    else:
        raise ValueError("the heading hierarchy has a cycle")
    return sums / counts.clamp(min=1).unsqueeze(1)  # (H, dim)


def scope_headings(graph, scope: int) -> torch.Tensor:
    """``(A,)`` the heading ``scope`` levels above each article's deepest heading (clamped
    at the top; ``-1`` for an article under no heading)."""
    import torch

    article_heading, heading_parent = hierarchy_links(graph)
    target = article_heading.clone()
    for _ in range(scope):
        has = target >= 0
        parent = torch.full_like(target, -1)
        parent[has] = heading_parent[target[has]]
        target = torch.where(parent >= 0, parent, target)
    return target


def hierarchy_prior(graph, article_vectors: torch.Tensor, weight: float, scope: int = 0) -> torch.Tensor:
    """``(A, dim)`` article vectors ``u_a + weight * m_{h_scope(a)}`` (module docstring)."""
    import torch.nn.functional as F

    if scope < 0:
        raise ValueError(f"scope must be >= 0, got {scope}")
    u = F.normalize(article_vectors.float(), dim=-1)  # (A, dim)
    if weight == 0:
        return u
    means = subtree_means(graph, article_vectors)  # (H, dim)
    target = scope_headings(graph, scope)  # (A,)
    out = u.clone()
    has = target >= 0
    out[has] += weight * means[target[has]]
    return out


def read_hprior(model_dir: str | Path) -> dict[str, Any]:
    """The ``hprior`` stage's report in ``model_dir``: a missing, truncated or wrong-shaped
    file (the format, the metric, a grid of ``{scope, weight, <metric>}`` rows) is a
    DataError naming it."""
    path = Path(model_dir) / HPRIOR_SETTINGS
    fix = "rerun `dvc repro hprior`"
    what = f"the hprior stage's {HPRIOR_FORMAT} report"
    report = read_json_object(
        path,
        what=what,
        fix=fix,
        keys={
            "format": (lambda v: v == HPRIOR_FORMAT, repr(HPRIOR_FORMAT)),
            "metric": (lambda v: isinstance(v, str) and bool(v), "a metric name"),
            "grid": (lambda v: isinstance(v, list) and bool(v), "a non-empty list of rows"),
        },
    )
    metric = report["metric"]
    for n, row in enumerate(report["grid"]):
        ok = (
            isinstance(row, dict)
            and isinstance(row.get("scope"), int)
            and not isinstance(row["scope"], bool)
            and finite_number(row.get("weight"))
            and finite_number(row.get(metric))
            and row["scope"] >= 0  # hprior.scopes' and hprior.weights' domain in params.yaml
            and row["weight"] >= 0
        )
        if not ok:
            raise DataError(
                path,
                f"key 'grid.{n}' = {json.dumps(row)[:60]}, not a row with an integer 'scope' >= 0, a "
                f"number 'weight' >= 0 and a number '{metric}'; expected {what}; {fix}",
            )
    return report


def first_best(rows: list[dict[str, Any]], metric: str) -> dict[str, Any]:
    """The first of ``rows`` with the best ``metric`` (a grid in tie-breaking order)."""
    top = max(r[metric] for r in rows)
    return next(r for r in rows if r[metric] == top)


def best_weight(report: dict[str, Any], scope: int = 0) -> float:
    """The weight with the best dev metric among the report's rows at ``scope`` (its grid
    is in tie-breaking order: the first best wins); 0 (DSR) when dev prefers it."""
    rows = [r for r in report["grid"] if r["scope"] == scope]
    return float(first_best(rows, report["metric"])["weight"]) if rows else 0.0

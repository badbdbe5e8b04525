"""The legislative graph: articles, headings and training questions as one typed graph.

Nodes (ids are contiguous and deterministic)::

    0 .. A-1            articles, sorted by article id
    A .. A+H-1          headings, sorted by heading_id (one per unique full path)
    A+H .. A+H+Q-1      **train** questions, sorted by question id (``graph.questions``)

Dev, test and synthetic questions never become nodes: at test time a question is
unseen, so the graph may only carry what training is allowed to see.

Edges follow PyG's convention, ``edge_index[0]`` = source, ``edge_index[1]`` = target,
messages flow source -> target. Each edge carries an :class:`EdgeType`:

=====  ======================  =====================================================
type   name                    meaning
=====  ======================  =====================================================
0      HEADING_SUBHEADING      parent heading -> child heading (``parent_id``)
1      HEADING_ARTICLE         deepest heading of an article -> the article
2      QUESTION_ARTICLE        train question -> each of its gold articles
3      ARTICLE_NEXT            article -> next article (by id) under the same heading
                               (only with ``graph.consecutive``)
4-7    reverse of 0-3          added when ``graph.directed`` is false; the
                               question-article edges (2 and 6) always go
                               both ways: a question node must hear its articles
=====  ======================  =====================================================

The enum is fixed (8 types whatever the configuration), so edge-type embeddings keep
their shape when the graph options change. Missing hierarchy levels need no special
case: ``headings.parquet`` already links each heading to its nearest existing parent
and each article to its deepest existing heading. Articles with ``heading_id == -1``
hang under no heading; they get no structural edges (and no consecutive edges, as
they share no heading).

Edges are sorted by (type, source, target); the saved file is byte-identical for equal
inputs. ``graph.pt`` holds a plain dict of tensors (loadable with
``torch.load(weights_only=True)``); :func:`load_graph` turns it into a PyG ``Data``.
"""

from __future__ import annotations

import enum
import io
import logging
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from lexgraph.core.errors import DataError
from lexgraph.core.settings import Bool, Section
from lexgraph.core.stage import StageContext, stage_paths

log = logging.getLogger(__name__)

GRAPH_FORMAT = "lexgraph-graph/1"


class NodeType(enum.IntEnum):
    ARTICLE = 0
    HEADING = 1
    QUESTION = 2


class EdgeType(enum.IntEnum):
    HEADING_SUBHEADING = 0
    HEADING_ARTICLE = 1
    QUESTION_ARTICLE = 2
    ARTICLE_NEXT = 3
    SUBHEADING_HEADING = 4
    ARTICLE_HEADING = 5
    ARTICLE_QUESTION = 6
    NEXT_ARTICLE = 7


NUM_EDGE_TYPES = len(EdgeType)
#: forward type -> its reverse type
REVERSE: dict[EdgeType, EdgeType] = {
    EdgeType.HEADING_SUBHEADING: EdgeType.SUBHEADING_HEADING,
    EdgeType.HEADING_ARTICLE: EdgeType.ARTICLE_HEADING,
    EdgeType.QUESTION_ARTICLE: EdgeType.ARTICLE_QUESTION,
    EdgeType.ARTICLE_NEXT: EdgeType.NEXT_ARTICLE,
}
#: question-article (bipartite) edge types, both directions
BIPARTITE_TYPES = (EdgeType.QUESTION_ARTICLE, EdgeType.ARTICLE_QUESTION)
#: statute-structure edge types (hierarchy and consecutive articles), both directions
STRUCTURE_TYPES = tuple(t for t in EdgeType if t not in BIPARTITE_TYPES)


class GraphConfig(Section, section="graph"):
    """The ``graph`` section of params.yaml."""

    directed: Bool = Field(description="true: statute edges point down (G-DSR's DAG); false: reverse types too")
    consecutive: Bool = Field(description="article -> next article under the same heading")
    questions: Bool = Field(description="train questions as nodes, linked to their gold articles")


# ---------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------


def _ids(df, column: str, path) -> np.ndarray:
    values = df[column].to_numpy()
    if df[column].null_count():
        raise DataError(path, f"{df[column].null_count()} missing value(s), expected integer ids", column=column)
    values = values.astype(np.int64)
    uniq, counts = np.unique(values, return_counts=True)
    if (counts > 1).any():
        dup = int(uniq[counts > 1][0])
        raise DataError(path, f"duplicate id {dup}, expected unique ids", column=column)
    return values


def _lookup(
    sorted_ids: np.ndarray,
    offset: int,
    values: np.ndarray,
    owners: np.ndarray,
    path,
    column: str,
    what: str,
    owner: str,
) -> np.ndarray:
    """Node index of each id in ``values`` (``sorted_ids`` sorted); a DataError names the
    first unknown value and the record (``owner`` with id ``owners[i]``) that cites it."""
    pos = np.searchsorted(sorted_ids, values)
    if not len(sorted_ids):
        ok = np.zeros(len(values), dtype=bool)
    else:
        ok = (pos < len(sorted_ids)) & (sorted_ids[np.minimum(pos, len(sorted_ids) - 1)] == values)
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise DataError(path, f"{owner} {int(owners[i])} refers to unknown {what} {int(values[i])}", column=column)
    return pos + offset


EdgeBlock = tuple[np.ndarray, np.ndarray, EdgeType]  # (source nodes, target nodes, their type)


def build_graph(
    articles,
    headings,
    questions,
    config: GraphConfig,
    paths: tuple = ("articles.parquet", "headings.parquet", "questions.parquet"),
):
    """Build the graph from the cleaned tables (polars DataFrames).

    Returns ``(data, nodes)``: a PyG ``Data`` (``edge_index`` (2, E), ``edge_type`` (E,),
    ``node_type`` (N,), ``article_ids`` (A,), ``heading_ids`` (H,), ``question_ids``
    (Q,), all int64) and the node table (``node_id``, ``type``, ``source_id``, ``text``).
    """
    a_path, h_path, q_path = paths
    if len(articles) == 0:
        raise DataError(
            a_path,
            "no articles, so the graph would be empty; expected at least one article "
            "(rerun clean, lowering 'clean.min_words' in params.yaml if it dropped them all)",
        )
    import polars as pl

    articles = articles.sort("id")
    headings = headings.sort("heading_id")
    article_ids = _ids(articles, "id", a_path)
    heading_ids = _ids(headings, "heading_id", h_path)
    train = questions.filter(pl.col("split") == "train").sort("id") if config.questions else questions.clear()
    question_ids = _ids(train, "id", q_path)

    blocks = _statute_edges(articles, headings, article_ids, heading_ids, config, a_path, h_path)
    if len(question_ids):
        blocks.append(_question_edges(train, question_ids, article_ids, len(article_ids) + len(heading_ids), q_path))
    blocks += [
        (dst, src, REVERSE[etype])
        for src, dst, etype in list(blocks)
        if not config.directed or etype == EdgeType.QUESTION_ARTICLE
    ]
    data = _graph_data(blocks, article_ids, heading_ids, question_ids)
    nodes = _node_table(articles, headings, train, article_ids, heading_ids, question_ids)
    log.info(
        "graph: %d articles, %d headings, %d train questions, %d edges",
        len(article_ids),
        len(heading_ids),
        len(question_ids),
        data.edge_index.size(1),
    )
    return data, nodes


def _statute_edges(
    articles, headings, article_ids: np.ndarray, heading_ids: np.ndarray, config: GraphConfig, a_path, h_path
) -> list[EdgeBlock]:
    """The forward edges of the statute: heading -> subheading, heading -> article and, with
    ``config.consecutive``, article -> next article under the same heading (articles and
    headings sorted by id; heading nodes follow the articles)."""
    h_off = len(article_ids)
    blocks: list[EdgeBlock] = []

    # heading -> subheading
    parents = headings["parent_id"].fill_null(-1).to_numpy().astype(np.int64)
    has_parent = parents != -1
    src = _lookup(
        heading_ids,
        h_off,
        parents[has_parent],
        heading_ids[has_parent],
        h_path,
        "parent_id",
        "parent heading_id",
        "heading",
    )
    blocks.append((src, np.flatnonzero(has_parent) + h_off, EdgeType.HEADING_SUBHEADING))

    # heading -> article
    art_heading = articles["heading_id"].fill_null(-1).to_numpy().astype(np.int64)
    under = art_heading != -1
    src = _lookup(
        heading_ids, h_off, art_heading[under], article_ids[under], a_path, "heading_id", "heading_id", "article"
    )
    blocks.append((src, np.flatnonzero(under), EdgeType.HEADING_ARTICLE))

    # article -> next article under the same heading (articles are sorted by id)
    if config.consecutive:
        idx = np.flatnonzero(under)
        order = idx[np.argsort(art_heading[idx], kind="stable")]
        same = art_heading[order[:-1]] == art_heading[order[1:]]
        blocks.append((order[:-1][same], order[1:][same], EdgeType.ARTICLE_NEXT))
    return blocks


def _question_edges(train, question_ids: np.ndarray, article_ids: np.ndarray, q_off: int, q_path) -> EdgeBlock:
    """Train question -> gold article edges (question nodes start at ``q_off``); a gold
    article listed twice is one edge; an unknown article id is an error."""
    gold = train["article_ids"].to_list()
    q_rows = np.repeat(np.arange(len(question_ids)), [len(g or []) for g in gold])
    flat = np.asarray([a for g in gold for a in (g or [])], dtype=np.int64)
    known = np.isin(flat, article_ids)
    if not known.all():
        bad = int(np.flatnonzero(~known)[0])
        raise DataError(
            q_path,
            f"question {int(question_ids[q_rows[bad]])} cites unknown article id {int(flat[bad])}",
            column="article_ids",
        )
    dst = np.searchsorted(article_ids, flat)
    pairs = np.unique(np.stack([q_rows + q_off, dst]), axis=1)  # a gold listed twice is one edge
    return pairs[0], pairs[1], EdgeType.QUESTION_ARTICLE


def _graph_data(blocks: list[EdgeBlock], article_ids: np.ndarray, heading_ids: np.ndarray, question_ids: np.ndarray):
    """The PyG ``Data`` of ``blocks``: edges sorted by type, then source, then target; nodes
    are the articles, then the headings, then the questions."""
    import torch
    from torch_geometric.data import Data

    n_a, n_h, n_q = len(article_ids), len(heading_ids), len(question_ids)
    src = np.concatenate([b[0] for b in blocks]).astype(np.int64)
    dst = np.concatenate([b[1] for b in blocks]).astype(np.int64)
    etype = np.concatenate([np.full(len(b[0]), int(b[2]), dtype=np.int64) for b in blocks])
    order = np.lexsort((dst, src, etype))  # sort by type, then source, then target

    node_type = np.concatenate(
        [np.full(n_a, NodeType.ARTICLE), np.full(n_h, NodeType.HEADING), np.full(n_q, NodeType.QUESTION)]
    ).astype(np.int64)
    return Data(
        edge_index=torch.from_numpy(np.stack([src[order], dst[order]])),  # (2, E)
        edge_type=torch.from_numpy(etype[order]),  # (E,)
        node_type=torch.from_numpy(node_type),  # (N,)
        article_ids=torch.from_numpy(article_ids),  # (A,)
        heading_ids=torch.from_numpy(heading_ids),  # (H,)
        question_ids=torch.from_numpy(question_ids),  # (Q,)
        num_nodes=n_a + n_h + n_q,
    )


def _node_table(articles, headings, train, article_ids: np.ndarray, heading_ids: np.ndarray, question_ids: np.ndarray):
    """The node table (``node_id``, ``type``, ``source_id``, ``text``) in node order; a
    heading's text is its title, else its label."""
    import polars as pl

    n_a, n_h, n_q = len(article_ids), len(heading_ids), len(question_ids)
    heading_text = [
        (text if text else label) or "" for text, label in zip(headings["text"].to_list(), headings["label"].to_list())
    ]
    return pl.DataFrame(
        {
            "node_id": np.arange(n_a + n_h + n_q, dtype=np.int64),
            "type": ["article"] * n_a + ["heading"] * n_h + ["question"] * n_q,
            "source_id": np.concatenate([article_ids, heading_ids, question_ids]).astype(np.int64),
            "text": [t or "" for t in articles["article"].to_list()] + heading_text + train["question"].to_list(),
        },
        schema={"node_id": pl.Int64, "type": pl.Utf8, "source_id": pl.Int64, "text": pl.Utf8},
    )


# ---------------------------------------------------------------------------
# Saving, loading, statistics
# ---------------------------------------------------------------------------

_TENSORS = ("edge_index", "edge_type", "node_type", "article_ids", "heading_ids", "question_ids")


def graph_bytes(data, config: GraphConfig | None = None) -> bytes:
    """Serialise ``data`` deterministically (torch.save of a plain dict into memory)."""
    import torch

    payload = {"format": GRAPH_FORMAT, "num_nodes": int(data.num_nodes)}
    payload.update({key: getattr(data, key).contiguous() for key in _TENSORS})
    if config is not None:
        payload["config"] = config.model_dump()
    buffer = io.BytesIO()  # a file name would end up inside the zip archive
    torch.save(payload, buffer)
    return buffer.getvalue()


def save_graph(data, nodes, out_dir: str | Path, config: GraphConfig | None = None) -> None:
    """Write ``out_dir/graph.pt`` and ``out_dir/nodes.parquet`` atomically (the whole dir)."""
    from lexgraph.core.io import atomic_path

    with atomic_path(out_dir, directory=True) as tmp:
        (tmp / "graph.pt").write_bytes(graph_bytes(data, config))
        nodes.write_parquet(tmp / "nodes.parquet", compression="zstd", statistics=False)


def load_graph(path: str | Path):
    """Load ``graph.pt`` (or a directory holding it) as a PyG ``Data``."""
    import torch
    from torch_geometric.data import Data

    path = Path(path)
    if path.is_dir():
        path = path / "graph.pt"
    if not path.is_file():
        raise DataError(path, "file not found (run the build_graph stage)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any reader failure is a bad file for the user
        raise DataError(path, f"not a readable graph file ({type(exc).__name__}: {exc})") from exc
    if not isinstance(payload, dict) or payload.get("format") != GRAPH_FORMAT:
        raise DataError(path, f"not a {GRAPH_FORMAT} file (rebuild it with the build_graph stage)")
    return Data(num_nodes=payload["num_nodes"], **{key: payload[key] for key in _TENSORS})


def graph_stats(data) -> dict[str, Any]:
    """Node and edge counts by type (for ``metrics/graph.json``)."""
    import torch

    node_counts = torch.bincount(data.node_type, minlength=len(NodeType)).tolist()
    edge_counts = torch.bincount(data.edge_type, minlength=NUM_EDGE_TYPES).tolist()
    nodes = {t.name.lower(): int(node_counts[t]) for t in NodeType}
    edges = {t.name.lower(): int(edge_counts[t]) for t in EdgeType}
    return {
        "nodes": {**nodes, "total": int(data.num_nodes)},
        "edges": {**edges, "total": int(data.edge_index.size(1))},
    }


def restrict_graph(data, *, headings: bool = True, questions: bool = True, consecutive: bool = True):
    """A copy of ``data`` without heading nodes and/or question nodes (and their edges).

    Nodes keep their relative order (articles, then headings, then questions) and are
    relabelled contiguously; the id maps follow. ``consecutive=False`` also drops the
    article -> next article edges. Used by training variants and ablations.
    """
    import torch
    from torch_geometric.data import Data
    from torch_geometric.utils import subgraph

    keep = torch.ones(data.num_nodes, dtype=torch.bool)
    if not headings:
        keep &= data.node_type != NodeType.HEADING
    if not questions:
        keep &= data.node_type != NodeType.QUESTION
    edge_keep = torch.ones(data.edge_type.numel(), dtype=torch.bool)
    if not consecutive:
        edge_keep &= (data.edge_type != EdgeType.ARTICLE_NEXT) & (data.edge_type != EdgeType.NEXT_ARTICLE)
    edge_index, edge_type = subgraph(
        keep, data.edge_index[:, edge_keep], data.edge_type[edge_keep], relabel_nodes=True, num_nodes=data.num_nodes
    )
    return Data(
        edge_index=edge_index,
        edge_type=edge_type,
        node_type=data.node_type[keep],
        article_ids=data.article_ids,
        heading_ids=data.heading_ids if headings else data.heading_ids[:0],
        question_ids=data.question_ids if questions else data.question_ids[:0],
        num_nodes=int(keep.sum()),
    )


GraphPaths = stage_paths("build_graph")


def run_build_graph(paths: GraphPaths, config: GraphConfig, context: StageContext) -> None:
    """The ``build_graph`` stage: the graph -> ``paths.out``, its counts -> ``paths.metrics``."""
    from lexgraph.core.io import read_parquet, write_json

    articles = read_parquet(paths.articles, ["id", "article", "heading_id"])
    headings = read_parquet(paths.headings, ["heading_id", "parent_id", "label", "text"])
    questions = read_parquet(paths.questions, ["id", "question", "article_ids", "split"])
    data, nodes = build_graph(
        articles, headings, questions, config, paths=(paths.articles, paths.headings, paths.questions)
    )
    save_graph(data, nodes, paths.out, config)
    write_json(graph_stats(data), paths.metrics)

"""Training inputs of the graph encoders: node features, (question, gold article) pairs,
BM25 negatives, and each batch's subgraph with QABISAR's label-leak cut
(:mod:`lexgraph.methods.gnn.train` explains both)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lexgraph.core.errors import ConfigError, DataError
from lexgraph.encoding.embed import select_rows
from lexgraph.graph.build import BIPARTITE_TYPES, NodeType, restrict_graph
from lexgraph.graph.hierarchy import subtree_means
from lexgraph.methods.gnn.config import GNNSettings

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------
# Training inputs
# ---------------------------------------------------------------------------


@dataclass
class TrainingSet:
    """Everything a training run reads. Only train questions appear outside ``dev_*``."""

    graph: Any  # PyG Data restricted to the variant (articles first, node order kept)
    x: torch.Tensor  # (nodes, dim) node features
    train_ids: np.ndarray  # (Q,) train question ids, row order
    train_texts: list[str]
    train_queries: torch.Tensor  # (Q, dim) fixed DSR embeddings of the train questions
    question_nodes: torch.Tensor  # (Q,) node of each train question, -1 when not in the graph
    gold: list[set[int]]  # gold article ids of each train question row
    pairs: torch.Tensor  # (P, 2) (question row, gold article node)
    negatives: list[torch.Tensor]  # per question row: BM25 negative article nodes
    dev_ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    dev_texts: list[str] = field(default_factory=list)
    dev_queries: torch.Tensor | None = None  # (D, dim) DSR embeddings of the dev questions
    dev_qrels: dict[int, set[int]] = field(default_factory=dict)
    synthetic_pairs: int = 0  # pairs of synthetic queries (the last rows), G-DSR's augmentation

    @property
    def article_ids(self) -> np.ndarray:
        return self.graph.article_ids.numpy()

    @property
    def num_articles(self) -> int:
        return int(self.graph.article_ids.numel())


def variant_graph(graph, settings: GNNSettings):
    """The graph a variant trains on: gdsr/hgraph have no question nodes; the question
    variants' ablations drop parts."""
    if not settings.uses_questions:
        return restrict_graph(graph, questions=False)
    if graph.question_ids.numel() == 0:
        raise ConfigError(
            f"{settings.variant} needs train-question nodes but the graph has none: set graph.questions: true "
            "(and check that questions.parquet has a train split)"
        )
    graph = restrict_graph(graph, headings=settings.structure, consecutive=settings.structure)
    if not settings.bipartite:  # question nodes stay, isolated: the teacher sees only its own text
        keep = ~torch.isin(graph.edge_type, torch.tensor([int(t) for t in BIPARTITE_TYPES]))
        graph.edge_index, graph.edge_type = graph.edge_index[:, keep], graph.edge_type[keep]
    return graph


def prepare_training_set(
    graph,
    questions,
    negatives,
    embeddings: dict[str, tuple[np.ndarray, torch.Tensor]],
    settings: GNNSettings,
    paths: dict[str, Any] | None = None,
    train_splits: tuple[str, ...] = ("train",),
    synthetic=None,
) -> TrainingSet:
    """Assemble a :class:`TrainingSet`.

    Args:
        graph: the full graph of ``build_graph`` (``lexgraph.graph.build.load_graph``).
        questions: polars DataFrame (``id``, ``question``, ``article_ids``, ``split``);
            only ``train`` rows are used for training, ``dev`` rows for model selection;
            every other split is dropped here.
        negatives: polars DataFrame (``question_id``, ``split``, ``negative_ids``) or None;
            only the rows of the splits trained on are read.
        embeddings: ``{"articles"|"headings"|"questions"[|"synthetic"]: (ids, (n, dim) embeddings)}``.
        paths: file names for error messages: ``questions``, ``negatives``, ``graph``,
            ``synthetic`` and ``<name>_embeddings``.
        synthetic: with ``settings.synthetic``, the synthetic queries (the questions' columns,
            split ``synthetic``, one gold article each): trained on after the train questions,
            each with the DSR's vector of its text and its BM25 negatives (G-DSR's augmented
            set, as maastrichtlawtech/gdsr ``src/data/bsard_module.py`` trains every module on it).
    """
    names = ("articles", "headings", "questions", "synthetic")
    paths = {
        "questions": "questions.parquet",
        "negatives": "negatives.parquet",
        "graph": "graph.pt",
        "synthetic": "synthetic.parquet",
        **{f"{name}_embeddings": f"{name}.safetensors" for name in names},
        **(paths or {}),
    }
    graph = variant_graph(graph, settings)
    train, dev = split_questions(questions, train_splits, paths["questions"])
    human = train.height
    if settings.synthetic:
        train = with_synthetic(train, synthetic, paths["synthetic"])
        train_splits = (*train_splits, "synthetic")
        embeddings = {**embeddings, "questions": stacked(embeddings["questions"], embeddings["synthetic"])}
    x = node_features(graph, embeddings, settings, paths)
    train_ids = train["id"].to_numpy().astype(np.int64)
    article_ids = graph.article_ids.numpy()
    gold = [set(int(a) for a in (g or [])) for g in train["article_ids"].to_list()]
    pairs = gold_pairs(train_ids, gold, article_ids, paths["questions"])
    q_nodes = question_nodes(graph, train_ids, paths["graph"])
    negs = negative_nodes(negatives, train_ids, gold, article_ids, train_splits)
    check_dev_negatives(negs, train_ids, train["split"].to_list(), settings, paths["negatives"])
    warn_missing_negatives(negs, settings, train_splits)

    q_ids, q_emb = embeddings["questions"]
    dev_ids = dev["id"].to_numpy().astype(np.int64)
    dev_queries = None
    if len(dev_ids):
        dev_queries = select_rows(q_ids, q_emb, dev_ids, paths["questions_embeddings"], "question").float()
    return TrainingSet(
        graph=graph,
        x=x,
        train_ids=train_ids,
        train_texts=train["question"].to_list(),
        train_queries=select_rows(q_ids, q_emb, train_ids, paths["questions_embeddings"], "question").float(),
        question_nodes=q_nodes,
        gold=gold,
        pairs=pairs,
        negatives=negs,
        dev_ids=dev_ids,
        dev_texts=dev["question"].to_list(),
        dev_queries=dev_queries,
        dev_qrels={int(q): set(int(a) for a in g) for q, g in zip(dev_ids, dev["article_ids"].to_list())},
        synthetic_pairs=int((pairs[:, 0] >= human).sum()),
    )


def with_synthetic(train, synthetic, path: Any):
    """``train`` followed by the synthetic queries (ids after every human id, as
    ``generate_queries`` numbers them); an error when there are none to add."""
    import polars as pl

    if synthetic is None or synthetic.height == 0:
        raise DataError(path, "no synthetic query to train on (see queries.generator and queries.per_article)")
    return pl.concat([train, synthetic.select(train.columns).cast(train.schema)])


def stacked(*tables: tuple[np.ndarray, torch.Tensor]) -> tuple[np.ndarray, torch.Tensor]:
    """One ``(ids, embeddings)`` table of several (disjoint ids)."""
    return np.concatenate([ids for ids, _ in tables]), torch.cat([emb for _, emb in tables])


def split_questions(questions, train_splits: tuple[str, ...], path: Any):
    """``(train, dev)`` polars frames sorted by id: the rows of ``train_splits``, and the dev
    rows kept apart for model selection (none when dev is trained on); an error when no
    question is left to train on."""
    import polars as pl

    questions = questions.filter(pl.col("split").is_in(["train", "dev"]))
    train = questions.filter(pl.col("split").is_in(list(train_splits))).sort("id")
    dev = questions.filter(pl.col("split") == "dev").sort("id") if "dev" not in train_splits else questions.clear()
    if train.height == 0:
        raise DataError(path, "no question with split 'train'", column="split")
    return train, dev


def node_features(
    graph, embeddings: dict[str, tuple[np.ndarray, torch.Tensor]], settings: GNNSettings, paths: dict[str, Any]
) -> torch.Tensor:
    """``(nodes, dim)`` features in the graph's node order: articles, then headings (the mean
    of their articles' unit vectors, or their own text's vectors), then questions."""
    # L2-normalised inputs (normalize_features, lexgraph's), or the encoder's own vectors (the papers')
    unit = partial(F.normalize, dim=-1) if settings.normalize_features else (lambda v: v)

    def rows(name: str, ids: torch.Tensor, kind: str) -> torch.Tensor:
        table_ids, table = embeddings[name]
        return unit(select_rows(table_ids, table, ids.numpy(), paths[f"{name}_embeddings"], kind).float())

    articles = rows("articles", graph.article_ids, "article")
    blocks = [articles]  # (A, dim)
    if graph.heading_ids.numel():
        if settings.heading_features == "articles":  # the mean of the (unit) articles under each heading
            blocks.append(subtree_means(graph, articles))  # (H, dim)
        else:
            blocks.append(rows("headings", graph.heading_ids, "heading"))
    if graph.question_ids.numel():
        blocks.append(rows("questions", graph.question_ids, "question"))
    x = torch.cat(blocks)  # (nodes, dim)
    if x.size(0) != graph.num_nodes:
        raise DataError(paths["graph"], f"{graph.num_nodes} nodes but {x.size(0)} feature rows")
    return x


def gold_pairs(train_ids: np.ndarray, gold: list[set[int]], article_ids: np.ndarray, path: Any) -> torch.Tensor:
    """``(P, 2)`` (question row, gold article node), rows in order and each row's articles
    ascending; an error names a cited article that is not in the graph."""
    rows, nodes = [], []
    for r, (qid, g) in enumerate(zip(train_ids, gold)):
        for a in sorted(g):
            pos = int(np.searchsorted(article_ids, a))
            if pos >= len(article_ids) or article_ids[pos] != a:
                raise DataError(path, f"question {qid} cites article {a}, not in the graph", column="article_ids")
            rows.append(r)
            nodes.append(pos)
    if not rows:
        raise DataError(path, "the train questions cite no article", column="article_ids")
    return torch.tensor([rows, nodes], dtype=torch.long).T.contiguous()  # (P, 2)


def question_nodes(graph, train_ids: np.ndarray, path: Any) -> torch.Tensor:
    """``(Q,)`` the graph node of each train question, -1 for all when the graph has no
    question nodes; an error when it has some but not one of these questions."""
    if not graph.question_ids.numel():
        return torch.full((len(train_ids),), -1, dtype=torch.long)
    first_q = int((graph.node_type != NodeType.QUESTION).sum())
    graph_q = graph.question_ids.numpy()
    pos = np.searchsorted(graph_q, train_ids)
    ok = (pos < len(graph_q)) & (graph_q[np.minimum(pos, len(graph_q) - 1)] == train_ids)
    if not ok.all():
        raise DataError(
            path, f"train question {int(train_ids[~ok][0])} has no node (rebuild the graph from the same questions)"
        )
    return torch.from_numpy(pos + first_q).long()


def negative_nodes(
    negatives, train_ids: np.ndarray, gold: list[set[int]], article_ids: np.ndarray, train_splits: tuple[str, ...]
) -> list[torch.Tensor]:
    """Per question row, the article nodes of its BM25 negatives (rows of ``train_splits``
    only; its own gold articles and articles not in the graph dropped); empty when it has none."""
    import polars as pl

    negs = [torch.empty(0, dtype=torch.long) for _ in train_ids]
    if negatives is None or not negatives.height:
        return negs
    row_of = {int(q): r for r, q in enumerate(train_ids)}
    rows = negatives.filter(pl.col("split").is_in(list(train_splits))).select("question_id", "negative_ids")
    for qid, ids in rows.iter_rows():
        r = row_of.get(int(qid))
        if r is None or not ids:
            continue
        ids = np.asarray([i for i in ids if int(i) not in gold[r]], dtype=np.int64)
        pos = np.searchsorted(article_ids, ids)
        ok = (pos < len(article_ids)) & (article_ids[np.minimum(pos, len(article_ids) - 1)] == ids)
        negs[r] = torch.from_numpy(pos[ok]).long()
    return negs


def warn_missing_negatives(negs: list[torch.Tensor], settings: GNNSettings, splits: tuple[str, ...]) -> None:
    missing = sum(int(n.numel() == 0) for n in negs)
    if settings.hard_negatives and missing:
        what = "+".join(splits)
        log.warning("%d of %d %s questions have no BM25 negatives: random articles stand in", missing, len(negs), what)


def check_dev_negatives(
    negs: list[torch.Tensor], ids: np.ndarray, splits: list[str], settings: GNNSettings, path: Any
) -> None:
    """A refit trains dev questions with their BM25 negatives (G-DSR appendix B), never with
    random stand-ins: a dev question without any is an error naming ``negatives.splits``."""
    if not settings.hard_negatives:
        return
    for neg, qid, split in zip(negs, ids, splits):
        if split == "dev" and neg.numel() == 0:
            raise DataError(
                path,
                f"dev question {int(qid)} has no BM25 negatives (split 'dev'), which the "
                f"train+dev refit of {settings.variant} trains with: add dev to negatives.splits "
                "and rerun mine_negatives",
                column="split",
            )


# ---------------------------------------------------------------------------
# Mini-batches
# ---------------------------------------------------------------------------


def batch_subgraph(
    edge_index: torch.Tensor,
    edge_type: torch.Tensor,
    seeds: torch.Tensor,
    num_hops: int,
    num_nodes: int,
    cut_pairs: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``num_hops``-hop in-neighbourhood of ``seeds`` (all nodes whose messages reach a seed).

    With ``cut_pairs = (questions (B,), articles (B,))``, the edges between each question
    node and the article it is scored against (both directions) are removed first (the
    label-leak rule); the question's other edges stay. Returns ``(subset (n,), edge_index
    (2, e) relabelled to positions in subset, edge_type (e,))``; ``subset`` is sorted.
    """
    from torch_geometric.utils import k_hop_subgraph

    if cut_pairs is not None and cut_pairs[0].numel():
        questions, articles = cut_pairs
        cut = torch.cat([questions * num_nodes + articles, articles * num_nodes + questions])  # (2B,)
        keep = ~torch.isin(edge_index[0] * num_nodes + edge_index[1], cut)  # (E,)
        edge_index, edge_type = edge_index[:, keep], edge_type[keep]
    subset, sub_edge_index, _, edge_mask = k_hop_subgraph(
        seeds.unique(), num_hops, edge_index, relabel_nodes=True, num_nodes=num_nodes
    )
    return subset, sub_edge_index, edge_type[edge_mask]


def other_positive_mask(gold: Sequence[set[int]], column_ids: np.ndarray) -> torch.Tensor:
    """Bool ``(B, C)``: column ``j`` holds another gold article of row ``i``'s question."""
    mask = np.stack([np.isin(column_ids, np.fromiter(g, np.int64, len(g))) for g in gold])  # (B, C)
    n = min(mask.shape)
    mask[np.arange(n), np.arange(n)] = False
    return torch.from_numpy(mask)


def sample_negatives(
    rows: torch.Tensor, ts: TrainingSet, per_question: int, generator: torch.Generator
) -> torch.Tensor:
    """``per_question`` BM25 negatives (article nodes) for each question row; random articles stand in."""
    if per_question == 0:
        return torch.empty(0, dtype=torch.long)
    out = []
    for r in rows.tolist():
        pool = ts.negatives[r]
        if pool.numel():
            pick = torch.randperm(pool.numel(), generator=generator)[:per_question]
            out.append(pool[pick])
        else:
            out.append(torch.randint(ts.num_articles, (per_question,), generator=generator))
    return torch.cat(out)  # (<= B * per_question,)

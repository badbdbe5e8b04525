"""Training the graph encoders: G-DSR's LGE and QABISAR.

Both variants start from the DSR embeddings of the ``embed`` stage (articles, headings,
questions) as node features and train a :class:`~lexgraph.models.gnn.GraphEncoder` on
mini-batches of (train question, gold article) pairs:

1. a batch of ``batch_size`` pairs; for each question ``hard_negatives`` BM25 negatives
   are drawn from ``negatives.parquet`` (all batch columns are shared negatives);
2. the ``layers``-hop in-neighbourhood of the batch's articles (positives + negatives
   and, for QABISAR, the batch's question nodes) is cut out of the graph with
   ``torch_geometric.utils.k_hop_subgraph``; with ``layers`` message-passing steps the
   outputs of these seed nodes are exactly their full-graph outputs;
3. InfoNCE over cosine / ``temperature`` with in-batch + BM25 negatives (columns that
   are another gold article of the row's question are left out of its softmax).

**lge** (Louis, van Dijck & Spanakis, EACL 2023): the graph holds articles and headings
only; queries are the fixed DSR question embeddings; only the GNN trains. At test time
G-DSR scores DSR query embeddings against the GNN's article embeddings.

**qabisar** (Santosh, Sarwat & Grabmair, 2024): the graph also holds the train questions,
linked to their gold articles (bipartite edges, with their own convolution per layer,
starting at zero), with edge-type embeddings (``edge_dim``). The query encoder (from
``models/dsr/query_encoder``) trains jointly, with DSR's parameter groups (no decay on
biases and LayerNorm weights):
``loss = (1 - kd.weight) * InfoNCE(q_graph, a_graph) + kd.weight * KD``, KD distilling
the graph query (teacher, detached) into the query encoder (student) over the same
candidate articles (:class:`~lexgraph.losses.QabisarLoss`). At test time an unseen
question has only the distilled encoder.

**Node features.** Every input vector is L2-normalised (scores are cosines). With
``heading_features: articles`` a heading's feature is the mean of the vectors of every
article under it (:func:`lexgraph.hierarchy.subtree_means`): one heading -> article hop
then moves information between sibling articles, also over a directed graph, where
nothing flows from an article up to its heading. ``title``: the DSR encoding of the
heading's title (G-DSR's choice).

**Start and selection.** With ``init: prior`` the untrained encoder is the hierarchy
prior (:mod:`lexgraph.hierarchy`): the heading -> article messages start as
``w * x_heading``, ``w`` the best deepest-heading weight of the ``hprior`` stage's dev grid
(``w = 0``, i.e. DSR, when dev prefers no propagation). The untrained model (epoch 0) is
evaluated on dev and may be kept, so training can only improve on its start on dev.

**The teacher's neighbourhood (QABISAR).** A batch question's node keeps its edges to its
other gold articles, so the teacher sees its graph neighbourhood as the paper intends;
only the edges between the question and the articles it is *scored against as
positives in this batch* are cut (both directions) before the subgraph is sampled.
Left in place, the question node would read its positive off its own neighbours, and
the positive would receive the question's embedding: the contrastive task would be
trivial. The other gold articles stay connected; they are masked out of the question's
softmax (never negatives) and out of the distillation candidates. What can still pass
is indirect: over an undirected graph, a sibling of a kept gold article reaches the
question's node through their shared heading in two hops, which is the signal the graph
is for. Full-graph inference (article embeddings) uses every train question's edges.
Dev and test questions never enter the graph, the batches or the node features; dev
questions are only scored for model selection (dev R@200, as in G-DSR).
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from lexgraph.config import check_types
from lexgraph.embed import select_rows
from lexgraph.errors import ConfigError, DataError, LexgraphError
from lexgraph.hierarchy import best_weight, read_hprior, subtree_means
from lexgraph.graph import BIPARTITE_TYPES, STRUCTURE_TYPES, NodeType, restrict_graph
from lexgraph.losses.InfoNCELoss import InfoNCELoss
from lexgraph.losses.QabisarLoss import QabisarLoss
from lexgraph.models.gnn import GraphEncoder, GraphEncoderConfig
from lexgraph.training.engine import FitConfig, ParamGroup, Runtime, build_optimizer, build_scheduler, fit

log = logging.getLogger(__name__)

VARIANTS = ("lge", "qabisar")
ARCH_KEYS = ("model", "layers", "hidden", "heads", "concat_heads", "dropout", "residual", "edge_dim", "init")
HEADING_FEATURES = ("articles", "title")
SIMILARITIES = ("cosine", "dot")
SELECTION_METRIC = "recall@200"
RETRIEVAL_DEPTH = 500  # dev metrics need the top-500 (recall@500); selection uses recall@200
FORMAT_VERSION = 1
WEIGHTS = "gnn.safetensors"
CONFIG = "gnn.json"
ARTICLE_EMBEDDINGS = "article_embeddings.safetensors"
QUERY_ENCODER = "query_encoder"


# ---------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GNNSettings:
    """The ``gnn`` section of params.yaml, resolved for one variant."""

    variant: str
    model: str
    layers: int
    hidden: int | None
    heads: int
    concat_heads: bool
    dropout: float
    residual: bool
    edge_dim: int | None
    init: str  # random | identity | prior (the hprior stage's deepest-heading weight)
    heading_features: str  # articles (mean of the articles under the heading) | title (its DSR encoding)
    hard_negatives: int
    batch_size: int
    lr: float
    adam_epsilon: float
    warmup_ratio: float
    weight_decay: float
    max_grad_norm: float
    accumulation_steps: int  # micro-batches per batch and process (lexgraph.training.engine)
    epochs: int
    similarity: str  # cosine | dot (QABISAR's)
    temperature: float
    encoder_lr: float
    kd_weight: float
    kd_mode: str
    kd_temperature: float
    kd_student_contrastive: bool  # the student also trains contrastively against the graph's articles
    bipartite: bool
    structure: bool
    refit: bool  # lge: after choosing the epoch on dev, retrain on train+dev for that many (G-DSR appendix B)

    @classmethod
    def from_params(cls, params: dict[str, Any], variant: str) -> "GNNSettings":
        """Read ``params`` (the ``gnn`` section); ``params[variant]`` overrides architecture keys."""
        if variant not in VARIANTS:
            raise ConfigError(f"unknown GNN variant {variant!r}, expected one of {', '.join(VARIANTS)}")
        kd_fields = {"kd_weight": "weight", "kd_mode": "mode", "kd_temperature": "temperature",
                     "kd_student_contrastive": "student_contrastive"}
        scalar = {f for f in cls.__dataclass_fields__ if f not in ("variant", "epochs", *kd_fields)}
        allowed = scalar | {"epochs_lge", "epochs_qabisar", "kd", *VARIANTS}
        unknown = sorted(set(params) - allowed, key=str)
        if unknown:
            raise ConfigError(f"params.yaml: unknown keys {', '.join(repr(f'gnn.{k}') for k in unknown)}; "
                              f"expected keys of 'gnn': {', '.join(sorted(allowed))}")
        values: dict[str, Any] = {k: params[k] for k in scalar if k in params}
        override = params.get(variant) or {}
        if not isinstance(override, dict) or set(override) - set(ARCH_KEYS):
            raise ConfigError(
                f"params.yaml: 'gnn.{variant}' overrides architecture keys only ({', '.join(ARCH_KEYS)}); "
                f"got {override!r}"
            )
        values.update(override)
        epochs_key = f"epochs_{variant}"
        if epochs_key not in params:
            raise ConfigError(f"params.yaml: missing key 'gnn.{epochs_key}'")
        values["epochs"] = params[epochs_key]
        kd = params.get("kd") or {}
        if not isinstance(kd, dict) or set(kd) - set(kd_fields.values()):
            raise ConfigError(f"params.yaml: 'gnn.kd' = {kd!r}, expected a mapping with "
                              f"{', '.join(repr(k) for k in kd_fields.values())}")
        values.update({field_: kd[key] for field_, key in kd_fields.items() if key in kd})
        missing = sorted((set(cls.__dataclass_fields__) - {"variant"}) - set(values))
        if missing:
            names = {**{f: f"kd.{k}" for f, k in kd_fields.items()}, "epochs": epochs_key}
            raise ConfigError(f"params.yaml: missing key(s) {', '.join(repr('gnn.' + names.get(m, m)) for m in missing)}")
        names = {"epochs": epochs_key, **{f: f"kd.{k}" for f, k in kd_fields.items()},
                 **{key: f"{variant}.{key}" for key in override}}
        settings = cls(variant=variant, **check_types(cls, values, "gnn", names))
        settings.validate()
        try:  # architecture errors now, not after the data is loaded (the size is checked later)
            hidden = settings.hidden or settings.heads
            GraphEncoderConfig(in_dim=settings.hidden or hidden, **{k: getattr(settings, k) for k in ARCH_KEYS})
        except ConfigError as exc:
            if override:
                raise ConfigError(f"{exc} (with the overrides of 'gnn.{variant}': {override})") from None
            raise
        return settings

    def validate(self) -> None:
        def bad(key: str, value: Any, expected: str) -> ConfigError:
            return ConfigError(f"params.yaml: 'gnn.{key}' = {value!r}, expected {expected}")

        for key in ("hard_negatives",):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise bad(key, value, "an integer >= 0")
        for key in ("batch_size", "epochs", "accumulation_steps"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise bad(key if key != "epochs" else f"epochs_{self.variant}", value, "an integer >= 1")
        for key in ("lr", "encoder_lr", "temperature", "kd_temperature", "max_grad_norm", "adam_epsilon"):
            value = getattr(self, key)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
                raise bad(key.replace("kd_", "kd."), value, "a positive number")
        if not isinstance(self.weight_decay, (int, float)) or not 0 <= self.weight_decay < math.inf:
            raise bad("weight_decay", self.weight_decay, "a number >= 0")
        if not isinstance(self.warmup_ratio, (int, float)) or not 0.0 <= self.warmup_ratio < 1.0:
            raise bad("warmup_ratio", self.warmup_ratio, "a number in [0, 1)")
        if not isinstance(self.kd_weight, (int, float)) or not 0.0 <= self.kd_weight <= 1.0:
            raise bad("kd.weight", self.kd_weight, "a number in [0, 1]")
        if self.kd_mode not in ("score", "feature"):
            raise bad("kd.mode", self.kd_mode, "score or feature")
        if self.heading_features not in HEADING_FEATURES:
            raise bad("heading_features", self.heading_features, " or ".join(HEADING_FEATURES))
        if self.similarity not in SIMILARITIES:
            raise bad("similarity", self.similarity, " or ".join(SIMILARITIES))
        for key in ("bipartite", "structure", "residual", "concat_heads", "refit", "kd_student_contrastive"):
            if not isinstance(getattr(self, key), bool):
                raise bad(key.replace("kd_", "kd."), getattr(self, key), "true or false")

    def encoder_config(self, in_dim: int, prior_weight: float = 0.0) -> GraphEncoderConfig:
        """The encoder's architecture; QABISAR's question-article edges get their own
        convolutions (a second edge group), started at zero."""
        groups = (tuple(int(t) for t in STRUCTURE_TYPES),)
        if self.variant == "qabisar":
            groups += (tuple(int(t) for t in BIPARTITE_TYPES),)
        return GraphEncoderConfig(in_dim=in_dim, **{k: getattr(self, k) for k in ARCH_KEYS},
                                  prior_weight=prior_weight if self.init == "prior" else 0.0, edge_groups=groups)

    @property
    def trains_query_encoder(self) -> bool:
        return self.variant == "qabisar" and self.kd_weight > 0


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

    @property
    def article_ids(self) -> np.ndarray:
        return self.graph.article_ids.numpy()

    @property
    def num_articles(self) -> int:
        return int(self.graph.article_ids.numel())


def variant_graph(graph, settings: GNNSettings):
    """The graph a variant trains on: LGE has no question nodes; QABISAR ablations drop parts."""
    if settings.variant == "lge":
        return restrict_graph(graph, questions=False)
    if graph.question_ids.numel() == 0:
        raise ConfigError(
            "qabisar needs train-question nodes but the graph has none: set graph.questions: true "
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
) -> TrainingSet:
    """Assemble a :class:`TrainingSet`.

    Args:
        graph: the full graph of ``build_graph`` (``lexgraph.graph.load_graph``).
        questions: polars DataFrame (``id``, ``question``, ``article_ids``, ``split``);
            only ``train`` rows are used for training, ``dev`` rows for model selection;
            every other split is dropped here.
        negatives: polars DataFrame (``question_id``, ``split``, ``negative_ids``) or None;
            only ``train`` rows are read.
        embeddings: ``{"articles"|"headings"|"questions": (ids, (n, dim) embeddings)}``.
        paths: file names for error messages: ``questions``, ``negatives``, ``graph`` and
            ``<name>_embeddings``.
    """
    import polars as pl

    paths = {"questions": "questions.parquet", "negatives": "negatives.parquet", **(paths or {})}
    emb_paths = {
        name: paths.get(f"{name}_embeddings", f"{name}.safetensors") for name in ("articles", "headings", "questions")
    }
    graph = variant_graph(graph, settings)
    questions = questions.filter(pl.col("split").is_in(["train", "dev"]))
    train = questions.filter(pl.col("split").is_in(list(train_splits))).sort("id")
    dev = questions.filter(pl.col("split") == "dev").sort("id") if "dev" not in train_splits else questions.clear()
    if train.height == 0:
        raise DataError(paths["questions"], "no question with split 'train'", column="split")

    # node features: articles, then headings, then (train) questions
    art_ids, art_emb = embeddings["articles"]
    unit = partial(F.normalize, dim=-1)
    articles = unit(select_rows(art_ids, art_emb, graph.article_ids.numpy(), emb_paths["articles"], "article").float())
    blocks = [articles]  # (A, dim)
    if graph.heading_ids.numel():
        if settings.heading_features == "articles":  # the mean of the (unit) articles under each heading
            blocks.append(subtree_means(graph, articles))  # (H, dim)
        else:
            head_ids, head_emb = embeddings["headings"]
            blocks.append(unit(select_rows(head_ids, head_emb, graph.heading_ids.numpy(), emb_paths["headings"],
                                           "heading").float()))
    q_ids, q_emb = embeddings["questions"]
    if graph.question_ids.numel():
        blocks.append(unit(select_rows(q_ids, q_emb, graph.question_ids.numpy(), emb_paths["questions"],
                                       "question").float()))
    x = torch.cat(blocks)  # (nodes, dim)
    if x.size(0) != graph.num_nodes:
        raise DataError(paths.get("graph", "graph.pt"), f"{graph.num_nodes} nodes but {x.size(0)} feature rows")

    train_ids = train["id"].to_numpy().astype(np.int64)
    article_ids = graph.article_ids.numpy()
    gold = [set(int(a) for a in (g or [])) for g in train["article_ids"].to_list()]
    rows, nodes = [], []
    for r, (qid, g) in enumerate(zip(train_ids, gold)):
        for a in sorted(g):
            pos = int(np.searchsorted(article_ids, a))
            if pos >= len(article_ids) or article_ids[pos] != a:
                raise DataError(
                    paths["questions"], f"question {qid} cites article {a}, not in the graph", column="article_ids"
                )
            rows.append(r)
            nodes.append(pos)
    if not rows:
        raise DataError(paths["questions"], "the train questions cite no article", column="article_ids")
    pairs = torch.tensor([rows, nodes], dtype=torch.long).T.contiguous()  # (P, 2)

    q_nodes = torch.full((len(train_ids),), -1, dtype=torch.long)  # (Q,)
    if graph.question_ids.numel():
        first_q = int((graph.node_type != NodeType.QUESTION).sum())
        graph_q = graph.question_ids.numpy()
        pos = np.searchsorted(graph_q, train_ids)
        ok = (pos < len(graph_q)) & (graph_q[np.minimum(pos, len(graph_q) - 1)] == train_ids)
        if not ok.all():
            raise DataError(
                paths.get("graph", "graph.pt"),
                f"train question {int(train_ids[~ok][0])} has no node (rebuild the graph from the same questions)",
            )
        q_nodes = torch.from_numpy(pos + first_q).long()

    negs = [torch.empty(0, dtype=torch.long) for _ in train_ids]
    if negatives is not None and negatives.height:
        row_of = {int(q): r for r, q in enumerate(train_ids)}
        rows_ = negatives.filter(pl.col("split").is_in(list(train_splits))).select("question_id", "negative_ids")
        for qid, ids in rows_.iter_rows():
            r = row_of.get(int(qid))
            if r is None or not ids:
                continue
            ids = np.asarray([i for i in ids if int(i) not in gold[r]], dtype=np.int64)
            pos = np.searchsorted(article_ids, ids)
            ok = (pos < len(article_ids)) & (article_ids[np.minimum(pos, len(article_ids) - 1)] == ids)
            negs[r] = torch.from_numpy(pos[ok]).long()
    missing_neg = sum(int(n.numel() == 0) for n in negs)
    if settings.hard_negatives and missing_neg:
        log.warning("%d of %d train questions have no BM25 negatives: random articles stand in", missing_neg, len(negs))

    dev_ids = dev["id"].to_numpy().astype(np.int64)
    dev_queries = None
    if len(dev_ids):
        dev_queries = select_rows(q_ids, q_emb, dev_ids, emb_paths["questions"], "question").float()
    return TrainingSet(
        graph=graph,
        x=x,
        train_ids=train_ids,
        train_texts=train["question"].to_list(),
        train_queries=select_rows(q_ids, q_emb, train_ids, emb_paths["questions"], "question").float(),
        question_nodes=q_nodes,
        gold=gold,
        pairs=pairs,
        negatives=negs,
        dev_ids=dev_ids,
        dev_texts=dev["question"].to_list(),
        dev_queries=dev_queries,
        dev_qrels={int(q): set(int(a) for a in g) for q, g in zip(dev_ids, dev["article_ids"].to_list())},
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


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------


@dataclass
class TrainResult:
    model: GraphEncoder
    encoder: Any  # the (distilled) query encoder for qabisar, else None
    article_embeddings: torch.Tensor  # (A, dim) full-graph outputs of the selected model
    best_epoch: int
    dev_metrics: dict[str, float]
    input_dev_metrics: dict[str, float]
    history: list[dict[str, float]]
    initial_dev_metrics: dict[str, float]  # the untrained encoder (epoch 0)
    prior_weight: float


def full_graph_embeddings(model: GraphEncoder, ts: TrainingSet, device: torch.device) -> torch.Tensor:
    """Article embeddings ``(A, dim)`` from one pass over the whole graph (eval mode, CPU).

    Runs in float32 even on CUDA: the pass is cheap and the saved embeddings are final.
    """
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model(ts.x.to(device), ts.graph.edge_index.to(device), ts.graph.edge_type.to(device))  # (nodes, dim)
    model.train(was_training)
    return out[: ts.num_articles].float().cpu()  # articles are the first nodes


def dev_metrics(
    article_embeddings: torch.Tensor, ts: TrainingSet, queries: torch.Tensor | None, similarity: str = "cosine"
) -> dict[str, float]:
    """Dev metrics of exact top-500 retrieval with ``queries`` ``(D, dim)`` (cosine or dot)."""
    from lexgraph.metrics import evaluate_run
    from lexgraph.retrieval.dense import exact_top_k

    if queries is None or not len(ts.dev_ids):
        return {}
    ids, _ = exact_top_k(queries, article_embeddings, ts.article_ids, RETRIEVAL_DEPTH,
                         normalize=similarity == "cosine")
    run = {int(q): ids[i].tolist() for i, q in enumerate(ts.dev_ids)}
    return evaluate_run(run, ts.dev_qrels)


def _dev_queries(ts: TrainingSet, encoder, device: torch.device) -> torch.Tensor | None:
    if encoder is None:
        return ts.dev_queries
    if not ts.dev_texts:
        return None
    return encoder.encode(ts.dev_texts, batch_size=64, device=device, show_progress=False)


@dataclass
class DeviceGraph:
    """The training graph's tensors, moved to the training device once."""

    x: torch.Tensor  # (nodes, dim)
    edge_index: torch.Tensor  # (2, E)
    edge_type: torch.Tensor  # (E,)
    train_queries: torch.Tensor  # (Q, dim)


def batch_loss(
    model: GraphEncoder,
    encoder,
    criterion: torch.nn.Module,
    ts: TrainingSet,
    graph: DeviceGraph,
    batch: torch.Tensor,
    settings: GNNSettings,
    generator: torch.Generator,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss of one batch of (question row, gold article node) pairs ``(B, 2)``."""
    device = graph.x.device
    qabisar = settings.variant == "qabisar"
    rows, positives = batch[:, 0], batch[:, 1]  # (B,), (B,)
    negatives = sample_negatives(rows, ts, settings.hard_negatives, generator)  # (N,)
    columns = torch.cat([positives, negatives])  # (B + N,)
    mask = other_positive_mask([ts.gold[r] for r in rows.tolist()], ts.article_ids[columns.numpy()]).to(device)
    q_nodes = ts.question_nodes[rows] if qabisar else torch.empty(0, dtype=torch.long)  # (B,) or (0,)
    subset, sub_edge_index, sub_edge_type = batch_subgraph(
        graph.edge_index, graph.edge_type, torch.cat([columns, q_nodes]).to(device), settings.layers,
        graph.x.size(0), cut_pairs=(q_nodes.to(device), positives.to(device)) if qabisar else None,
    )
    out = model(graph.x[subset], sub_edge_index, sub_edge_type)  # (subset, dim)
    cols = out[torch.searchsorted(subset, columns.to(device))]  # (B + N, dim)
    a_pos, a_neg = cols[: rows.numel()], cols[rows.numel() :]  # (B, dim), (N, dim)
    if not qabisar:  # LGE: fixed DSR query embeddings
        loss = criterion(graph.train_queries[rows.to(device)], a_pos, a_neg, mask)
        return loss, {"contrastive": float(loss.detach()), "kd": 0.0}
    q_graph = out[torch.searchsorted(subset, q_nodes.to(device))]  # (B, dim)
    q_enc = None
    if settings.trains_query_encoder:
        unique_rows, inverse = rows.unique(return_inverse=True)  # encode each question once
        texts = [ts.train_texts[r] for r in unique_rows.tolist()]
        inputs = {k: v.to(device) for k, v in encoder.tokenize(texts).items()}
        q_enc = encoder(**inputs)[inverse.to(device)]  # (B, dim)
    return criterion(q_graph, q_enc, a_pos, a_neg, mask)


class GNNTask:
    """:class:`~lexgraph.training.engine.TrainingTask` of a graph encoder (and, for
    qabisar, the query encoder distilled from it)."""

    def __init__(self, ts: TrainingSet, settings: GNNSettings, model: GraphEncoder, encoder, criterion,
                 graph: DeviceGraph, generator: torch.Generator, runtime, seed: int) -> None:
        self.ts, self.settings, self.model, self.encoder, self.criterion = ts, settings, model, encoder, criterion
        self.graph, self.runtime, self.order_generator = graph, runtime, generator
        # the batch order must be the same on every process; with one process the negatives
        # come from the same stream (the historical draw order), with several from their own
        self.draw_generator = generator if runtime.world_size == 1 else \
            torch.Generator().manual_seed(seed + 1 + runtime.rank)
        self.steps_per_epoch = math.ceil(ts.pairs.size(0) / settings.batch_size)

    def modules(self) -> list[torch.nn.Module]:
        return [self.model] + ([self.encoder] if self.settings.trains_query_encoder else [])

    def train(self) -> None:
        self.model.train()
        if self.encoder is not None:
            self.encoder.train(self.settings.trains_query_encoder)

    def batches(self, epoch: int):
        order = torch.randperm(self.ts.pairs.size(0), generator=self.order_generator)
        size = self.settings.batch_size
        for step in range(self.steps_per_epoch):
            yield self.ts.pairs[order[step * size : (step + 1) * size]]  # (B, 2)

    def step(self, batch: torch.Tensor):
        with self.runtime.autocast():
            return batch_loss(self.model, self.encoder, self.criterion, self.ts, self.graph, batch, self.settings,
                              self.draw_generator)

    def evaluate(self) -> dict[str, float]:
        device = self.runtime.device
        embeddings = full_graph_embeddings(self.model, self.ts, device)
        return dev_metrics(embeddings, self.ts, _dev_queries(self.ts, self.encoder, device), self.settings.similarity)

    def nan_error(self, value: float, epoch: int, step: int) -> LexgraphError:
        return LexgraphError(
            f"train_gnn {self.settings.variant}: the loss became {value} at epoch {epoch}, step {step}; "
            f"lower 'gnn.lr' (now {self.settings.lr}) or raise 'gnn.temperature'"
        )


def train_graph_encoder(
    ts: TrainingSet,
    settings: GNNSettings,
    device: torch.device | str = "cpu",
    seed: int = 13,
    query_encoder=None,
    show_progress: bool = True,
    runtime: Runtime | None = None,
    prior_weight: float = 0.0,
    select: bool = True,
) -> TrainResult:
    """Train a :class:`GraphEncoder` (and, for qabisar, ``query_encoder``) on ``ts``
    with :func:`lexgraph.training.engine.fit`.

    ``prior_weight``: the hierarchy prior's weight the encoder starts from (``init: prior``);
    ``select=False`` keeps the last epoch (the refit run, whose dev questions are trained on).
    Model selection: before training and after each epoch the whole graph is encoded and
    dev questions are ranked against the articles (LGE: fixed DSR dev embeddings; QABISAR:
    the current query encoder); the epoch with the best dev R@200 wins, the untrained model
    (epoch 0) included (the last epoch when there is no dev split). AdamW (the GNN: decay on
    every weight, G-DSR; the query encoder: DSR's groups, no decay on biases and LayerNorm
    weights), linear warm-up then decay, gradient clipping, mixed precision on CUDA.
    """
    runtime = runtime or Runtime(device)
    device = runtime.device
    qabisar = settings.variant == "qabisar"
    if qabisar and settings.trains_query_encoder and query_encoder is None:
        raise ConfigError("qabisar with gnn.kd.weight > 0 trains the query encoder: pass one")
    generator = torch.Generator().manual_seed(seed)
    model = GraphEncoder(settings.encoder_config(ts.x.size(1), prior_weight)).to(device)
    encoder = query_encoder.to(device) if (qabisar and query_encoder is not None) else None
    criterion = (
        QabisarLoss(settings.temperature, settings.kd_weight, settings.kd_mode, settings.kd_temperature,
                    settings.similarity, settings.kd_student_contrastive)
        if qabisar
        else InfoNCELoss(settings.temperature, settings.similarity)
    )
    groups = [ParamGroup(list(model.parameters()), settings.lr, settings.weight_decay, decay_exempt=False)]
    if settings.trains_query_encoder:
        groups.append(ParamGroup(list(encoder.parameters()), settings.encoder_lr, settings.weight_decay,
                                 decay_exempt=True))
    elif encoder is not None:
        encoder.requires_grad_(False)
    optimizer = build_optimizer(groups, [model] + ([encoder] if encoder is not None else []),
                                eps=settings.adam_epsilon, foreach=True)
    task = GNNTask(ts, settings, model, encoder, criterion, None, generator, runtime, seed)
    total = task.steps_per_epoch * settings.epochs
    scheduler = build_scheduler(optimizer, "linear", int(settings.warmup_ratio * total), total)
    task.graph = DeviceGraph(
        x=ts.x.to(device),  # (nodes, dim)
        edge_index=ts.graph.edge_index.to(device),  # (2, E)
        edge_type=ts.graph.edge_type.to(device),  # (E,)
        train_queries=ts.train_queries.to(device),  # (Q, dim)
    )
    input_metrics = dev_metrics(ts.x[: ts.num_articles], ts, ts.dev_queries, settings.similarity)
    if input_metrics:
        log.info("dev %s of the input (DSR) embeddings: %.4f", SELECTION_METRIC, input_metrics[SELECTION_METRIC])
    fit_config = FitConfig(
        name=settings.variant, epochs=settings.epochs, steps_per_epoch=task.steps_per_epoch,
        max_grad_norm=settings.max_grad_norm, accumulation_steps=settings.accumulation_steps,
        selection_metric=SELECTION_METRIC if select else None, select_epoch_zero=select, show_progress=show_progress,
    )
    result = fit(task, optimizer, scheduler, fit_config, runtime)
    if encoder is not None:
        encoder.eval()
    return TrainResult(
        model=model,
        encoder=encoder,
        article_embeddings=full_graph_embeddings(model, ts, device),
        best_epoch=result.best_epoch,
        dev_metrics=result.dev_metrics,
        input_dev_metrics=input_metrics,
        history=result.history,
        initial_dev_metrics=result.initial_metrics,
        prior_weight=prior_weight,
    )


# ---------------------------------------------------------------------------
# Saving and loading
# ---------------------------------------------------------------------------


def save_trained(result: TrainResult, ts: TrainingSet, settings: GNNSettings, directory: str | os.PathLike) -> None:
    """Write ``models/gnn_<variant>/`` atomically: weights, config, article embeddings
    (and ``query_encoder/`` for qabisar)."""
    from safetensors.torch import save_file

    from lexgraph.embed import save_embeddings
    from lexgraph.io import atomic_path

    config = {
        "format_version": FORMAT_VERSION,
        "variant": settings.variant,
        "graph_encoder": result.model.config.to_dict(),
        "settings": asdict(settings),
        "similarity": settings.similarity,
        "prior_weight": result.prior_weight,
        "best_epoch": result.best_epoch,
        "selection": f"dev {SELECTION_METRIC}",
        # where test-time queries come from
        "query_encoder": QUERY_ENCODER if result.encoder is not None else "models/dsr/query_encoder",
    }
    with atomic_path(directory, directory=True) as tmp:
        state = {k: v.detach().cpu().contiguous() for k, v in result.model.state_dict().items()}
        save_file(state, str(tmp / WEIGHTS))
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        save_embeddings(tmp / ARTICLE_EMBEDDINGS, ts.article_ids, result.article_embeddings)
        if result.encoder is not None:
            result.encoder.save_pretrained(tmp / QUERY_ENCODER)


def load_graph_encoder(directory: str | os.PathLike, device: torch.device | str = "cpu") -> GraphEncoder:
    """Rebuild a trained :class:`GraphEncoder` from ``models/gnn_<variant>/``."""
    from safetensors.torch import load_file

    directory = Path(directory)
    config_path = directory / CONFIG
    if not config_path.is_file():
        raise DataError(config_path, "not found (run the train_gnn stage)")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    model = GraphEncoder(GraphEncoderConfig.from_dict(config["graph_encoder"]))
    model.load_state_dict(load_file(str(directory / WEIGHTS)))
    return model.to(device).eval()


def training_metrics(result: TrainResult, ts: TrainingSet, settings: GNNSettings) -> dict[str, Any]:
    """``metrics/train_gnn_<variant>.json`` (no timings: the file is reproducible)."""

    def rounded(values: dict[str, float]) -> dict[str, float]:
        return {k: round(float(v), 4) for k, v in values.items()}

    return {
        "variant": settings.variant,
        "best_epoch": result.best_epoch,
        "dev": rounded(result.dev_metrics),
        "dev_input_embeddings": rounded(result.input_dev_metrics),
        "dev_untrained": rounded(result.initial_dev_metrics),
        "prior_weight": result.prior_weight,
        "train_questions": int(len(ts.train_ids)),
        "train_pairs": int(ts.pairs.size(0)),
        "steps_per_epoch": math.ceil(ts.pairs.size(0) / settings.batch_size),
        "graph": {"nodes": int(ts.graph.num_nodes), "edges": int(ts.graph.edge_index.size(1))},
        # epoch 0 (the untrained model) has no loss: null, not a bare NaN that strict JSON readers refuse
        "history": [{k: (v if k == "epoch" else round(float(v), 4) if math.isfinite(v) else None) for k, v in h.items()}
                    for h in result.history],
    }


# ---------------------------------------------------------------------------
# The train_gnn stage
# ---------------------------------------------------------------------------


def run_train_gnn(
    variant: str,
    *,
    graph: str | os.PathLike,
    embed: str | os.PathLike,
    questions: str | os.PathLike,
    negatives: str | os.PathLike,
    dsr: str | os.PathLike,
    hprior: str | os.PathLike,
    out: str | os.PathLike,
    metrics: str | os.PathLike,
    params: dict[str, Any],
    device: torch.device,
    seed: int,
) -> dict[str, Any]:
    """Read the stage inputs, train, write ``out`` (atomic dir) and ``metrics``.

    ``hprior``: the ``hprior`` stage's directory; with ``init: prior`` the encoder starts
    from its best deepest-heading weight on dev (0, i.e. the identity, when dev prefers DSR)."""
    from lexgraph.embed import load_embeddings
    from lexgraph.graph import load_graph
    from lexgraph.io import read_parquet, write_json

    settings = GNNSettings.from_params(params, variant)
    embed = Path(embed)
    paths = {f"{name}_embeddings": embed / f"{name}.safetensors" for name in ("articles", "headings", "questions")}
    paths.update(questions=questions, negatives=negatives, graph=Path(graph) / "graph.pt")
    full_graph = load_graph(graph)
    question_table = read_parquet(questions, ["id", "question", "article_ids", "split"])
    negative_table = None
    if settings.hard_negatives:
        negative_table = read_parquet(negatives, ["question_id", "split", "negative_ids"])
    tables = {name: load_embeddings(paths[f"{name}_embeddings"]) for name in ("articles", "headings", "questions")}
    ts = prepare_training_set(full_graph, question_table, negative_table, tables, settings, paths)
    log.info(
        "%s: %d nodes, %d edges, %d train pairs, %d dev questions, device %s",
        variant, ts.graph.num_nodes, ts.graph.edge_index.size(1), ts.pairs.size(0), len(ts.dev_ids), device,
    )
    encoder = None
    if variant == "qabisar":
        from lexgraph.models.encoders import QueryEncoder

        query_dir = Path(dsr) / "query_encoder"
        if not query_dir.is_dir():
            raise DataError(query_dir, "not found (run the train_dsr stage)")
        encoder = QueryEncoder.from_pretrained(query_dir)
        if encoder.dim != ts.x.size(1):
            raise DataError(query_dir, f"query encoder dim {encoder.dim} differs from the embeddings' {ts.x.size(1)}")
    prior_weight = best_weight(read_hprior(hprior)) if settings.init == "prior" else 0.0
    if settings.init == "prior":
        log.info("%s starts as the hierarchy prior with weight %g (hprior's best deepest-heading weight on dev)",
                 variant, prior_weight)
    runtime = Runtime(device)
    result = train_graph_encoder(ts, settings, seed=seed, query_encoder=encoder, runtime=runtime,
                                 prior_weight=prior_weight)
    summary = training_metrics(result, ts, settings)
    summary["refit"] = None
    if settings.refit and variant == "qabisar":
        log.info("gnn.refit: qabisar is not refit (its graph holds train questions only)")
    elif settings.refit and result.best_epoch >= 1:  # G-DSR appendix B: the chosen epochs on train+dev
        refit_ts = prepare_training_set(full_graph, question_table, negative_table, tables, settings, paths,
                                        train_splits=("train", "dev"))
        log.info("refit: %d epochs on %d train+dev pairs", result.best_epoch, refit_ts.pairs.size(0))
        result = train_graph_encoder(refit_ts, replace(settings, epochs=result.best_epoch), seed=seed,
                                     runtime=runtime, prior_weight=prior_weight, select=False)
        summary["refit"] = {"epochs": result.best_epoch, "pairs": int(refit_ts.pairs.size(0)),
                            "dev_metrics_of": "the selection run (dev is trained on after the refit)"}
    if runtime.is_main:  # one writer; the others wait for it
        save_trained(result, ts, settings, out)
        write_json(summary, metrics)
    runtime.wait()
    return summary

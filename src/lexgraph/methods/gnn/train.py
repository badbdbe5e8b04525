"""Training the graph encoders: G-DSR's LGE (``gdsr``), QABISAR (``qabisar``) and
lexgraph's recipes ``hgraph`` and ``hgraph_qa`` (:mod:`lexgraph.methods.gnn.config`).

Every variant starts from the DSR embeddings of the ``embed`` stage (articles, headings,
questions) as node features and train a :class:`~lexgraph.methods.gnn.model.GraphEncoder` on
mini-batches of (train question, gold article) pairs:

1. a batch of ``batch_size`` pairs; for each question ``hard_negatives`` BM25 negatives
   are drawn from ``negatives.parquet`` (all batch columns are shared negatives);
2. the ``layers``-hop in-neighbourhood of the batch's articles (positives + negatives
   and, for the question variants, the batch's question nodes) is cut out of the graph with
   ``torch_geometric.utils.k_hop_subgraph``; with ``layers`` message-passing steps the
   outputs of these seed nodes are exactly their full-graph outputs;
3. InfoNCE over ``similarity`` / ``temperature`` with in-batch + BM25 negatives (columns
   that are another gold article of the row's question are left out of its softmax).

The schedule is ``schedule`` (constant, or linear warm-up and decay); with ``selection: dev``
the epoch with the best dev R@200 is kept (the untrained model included), with ``fixed``
the last. ``refit`` retrains on train+dev (G-DSR appendix B): the fixed schedule in full,
or the epochs dev chose; dev pairs get their BM25 negatives (split ``dev`` of the negatives
file, which ``negatives.splits`` must then mine). Every refit, and every skipped one, is logged.

**gdsr, hgraph** (Louis, van Dijck & Spanakis, EACL 2023): the graph holds articles and headings
only; queries are the fixed DSR question embeddings; only the GNN trains. At test time
G-DSR scores DSR query embeddings against the GNN's article embeddings.

**qabisar, hgraph_qa** (Santosh, Sarwat & Grabmair, 2024): the graph also holds the train questions,
linked to their gold articles (bipartite edges), with edge-type embeddings (``edge_dim``),
attended jointly with the statute edges (``edge_attention: joint``, QABISAR) or by a
convolution per edge group, summed (``per_group``, hgraph_qa). The query encoder (from
``models/dsr/query_encoder``) trains jointly, with DSR's parameter groups (no decay on
biases and LayerNorm weights):
``loss = (1 - kd.weight) * InfoNCE(q_graph, a_graph) + kd.weight * KD``, KD distilling
the graph query (teacher, detached) into the query encoder (student) over the same
candidate articles (:class:`~lexgraph.losses.QabisarLoss`). At test time an unseen
question has only the distilled encoder.

**Node features.** With ``normalize_features`` (lexgraph's recipes) every input vector is
L2-normalised; without (the papers'), the embed stage's vectors are used as they are, so a
dot product (QABISAR's f) sees the encoder's scale on both sides of the distillation. With
``heading_features: articles`` a heading's feature is the mean of the vectors of every
article under it (:func:`lexgraph.graph.hierarchy.subtree_means`): one heading -> article hop
then moves information between sibling articles, also over a directed graph, where
nothing flows from an article up to its heading. ``title``: the DSR encoding of the
heading's title (G-DSR's choice).

**Start and selection.** With ``init: prior`` the untrained encoder is the hierarchy
prior (:mod:`lexgraph.graph.hierarchy`): the heading -> article messages start as
``w * x_heading``, ``w`` the best deepest-heading weight of the ``hprior`` stage's dev grid
(``w = 0``, i.e. DSR, when dev prefers no propagation). The untrained model (epoch 0) is
evaluated on dev and may be kept, so training can only improve on its start on dev.

**The teacher's neighbourhood (question variants).** A batch question's node keeps its edges to its
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

import logging
import math
from dataclasses import dataclass

import torch

from lexgraph.core.errors import ConfigError, LexgraphError
from lexgraph.losses.InfoNCELoss import InfoNCELoss
from lexgraph.losses.QabisarLoss import QabisarLoss
from lexgraph.methods.gnn.config import SELECTION_METRIC, GNNSettings, encoder_for
from lexgraph.methods.gnn.data import (
    TrainingSet,
    batch_subgraph,
    other_positive_mask,
    sample_negatives,
)
from lexgraph.methods.gnn.io import GNNTrainResult
from lexgraph.methods.gnn.model import GraphEncoder
from lexgraph.training.engine import (
    FitConfig,
    ParamGroup,
    Runtime,
    build_optimizer,
    build_scheduler,
    fit,
)
from lexgraph.training.resume import Resume

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------


def full_graph_embeddings(model: GraphEncoder, ts: TrainingSet, device: torch.device) -> torch.Tensor:
    """Article embeddings ``(A, dim)`` from one pass over the whole graph (eval mode, CPU)."""
    return graph_pass(model, ts.graph, ts.x, device)


def graph_pass(model: GraphEncoder, graph, x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Article embeddings ``(A, dim)`` of one pass of ``model`` over ``graph`` with node features
    ``x`` ``(nodes, dim)`` (eval mode; the result on the CPU).

    Runs in float32 even on CUDA: the pass is cheap and the saved embeddings are final.
    """
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model(x.to(device), graph.edge_index.to(device), graph.edge_type.to(device))  # (nodes, dim)
    model.train(was_training)
    return out[: graph.article_ids.numel()].float().cpu()  # articles are the first nodes


def dev_metrics(
    article_embeddings: torch.Tensor, ts: TrainingSet, queries: torch.Tensor | None, similarity: str = "cosine"
) -> dict[str, float]:
    """Dev metrics of exact top-500 retrieval with ``queries`` ``(D, dim)`` (cosine or dot)."""
    from lexgraph.metrics.ir import dense_run_metrics

    if queries is None or not len(ts.dev_ids):
        return {}
    return dense_run_metrics(
        queries,
        article_embeddings,
        ts.article_ids,
        [int(q) for q in ts.dev_ids],
        ts.dev_qrels,
        normalize=similarity == "cosine",
    )


def _dev_queries(ts: TrainingSet, encoder, device: torch.device) -> torch.Tensor | None:
    if encoder is None:
        return ts.dev_queries
    if not ts.dev_texts:
        return None
    return encoder.encode(ts.dev_texts, batch_size=64, device=device, show_progress=False)


@dataclass
class StudentCache:
    """QABISAR's student with only its top ``layers`` blocks trained (``encoder_layers``): the
    train questions' token states below them, computed once (eval mode), so that a step runs
    the top blocks alone; questions go through them in length-sorted groups (less padding,
    the same vectors)."""

    states: torch.Tensor  # (Q, seq, dim) the frozen blocks' output per train question
    mask: torch.Tensor  # (Q, seq)
    lengths: torch.Tensor  # (Q,) tokens per question
    layers: int
    group: int = 64  # questions per forward

    @classmethod
    def build(cls, encoder, texts: list[str], layers: int, device: torch.device) -> StudentCache:
        from lexgraph.models.backbone import frozen_states, set_trainable_layers

        set_trainable_layers(encoder.backbone, layers)
        encoder.trainable_layers = layers  # saved with the distilled encoder
        inputs = {k: v.to(device) for k, v in encoder.tokenize(texts).items()}
        states = frozen_states(encoder.backbone, inputs["input_ids"], inputs["attention_mask"], layers)
        mask = inputs["attention_mask"]
        return cls(states, mask, mask.sum(1).cpu(), layers)

    def embed(self, encoder, rows: torch.Tensor) -> torch.Tensor:
        """``(b,)`` question rows -> ``(b, dim)`` student vectors (top blocks with gradients)."""
        from lexgraph.models.backbone import top_states

        order = torch.argsort(self.lengths[rows], stable=True)  # (b,)
        out = [None] * rows.numel()
        for start in range(0, rows.numel(), self.group):
            picked = order[start : start + self.group]
            sub = rows[picked]
            width = int(self.lengths[sub].max())
            mask = self.mask[sub.to(self.mask.device), :width]  # (g, width)
            hidden = top_states(encoder.backbone, self.states[sub.to(self.states.device), :width], mask, self.layers)
            for i, vector in zip(picked.tolist(), encoder.pool_states(hidden, mask)):
                out[i] = vector
        return torch.stack(out)  # (b, dim)


@dataclass
class DeviceGraph:
    """The training graph's tensors, moved to the training device once."""

    x: torch.Tensor  # (nodes, dim)
    edge_index: torch.Tensor  # (2, E)
    edge_type: torch.Tensor  # (E,)
    train_queries: torch.Tensor  # (Q, dim)

    @classmethod
    def on(cls, ts: TrainingSet, device: torch.device) -> DeviceGraph:
        """``ts``'s graph and train query embeddings on ``device``."""
        return cls(
            x=ts.x.to(device),  # (nodes, dim)
            edge_index=ts.graph.edge_index.to(device),  # (2, E)
            edge_type=ts.graph.edge_type.to(device),  # (E,)
            train_queries=ts.train_queries.to(device),  # (Q, dim)
        )


def batch_loss(
    model: GraphEncoder,
    encoder,
    criterion: torch.nn.Module,
    ts: TrainingSet,
    graph: DeviceGraph,
    batch: torch.Tensor,
    settings: GNNSettings,
    generator: torch.Generator,
    student: StudentCache | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss of one batch of (question row, gold article node) pairs ``(B, 2)``."""
    device = graph.x.device
    qabisar = settings.uses_questions
    rows, positives = batch[:, 0], batch[:, 1]  # (B,), (B,)
    negatives = sample_negatives(rows, ts, settings.hard_negatives, generator)  # (N,)
    columns = torch.cat([positives, negatives])  # (B + N,)
    mask = other_positive_mask([ts.gold[r] for r in rows.tolist()], ts.article_ids[columns.numpy()]).to(device)
    q_nodes = ts.question_nodes[rows] if qabisar else torch.empty(0, dtype=torch.long)  # (B,) or (0,)
    subset, sub_edge_index, sub_edge_type = batch_subgraph(
        graph.edge_index,
        graph.edge_type,
        torch.cat([columns, q_nodes]).to(device),
        settings.encoder.layers,
        graph.x.size(0),
        cut_pairs=(q_nodes.to(device), positives.to(device)) if settings.leak_cut else None,
    )
    out = model(graph.x[subset], sub_edge_index, sub_edge_type)  # (subset, dim)
    cols = out[torch.searchsorted(subset, columns.to(device))]  # (B + N, dim)
    a_pos, a_neg = cols[: rows.numel()], cols[rows.numel() :]  # (B, dim), (N, dim)
    if not qabisar:  # gdsr, hgraph: fixed DSR query embeddings
        loss = criterion(graph.train_queries[rows.to(device)], a_pos, a_neg, mask)
        return loss, {"contrastive": float(loss.detach()), "kd": 0.0}
    q_graph = out[torch.searchsorted(subset, q_nodes.to(device))]  # (B, dim)
    q_enc = None
    if settings.trains_query_encoder:
        unique_rows, inverse = rows.unique(return_inverse=True)  # encode each question once
        if student is not None:  # the top blocks over cached states
            q_enc = student.embed(encoder, unique_rows)[inverse.to(device)]  # (B, dim)
        else:
            texts = [ts.train_texts[r] for r in unique_rows.tolist()]
            inputs = {k: v.to(device) for k, v in encoder.tokenize(texts).items()}
            q_enc = encoder(**inputs)[inverse.to(device)]  # (B, dim)
    return criterion(q_graph, q_enc, a_pos, a_neg, mask)


class GNNTask:
    """:class:`~lexgraph.training.engine.TrainingTask` of a graph encoder (and, for
    qabisar, the query encoder distilled from it)."""

    def __init__(
        self,
        ts: TrainingSet,
        settings: GNNSettings,
        model: GraphEncoder,
        encoder,
        criterion,
        graph: DeviceGraph,
        generator: torch.Generator,
        runtime,
        seed: int,
    ) -> None:
        self.ts, self.settings, self.model, self.encoder, self.criterion = ts, settings, model, encoder, criterion
        self.graph, self.runtime, self.order_generator = graph, runtime, generator
        self.student: StudentCache | None = None
        # the batch order must be the same on every process; with one process the negatives
        # come from the same stream (the historical draw order), with several from their own
        self.draw_generator = (
            generator if runtime.world_size == 1 else torch.Generator().manual_seed(seed + 1 + runtime.rank)
        )
        self.steps_per_epoch = math.ceil(ts.pairs.size(0) / settings.batch_size)

    def modules(self) -> list[torch.nn.Module]:
        return [self.model] + ([self.encoder] if self.settings.trains_query_encoder else [])

    def train(self) -> None:
        self.model.train()
        if self.encoder is not None:
            self.encoder.train(self.settings.trains_query_encoder)

    def state_dict(self) -> dict:
        """The generators' states (a resumed run draws on where it stopped)."""
        return {"order": self.order_generator.get_state(), "draw": self.draw_generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.order_generator.set_state(state["order"])
        self.draw_generator.set_state(state["draw"])

    def batches(self, epoch: int):
        order = torch.randperm(self.ts.pairs.size(0), generator=self.order_generator)
        size = self.settings.batch_size
        for step in range(self.steps_per_epoch):
            yield self.ts.pairs[order[step * size : (step + 1) * size]]  # (B, 2)

    def step(self, batch: torch.Tensor):
        with self.runtime.autocast():
            return batch_loss(
                self.model,
                self.encoder,
                self.criterion,
                self.ts,
                self.graph,
                batch,
                self.settings,
                self.draw_generator,
                self.student,
            )

    def evaluate(self) -> dict[str, float]:
        device = self.runtime.device
        embeddings = full_graph_embeddings(self.model, self.ts, device)
        return dev_metrics(embeddings, self.ts, _dev_queries(self.ts, self.encoder, device), self.settings.similarity)

    def nan_error(self, value: float, epoch: int, step: int) -> LexgraphError:
        return LexgraphError(
            f"train_gnn {self.settings.variant}: the loss became {value} at epoch {epoch}, step {step}; "
            f"lower 'gnn.lr' (now {self.settings.lr}) or raise 'gnn.temperature'"
        )


def build_criterion(settings: GNNSettings) -> torch.nn.Module:
    """The variant's loss: InfoNCE (gdsr, hgraph) or QABISAR's joint loss (question variants)."""
    if settings.uses_questions:
        return QabisarLoss(
            settings.temperature,
            settings.kd_weight,
            settings.kd_mode,
            settings.kd_temperature,
            settings.similarity,
            settings.kd_student_contrastive,
        )
    return InfoNCELoss(settings.temperature, settings.similarity)


def _optimizer(settings: GNNSettings, model: GraphEncoder, encoder) -> torch.optim.Optimizer:
    """AdamW over the GNN (decay on every weight) and, when it is trained, the query encoder
    (DSR's groups: no decay on biases and LayerNorm weights); an untrained encoder is frozen."""
    groups = [ParamGroup(list(model.parameters()), settings.lr, settings.weight_decay, decay_exempt=False)]
    if settings.trains_query_encoder:
        groups.append(
            ParamGroup(list(encoder.parameters()), settings.encoder_lr, settings.weight_decay, decay_exempt=True)
        )
    elif encoder is not None:
        encoder.requires_grad_(False)
    return build_optimizer(
        groups, [model] + ([encoder] if encoder is not None else []), eps=settings.adam_epsilon, foreach=True
    )


def _student(ts: TrainingSet, settings: GNNSettings, encoder, device: torch.device) -> StudentCache | None:
    """The distilled query encoder's cached lower states when only its top blocks train."""
    if not settings.trains_query_encoder or settings.encoder_layers is None:
        return None
    student = StudentCache.build(encoder, ts.train_texts, settings.encoder_layers, device)
    log.info("%s: the query encoder's top %d block(s) train, over cached states", settings.variant, student.layers)
    return student


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
    resume: Resume | None = None,
) -> GNNTrainResult:
    """Train a :class:`GraphEncoder` (and, for a question variant, ``query_encoder``) on ``ts``
    with :func:`lexgraph.training.engine.fit`.

    ``prior_weight``: the hierarchy prior's weight the encoder starts from (``init: prior``);
    ``select=False`` keeps the last epoch whatever ``settings.selection`` says (the refit run,
    whose dev questions are trained on). With ``selection: dev``, before training and after
    each epoch the whole graph is encoded and dev questions are ranked against the articles
    (gdsr/hgraph: fixed DSR dev embeddings; question variants: the current query encoder);
    the epoch with the best dev R@200 wins, the untrained model (epoch 0) included. With
    ``fixed`` the last epoch is kept (dev is still scored, for the report). AdamW (the GNN:
    decay on every weight, G-DSR; the query encoder: DSR's groups, no decay on biases and
    LayerNorm weights), ``settings.schedule``, gradient clipping, mixed precision on CUDA.
    """
    runtime = runtime or Runtime(device)
    device = runtime.device
    questions = settings.uses_questions
    if settings.trains_query_encoder and query_encoder is None:
        raise ConfigError(
            f"{settings.variant} with gnn.{settings.variant}.kd.weight > 0 trains the query encoder: pass one"
        )
    generator = torch.Generator().manual_seed(seed)
    model = GraphEncoder(encoder_for(settings, ts.x.size(1), prior_weight)).to(device)
    log.info(
        "%s graph encoder: %s (%s), %d layer(s), %d head(s), %.2fM parameters",
        settings.variant,
        settings.encoder.model,
        settings.encoder.layer,
        settings.encoder.layers,
        settings.encoder.heads,
        sum(p.numel() for p in model.parameters()) / 1e6,
    )
    encoder = query_encoder.to(device) if (questions and query_encoder is not None) else None
    student = _student(ts, settings, encoder, device)
    criterion = build_criterion(settings)
    optimizer = _optimizer(settings, model, encoder)
    task = GNNTask(ts, settings, model, encoder, criterion, None, generator, runtime, seed)
    task.student = student
    total = task.steps_per_epoch * settings.epochs
    scheduler = build_scheduler(optimizer, settings.schedule, int(settings.warmup_ratio * total), total)
    task.graph = DeviceGraph.on(ts, device)
    input_metrics = dev_metrics(ts.x[: ts.num_articles], ts, ts.dev_queries, settings.similarity)
    if input_metrics:
        log.info("dev %s of the input (DSR) embeddings: %.4f", SELECTION_METRIC, input_metrics[SELECTION_METRIC])
    by_dev = select and settings.selection == "dev"
    fit_config = FitConfig(
        name=settings.variant,
        epochs=settings.epochs,
        steps_per_epoch=task.steps_per_epoch,
        max_grad_norm=settings.max_grad_norm,
        accumulation_steps=settings.accumulation_steps,
        selection_metric=SELECTION_METRIC if by_dev else None,
        select_epoch_zero=by_dev,
        show_progress=show_progress,
    )
    result = fit(task, optimizer, scheduler, fit_config, runtime, resume.next_fit() if resume else None)
    if encoder is not None:
        encoder.eval()
    return GNNTrainResult(
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

"""The ``gnn`` section of params.yaml, resolved for one variant: :class:`GNNSettings`.
The loop is :mod:`lexgraph.methods.gnn.train`.

Variants (``train_gnn --variant``, = the system names):

* ``gdsr``: G-DSR's legislative graph encoder (LGE) as published (Louis, van Dijck &
  Spanakis, EACL 2023);
* ``qabisar``: QABISAR's graph network and distilled query encoder as published
  (Santosh, Sarwat & Grabmair, COLING 2025);
* ``hgraph``: lexgraph's recipe over the statute graph (hierarchy-prior start, article-mean
  headings, residual, ELU, linear schedule, dev epoch selection);
* ``hgraph_qa``: lexgraph's recipe with train questions (per-edge-group convolutions summed,
  cosine, KD at temperature 0.05).

**One rule for the keys.** ``SHARED_KEYS`` are read by every variant with one meaning and
never overridden; every other setting lives in the variant's own mapping ``gnn.<variant>``
(``GRAPH_KEYS`` for every variant, plus ``QUESTION_KEYS`` for the variants whose graph holds
train questions). No key is inert for a variant, so DVC reruns ``train_gnn@<variant>`` only
when a key it reads changes (:meth:`GNNSettings.dvc_params` lists them for dvc.yaml).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from lexgraph.core import layout
from lexgraph.core.settings import (
    Bool,
    Expect,
    Float,
    Int,
    Invalid,
    Settings,
    bad_value,
    params_error,
    read_section,
)
from lexgraph.graph.build import BIPARTITE_TYPES, NUM_EDGE_TYPES, STRUCTURE_TYPES
from lexgraph.methods.gnn.model import (
    ACTIVATIONS,
    INITS,
    LAYERS,
    MAX_LAYERS,
    MODELS,
    PROJECTIONS,
    GraphEncoderConfig,
    architecture_problem,
)

log = logging.getLogger(__name__)

VARIANTS = tuple(layout.GNN)  # the foreach items of train_gnn (core.layout)
QUESTION_VARIANTS = layout.QUESTION_VARIANTS  # their graph holds the train questions

#: read by every variant, with the same meaning (``dropout``: between layers)
SHARED_KEYS = (
    "model",
    "layers",
    "dropout",
    "hard_negatives",
    "adam_epsilon",
    "weight_decay",
    "max_grad_norm",
    "accumulation_steps",
)
#: architecture keys of a variant's mapping (fields of GraphEncoderConfig)
ARCH_KEYS = (
    "layer",
    "hidden",
    "heads",
    "concat_heads",
    "attention_dropout",
    "residual",
    "self_loops",
    "projections",
    "edge_dim",
    "init",
    "activation",
)
KD_KEYS = {
    "kd_weight": "weight",
    "kd_mode": "mode",
    "kd_temperature": "temperature",
    "kd_student_contrastive": "student_contrastive",
}

HEADING_FEATURES = ("articles", "title")
SELECTION_METRIC = "recall@200"  # the dev metric that chooses the epoch (G-DSR)
#: what a graph variant, which reads no question key, holds for them (not settings: nothing reads them)
GRAPH_VARIANT_VALUES: dict[str, Any] = {
    "encoder_lr": 0.0,
    "encoder_layers": None,
    "kd_weight": 0.0,
    "kd_mode": "score",
    "kd_temperature": 1.0,
    "kd_student_contrastive": False,
    "leak_cut": False,
    "bipartite": False,
    "structure": True,
    "edge_attention": "per_group",
}

Positive = Annotated[Float, Field(gt=0)]
NonNegative = Annotated[Float, Field(ge=0)]
Rate = Annotated[Float, Field(ge=0, lt=1)]
Count = Annotated[Int, Field(gt=0)]
Width = Annotated[Int, Field(gt=0)] | None
_LAYERS_WORDS = (
    f"an integer in [1, {MAX_LAYERS}] (one hop per layer: an article's farthest heading is {MAX_LAYERS} hops up "
    f"the hierarchy's {MAX_LAYERS} levels, so a deeper stack adds parameters, not information)"
)


class Distillation(Settings):
    """``gnn.<question variant>.kd``: distilling the graph's scores into the query encoder."""

    weight: Annotated[Float, Field(ge=0, le=1, description="the KD term's share of the loss")]
    mode: Literal["score", "feature"]
    temperature: Positive
    student_contrastive: Bool


class GraphKeys(Settings):
    """A variant's own mapping ``gnn.<variant>`` (every variant's keys)."""

    layer: Literal[LAYERS] = Field(description="stack (G-DSR) | qabisar (QABISAR §2.2)")
    hidden: Width = Field(description="the hidden width (null: the input's)")
    heads: Count
    concat_heads: Bool = Field(description="heads concatenated (hidden / heads each) or averaged (hidden each)")
    attention_dropout: Rate | None = Field(description="on the attention coefficients (null: gnn.dropout)")
    residual: Bool
    self_loops: Bool | None = Field(description="null: without a residual only; with edge_dim, their own edge type")
    projections: Literal[PROJECTIONS] = Field(description="linear: maps around the stack | convolutions: in the convs")
    edge_dim: Width = Field(description="the edge-type vectors' width (null: no edge-type features)")
    init: Literal[INITS]
    activation: Literal[tuple(ACTIVATIONS)] = Field(description="between layers (relu: G-DSR's public code)")
    heading_features: Literal[HEADING_FEATURES] = Field(
        description="articles (mean of the articles under the heading) | title (its DSR encoding)"
    )
    normalize_features: Bool = Field(description="L2-normalise the node features (lexgraph's)")
    synthetic: Bool = Field(description="train on the synthetic queries of generate_queries too (G-DSR's)")
    batch_size: Count = Field(description="(question, gold article) pairs per step")
    lr: Positive
    schedule: Literal["constant", "linear"] = Field(description="constant | linear (warm-up then linear decay)")
    warmup_ratio: Rate
    epochs: Count
    selection: Literal["dev", "fixed"] = Field(description="dev: the epoch with the best dev R@200 | fixed: the last")
    similarity: Literal["cosine", "dot"]
    temperature: Positive
    refit: Bool = Field(description="retrain on train+dev (G-DSR appendix B)")

    @classmethod
    def unknown_hint(cls, keys: list[str]) -> str | None:
        return " (a shared key: set it once under 'gnn')" if set(map(str, keys)) & set(SHARED_KEYS) else None

    @model_validator(mode="after")
    def _warmup_needs_a_schedule(self) -> GraphKeys:
        if self.schedule == "constant" and self.warmup_ratio:
            raise Invalid("warmup_ratio", self.warmup_ratio, "0 with schedule: constant (no warm-up)")
        return self


class QuestionKeys(GraphKeys):
    """A question variant's own mapping (its graph holds the train questions)."""

    synthetic: Annotated[Literal[False], Expect("false: a question variant's graph holds the train questions only")]
    refit: Annotated[Literal[False], Expect("false: a question variant's graph holds train questions only")]
    edge_attention: Literal["joint", "per_group"]
    encoder_lr: Positive
    encoder_layers: Annotated[Int, Field(ge=1)] | None = Field(
        description="the query encoder's top N blocks train in the distillation (null: those the DSR trained)"
    )
    kd: Distillation
    leak_cut: Bool = Field(description="a positive never hears its own question's message (lexgraph's label-leak cut)")
    bipartite: Bool
    structure: Bool


class GnnSection(Settings):
    """The ``gnn`` section: the shared keys, then one mapping per variant."""

    model: Literal[MODELS]
    layers: Annotated[Int, Field(ge=1, le=MAX_LAYERS), Expect(_LAYERS_WORDS)]
    dropout: Rate = Field(description="between layers")
    hard_negatives: Annotated[Int, Field(ge=0)]
    adam_epsilon: Positive
    weight_decay: NonNegative
    max_grad_norm: Positive
    accumulation_steps: Count = Field(description="micro-batches per batch and process (lexgraph.training.engine)")
    gdsr: GraphKeys
    qabisar: QuestionKeys
    hgraph: GraphKeys
    hgraph_qa: QuestionKeys

    @model_validator(mode="after")
    def _architectures(self) -> GnnSection:
        for variant in VARIANTS:
            problem = architecture_problem(self.encoder(variant))
            if problem is not None:
                key, value, expected = problem
                raise Invalid(key if key in SHARED_KEYS else f"{variant}.{key}", value, expected)
        return self

    def encoder(self, variant: str) -> GraphEncoderConfig:
        """``variant``'s architecture (its width comes with the data: ``with_input``)."""
        own = getattr(self, variant)
        if variant not in QUESTION_VARIANTS:
            groups: tuple[tuple[int, ...], ...] = (tuple(int(t) for t in STRUCTURE_TYPES),)
        elif own.edge_attention == "joint":
            groups = (tuple(range(NUM_EDGE_TYPES)),)
        else:
            groups = (tuple(int(t) for t in STRUCTURE_TYPES), tuple(int(t) for t in BIPARTITE_TYPES))
        arch = {k: getattr(own, k) for k in ARCH_KEYS}
        return GraphEncoderConfig(
            in_dim=None, model=self.model, layers=self.layers, dropout=self.dropout, edge_groups=groups, **arch
        )

    def resolve(self, variant: str) -> GNNSettings:
        """The settings ``train_gnn@<variant>`` trains with: the shared keys and its own mapping, flat."""
        own = getattr(self, variant)
        shared = {k: getattr(self, k) for k in SHARED_KEYS if k not in ("model", "layers", "dropout")}
        values = {k: getattr(own, k) for k in GraphKeys.model_fields if k not in ARCH_KEYS}
        if variant in QUESTION_VARIANTS:
            values.update({k: getattr(own, k) for k in QuestionKeys.model_fields if k not in GraphKeys.model_fields})
            kd = values.pop("kd")
            values.update({f"kd_{k}": getattr(kd, k) for k in Distillation.model_fields})
        else:
            values.update(GRAPH_VARIANT_VALUES)
        return GNNSettings(variant=variant, encoder=self.encoder(variant), **shared, **values)


@dataclass(frozen=True)
class GNNSettings:
    """The ``gnn`` section resolved for one variant (:meth:`GnnSection.resolve`; checked there)."""

    variant: str
    encoder: GraphEncoderConfig  # gnn.model, gnn.layers, gnn.dropout and gnn.<variant>'s ARCH_KEYS
    heading_features: str
    normalize_features: bool
    synthetic: bool
    hard_negatives: int
    batch_size: int
    lr: float
    adam_epsilon: float
    schedule: str
    warmup_ratio: float
    weight_decay: float
    max_grad_norm: float
    accumulation_steps: int
    epochs: int
    selection: str
    similarity: str
    temperature: float
    refit: bool
    encoder_lr: float
    encoder_layers: int | None
    kd_weight: float
    kd_mode: str
    kd_temperature: float
    kd_student_contrastive: bool
    leak_cut: bool
    bipartite: bool
    structure: bool
    edge_attention: str

    @staticmethod
    def keys(variant: str) -> tuple[str, ...]:
        """The keys of ``gnn.<variant>``."""
        return tuple((QuestionKeys if variant in QUESTION_VARIANTS else GraphKeys).model_fields)

    @staticmethod
    def dvc_params(variant: str) -> list[str]:
        """What ``train_gnn@<variant>`` reads: dvc.yaml's params list (``base`` + each shared key +
        the variant's mapping)."""
        return ["base", *(f"gnn.{k}" for k in SHARED_KEYS), f"gnn.{variant}"]

    @classmethod
    def from_params(cls, params: dict[str, Any], variant: str) -> GNNSettings:
        """Read ``params`` (the ``gnn`` section) for ``variant``."""
        if variant not in VARIANTS:
            raise params_error(f"unknown 'gnn' variant {variant!r}, expected one of {', '.join(VARIANTS)}")
        return read_section(GnnSection, params, "gnn").resolve(variant)

    @classmethod
    def per_variant(cls, params: dict[str, Any]) -> dict[str, GNNSettings]:
        """``{variant: settings}`` of the ``gnn`` section for every variant (what the
        ``train_gnn`` stage checks before any work, whichever variant it runs)."""
        section = read_section(GnnSection, params, "gnn")
        return {variant: section.resolve(variant) for variant in VARIANTS}

    def to_dict(self) -> dict[str, Any]:
        """The settings, flat, for the model's ``gnn.json`` (the architecture keys inline)."""
        values = asdict(self)
        encoder = values.pop("encoder")
        arch = {k: encoder[k] for k in ("model", "layers", "dropout", *ARCH_KEYS)}
        if self.variant not in QUESTION_VARIANTS:
            for key in GRAPH_VARIANT_VALUES:
                values.pop(key)
        return {"variant": values.pop("variant"), **arch, **values}

    @property
    def uses_questions(self) -> bool:
        """The graph holds train questions and their edges (qabisar, hgraph_qa)."""
        return self.variant in QUESTION_VARIANTS

    @property
    def trains_query_encoder(self) -> bool:
        return self.uses_questions and self.kd_weight > 0


def encoder_for(settings: GNNSettings, width: int, prior_weight: float = 0.0) -> GraphEncoderConfig:
    """``settings``' architecture for ``width``-dimensional node features (the embed stage's), whose
    width the rules of :func:`~lexgraph.methods.gnn.model.architecture_problem` are checked on."""
    encoder = settings.encoder.with_input(width, prior_weight)
    problem = architecture_problem(encoder)
    if problem is not None:
        key, value, expected = problem
        where = key if key in SHARED_KEYS else f"{settings.variant}.{key}"
        raise bad_value("gnn", where, value, f"{expected} (the node features are {width}-dimensional)")
    return encoder

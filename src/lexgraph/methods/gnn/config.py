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
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from lexgraph.core import layout
from lexgraph.core.config import params_error, section_config
from lexgraph.core.errors import ConfigError
from lexgraph.graph.build import BIPARTITE_TYPES, NUM_EDGE_TYPES, STRUCTURE_TYPES
from lexgraph.methods.gnn.model import GraphEncoderConfig

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
#: every variant's own mapping
GRAPH_KEYS = (
    *ARCH_KEYS,
    "heading_features",
    "normalize_features",
    "synthetic",
    "batch_size",
    "lr",
    "schedule",
    "warmup_ratio",
    "epochs",
    "selection",
    "similarity",
    "temperature",
    "refit",
)
#: the question variants' mapping adds
QUESTION_KEYS = ("edge_attention", "encoder_lr", "encoder_layers", "kd", "leak_cut", "bipartite", "structure")
KD_KEYS = {
    "kd_weight": "weight",
    "kd_mode": "mode",
    "kd_temperature": "temperature",
    "kd_student_contrastive": "student_contrastive",
}

HEADING_FEATURES = ("articles", "title")
SIMILARITIES = ("cosine", "dot")
SCHEDULES = ("constant", "linear")
SELECTIONS = ("dev", "fixed")  # dev: the epoch with the best dev R@200 (epoch 0 included) | fixed: the last
EDGE_ATTENTION = ("joint", "per_group")
SELECTION_METRIC = "recall@200"  # the dev metric that chooses the epoch (G-DSR)


def _own(key: str) -> str:
    """Where a key of the variant's own mapping lives: ``gnn.<variant>.<key>``."""
    return "{variant}." + key


def _question(key: str, unread: Any) -> dict[str, Any]:
    """A question variant's key (``gnn.<variant>.<key>``); the value a graph variant, which reads
    no such key, holds (not a setting: nothing reads it)."""
    return {"key": _own(key), "variants": QUESTION_VARIANTS, "unread": unread}


def _edge_groups(variant: str, values: dict[str, Any]) -> dict[str, Any]:
    """The architecture's edge groups for ``variant``: one group of statute edges (graph variants),
    or the statute and question-article edges attended jointly (one convolution over all edge
    types) or per group (a convolution per group, summed); the width comes with the data."""
    if variant not in QUESTION_VARIANTS:
        groups: tuple[tuple[int, ...], ...] = (tuple(int(t) for t in STRUCTURE_TYPES),)
    elif values[variant].get("edge_attention") == "joint":
        groups = (tuple(range(NUM_EDGE_TYPES)),)
    else:
        groups = (tuple(int(t) for t in STRUCTURE_TYPES), tuple(int(t) for t in BIPARTITE_TYPES))
    return {"in_dim": None, "edge_groups": groups}


@dataclass(frozen=True)
class GNNSettings:
    """The ``gnn`` section of params.yaml, resolved for one variant (read by
    :func:`lexgraph.core.config.section_config`: each field's metadata says where its key lives)."""

    VARIANTS = VARIANTS  # the per-variant mappings (not a field: no annotation)

    variant: str
    # gnn.model, gnn.layers, gnn.dropout and gnn.<variant>'s ARCH_KEYS
    encoder: GraphEncoderConfig = field(
        metadata={
            "keys": {"model": "model", "layers": "layers", "dropout": "dropout", **{k: _own(k) for k in ARCH_KEYS}},
            "extra": _edge_groups,
        }
    )
    # articles (mean of the articles under the heading) | title (its DSR encoding)
    heading_features: str = field(metadata={"key": _own("heading_features")})
    # L2-normalise the node features (lexgraph's) | the embed stage's vectors as they are
    normalize_features: bool = field(metadata={"key": _own("normalize_features")})
    # train on the train questions and the synthetic queries of generate_queries (G-DSR's augmented set)
    synthetic: bool = field(metadata={"key": _own("synthetic")})
    hard_negatives: int
    batch_size: int = field(metadata={"key": _own("batch_size")})  # (question, gold article) pairs per step
    lr: float = field(metadata={"key": _own("lr")})
    adam_epsilon: float
    schedule: str = field(metadata={"key": _own("schedule")})  # constant | linear (warm-up then linear decay)
    warmup_ratio: float = field(metadata={"key": _own("warmup_ratio")})
    weight_decay: float
    max_grad_norm: float
    accumulation_steps: int  # micro-batches per batch and process (lexgraph.training.engine)
    epochs: int = field(metadata={"key": _own("epochs")})
    selection: str = field(metadata={"key": _own("selection")})  # dev | fixed
    similarity: str = field(metadata={"key": _own("similarity")})  # cosine | dot (QABISAR's)
    temperature: float = field(metadata={"key": _own("temperature")})
    refit: bool = field(metadata={"key": _own("refit")})  # retrain on train+dev (G-DSR appendix B)
    encoder_lr: float = field(metadata=_question("encoder_lr", 0.0))
    # the query encoder's top N blocks train in the distillation (None: those the DSR trained)
    encoder_layers: int | None = field(metadata=_question("encoder_layers", None))
    kd_weight: float = field(metadata=_question("kd.weight", 0.0))
    kd_mode: str = field(metadata=_question("kd.mode", "score"))
    kd_temperature: float = field(metadata=_question("kd.temperature", 1.0))
    kd_student_contrastive: bool = field(metadata=_question("kd.student_contrastive", False))
    # a positive never hears its own question's message in training (lexgraph's label-leak cut)
    leak_cut: bool = field(metadata=_question("leak_cut", False))
    bipartite: bool = field(metadata=_question("bipartite", False))
    structure: bool = field(metadata=_question("structure", True))
    edge_attention: str = field(metadata=_question("edge_attention", "per_group"))

    @staticmethod
    def keys(variant: str) -> tuple[str, ...]:
        """The keys of ``gnn.<variant>``."""
        return GRAPH_KEYS + (QUESTION_KEYS if variant in QUESTION_VARIANTS else ())

    @staticmethod
    def dvc_params(variant: str) -> list[str]:
        """What ``train_gnn@<variant>`` reads: dvc.yaml's params list (``base`` + each shared key +
        the variant's mapping)."""
        return ["base", *(f"gnn.{k}" for k in SHARED_KEYS), f"gnn.{variant}"]

    @classmethod
    def from_params(cls, params: dict[str, Any], variant: str) -> GNNSettings:
        """Read ``params`` (the ``gnn`` section) for ``variant``."""
        return section_config(cls, params, "gnn", variant)

    @classmethod
    def per_variant(cls, params: dict[str, Any]) -> dict[str, GNNSettings]:
        """``{variant: settings}`` of the ``gnn`` section for every variant (what the
        ``train_gnn`` stage checks before any work, whichever variant it runs)."""
        return {variant: cls.from_params(params, variant) for variant in VARIANTS}

    def validate(self) -> None:
        v = self.variant

        def bad(key: str, value: Any, expected: str) -> ConfigError:
            shared = key in SHARED_KEYS
            return params_error(f"'gnn.{key if shared else f'{v}.{key}'}' = {value!r}, expected {expected}")

        for key, low in (("hard_negatives", 0), ("batch_size", 1), ("epochs", 1), ("accumulation_steps", 1)):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise bad(key, value, f"an integer >= {low}")
        positive = ["lr", "temperature", "max_grad_norm", "adam_epsilon"]
        positive += ["encoder_lr", "kd_temperature"] if v in QUESTION_VARIANTS else []
        for key in positive:
            value = getattr(self, key)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
                raise bad(key.replace("kd_", "kd."), value, "a positive number")
        if not isinstance(self.weight_decay, (int, float)) or not 0 <= self.weight_decay < math.inf:
            raise bad("weight_decay", self.weight_decay, "a number >= 0")
        if not isinstance(self.warmup_ratio, (int, float)) or not 0.0 <= self.warmup_ratio < 1.0:
            raise bad("warmup_ratio", self.warmup_ratio, "a number in [0, 1)")
        if self.schedule == "constant" and self.warmup_ratio:
            raise bad("warmup_ratio", self.warmup_ratio, f"0 with 'gnn.{v}.schedule: constant' (no warm-up)")
        for key, choices in (
            ("heading_features", HEADING_FEATURES),
            ("similarity", SIMILARITIES),
            ("schedule", SCHEDULES),
            ("selection", SELECTIONS),
            ("kd_mode", ("score", "feature")),
            ("edge_attention", EDGE_ATTENTION),
        ):
            if getattr(self, key) not in choices:
                raise bad(key.replace("kd_", "kd."), getattr(self, key), " or ".join(choices))
        if not isinstance(self.kd_weight, (int, float)) or not 0.0 <= self.kd_weight <= 1.0:
            raise bad("kd.weight", self.kd_weight, "a number in [0, 1]")
        if self.encoder_layers is not None and self.encoder_layers < 1:  # the type: conform, from the annotation
            raise bad("encoder_layers", self.encoder_layers, "null or an integer >= 1")
        if self.synthetic and v in QUESTION_VARIANTS:
            raise bad("synthetic", self.synthetic, "false: a question variant's graph holds the train questions only")
        for key in ("bipartite", "structure", "refit", "kd_student_contrastive", "normalize_features"):
            if not isinstance(getattr(self, key), bool):
                raise bad(key.replace("kd_", "kd."), getattr(self, key), "true or false")
        if self.refit and v in QUESTION_VARIANTS:
            raise bad("refit", self.refit, "false: a question variant's graph holds train questions only")

    def to_dict(self) -> dict[str, Any]:
        """The settings, flat, for the model's ``gnn.json`` (the architecture keys inline)."""
        values = asdict(self)
        encoder = values.pop("encoder")
        arch = {k: encoder[k] for k in ("model", "layers", "dropout", *ARCH_KEYS)}
        if self.variant not in QUESTION_VARIANTS:
            for key in (
                *KD_KEYS,
                *("encoder_lr", "encoder_layers", "leak_cut", "bipartite", "structure", "edge_attention"),
            ):
                values.pop(key)
        return {"variant": values.pop("variant"), **arch, **values}

    @property
    def uses_questions(self) -> bool:
        """The graph holds train questions and their edges (qabisar, hgraph_qa)."""
        return self.variant in QUESTION_VARIANTS

    @property
    def trains_query_encoder(self) -> bool:
        return self.uses_questions and self.kd_weight > 0

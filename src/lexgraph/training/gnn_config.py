"""The ``gnn`` section of params.yaml, resolved for one variant (``lge`` = G-DSR's LGE,
``qabisar``): :class:`GNNSettings`. The loop is :mod:`lexgraph.training.gnn`."""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from typing import Any


from lexgraph.config import check_types, params_error
from lexgraph.errors import ConfigError
from lexgraph.graph import BIPARTITE_TYPES, STRUCTURE_TYPES
from lexgraph.models.gnn import GraphEncoderConfig

log = logging.getLogger(__name__)

VARIANTS = ("lge", "qabisar")
ARCH_KEYS = ("model", "layers", "hidden", "heads", "concat_heads", "dropout", "residual", "edge_dim", "init")
HEADING_FEATURES = ("articles", "title")
SIMILARITIES = ("cosine", "dot")
SELECTION_METRIC = "recall@200"  # the dev metric that chooses the epoch (G-DSR)

# ---------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GNNSettings:
    """The ``gnn`` section of params.yaml, resolved for one variant."""

    variant: str
    encoder: GraphEncoderConfig  # the architecture keys (gnn.model … gnn.init, with gnn.<variant>'s
    #                              overrides); in_dim and the prior weight are set when training starts
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
        scalar = {f for f in cls.__dataclass_fields__ if f not in ("variant", "encoder", "epochs", *kd_fields)}
        scalar |= set(ARCH_KEYS)
        allowed = scalar | {"epochs_lge", "epochs_qabisar", "kd", *VARIANTS}
        unknown = sorted(set(params) - allowed, key=str)
        if unknown:
            raise params_error(f"unknown keys {', '.join(repr(f'gnn.{k}') for k in unknown)}; "
                              f"expected keys of 'gnn': {', '.join(sorted(allowed))}")
        values: dict[str, Any] = {k: params[k] for k in scalar if k in params}
        for name in VARIANTS:  # the per-variant override mappings are part of the section ({} for none)
            if name not in params:
                raise params_error(f"missing key 'gnn.{name}', expected a mapping of architecture "
                                  f"overrides for {name} ({{}} for none)")
        override = params.get(variant) or {}
        if not isinstance(override, dict) or set(override) - set(ARCH_KEYS):
            raise params_error(f"'gnn.{variant}' overrides architecture keys only ({', '.join(ARCH_KEYS)}); "
                f"got {override!r}"
            )
        values.update(override)
        epochs_key = f"epochs_{variant}"
        if epochs_key not in params:
            raise params_error(f"missing key 'gnn.{epochs_key}'")
        values["epochs"] = params[epochs_key]
        if "kd" not in params:
            raise params_error("missing key 'gnn.kd', expected a mapping of the distillation settings "
                              "(weight, mode, temperature, student_contrastive)")
        kd = params["kd"] or {}
        if not isinstance(kd, dict) or set(kd) - set(kd_fields.values()):
            raise params_error(f"'gnn.kd' = {kd!r}, expected a mapping with "
                              f"{', '.join(repr(k) for k in kd_fields.values())}")
        values.update({field_: kd[key] for field_, key in kd_fields.items() if key in kd})
        missing = sorted((set(cls.__dataclass_fields__) - {"variant", "encoder"} | set(ARCH_KEYS)) - set(values))
        if missing:
            names = {**{f: f"kd.{k}" for f, k in kd_fields.items()}, "epochs": epochs_key}
            raise params_error(f"missing key(s) {', '.join(repr('gnn.' + names.get(m, m)) for m in missing)}")
        names = {"epochs": epochs_key, **{f: f"kd.{k}" for f, k in kd_fields.items()},
                 **{key: f"{variant}.{key}" for key in override}}
        arch = check_types(GraphEncoderConfig, {k: values.pop(k) for k in ARCH_KEYS}, "gnn", names)
        values = check_types(cls, values, "gnn", names)
        groups = (tuple(int(t) for t in STRUCTURE_TYPES),)
        if variant == "qabisar":  # QABISAR's question-article edges get their own convolutions
            groups += (tuple(int(t) for t in BIPARTITE_TYPES),)
        try:  # architecture errors now, not after the data is loaded (the width is checked then)
            encoder = GraphEncoderConfig(in_dim=None, **arch, edge_groups=groups)
        except ConfigError as exc:
            if override:
                raise ConfigError(f"{exc} (with the overrides of 'gnn.{variant}': {override})") from None
            raise
        settings = cls(variant=variant, encoder=encoder, **values)
        settings.validate()
        return settings

    @classmethod
    def per_variant(cls, params: dict[str, Any]) -> dict[str, "GNNSettings"]:
        """``{variant: settings}`` of the ``gnn`` section for every variant (what the
        ``train_gnn`` stage checks before any work, whichever variant it runs)."""
        return {variant: cls.from_params(params, variant) for variant in VARIANTS}

    def validate(self) -> None:
        def bad(key: str, value: Any, expected: str) -> ConfigError:
            return params_error(f"'gnn.{key}' = {value!r}, expected {expected}")

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
        for key in ("bipartite", "structure", "refit", "kd_student_contrastive"):
            if not isinstance(getattr(self, key), bool):
                raise bad(key.replace("kd_", "kd."), getattr(self, key), "true or false")

    def to_dict(self) -> dict[str, Any]:
        """The settings as params.yaml spells them, flat (the architecture keys inline, as
        ``gnn`` writes them), for the model's ``gnn.json``."""
        values = asdict(self)
        encoder = values.pop("encoder")
        return {"variant": values.pop("variant"), **{k: encoder[k] for k in ARCH_KEYS}, **values}

    @property
    def trains_query_encoder(self) -> bool:
        return self.variant == "qabisar" and self.kd_weight > 0

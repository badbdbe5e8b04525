"""The ``rerank`` section of params.yaml (MVCL, :mod:`lexgraph.training.rerank`) and the
re-ranker's artefact names."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any


from lexgraph.config import SYSTEM_NAMES, bad_value, expectation, refuse_held_out, section_config
from lexgraph.elements import PATTERNS
from lexgraph.metrics import METRICS

log = logging.getLogger(__name__)

#: Where MVCL's word-level attention is computed (``rerank.alignment``; the
#: ``InteractionModel`` of :mod:`lexgraph.models.mvcl`).
ALIGNMENTS = ("plm", "projected")

SECTION = "rerank"
SYSTEM = "mvcl"
WEIGHTS = "mvcl.safetensors"
SETTINGS = "mvcl.json"
#: what ``models/mvcl/mvcl.json`` is, and how to get it back: the words of its readers' errors
SETTINGS_WHAT = "the MVCL settings the rerank stage writes"
RESTORE = "rerun `dvc repro rerank` (or `dvc checkout`) to restore it"


def _first_stages() -> tuple[str, ...]:
    return tuple(s for s in SYSTEM_NAMES if s != SYSTEM)


@dataclass(frozen=True)
class RerankConfig:
    """The ``rerank`` section of params.yaml."""

    enabled: bool = True  # false: encode_rerank and rerank write placeholders in seconds and evaluate skips mvcl
    first_stage: str = field(default="hybrid", metadata={"expected": "a retrieval system other than mvcl (bm25, zeroshot, dsr, hprior, gdsr, qabisar, hgraph, hgraph_qa, hybrid)"})
    k: int = field(default=100, metadata={"expected": "an integer >= 2 (articles re-ranked per question)"})
    max_query_length: int = field(default=64, metadata={"expected": "an integer >= 8"})
    max_article_length: int = field(default=128, metadata={"expected": "an integer >= 8"})
    encode_batch_size: int = field(default=32, metadata={"expected": "a positive integer"})
    hidden: int = field(default=64, metadata={"expected": "an even positive integer"})
    dropout: float = field(default=0.1, metadata={"expected": "a number in [0, 1)"})
    alignment: str = field(default="plm", metadata={"expected": "plm (word-level attention on the PLM's states) or projected (on the learned projection)"})
    align_temperature: float = field(default=0.05, metadata={"expected": "a number > 0 (cosine / temperature of the plm alignment)"})
    match_features: bool = True  # H_{a,b} ends with the PLM's alignment scores (MaxSim both ways, mean cosine)
    warm_start: bool = True  # untrained network = MaxSim ranking (needs match_features); epoch 0 can be kept
    negatives: int = field(default=1, metadata={"expected": "a positive integer (C- per question and gold article per epoch)"})
    swap: bool = True
    lambda_case: float = field(default=0.01, metadata={"expected": "a number >= 0"})
    lambda_ele: float = field(default=0.01, metadata={"expected": "a number >= 0"})
    t1: float = field(default=0.1, metadata={"expected": "a number > 0 (case-view temperature)"})
    t2: float = field(default=0.1, metadata={"expected": "a number > 0 (element-view temperature)"})
    element_patterns: list[str] = field(default_factory=lambda: list(PATTERNS),
                                        metadata={"expected": f"a non-empty list of distinct pattern families among {', '.join(PATTERNS)}"})
    element_budget: int = field(default=32, metadata={"expected": "a positive integer (L1: at most this many tokens of non-element sentences deleted in an element view)"})
    del_token: str = field(default="<mask>", metadata={"expected": "a token of the base encoder's vocabulary"})
    epochs: int = field(default=5, metadata={"expected": "a positive integer"})
    batch_size: int = field(default=16, metadata={"expected": "a positive integer (triples per step)"})
    lr: float = field(default=0.0003, metadata={"expected": "a number > 0"})
    warmup_ratio: float = field(default=0.1, metadata={"expected": "a number in [0, 1)"})
    weight_decay: float = field(default=0.01, metadata={"expected": "a number >= 0"})
    max_grad_norm: float = field(default=1.0, metadata={"expected": "a number > 0"})
    split: str = field(default="dev", metadata={"expected": "dev (the split that chooses the epoch and alpha)"})
    metric: str = field(default="map", metadata={"expected": f"one of {', '.join(METRICS)}"})
    interpolation: list[float] = field(default_factory=lambda: [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
                                       metadata={"expected": "a non-empty list of distinct numbers in [0, 1] (the re-ranker's weight)"})
    eval_batch_size: int = field(default=128, metadata={"expected": "a positive integer"})

    @classmethod
    def from_params(cls, params: dict[str, Any] | None) -> "RerankConfig":
        return section_config(cls, params, SECTION)

    def validate(self) -> None:
        def bad(key: str) -> Exception:
            return bad_value(SECTION, key, getattr(self, key), expectation(RerankConfig, key))

        refuse_held_out(SECTION, "split", self.split, expectation(RerankConfig, "split"))
        if self.first_stage not in _first_stages():
            raise bad("first_stage")
        if self.k < 2:
            raise bad("k")
        for key in ("max_query_length", "max_article_length"):
            if getattr(self, key) < 8:
                raise bad(key)
        for key in ("element_budget", "encode_batch_size", "negatives", "epochs", "batch_size", "eval_batch_size"):
            if getattr(self, key) < 1:
                raise bad(key)
        if self.hidden < 2 or self.hidden % 2:
            raise bad("hidden")
        if not 0.0 <= self.dropout < 1.0:
            raise bad("dropout")
        for key in ("lambda_case", "lambda_ele", "weight_decay"):
            if getattr(self, key) < 0:
                raise bad(key)
        if self.alignment not in ALIGNMENTS:
            raise bad("alignment")
        for key in ("t1", "t2", "lr", "max_grad_norm", "align_temperature"):
            if getattr(self, key) <= 0:
                raise bad(key)
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise bad("warmup_ratio")
        pats = self.element_patterns
        if not pats or any(p not in PATTERNS for p in pats) or len(set(pats)) < len(pats):
            raise bad("element_patterns")
        if not self.del_token.strip():
            raise bad("del_token")
        if self.split not in ("dev", "train"):
            raise bad("split")
        if self.metric not in METRICS:
            raise bad("metric")
        a = self.interpolation
        if not a or any(not 0.0 <= x <= 1.0 for x in a) or len(set(a)) < len(a):
            raise bad("interpolation")

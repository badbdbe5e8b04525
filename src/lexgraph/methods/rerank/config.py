"""The ``rerank`` section of params.yaml (the re-rankers ``mvcl`` and ``xrerank``,
:mod:`lexgraph.methods.rerank.train`) and the re-rankers' artefact names.

The section follows the params rule of variant sections: **shared keys** at its top,
read by both re-rankers and never overridden, and one mapping per re-ranker
(``rerank.mvcl``, ``rerank.xrerank``) holding every key that differs between them
(:data:`VARIANT_KEYS`). A key that a re-ranker would not read is refused rather than
ignored (``plm_lr`` and ``plm_layers`` with a frozen PLM, ``align_temperature`` without the cosine
alignment, ``warm_start`` without match features, ``interpolation`` without fusion), so that no key
is ever inert for a re-ranker and DVC (which tracks ``rerank.<variant>`` whole and each
shared key) reruns a re-ranker only when something it reads changed.

* ``mvcl``: MVCL as published (Wang, IJCNN 2022): the PLM fine-tuned (§IV-C), word-level
  alignment ``e = h_a . h_b / sqrt(d)`` on the PLM's states and the strengthening on those
  states themselves (``projection: false``, eq. 2-4), eq. 6's attention pooling
  (``pooling: eq6``), inputs truncated "from the front" (``truncation: left``), the epoch chosen
  by the pairwise accuracy on dev (``metric: accuracy``), 5.5 epochs, the re-ranked list alone,
  ordered by the sum of each candidate's probabilities in all its pairs (``ranking: probability``,
  the paper's Appendix B); on the sample only the PLM's top 2 blocks train (``plm_layers: 2``, the
  sample's budget rule; the paper profile: ``null``, every weight).
* ``xrerank``: lexgraph's recipe: the PLM frozen with cached states, every state projected to
  ``hidden`` (``projection: true``), cosine / temperature alignment, the MaxSim warm start and
  match features, tanh pooling, the first tokens kept (``truncation: right``), fused with the
  first stage at the alpha chosen on dev by ``metric`` (map); its candidates scored by their mean
  logit margin (``ranking: margin``, lexgraph's rule).

``truncation``: MVCL §IV-C says that texts beyond 512 tokens "will be truncated from the front"
(the indicator) and that "the documents longer than 512 tokens are truncated from the front"
(the matching part). lexgraph reads "from the front" as Hugging Face's ``truncation_side='left'``:
the tokens at the front are dropped and the end is kept (``left``; a text prefix such as E5's
``passage: `` and the special tokens stay). The other reading, the text kept from its front
and cut at the limit (its first tokens kept), is ``right`` (today's, xrerank's). ``epochs`` may be
fractional: ``round(epochs * steps per epoch)`` optimizer steps in all, the last epoch partial
(MVCL: "3500 (about 5.5 epochs) iterations", lexgraph's budget rule keeps the 5.5 passes).
``metric: accuracy`` is the classifier's pairwise accuracy on dev triples (MVCL §IV-C: "best
model is selected in the training process according to the accuracy measure on the validation
set"); any other metric is an IR metric of the re-ranked (and, with fusion, fused) dev lists.

``ranking`` (:data:`lexgraph.methods.rerank.model.RANKINGS`) turns the pairwise classifier's round robin
over a list into one score per candidate: ``probability``, MVCL's Appendix B ("We could sum the
probabilities of a candidate in all pairs and rank candidates according to their summations of
probabilities"), or ``margin``, lexgraph's mean logit margin. Either reads with every other
setting (with fusion the scores are z-normalised, with ``warm_start`` both rank the untrained
network's list by MaxSim), so no combination is refused.

``plm_layers`` (read with ``plm: finetune`` only): ``null``, every weight of the PLM trains (MVCL
§IV-C); ``N``, only its top ``N`` transformer blocks train (the embeddings and the blocks below
frozen), the sample's budget rule for a method that fine-tunes a PLM (as QABISAR's
``gnn.<variant>.encoder_layers``): the token states entering the top blocks are computed once per
article and question (eval mode) and cached in memory, a step runs the top blocks alone
(:mod:`lexgraph.methods.rerank.plm`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import Any

from lexgraph.core import layout
from lexgraph.core.config import bad_value, expectation, params_error, refuse_held_out, section_config
from lexgraph.methods.rerank.features import TRUNCATIONS
from lexgraph.methods.rerank.model import ALIGNMENTS, POOLINGS, RANKINGS
from lexgraph.metrics.ir import METRICS
from lexgraph.text.elements import PATTERNS

log = logging.getLogger(__name__)

#: The re-rankers, in the registry's order: each is a foreach item of the ``rerank`` stage (core.layout).
VARIANTS = tuple(layout.RERANKERS)
PLM_MODES = ("frozen", "finetune")
#: the classifier's pairwise accuracy on dev triples (MVCL §IV-C), a selection metric beside the IR ones
ACCURACY = "accuracy"
SELECTION_METRICS = (*METRICS, ACCURACY)
CHOICES = {
    "plm": PLM_MODES,
    "alignment": ALIGNMENTS,
    "pooling": POOLINGS,
    "truncation": TRUNCATIONS,
    "metric": SELECTION_METRICS,
    "ranking": RANKINGS,
}

SECTION = "rerank"
WEIGHTS = "mvcl.safetensors"
SETTINGS = "mvcl.json"
PLM_DIR = "plm"  # the fine-tuned PLM inside models/<variant>/ (plm: finetune)
#: what ``models/<variant>/mvcl.json`` is: the words of its readers' errors (the remedy: ``layout.restore_hint``)
SETTINGS_WHAT = "the re-ranker settings the rerank stage writes"

#: the keys of ``rerank.<variant>``; every other key of :class:`RerankConfig` (but ``variant``) is shared
VARIANT_KEYS = (
    "enabled",
    "plm",
    "plm_lr",
    "plm_layers",
    "max_query_length",
    "max_article_length",
    "truncation",
    "projection",
    "alignment",
    "align_temperature",
    "pooling",
    "match_features",
    "warm_start",
    "fusion",
    "interpolation",
    "ranking",
    "lr",
    "weight_decay",
    "epochs",
    "metric",
)
#: variant keys read only under a condition: key -> (the key it depends on, the value that makes it read)
CONDITIONAL = {
    "plm_lr": ("plm", "finetune"),
    "plm_layers": ("plm", "finetune"),
    "align_temperature": ("alignment", "cosine"),
    "warm_start": ("match_features", True),
    "interpolation": ("fusion", True),
}
#: the value a conditional key takes when it is not read (not a setting: nothing reads it)
UNREAD = {"plm_lr": None, "plm_layers": None, "align_temperature": None, "warm_start": False, "interpolation": [1.0]}
#: the keys the encode_rerank stage reads (it caches the frozen PLM's states for xrerank)
ENCODE_KEYS = (
    "xrerank.enabled",
    "xrerank.max_query_length",
    "xrerank.max_article_length",
    "encode_batch_size",
    "element_patterns",
    "element_budget",
    "del_token",
    "split",
)


def _own(name: str, expected: str, **more: Any) -> dict[str, Any]:
    """The metadata of key ``name`` of ``rerank.<variant>`` (``more``: its ``choices``); a key of
    :data:`CONDITIONAL` is read under its condition only, and is :data:`UNREAD`'s value elsewhere."""
    if name in CONDITIONAL:
        more = {**more, "read_with": CONDITIONAL[name], "unread": UNREAD[name]}
    return {"key": "{variant}." + name, "expected": expected, **more}


@dataclass(frozen=True)
class RerankConfig:
    """The ``rerank`` section of params.yaml resolved for one re-ranker (``variant``), read by
    :func:`lexgraph.core.config.section_config` (every key required; a conditional key refused
    where its variant would not read it)."""

    VARIANTS = VARIANTS  # the per-variant mappings (not a field: no annotation)

    variant: str
    # -- rerank.<variant>
    enabled: bool = field(
        metadata=_own("enabled", "true or false")
    )  # false: a placeholder in seconds, evaluate skips it
    plm: str = field(metadata=_own("plm", "frozen (cached states) or finetune (the PLM trains)", choices=PLM_MODES))
    plm_lr: float | None = field(metadata=_own("plm_lr", "a number > 0 (the PLM's learning rate)"))
    # null: every weight of the PLM trains; N: its top N blocks only, over cached states of the blocks below
    plm_layers: int | None = field(
        metadata=_own(
            "plm_layers",
            "null (every weight of the PLM trains) or an integer >= 1 (only the PLM's top N blocks train)",
        )
    )
    max_query_length: int = field(metadata=_own("max_query_length", "an integer >= 8"))
    max_article_length: int = field(metadata=_own("max_article_length", "an integer >= 8"))
    truncation: str = field(
        metadata=_own(
            "truncation",
            "left (a longer text loses its first tokens, MVCL's 'from the front') or right (it keeps them)",
            choices=TRUNCATIONS,
        )
    )
    # false: eq. 2-4 on the PLM's own states (MVCL); true: every state projected to hidden first (xrerank)
    projection: bool = field(metadata=_own("projection", "true or false"))
    alignment: str = field(
        metadata=_own(
            "alignment",
            "scaled_dot (h_a . h_b / sqrt(d) on the PLM's states), cosine (their cosine / align_temperature) "
            "or projected",
            choices=ALIGNMENTS,
        )
    )
    align_temperature: float | None = field(
        metadata=_own("align_temperature", "a number > 0 (cosine / temperature of the cosine alignment)")
    )
    pooling: str = field(
        metadata=_own("pooling", "eq6 (MVCL's eq. 6, its own weights) or tanh (over the projection)", choices=POOLINGS)
    )
    # H_{a,b} ends with the PLM's alignment scores (MaxSim both ways, mean cosine)
    match_features: bool = field(metadata=_own("match_features", "true or false"))
    # untrained network = MaxSim ranking (read with match_features); epoch 0 can be kept
    warm_start: bool = field(metadata=_own("warm_start", "true or false"))
    # true: fused with the first stage at the alpha chosen on dev; false: the re-ranked list alone
    fusion: bool = field(metadata=_own("fusion", "true or false"))
    interpolation: list[float] = field(
        metadata=_own("interpolation", "a non-empty list of distinct numbers in [0, 1] (the re-ranker's weight)")
    )
    # how the classifier's round robin over a list becomes one score per candidate
    ranking: str = field(
        metadata=_own(
            "ranking",
            "probability (MVCL App. B: the sum of a candidate's probabilities in all pairs) or margin "
            "(the mean logit margin)",
            choices=RANKINGS,
        )
    )
    lr: float = field(metadata=_own("lr", "a number > 0"))
    weight_decay: float = field(metadata=_own("weight_decay", "a number >= 0"))
    # passes over the training triples; a fraction makes the last epoch partial (round(epochs * steps) steps)
    epochs: float = field(metadata=_own("epochs", "a number > 0"))
    metric: str = field(
        metadata=_own("metric", f"one of {', '.join(SELECTION_METRICS)} (chooses the epoch)", choices=SELECTION_METRICS)
    )
    # -- shared
    first_stage: str = field(
        # a name of the registry, checked where it is read (lexgraph.methods.rerank.system.check_first_stage)
        metadata={"expected": "a retrieval system other than a re-ranker"}
    )
    k: int = field(metadata={"expected": "an integer >= 2 (articles re-ranked per question)"})
    encode_batch_size: int = field(metadata={"expected": "a positive integer"})
    hidden: int = field(metadata={"expected": "an even positive integer"})
    dropout: float = field(metadata={"expected": "a number in [0, 1)"})
    negatives: int = field(metadata={"expected": "a positive integer (C- per question and gold article per epoch)"})
    swap: bool
    lambda_case: float = field(metadata={"expected": "a number >= 0"})
    lambda_ele: float = field(metadata={"expected": "a number >= 0"})
    t1: float = field(metadata={"expected": "a number > 0 (case-view temperature)"})
    t2: float = field(metadata={"expected": "a number > 0 (element-view temperature)"})
    element_patterns: list[str] = field(
        metadata={"expected": f"a non-empty list of distinct pattern families among {', '.join(PATTERNS)}"}
    )
    element_budget: int = field(
        metadata={
            "expected": (
                "a positive integer (L1: at most this many tokens of non-element sentences deleted in an element view)"
            )
        },
    )
    del_token: str = field(metadata={"expected": "a token of the base encoder's vocabulary"})
    batch_size: int = field(metadata={"expected": "a positive integer (triples per step)"})
    warmup_ratio: float = field(metadata={"expected": "a number in [0, 1)"})
    max_grad_norm: float = field(metadata={"expected": "a number > 0"})
    split: str = field(metadata={"expected": "dev (the split that chooses the epoch, and alpha with fusion)"})
    eval_batch_size: int = field(metadata={"expected": "a positive integer"})

    @classmethod
    def shared_keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.name not in VARIANT_KEYS and f.name != "variant")

    @classmethod
    def from_params(cls, params: dict[str, Any] | None, variant: str) -> RerankConfig:
        """The settings of re-ranker ``variant``: the shared keys of ``params`` (the ``rerank``
        section) and those of ``params[variant]``."""
        return section_config(cls, params, SECTION, variant)

    @classmethod
    def per_variant(cls, params: dict[str, Any] | None) -> dict[str, RerankConfig]:
        """``{variant: settings}`` for both re-rankers (what the stages check before any work)."""
        return {variant: cls.from_params(params, variant) for variant in VARIANTS}

    def key(self, name: str) -> str:
        """The dotted key of field ``name`` under ``rerank``."""
        return f"{self.variant}.{name}" if name in VARIANT_KEYS else name

    def validate(self) -> None:
        def bad(name: str) -> Exception:
            return bad_value(SECTION, self.key(name), getattr(self, name), expectation(RerankConfig, name))

        if self.variant not in VARIANTS:
            raise params_error(f"unknown re-ranker {self.variant!r}, expected one of {', '.join(VARIANTS)}")
        refuse_held_out(SECTION, "split", self.split, expectation(RerankConfig, "split"))
        if self.k < 2:
            raise bad("k")
        for name in ("max_query_length", "max_article_length"):
            if getattr(self, name) < 8:
                raise bad(name)
        for name in ("element_budget", "encode_batch_size", "negatives", "batch_size", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise bad(name)
        if self.hidden < 2 or self.hidden % 2:
            raise bad("hidden")
        if self.plm_layers is not None and self.plm_layers < 1:
            raise bad("plm_layers")
        if not 0.0 <= self.dropout < 1.0:
            raise bad("dropout")
        for name in ("lambda_case", "lambda_ele", "weight_decay"):
            if getattr(self, name) < 0:
                raise bad(name)
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise bad(name)
        for name in ("t1", "t2", "lr", "max_grad_norm", "align_temperature", "plm_lr", "epochs"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise bad(name)
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise bad("warmup_ratio")
        pats = self.element_patterns
        if not pats or any(p not in PATTERNS for p in pats) or len(set(pats)) < len(pats):
            raise bad("element_patterns")
        if not self.del_token.strip():
            raise bad("del_token")
        if self.split not in ("dev", "train"):
            raise bad("split")
        a = self.interpolation
        if not a or any(not 0.0 <= x <= 1.0 for x in a) or len(set(a)) < len(a):
            raise bad("interpolation")
        self._validate_combinations()

    def _validate_combinations(self) -> None:
        """Settings that exclude each other: one line naming both keys."""
        v = self.variant
        if not self.projection:
            for name, value in (("pooling", "tanh"), ("alignment", "projected")):
                if getattr(self, name) == value:
                    raise params_error(
                        f"'rerank.{v}.{name}' = {value} reads the projected states; it needs "
                        f"'rerank.{v}.projection' = true (got false)"
                    )
        if self.metric == ACCURACY and self.fusion:
            raise params_error(
                f"'rerank.{v}.metric' = {ACCURACY} is the classifier's and cannot choose the fused lists' alpha; "
                f"it needs 'rerank.{v}.fusion' = false (got true)"
            )

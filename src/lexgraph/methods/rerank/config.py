"""The ``rerank`` section of params.yaml (the re-rankers ``mvcl`` and ``xrerank``,
:mod:`lexgraph.methods.rerank.train`) and the re-rankers' artefact names.

The section follows the params rule of variant sections: **shared keys** at its top,
read by both re-rankers and never overridden, and one mapping per re-ranker
(``rerank.mvcl``, ``rerank.xrerank``) holding every key that differs between them
(:class:`RerankerKeys`). A key that a re-ranker would not read is refused rather than
ignored (``plm_lr`` and ``plm_layers`` with a frozen PLM, ``align_temperature`` without the cosine
alignment, ``warm_start`` without match features, ``interpolation`` without fusion: each flag is
the tag of a union of two models, one reading the keys, one holding what they stand for unread),
so that no key is ever inert for a re-ranker and DVC (which tracks ``rerank.<variant>`` whole and
each shared key) reruns a re-ranker only when something it reads changed.

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

import difflib
import logging
import typing
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, Field, ValidationError, ValidationInfo, field_validator, model_validator

from lexgraph.core import layout
from lexgraph.core.config import HELD_OUT_SPLIT
from lexgraph.core.settings import (
    Bool,
    Expect,
    Float,
    Int,
    Settings,
    Str,
    describe,
    enforce,
    expectation,
    params_error,
    read_section,
)
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

SECTION = "rerank"
WEIGHTS = "mvcl.safetensors"
SETTINGS = "mvcl.json"
PLM_DIR = "plm"  # the fine-tuned PLM inside models/<variant>/ (plm: finetune)
#: what ``models/<variant>/mvcl.json`` is: the words of its readers' errors (the remedy: ``layout.restore_hint``)
SETTINGS_WHAT = "the re-ranker settings the rerank stage writes"

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


def _distinct(values: list) -> list:
    if len(set(values)) < len(values):
        raise ValueError("a value is repeated")
    return values


# ---------------------------------------------------------------------------
# The values (each rule once: params.yaml's models and the resolved settings share them)
# ---------------------------------------------------------------------------

Positive = Annotated[Float, Field(gt=0)]
NonNegative = Annotated[Float, Field(ge=0)]
Rate = Annotated[Float, Field(ge=0, lt=1)]
Count = Annotated[Int, Field(gt=0)]
Length = Annotated[Int, Field(ge=8)]
PlmLayers = Annotated[
    Annotated[Int, Field(ge=1)] | None,
    Expect("null (every weight of the PLM trains) or an integer >= 1 (only the PLM's top N blocks train)"),
]
Truncation = Annotated[
    Literal[TRUNCATIONS],
    Expect("left (a longer text loses its first tokens, MVCL's 'from the front') or right (it keeps them)"),
]
ALIGNMENT_WORDS = (
    "scaled_dot (h_a . h_b / sqrt(d) on the PLM's states), cosine (their cosine / align_temperature) or projected"
)
Pooling = Annotated[Literal[POOLINGS], Expect("eq6 (MVCL's eq. 6, its own weights) or tanh (over the projection)")]
Ranking = Annotated[
    Literal[RANKINGS],
    Expect(
        "probability (MVCL App. B: the sum of a candidate's probabilities in all pairs) or margin "
        "(the mean logit margin)"
    ),
]
Interpolation = Annotated[
    list[Annotated[Float, Field(ge=0, le=1)]],
    Field(min_length=1),
    AfterValidator(_distinct),
    Expect("a non-empty list of distinct numbers in [0, 1] (the re-ranker's weight)"),
]
Hidden = Annotated[Int, Field(gt=0, multiple_of=2), Expect("an even positive integer")]
Patterns = Annotated[
    list[Literal[tuple(PATTERNS)]],
    Field(min_length=1),
    AfterValidator(_distinct),
    Expect(f"a non-empty list of distinct pattern families among {', '.join(PATTERNS)}"),
]
DelToken = Annotated[Str, Field(pattern=r"\S"), Expect("a token of the base encoder's vocabulary")]
Split = Annotated[
    Literal["dev", "train"],
    Expect(
        "dev or train (the split that chooses the epoch, and alpha with fusion); "
        f"the '{HELD_OUT_SPLIT}' split is held out for evaluation"
    ),
]
FirstStage = Annotated[Str, Expect("a retrieval system other than a re-ranker")]


# ---------------------------------------------------------------------------
# rerank.<variant>: a flag and the keys it decides on, one model per value of the flag
# (the model of the value that does not read them holds what they stand for, as constants)
# ---------------------------------------------------------------------------


class FrozenPlm(Settings):
    """``plm: frozen``: the PLM's states cached, nothing of it trains."""

    plm: Literal["frozen"]
    plm_lr: ClassVar[None] = None
    plm_layers: ClassVar[None] = None


class FinetunedPlm(Settings):
    """``plm: finetune``: the PLM trains with the network."""

    plm: Literal["finetune"]
    plm_lr: Positive = Field(description="the PLM's learning rate")
    plm_layers: PlmLayers = Field(
        description="null: every weight of the PLM trains; N: its top N blocks only, over cached states of the "
        "blocks below"
    )


class CosineAlignment(Settings):
    """``alignment: cosine``: the states' cosine over a temperature."""

    alignment: Literal["cosine"]
    align_temperature: Positive = Field(description="cosine / temperature")


class ScoredAlignment(Settings):
    """``alignment: scaled_dot`` (MVCL's h_a . h_b / sqrt(d)) or ``projected``: no temperature."""

    alignment: Literal["scaled_dot", "projected"]
    align_temperature: ClassVar[None] = None


class WithMatchFeatures(Settings):
    """``match_features: true``: H_{a,b} ends with the PLM's alignment scores (MaxSim both ways, mean cosine)."""

    match_features: Literal[True]
    warm_start: Bool = Field(description="the untrained network = the MaxSim ranking; epoch 0 can be kept")


class WithoutMatchFeatures(Settings):
    """``match_features: false``: no alignment scores, no warm start."""

    match_features: Literal[False]
    warm_start: ClassVar[bool] = False


class Fused(Settings):
    """``fusion: true``: fused with the first stage at the alpha chosen on dev."""

    fusion: Literal[True]
    interpolation: Interpolation


class Unfused(Settings):
    """``fusion: false``: the re-ranked list alone (the re-ranker's weight 1)."""

    fusion: Literal[False]
    interpolation: ClassVar[list[float]] = [1.0]


TRUE_OR_FALSE = Expect("true or false")


class RerankerKeys(Settings):
    """A re-ranker's own mapping ``rerank.<variant>`` (written flat: each flag's union reads the
    flag with the keys it decides on)."""

    enabled: Bool = Field(description="false: a placeholder in seconds, evaluate skips it")
    plm: Annotated[
        FrozenPlm | FinetunedPlm,
        Field(discriminator="plm"),
        Expect("frozen (cached states) or finetune (the PLM trains)"),
    ]
    max_query_length: Length
    max_article_length: Length
    truncation: Truncation
    projection: Bool = Field(
        description="false: eq. 2-4 on the PLM's own states (MVCL); true: every state projected to hidden first"
    )
    alignment: Annotated[CosineAlignment | ScoredAlignment, Field(discriminator="alignment"), Expect(ALIGNMENT_WORDS)]
    pooling: Pooling
    match_features: Annotated[
        WithMatchFeatures | WithoutMatchFeatures, Field(discriminator="match_features"), TRUE_OR_FALSE
    ]
    fusion: Annotated[Fused | Unfused, Field(discriminator="fusion"), TRUE_OR_FALSE] = Field(
        description="true: fused with the first stage at the alpha chosen on dev; false: the re-ranked list alone"
    )
    ranking: Ranking = Field(description="how the classifier's round robin over a list becomes one score per candidate")
    lr: Positive
    weight_decay: NonNegative
    epochs: Positive = Field(
        description="passes over the training triples; a fraction makes the last epoch partial "
        "(round(epochs * steps) steps)"
    )
    metric: Literal[SELECTION_METRICS] = Field(description="chooses the epoch (and alpha with fusion)")

    @model_validator(mode="before")
    @classmethod
    def _flags(cls, values: Any) -> Any:
        """Each flag, with the keys it decides on, as its union's mapping."""
        if not isinstance(values, dict):
            return values
        out: dict[str, Any] = {}
        for key, value in values.items():
            flag = _FLAG_OF.get(key)
            if flag is None:
                out[key] = value
            else:
                out.setdefault(flag, {})[key] = value
        return out

    @model_validator(mode="after")
    def _combinations(self) -> RerankerKeys:
        """Settings that exclude each other."""
        v = self.flat()
        plain = not v["projection"]
        rules = (
            (
                "pooling",
                plain and v["pooling"] == "tanh",
                "eq6 with projection: false (tanh pools the projected states)",
            ),
            (
                "alignment",
                plain and v["alignment"] == "projected",
                "scaled_dot or cosine with projection: false (projected aligns the projected states)",
            ),
            (
                "metric",
                v["metric"] == ACCURACY and v["fusion"],
                f"one of {', '.join(METRICS)} with fusion: true (accuracy is the classifier's: it cannot choose "
                "the fused lists' alpha)",
            ),
        )
        enforce(v, rules)
        return self

    def flat(self) -> dict[str, Any]:
        """The keys as written, in order: a key that its flag does not read holds its unread value."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            out.update({key: getattr(value, key) for key in _keys_of(name)} if _members(name) else {name: value})
        return out


def _members(name: str) -> tuple[type[BaseModel], ...]:
    """The models of the union of the flag ``name`` of ``rerank.<variant>`` (none for another key)."""
    field = RerankerKeys.model_fields.get(name)
    args = typing.get_args(field.annotation) if field is not None else ()
    return tuple(a for a in args if isinstance(a, type) and issubclass(a, BaseModel))


def _keys_of(name: str) -> tuple[str, ...]:
    """The keys a field of :class:`RerankerKeys` stands for: a flag and the keys it decides on."""
    return tuple(dict.fromkeys(k for m in _members(name) for k in m.model_fields)) or (name,)


def _member(flag: str, value: Any) -> type[BaseModel] | None:
    """The model of the union of ``flag`` whose tag is ``value``."""
    return next((m for m in _members(flag) if value in typing.get_args(m.model_fields[flag].annotation)), None)


#: the keys of ``rerank.<variant>``, as written; every other key of :class:`RerankConfig` (but ``variant``) is shared
VARIANT_KEYS = tuple(key for name in RerankerKeys.model_fields for key in _keys_of(name))
#: a key of ``rerank.<variant>`` read only under a flag -> that flag
_FLAG_OF = {key: name for name in RerankerKeys.model_fields if _members(name) for key in _keys_of(name)}


class RerankShared(Settings):
    """The keys at the top of ``rerank``, read by both re-rankers."""

    first_stage: FirstStage = Field(
        description="a name of the registry, checked where it is read (lexgraph.methods.rerank.system)"
    )
    k: Annotated[Int, Field(ge=2, description="articles re-ranked per question")]
    encode_batch_size: Count
    hidden: Hidden
    dropout: Rate
    negatives: Count = Field(description="C- per question and gold article per epoch")
    swap: Bool
    lambda_case: NonNegative
    lambda_ele: NonNegative
    t1: Positive = Field(description="case-view temperature")
    t2: Positive = Field(description="element-view temperature")
    element_patterns: Patterns
    element_budget: Count = Field(
        description="L1: at most this many tokens of non-element sentences deleted in an element view"
    )
    del_token: DelToken
    batch_size: Count = Field(description="triples per step")
    warmup_ratio: Rate
    max_grad_norm: Positive
    split: Split
    eval_batch_size: Count


class RerankSection(RerankShared):
    """The ``rerank`` section: the shared keys, then one mapping per re-ranker."""

    xrerank: Annotated[RerankerKeys, Expect("a mapping of the xrerank settings")]
    mvcl: Annotated[RerankerKeys, Expect("a mapping of the mvcl settings")]

    @field_validator(*VARIANTS, mode="before")
    @classmethod
    def _own(cls, values: Any, info: ValidationInfo) -> Any:
        """A re-ranker's mapping, read by its own model: its errors (a conditional key's location
        in pydantic's words holds its flag's tag) worded here, as :class:`ConfigError` sentences."""
        return _read_own(values, f"{SECTION}.{info.field_name}") if isinstance(values, dict) else values

    def resolve(self, variant: str) -> RerankConfig:
        """The settings of re-ranker ``variant``: its own keys, then the shared ones, flat."""
        return _resolved(self, getattr(self, _known(variant)), variant)


def _resolved(shared: RerankShared, own: RerankerKeys, variant: str) -> RerankConfig:
    return RerankConfig(variant=variant, **own.flat(), **{k: getattr(shared, k) for k in RerankShared.model_fields})


class RerankConfig(Settings):
    """The ``rerank`` section resolved for one re-ranker (``variant``): its own keys flat (a key its
    flag does not read holds its unread value), then the shared keys. Read from params.yaml by
    :meth:`from_params` and from ``mvcl.json`` by :meth:`from_saved`, both through
    :class:`RerankSection`'s models."""

    variant: Literal[VARIANTS]
    # -- rerank.<variant>
    enabled: Bool
    plm: Literal[PLM_MODES]
    plm_lr: Positive | None
    plm_layers: PlmLayers
    max_query_length: Length
    max_article_length: Length
    truncation: Truncation
    projection: Bool
    alignment: Annotated[Literal[ALIGNMENTS], Expect(ALIGNMENT_WORDS)]
    align_temperature: Positive | None
    pooling: Pooling
    match_features: Bool
    warm_start: Bool
    fusion: Bool
    interpolation: Interpolation
    ranking: Ranking
    lr: Positive
    weight_decay: NonNegative
    epochs: Positive
    metric: Literal[SELECTION_METRICS]
    # -- shared
    first_stage: FirstStage
    k: Annotated[Int, Field(ge=2)]
    encode_batch_size: Count
    hidden: Hidden
    dropout: Rate
    negatives: Count
    swap: Bool
    lambda_case: NonNegative
    lambda_ele: NonNegative
    t1: Positive
    t2: Positive
    element_patterns: Patterns
    element_budget: Count
    del_token: DelToken
    batch_size: Count
    warmup_ratio: Rate
    max_grad_norm: Positive
    split: Split
    eval_batch_size: Count

    @classmethod
    def shared_keys(cls) -> tuple[str, ...]:
        return tuple(RerankShared.model_fields)

    @classmethod
    def from_params(cls, params: dict[str, Any] | None, variant: str) -> RerankConfig:
        """The settings of re-ranker ``variant``: the shared keys of ``params`` (the ``rerank``
        section) and those of ``params[variant]``."""
        return read_section(RerankSection, params, SECTION).resolve(variant)

    @classmethod
    def per_variant(cls, params: dict[str, Any] | None) -> dict[str, RerankConfig]:
        """``{variant: settings}`` for both re-rankers (what the stages check before any work)."""
        section = read_section(RerankSection, params, SECTION)
        return {variant: section.resolve(variant) for variant in VARIANTS}

    @classmethod
    def from_saved(cls, values: dict[str, Any]) -> RerankConfig:
        """The settings saved flat (``mvcl.json``'s ``config``: :meth:`model_dump`) read back through
        params.yaml's models: the keys its flags read as ``rerank.<variant>``, the others as the
        shared keys (an error names the key of params.yaml it came from)."""
        variant = _known(values.get("variant"))
        read = {key for name in RerankerKeys.model_fields for key in _read_with(name, values)}
        own = {k: v for k, v in values.items() if k in read}
        shared = {k: v for k, v in values.items() if k not in VARIANT_KEYS and k != "variant"}
        return _resolved(read_section(RerankShared, shared, SECTION), _read_own(own, f"{SECTION}.{variant}"), variant)

    def key(self, name: str) -> str:
        """The dotted key of field ``name`` under ``rerank``."""
        return f"{self.variant}.{name}" if name in VARIANT_KEYS else name


def _known(variant: Any) -> str:
    if variant not in VARIANTS:
        raise params_error(f"unknown '{SECTION}' variant {variant!r}, expected one of {', '.join(VARIANTS)}")
    return variant


def _read_with(name: str, values: dict[str, Any]) -> tuple[str, ...]:
    """The keys of field ``name`` of :class:`RerankerKeys` that the flat ``values`` hold as read: the
    flag, the keys its value reads, and any other one not at its unread value (refused then, as in
    params.yaml); every key the flag decides on for a value that is no tag of its union."""
    member = _member(name, values.get(name)) if _members(name) else None
    if member is None:
        return _keys_of(name)
    unread = {k: getattr(member, k) for k in _keys_of(name) if k not in member.model_fields}
    return tuple(k for k in _keys_of(name) if k not in unread or values.get(k, unread[k]) != unread[k])


# ---------------------------------------------------------------------------
# Reading, in one sentence per error (pydantic's location of a union's error holds its tag:
# the conditional keys and the unknown keys of rerank.<variant> are worded here, the rest by core)
# ---------------------------------------------------------------------------

_RANK = {"extra_forbidden": 0, "missing": 1, "union_tag_not_found": 1}


def _read_own(values: Any, where: str) -> RerankerKeys:
    """``values`` as the mapping ``where`` (``rerank.<variant>``): an error is one sentence."""
    try:
        return RerankerKeys.model_validate(values)
    except ValidationError as exc:
        raise params_error(_describe(values, where, exc)) from None


def _describe(values: dict, where: str, exc: ValidationError) -> str:
    """The first error (unknown keys, then missing ones, then values) in the user's words: a
    conditional key's and an unknown key's here, any other by core's :func:`describe`."""
    errors = sorted(exc.errors(), key=lambda e: _RANK.get(e["type"], 2))
    first, loc = errors[0], errors[0]["loc"]
    if loc and _members(loc[0]) and (len(loc) > 1 or first["type"] != "missing"):
        return _conditional(first, loc, values, where)
    if first["type"] == "extra_forbidden":
        return _unknown([e["loc"][-1] for e in errors if e["type"] == "extra_forbidden" and len(e["loc"]) == 1], where)
    return describe(RerankerKeys, values, where, _only([first]))


def _only(errors: list[dict]) -> ValidationError:
    """A ValidationError of ``errors`` alone: what core's :func:`describe` words."""
    keep = ("type", "loc", "input", "ctx")
    return ValidationError.from_exception_data("rerank", [{k: e[k] for k in keep if k in e} for e in errors])


def _yaml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _tag(member: type[BaseModel], flag: str, value: Any = None) -> str:
    """The value of ``flag`` that selects ``member`` (``value`` among several), as YAML writes it."""
    tags = typing.get_args(member.model_fields[flag].annotation)
    return _yaml(next((t for t in tags if t == value), tags[0]))


def _conditional(error: dict, loc: tuple, values: dict, where: str) -> str:
    """An error at ``loc`` (a flag, then the tag of its union's model, then a key) of the mapping
    ``values`` of ``rerank.<variant>`` (``where``)."""
    flag, words = loc[0], expectation(RerankerKeys.model_fields[loc[0]])
    if len(loc) == 1:  # the flag itself: absent (another key it decides on given) or no tag of its union
        if error["type"] == "union_tag_not_found":
            return f"missing key '{where}.{flag}', expected {words}"
        return f"'{where}.{flag}' = {values[flag]!r}, expected {words}"
    member, key = _member(flag, loc[1]), loc[2]
    now = f"{flag}: {_tag(member, flag, values[flag])}"
    if error["type"] == "extra_forbidden":
        reader = next(m for m in _members(flag) if key in m.model_fields)
        return (
            f"'{where}.{key}' is read only with {flag}: {_tag(reader, flag)}; expected no {key} with {now} (remove it)"
        )
    if error["type"] == "missing":
        return f"missing key '{where}.{key}', expected {expectation(member.model_fields[key])} (read with {now})"
    return describe(member, values, where, _only([{**error, "loc": loc[2:]}]))


def _unknown(unknown: list, where: str) -> str:
    """Unknown keys of ``rerank.<variant>`` (``where``), with every key it may hold."""
    keys = sorted(VARIANT_KEYS)
    close = difflib.get_close_matches(str(unknown[0]), keys, n=1)
    if set(map(str, unknown)) & set(RerankShared.model_fields):
        hint = f" (a shared key: set it once under '{SECTION}')"
    else:
        hint = f" (did you mean '{where}.{close[0]}'?)" if close else ""
    listed = ", ".join(repr(f"{where}.{k}") for k in sorted(unknown, key=str))
    return f"unknown keys {listed}{hint}; expected keys of '{where}': {', '.join(keys)}"

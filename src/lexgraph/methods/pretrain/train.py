"""MLM training: the ``pretrain`` stage's data, loop and I/O.

The settings and the models (``PretrainConfig``, the base checkpoint, the scratch
WordPiece tokenizer and BERT) are :mod:`lexgraph.methods.pretrain.model`. Sequences are the
articles, tokenised without special tokens, concatenated into one stream (a separator
token between articles) and cut into blocks that, wrapped with the model's special
tokens, hold ``max_length`` tokens; a seeded fraction of the blocks is held out to report
the eval MLM loss and perplexity. The training loop is the shared engine
(:mod:`lexgraph.training.engine`): AdamW, linear warm-up then linear decay, gradient
clipping, gradient accumulation, mixed precision on CUDA, several processes under
``accelerate launch`` / ``torchrun``.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from typing import Any

from lexgraph.core.config import params_error
from lexgraph.core.errors import ConfigError, DataError
from lexgraph.core.stage import StageContext
from lexgraph.methods.pretrain.model import SECTION, PretrainConfig, PretrainPaths, load_tokenizer_and_model

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------


def make_blocks(texts: Sequence[str], tokenizer, max_length: int) -> list[list[int]]:
    """Tokenise, concatenate (separator between articles) and cut into blocks.

    Each block is ``[CLS] … [SEP]`` (the tokenizer's own special tokens) with at most
    ``max_length`` ids; only the last block may be shorter.
    """
    from lexgraph.core.progress import progress

    prefix, suffix = special_affixes(tokenizer)
    inner = max_length - len(prefix) - len(suffix)
    if inner < 1:
        raise params_error(f"'{SECTION}.max_length' = {max_length} leaves no room for text")
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
    raise params_error("the pretrain tokenizer adds special tokens inside the text; expected a prefix/suffix template")


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
    from lexgraph.models.packing import pad_rows

    return pad_rows(blocks, pad_id)


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

    from lexgraph.core.config import autocast

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
    """:class:`~lexgraph.training.engine.TrainingTask` of MLM pre-training: ``max_steps``
    batches drawn from seeded epoch permutations of the blocks (refilled as they run out), cut
    into engine "epochs" of ``checkpoint_every`` steps, each ending with a resume checkpoint
    (the batches do not depend on the cut); masking is drawn per batch from its own seeded
    generator."""

    def __init__(self, model, tokenizer, train_blocks, eval_blocks, cfg: PretrainConfig, runtime, seed: int) -> None:
        import torch

        self.model, self.tokenizer, self.cfg, self.runtime, self.seed = model, tokenizer, cfg, runtime, seed
        self.train_blocks, self.eval_blocks = train_blocks, eval_blocks
        self.order_generator = torch.Generator().manual_seed(seed)
        self.order: list[int] = []  # the permutation being drawn from: runs on across epochs
        self.mask_generator = torch.Generator().manual_seed(seed + 2 + 7919 * runtime.rank)

    def modules(self):
        return [self.model]

    def train(self) -> None:
        self.model.train()

    def state_dict(self) -> dict:
        """The generators' states (a resumed run draws on where it stopped)."""
        return {
            "order": self.order_generator.get_state(),
            "mask": self.mask_generator.get_state(),
            "drawn": list(self.order),
        }

    def load_state_dict(self, state: dict) -> None:
        self.order_generator.set_state(state["order"])
        self.mask_generator.set_state(state["mask"])
        self.order = list(state["drawn"])

    def batches(self, epoch: int):
        import torch

        done = (epoch - 1) * self.cfg.checkpoint_every
        for _ in range(min(self.cfg.checkpoint_every, self.cfg.max_steps - done)):
            if len(self.order) < self.cfg.batch_size:  # refill with a fresh epoch permutation
                self.order += torch.randperm(len(self.train_blocks), generator=self.order_generator).tolist()
            batch, self.order = self.order[: self.cfg.batch_size], self.order[self.cfg.batch_size :]
            yield batch

    def step(self, batch: list[int]):
        device = self.runtime.device
        input_ids, attention = collate([self.train_blocks[i] for i in batch], self.tokenizer.pad_token_id)
        masked, labels = mask_tokens(
            input_ids, attention, self.tokenizer, self.cfg.mlm_probability, self.mask_generator
        )
        with self.runtime.autocast():
            return mlm_loss(self.model, masked.to(device), attention.to(device), labels.to(device))

    def evaluate(self) -> dict[str, float]:
        return {
            "eval_loss": _eval_loss(
                self.model, self.eval_blocks, self.tokenizer, self.cfg, self.runtime.device, self.seed
            )
        }

    def nan_error(self, value: float, epoch: int, step: int) -> ConfigError:
        return ConfigError(f"MLM loss became {value} at step {step}; lower params.yaml '{SECTION}.learning_rate'")


def train_mlm(
    model, tokenizer, train_blocks, eval_blocks, cfg: PretrainConfig, *, device, seed: int, runtime=None, resume=None
) -> tuple[dict[str, Any], list[dict]]:
    """Train ``model`` in place with MLM (:func:`lexgraph.training.engine.fit`); return the metrics dict
    and the training curve (:func:`lexgraph.training.curves.step_records`: each step's loss).

    AdamW (no decay on biases and LayerNorm weights), linear warm-up over ``warmup_ratio``
    of ``max_steps`` (``cfg.warmup_steps``) then linear decay to 0 at ``max_steps``,
    gradient clipping, mixed precision on CUDA when ``mixed_precision``."""
    import torch

    from lexgraph.training.curves import step_records
    from lexgraph.training.engine import FitConfig, ParamGroup, Runtime, build_optimizer, build_scheduler, fit

    if not train_blocks:
        raise ConfigError("pretrain: no training blocks (the articles hold too little text)")
    runtime = runtime or Runtime(device, "auto" if cfg.mixed_precision else "no")
    torch.manual_seed(seed)  # dropout
    model.to(runtime.device)
    task = MLMTask(model, tokenizer, train_blocks, eval_blocks, cfg, runtime, seed)
    optimizer = build_optimizer(
        [ParamGroup(list(model.parameters()), cfg.learning_rate, cfg.weight_decay)], [model], eps=cfg.adam_epsilon
    )
    scheduler = build_scheduler(optimizer, "linear", cfg.warmup_steps, cfg.max_steps)
    log.info(
        "MLM: %d train / %d eval blocks of <= %d tokens, %d steps of %d",
        len(train_blocks),
        len(eval_blocks),
        cfg.max_length,
        cfg.max_steps,
        cfg.batch_size,
    )
    start = time.perf_counter()
    result = fit(
        task,
        optimizer,
        scheduler,
        FitConfig(
            name="pretrain",
            epochs=math.ceil(cfg.max_steps / cfg.checkpoint_every),  # an "epoch": the steps between checkpoints
            steps_per_epoch=min(cfg.checkpoint_every, cfg.max_steps),
            max_grad_norm=cfg.max_grad_norm,
            accumulation_steps=cfg.accumulation_steps,
            select_epoch_zero=True,
            log_every=cfg.log_every,
        ),
        runtime,
        resume.next_fit() if resume else None,
    )
    seconds = time.perf_counter() - start
    initial_eval = result.initial_metrics["eval_loss"]
    eval_loss = result.dev_metrics["eval_loss"]
    recent = result.step_losses[-cfg.log_every :]
    perplexity = math.exp(eval_loss) if math.isfinite(eval_loss) and eval_loss < 700 else float("inf")
    log.info(
        "MLM done in %.1f s: eval loss %.4f (before %.4f), perplexity %.1f",
        seconds,
        eval_loss,
        initial_eval,
        perplexity,
    )
    metrics = {
        "mode": cfg.mode,
        "steps": cfg.max_steps,
        "train_loss": round(sum(recent) / len(recent), 4),
        "eval_loss_initial": round(initial_eval, 4),
        "eval_loss": round(eval_loss, 4),
        "perplexity": round(perplexity, 2) if math.isfinite(perplexity) else None,
        "train_blocks": len(train_blocks),
        "eval_blocks": len(eval_blocks),
    }
    return metrics, step_records(result.step_losses, initial_eval, eval_loss)


def read_articles(path: str | os.PathLike) -> list[str]:
    """The ``article`` texts of a clean articles file, in file order (empty ones dropped)."""
    from lexgraph.core.io import read_parquet

    df = read_parquet(path, required=["id", "article"])
    nulls = df["article"].is_null()
    if nulls.any():
        raise DataError(path, "article text is null; expected a string", row=int(nulls.arg_max()), column="article")
    return [t for t in df["article"].to_list() if t.strip()]


def pretrain(
    texts: Sequence[str],
    cfg: PretrainConfig,
    out_dir: str | os.PathLike,
    *,
    seed: int,
    device,
    runtime=None,
    resume=None,
) -> tuple[dict[str, Any], list[dict]]:
    """Resolve (``none``) or pre-train (``continue``, ``scratch``) the base model and save
    model + tokenizer (+ ``lexgraph_base.json``) atomically into ``out_dir``; return the metrics
    and the training curve (none without MLM)."""
    import contextlib
    import tempfile
    from pathlib import Path

    from lexgraph.core.io import atomic_path
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
            metrics, curve = {"mode": "none", "model": cfg.model, "source": info["source"]}, []
        else:
            with tempfile.TemporaryDirectory(prefix="lexgraph-base-") as base_dir:
                tokenizer, model = load_tokenizer_and_model(cfg, texts, seed, base_dir)
                info = read_base_summary(base_dir)
            blocks = make_blocks(texts, tokenizer, cfg.max_length)
            train_blocks, eval_blocks = split_blocks(blocks, cfg.eval_fraction, cfg.max_eval_blocks, seed)
            metrics, curve = train_mlm(
                model,
                tokenizer,
                train_blocks,
                eval_blocks,
                cfg,
                device=device,
                seed=seed,
                runtime=runtime,
                resume=resume,
            )
            metrics = {"mode": cfg.mode, **metrics}
            model.to("cpu")
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            if info:  # keep the family's prefixes
                write_base_info(tmp, {**info, "mlm": "continued"})
    if runtime.is_main:
        log.info("wrote %s", out_dir)
    runtime.wait()
    return metrics, curve


def run_pretrain(paths: PretrainPaths, config: PretrainConfig, context: StageContext) -> dict[str, Any]:
    """The ``pretrain`` stage: articles file -> checkpoint directory + metrics JSON + training
    curve ``paths.plot`` (``step,loss,eval_loss``; the header alone with ``mode: none``)."""
    articles, out, metrics_path, plot = paths.articles, paths.out, paths.metrics, paths.plot
    seed, device = context.seed, context.device
    from lexgraph.core.config import resolve_device
    from lexgraph.core.io import write_json
    from lexgraph.training.curves import write_curve

    texts = read_articles(articles)
    if not texts:
        raise DataError(articles, "no non-empty article text to pre-train on")
    from lexgraph.training.engine import Runtime
    from lexgraph.training.resume import resumable

    device = resolve_device(device)
    runtime = Runtime(device, "auto" if config.mixed_precision else "no")
    with resumable(out, {"config": config, "seed": seed}, {"articles": articles}, runtime) as resume:
        metrics, curve = pretrain(texts, config, out, seed=seed, device=device, runtime=runtime, resume=resume)
        if runtime.is_main:  # several processes: the main one writes
            write_json(metrics, metrics_path)
            write_curve(curve, ("step", "loss", "eval_loss"), plot)
    return metrics

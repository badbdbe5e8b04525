"""One training loop for every trained model (DSR, GNN, MLM pre-training), on HF Accelerate.

A training module describes *what* to train with a :class:`TrainingTask` (its modules,
its global batches per epoch, a ``step(batch) -> loss``, an ``evaluate()`` on dev) and
builds its optimizer with :func:`build_optimizer` / :func:`build_scheduler`;
:func:`fit` does the rest, identically for all of them:

* **data parallelism** (several processes under ``accelerate launch`` or ``torchrun``,
  gloo on CPU, NCCL on GPUs): every process draws the same global batches (same seed)
  and takes its own contiguous slice of each; the gradients are summed over processes
  once per optimizer step (one all-reduce of the flattened gradients). Each slice's loss
  is weighted by its share of the global batch, so for a loss that is a mean over
  examples the update equals the one-process update on the whole batch, whatever the
  number of processes (``tests/test_engine_distributed.py`` checks 2 x 4 against 1 x 8).
  A contrastive loss with in-batch negatives sees only its slice's negatives.
* **gradient accumulation**: ``accumulation_steps`` cuts each process's slice into that
  many micro-batches (same weighting), so the global batch, the number of optimizer
  steps and the learning-rate schedule do not change; only the memory per forward does.
* **mixed precision** on CUDA through ``Accelerator(mixed_precision=...)`` (``auto``:
  bf16 where supported, else fp16 with a gradient scaler); CPU runs in float32.
* one **NaN/inf guard** (the step loss, after the reduction, so every process stops
  together; with fp16 the scaler skips such steps instead), **gradient clipping**,
  per-epoch **history** (mean step loss, the task's loss parts, the dev selection metric).
* **model selection** (:class:`BestState`): ``evaluate()`` runs on the main process
  after each epoch (and before training when ``select_epoch_zero``: the untrained model
  competes too, so training never ends below its start); the best epoch's weights are
  restored at the end. Without a selection metric or dev data the last epoch is kept.

Only the main process writes outputs (:attr:`Runtime.is_main`); the others wait
(:meth:`Runtime.wait`). Randomness: the engine draws none; tasks seed their own
generators, so a run is a function of (seed, number of processes, accumulation).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from lexgraph.core.distributed import shard
from lexgraph.core.errors import ConfigError, LexgraphError
from lexgraph.core.progress import progress
from lexgraph.training import resume
from lexgraph.training.checkpoint import check_weights, load_trained_state, trained_state
from lexgraph.training.runtime import MIXED_PRECISION, SDPA_ENV, Runtime, sdpa_backends  # noqa: F401 - re-exported

log = logging.getLogger(__name__)

SCHEDULES = ("linear", "constant")
NORM_LAYERS = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d)


# ---------------------------------------------------------------------------
# Optimizer and schedule
# ---------------------------------------------------------------------------


@dataclass
class ParamGroup:
    """Parameters trained at one learning rate. ``decay_exempt``: no weight decay on
    biases and normalisation-layer weights (the BERT/AdamW rule)."""

    params: list[nn.Parameter]
    lr: float
    weight_decay: float = 0.0
    decay_exempt: bool = True


def no_decay_parameters(*modules: nn.Module) -> set[int]:
    """Ids of the parameters exempt from weight decay: every parameter of a normalisation
    layer (LayerNorm, GroupNorm, BatchNorm, or a class named ``*LayerNorm``/``*RMSNorm``)
    and every parameter whose name ends in ``bias``."""
    exempt: set[int] = set()
    for root in modules:
        for module in root.modules():
            name = type(module).__name__
            if isinstance(module, NORM_LAYERS) or name.endswith(("LayerNorm", "RMSNorm")):
                exempt.update(id(p) for p in module.parameters(recurse=False))
        exempt.update(id(p) for n, p in root.named_parameters() if n.endswith("bias"))
    return exempt


def build_optimizer(
    groups: Sequence[ParamGroup],
    modules: Sequence[nn.Module],
    *,
    eps: float = 1e-8,
    betas: tuple[float, float] = (0.9, 0.999),
    foreach: bool | None = None,
) -> torch.optim.AdamW:
    """AdamW over the trainable parameters of ``groups`` (frozen ones skipped); each
    ``decay_exempt`` group is split into a decayed and an exempt part
    (:func:`no_decay_parameters` of ``modules``). Empty groups are dropped. Parameters all on a
    GPU (and ``foreach`` not given): the fused implementation, one kernel per step for the whole
    update (issue 43: plain AdamW took 36 ms a step on an H100); elsewhere torch's default."""
    exempt = no_decay_parameters(*modules)
    out: list[dict[str, Any]] = []
    for group in groups:
        params = [p for p in group.params if p.requires_grad]
        if group.decay_exempt:
            out += [
                {
                    "params": [p for p in params if id(p) not in exempt],
                    "weight_decay": group.weight_decay,
                    "lr": group.lr,
                },
                {"params": [p for p in params if id(p) in exempt], "weight_decay": 0.0, "lr": group.lr},
            ]
        else:
            out.append({"params": params, "weight_decay": group.weight_decay, "lr": group.lr})
    out = [g for g in out if g["params"]]
    if not out:
        raise ConfigError("nothing to train: every parameter is frozen")
    log.info("%.1fM trainable parameters", sum(p.numel() for g in out for p in g["params"]) / 1e6)
    fused = foreach is None and all(p.is_cuda for g in out for p in g["params"])
    return torch.optim.AdamW(out, lr=out[0]["lr"], betas=betas, eps=eps, foreach=foreach, fused=fused or None)


def linear_warmup_decay(warmup_steps: int, total_steps: int):
    """LR multiplier: linear ``1/(w+1) -> 1`` over the ``w = warmup_steps`` first steps
    (the first step already moves), then linear ``1 -> 0`` at ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, schedule: str, warmup_steps: int = 0, total_steps: int = 1):
    """``linear`` (:func:`linear_warmup_decay`) or ``constant`` learning rates."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"learning-rate schedule {schedule!r}, expected one of {', '.join(SCHEDULES)}")
    factor = linear_warmup_decay(warmup_steps, total_steps) if schedule == "linear" else (lambda step: 1.0)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# ---------------------------------------------------------------------------
# Model selection
# ---------------------------------------------------------------------------


class BestState:
    """Keeps what trains of the best epoch by ``metric`` (higher is better, ties keep the
    earlier epoch; frozen weights do not change). No metric, or an epoch without dev metrics:
    the latest epoch wins and no copy is kept (the current weights are the answer)."""

    def __init__(self, modules: Sequence[nn.Module], metric: str | None) -> None:
        self.modules = list(modules)
        self.metric = metric
        self.epoch: int | None = None
        self.score = -math.inf
        self.metrics: dict[str, float] = {}
        self._states: list[dict[str, torch.Tensor]] | None = None

    def offer(self, epoch: int, metrics: dict[str, float]) -> bool:
        """Consider the current weights after ``epoch``; True when they become the best."""
        if self.metric is None or not metrics:
            self.epoch, self.metrics, self._states = epoch, dict(metrics), None
            return True
        score = float(metrics[self.metric])
        if score > self.score:
            self.epoch, self.score, self.metrics = epoch, score, dict(metrics)
            self._states = [trained_state(m, copy=True) for m in self.modules]
            return True
        return False

    def restore(self) -> None:
        """Load the best epoch's weights back into the modules."""
        if self._states is not None:
            for module, state in zip(self.modules, self._states):
                load_trained_state(module, state)


# ---------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------


class TrainingTask(Protocol):
    """What a training module gives :func:`fit`."""

    def modules(self) -> Sequence[nn.Module]:
        """The modules whose weights train (and are selected)."""

    def train(self) -> None:
        """Put the modules in training mode (called at every epoch start)."""

    def batches(self, epoch: int) -> Iterable[Sequence]:
        """The global batches of ``epoch`` (1-based), the same on every process: seeded
        by (seed, epoch), never by the process."""

    def step(self, batch: Sequence) -> torch.Tensor | tuple[torch.Tensor, dict[str, float]]:
        """Loss (a scalar mean over ``batch``) of this process's part of a batch, or
        ``(loss, parts)`` with float loss components for the history."""

    def evaluate(self) -> dict[str, float]:
        """Dev metrics of the current weights ({} without dev data). Main process only."""

    def nan_error(self, value: float, epoch: int, step: int) -> LexgraphError:
        """The error raised when the loss is not finite."""


@dataclass(frozen=True)
class FitConfig:
    name: str  # progress / log label
    epochs: int
    steps_per_epoch: int  # optimizer steps (global batches) per epoch
    max_grad_norm: float = 1.0  # 0: no clipping
    accumulation_steps: int = 1
    selection_metric: str | None = None  # key of evaluate()'s dict; None: keep the last epoch
    select_epoch_zero: bool = False  # evaluate (and possibly keep) the untrained model
    log_every: int = 0  # log the mean loss every N optimizer steps (0: per epoch only)
    show_progress: bool = True


@dataclass
class FitResult:
    best_epoch: int
    dev_metrics: dict[str, float]  # of the best epoch ({} without dev data)
    history: list[dict[str, float]]  # per epoch: epoch, loss, parts, dev_<metric>
    step_losses: list[float] = field(default_factory=list)  # global loss of every optimizer step
    initial_metrics: dict[str, float] = field(default_factory=dict)  # evaluate() before training


@dataclass
class TrainResult:
    """What a training stage's ``train_*`` returns: the trained (selected) model, its epoch,
    its dev metrics and the per-epoch history of :func:`fit`. Each stage adds its own
    fields in a subclass (``DSRTrainResult``: time and pairs per epoch; ``GNNTrainResult``:
    query encoder, article embeddings, the reference dev metrics, the prior weight)."""

    model: nn.Module
    best_epoch: int
    dev_metrics: dict[str, float] | None  # None: train_dsr without dev data
    history: list[dict[str, float]]


def _sync_gradients(params: list[nn.Parameter], runtime: Runtime) -> None:
    """Sum every parameter's gradient over the processes (one flattened all-reduce). A parameter
    that no process gave a gradient keeps none, as on one process, so that AdamW leaves it (weight
    decay included) on any number of processes; one that some processes did not reach counts as
    zero there. Which is which travels in the same all-reduce (one flag per parameter), read on
    the host once per step."""
    if runtime.world_size == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    reached = torch.tensor([p.grad is not None for p in params], dtype=grads[0].dtype, device=grads[0].device)
    flat = torch.cat([*(g.reshape(-1) for g in grads), reached])  # (n_params + n_tensors,)
    runtime.all_reduce_sum(flat)
    offset = 0
    for p, any_process in zip(params, flat[-len(params) :].tolist()):
        n = p.numel()
        if not any_process:
            p.grad = None
        elif p.grad is None:
            p.grad = flat[offset : offset + n].view_as(p).clone()
        else:
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
        offset += n


def fit(
    task: TrainingTask,
    optimizer: torch.optim.Optimizer,
    scheduler,
    config: FitConfig,
    runtime: Runtime,
    checkpoint: resume.ResumePoint | None = None,
) -> FitResult:
    """Train ``task`` for ``config.epochs`` epochs; returns with the best epoch's weights loaded.
    With ``checkpoint``, each epoch ends with a checkpoint, and a saved one is resumed from
    (:mod:`lexgraph.training.resume`)."""
    if config.accumulation_steps < 1:
        raise ConfigError(f"accumulation_steps = {config.accumulation_steps}, expected an integer >= 1")
    loop = _FitLoop(task, optimizer, scheduler, config, runtime)
    check_weights(config.name, loop.modules)  # nan weights before any step: a damaged start, not a setting
    first, initial = resume.start(loop, checkpoint)
    for epoch in range(first, config.epochs + 1):
        loop.train_epoch(epoch)
        resume.save(loop, checkpoint, epoch, initial)
    best = loop.best
    best.restore()
    for module in loop.modules:
        module.eval()
    if config.selection_metric:
        log.info(
            "%s: best epoch %d (%s %s)",
            config.name,
            best.epoch,
            loop.metric_key,
            f"{best.score:.4f}" if best.metrics else "n/a",
        )
    return FitResult(best.epoch, best.metrics, loop.history, loop.step_losses, initial)


def training_loop(
    task: TrainingTask, optimizer: torch.optim.Optimizer, scheduler, config: FitConfig, runtime: Runtime
) -> _FitLoop:
    """The loop :func:`fit` runs, for driving its optimizer steps one by one
    (``loop.step(batch)``: ``benchmarks/throughput.py`` times and counts the real step)."""
    return _FitLoop(task, optimizer, scheduler, config, runtime)


class _FitLoop:
    """The state of one :func:`fit`: the best epoch so far, the history, every step's loss."""

    def __init__(
        self, task: TrainingTask, optimizer: torch.optim.Optimizer, scheduler, config: FitConfig, runtime: Runtime
    ) -> None:
        self.task, self.optimizer, self.scheduler = task, optimizer, scheduler
        self.config, self.runtime = config, runtime
        self.modules = list(task.modules())
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        # clipped in the modules' own order (the total norm's float sum is order-sensitive)
        self.clip = [p for m in self.modules for p in m.parameters() if p.requires_grad]
        self.scaler = runtime.scaler
        self.metric_key = f"dev_{config.selection_metric}" if config.selection_metric else None
        self.best = BestState(self.modules, config.selection_metric)
        self.history: list[dict[str, float]] = []
        self.step_losses: list[float] = []
        self.global_step = 0

    def evaluate(self) -> dict[str, float]:
        metrics = self.task.evaluate() if self.runtime.is_main else None
        return self.runtime.broadcast(metrics) or {}

    def epoch_zero(self) -> dict[str, float]:
        """With ``select_epoch_zero``, the untrained model's dev metrics, offered as epoch 0."""
        config, metric_key = self.config, self.metric_key
        if not config.select_epoch_zero:
            return {}
        initial = self.evaluate()
        if initial:
            self.best.offer(0, initial)
            record = {"epoch": 0, "loss": float("nan")}
            if metric_key:
                record[metric_key] = initial[config.selection_metric]
            self.history.append(record)
            if metric_key:
                log.info("%s epoch 0 (untrained): %s %.4f", config.name, metric_key, initial[config.selection_metric])
        elif config.selection_metric:
            log.warning("%s: no dev data, model selection is off: the last epoch is kept", config.name)
        return initial

    def train_epoch(self, epoch: int) -> None:
        """One epoch of optimizer steps, then its dev metrics, history record and best-epoch offer."""
        config = self.config
        self.task.train()
        totals: dict[str, float] = {}
        n_steps = 0
        bar = progress(
            self.task.batches(epoch),
            f"{config.name} epoch {epoch}/{config.epochs}",
            total=config.steps_per_epoch,
            unit="step",
            disable=not config.show_progress,
        )
        for batch in bar:
            values = self.step(batch, epoch, n_steps + 1)
            n_steps += 1
            for key, value in values.items():
                totals[key] = totals.get(key, 0.0) + value
            bar.set_postfix(loss=f"{values['loss']:.4f}")
            if config.log_every and self.global_step % config.log_every == 0:
                recent = self.step_losses[-config.log_every :]
                log.info(
                    "%s step %d: loss %.4f (mean of last %d), lr %.2e",
                    config.name,
                    self.global_step,
                    sum(recent) / len(recent),
                    len(recent),
                    self.scheduler.get_last_lr()[0],
                )
        if n_steps == 0:
            raise LexgraphError(f"{config.name}: epoch {epoch} had no batch")
        record: dict[str, float] = {"epoch": epoch, **{k: v / n_steps for k, v in totals.items()}}
        metrics = self.evaluate()
        if self.metric_key and metrics:
            record[self.metric_key] = metrics[config.selection_metric]
        self.history.append(record)
        log.info(
            "%s epoch %d: loss %.4f%s",
            config.name,
            epoch,
            record["loss"],
            f", {self.metric_key} {record[self.metric_key]:.4f}" if self.metric_key in record else "",
        )
        self.best.offer(epoch, metrics)

    def step(self, batch: Sequence, epoch: int = 1, step: int = 1) -> dict[str, float]:
        """One optimizer step on ``batch`` (step ``step`` of ``epoch``, for the NaN error): its
        forward and backward passes, the NaN guard, the update. Reads one value back from the
        device, the loss (:meth:`batch_losses`)."""
        values = self.batch_losses(batch)
        if self.scaler is None and not math.isfinite(values["loss"]):
            raise self.task.nan_error(values["loss"], epoch, step)
        self.optimizer_step()
        self.global_step += 1
        self.step_losses.append(values["loss"])
        return values

    def batch_losses(self, batch: Sequence) -> dict[str, float]:
        """Forward and backward of this process's micro-batches of ``batch`` (gradients
        accumulate); returns the loss and the task's loss parts, summed over every process."""
        runtime, accumulation = self.runtime, self.config.accumulation_steps
        parts_per_step = runtime.world_size * accumulation
        n_global = len(batch)
        sums: dict[str, torch.Tensor | float] = {}
        for micro in range(accumulation):
            local = shard(batch, micro * runtime.world_size + runtime.rank, parts_per_step)
            if len(local) == 0:
                continue
            out = self.task.step(local)
            loss, parts = out if isinstance(out, tuple) else (out, {})
            weight = len(local) / n_global
            scaled = loss if weight == 1.0 else loss * weight
            runtime.accelerator.backward(scaled)  # fp16: scaled by the GradScaler
            sums["loss"] = sums.get("loss", 0.0) + scaled.detach().float()
            for key, value in parts.items():
                sums[key] = sums.get(key, 0.0) + float(value) * weight
        keys = ["loss", *sorted(k for k in sums if k != "loss")]
        if runtime.world_size == 1:
            return {k: float(sums.get(k, 0.0)) for k in keys}
        # every process needs the same names: the task's parts are fixed per task
        reduced = runtime.all_reduce_sum(
            torch.tensor([float(sums.get(k, 0.0)) for k in keys], dtype=torch.float64, device=runtime.device)
        )
        return dict(zip(keys, reduced.tolist()))

    def optimizer_step(self) -> None:
        """Average the gradients across processes, unscale (fp16), clip, step, zero them,
        and advance the schedule."""
        optimizer, scaler = self.optimizer, self.scaler
        _sync_gradients(self.params, self.runtime)
        if scaler is not None:
            scaler.unscale_(optimizer)
        if self.config.max_grad_norm > 0:
            nn.utils.clip_grad_norm_(self.clip, self.config.max_grad_norm)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()

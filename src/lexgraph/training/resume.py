"""Resumable training: a training stage killed after an epoch resumes from that epoch.

At the end of each epoch :func:`lexgraph.training.engine.fit` saves what it needs to go on:
the modules' weights, the optimizer, the scheduler and the gradient scaler, the random
states (Python, NumPy, torch, CUDA) and the task's own (its generators, its logs:
``TrainingTask.state_dict``), the best epoch so far with its weights and metrics, the
history. A rerun of the stage with the same fingerprint (its settings and the digests of
its inputs, :mod:`lexgraph.core.provenance`) loads the last checkpoint, says so in one log
line, and trains only the epochs left: on CPU with ``base.deterministic: true`` the final
model is byte-identical to an uninterrupted run's. A rerun with other settings or inputs
says so and starts afresh. The checkpoints are removed when the stage completes.

Where: ``<out's folder>/.<out's name>.resume/`` next to the stage's model output (never
one of its outputs, so ``dvc repro`` neither removes nor records it; ``.gitignore`` ignores
``*.resume/``). In it, ``fingerprint.json`` and, for the k-th :func:`fit` of the stage
(train_dsr's refit is its second), ``fit-k.pt`` written by the main process and
``fit-k.rank-R.epoch-E.pt`` with each process's random and task states. Every file is
written atomically (:func:`lexgraph.core.io.atomic_path`), the rank files first: a kill
between two writes leaves the previous epoch's checkpoint whole.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lexgraph.core.io import atomic_path, write_json
from lexgraph.core.provenance import fingerprint

log = logging.getLogger(__name__)

FINGERPRINT = "fingerprint.json"


def checkpoint_dir(out: str | Path) -> Path:
    """The resume folder of a stage whose model output is ``out``."""
    out = Path(out)
    return out.parent / f".{out.name}.resume"


def random_states() -> dict[str, Any]:
    """This process's global random states."""
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_random_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _save(state: dict[str, Any], target: Path) -> None:
    with atomic_path(target) as tmp:
        torch.save(state, tmp)


def _load(path: Path) -> dict[str, Any]:
    # lexgraph's own file in the user's workspace (it holds NumPy random states, so not weights_only)
    return torch.load(path, map_location="cpu", weights_only=False)


class Resume:
    """The resume folder of one stage run; :meth:`next_fit` hands each :func:`fit` its point."""

    def __init__(self, directory: Path, digest: str, rank: int = 0) -> None:
        self.directory, self.digest, self.rank = directory, digest, rank
        self.fits = 0

    def next_fit(self) -> ResumePoint:
        self.fits += 1
        return ResumePoint(self.directory, self.fits, self.rank)


class ResumePoint:
    """The checkpoints of one :func:`fit`: the common state (main process) and each process's own."""

    def __init__(self, directory: Path, index: int, rank: int) -> None:
        self.directory, self.index, self.rank = directory, index, rank
        self.common = directory / f"fit-{index}.pt"

    def _own(self, epoch: int) -> Path:
        return self.directory / f"fit-{self.index}.rank-{self.rank}.epoch-{epoch}.pt"

    def save(self, common: dict[str, Any] | None, own: dict[str, Any], epoch: int, runtime) -> None:
        """Write this process's state, then (main process, once every process has written)
        the common state; older own states are removed last."""
        _save({"epoch": epoch, **own}, self._own(epoch))
        runtime.wait()
        if common is not None:
            _save({"epoch": epoch, **common}, self.common)
        runtime.wait()
        for old in self.directory.glob(f"fit-{self.index}.rank-{self.rank}.epoch-*.pt"):
            if old != self._own(epoch):
                old.unlink(missing_ok=True)

    def load(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """``(common, own)`` of the last saved epoch, or ``None`` when there is none."""
        if not self.common.is_file():
            return None
        common = _load(self.common)
        own = self._own(common["epoch"])
        if not own.is_file():
            log.warning("resume: %s lacks %s; this training starts afresh", self.directory, own.name)
            return None
        return common, _load(own)


@contextlib.contextmanager
def resumable(out: str | Path, settings: Any, inputs: dict[str, Path], runtime=None) -> Iterator[Resume]:
    """The resume folder of the stage writing ``out``, for the fingerprint of ``settings``
    and ``inputs``; a folder of another fingerprint is removed (logged); the folder is
    removed when the block completes, kept when it raises (or the stage is killed)."""
    directory = checkpoint_dir(out)
    digest = fingerprint(settings, inputs)["digest"]
    is_main = runtime is None or runtime.is_main
    if is_main:
        _claim(directory, digest)
    if runtime is not None:
        runtime.wait()
    yield Resume(directory, digest, 0 if runtime is None else runtime.rank)
    if runtime is not None:
        runtime.wait()
    if is_main and directory.exists():
        shutil.rmtree(directory)


def _claim(directory: Path, digest: str) -> None:
    """Keep ``directory`` when it belongs to a run of ``digest``, else empty it and record ``digest``."""
    recorded = None
    with contextlib.suppress(OSError, ValueError):
        recorded = json.loads((directory / FINGERPRINT).read_text(encoding="utf-8")).get("digest")
    if recorded == digest:
        return
    if directory.exists():
        log.info("resume: the checkpoints in %s are of a run with other settings or inputs; starting afresh", directory)
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    write_json({"digest": digest}, directory / FINGERPRINT)


def _task_state(task) -> dict[str, Any]:
    return task.state_dict() if hasattr(task, "state_dict") else {}


def start(loop, point: ResumePoint | None) -> tuple[int, dict[str, float]]:
    """``(first epoch to train, the untrained model's dev metrics)``: from the last checkpoint
    of ``point`` (restored into ``loop``, logged), else from the start (epoch 0 evaluated)."""
    saved = point.load() if point is not None else None
    if saved is None:
        return 1, loop.epoch_zero()
    common, own = saved
    for module, state in zip(loop.modules, common["modules"]):
        module.load_state_dict(state)
    loop.optimizer.load_state_dict(common["optimizer"])
    loop.scheduler.load_state_dict(common["scheduler"])
    if loop.scaler is not None and common["scaler"] is not None:
        loop.scaler.load_state_dict(common["scaler"])
    best = loop.best
    best.epoch, best.score, best.metrics, best._states = (
        common["best"][k] for k in ("epoch", "score", "metrics", "states")
    )
    loop.history, loop.step_losses, loop.global_step = common["history"], common["step_losses"], common["global_step"]
    set_random_states(own["random"])
    if hasattr(loop.task, "load_state_dict"):
        loop.task.load_state_dict(own["task"])
    log.info(
        "%s: resumed after epoch %d of %d from %s", loop.config.name, common["epoch"], loop.config.epochs, point.common
    )
    return common["epoch"] + 1, common["initial"]


def save(loop, point: ResumePoint | None, epoch: int, initial: dict[str, float]) -> None:
    """Checkpoint ``loop`` after ``epoch`` (nothing without ``point``)."""
    if point is None:
        return
    best = loop.best
    common = None
    if loop.runtime.is_main:
        common = {
            "modules": [m.state_dict() for m in loop.modules],
            "optimizer": loop.optimizer.state_dict(),
            "scheduler": loop.scheduler.state_dict(),
            "scaler": loop.scaler.state_dict() if loop.scaler is not None else None,
            "best": {"epoch": best.epoch, "score": best.score, "metrics": best.metrics, "states": best._states},
            "history": loop.history,
            "step_losses": loop.step_losses,
            "global_step": loop.global_step,
            "initial": initial,
        }
    point.save(common, {"random": random_states(), "task": _task_state(loop.task)}, epoch, loop.runtime)

"""Resumable training: a training stage killed after an epoch resumes from that epoch.

At the end of each epoch :func:`lexgraph.training.engine.fit` saves what it needs to go on:
the weights that train, the optimizer, the scheduler and the gradient scaler, the random
states (Python, NumPy, torch, CUDA) and the task's own (its generators, its logs:
``TrainingTask.state_dict``), the best epoch so far with its weights and metrics, the
history. A rerun of the stage with the same fingerprint (its settings and the digests of
its inputs, :mod:`lexgraph.core.provenance`) loads the last checkpoint, says so in one log
line, and trains only the epochs left: on CPU with ``base.deterministic: true`` the final
model is byte-identical to an uninterrupted run's. A rerun with other settings or inputs
says so and starts afresh. The checkpoints are removed when the stage completes.

What a checkpoint holds (:mod:`lexgraph.training.checkpoint`): of each module, the parameters that train
(``requires_grad``) and the buffers; a frozen parameter is not copied but referenced by the
SHA-256 of every frozen weight (:func:`states_digest`), which a resumed run must start from
too. The optimizer holds state only for what trains (:func:`lexgraph.training.engine.build_optimizer`
skips frozen parameters). The best epoch's weights are not copied either when they are the
weights just saved (the best epoch is the last one) or the untrained start (epoch 0, referenced
by its digest). ``train_dsr`` on the sample: 2.1 GB per checkpoint before, 0.3 GB now.

Trust: ``fingerprint.json`` records, besides the fingerprint, the SHA-256 of every checkpoint
file, rewritten atomically once the file is complete (while ``fit-k.pt`` is replaced, both its
old and its new digest are listed, so that a kill at any point leaves one checkpoint whose
digest is recorded). Before a checkpoint is used its bytes must match (a flipped bit, a
truncated or partly written file does not), it must load, hold the weights this training
trains, all finite, and have been saved over the same frozen weights; otherwise it is discarded
with one log line naming it, and the training starts afresh.

Where: ``<out's folder>/.<out's name>.resume/`` next to the stage's model output (never
one of its outputs, so ``dvc repro`` neither removes nor records it; ``.gitignore`` ignores
``*.resume/``). Inside the copy of the workspace that ``dvc exp run --temp`` (or a queued
experiment) runs in, ``<DVC's tmp>/exps/[standalone/]tmpXXXX/``, that folder would stay behind in
a copy that no rerun uses (each run gets a new copy): there the checkpoints go to
``<DVC's tmp>/resume/<out's path, '/' as '--'>.<16 hex digits of the fingerprint>/``, outside the
copy, so that the same experiment run again (the same settings and inputs) resumes
(:func:`checkpoint_dir`). In the folder, ``fingerprint.json`` and, for the k-th :func:`fit` of
the stage (train_dsr's refit is its second), ``fit-k.pt`` written by the main process and
``fit-k.rank-R.epoch-E.pt`` with each process's random and task states. Every file is
written atomically (:func:`lexgraph.core.io.atomic_path`), the rank files first: a kill
between two writes leaves the previous epoch's checkpoint whole. A write that fails (disk
full, quota) is one :class:`~lexgraph.core.errors.DataError` naming the file; what is left is
the previous checkpoint, still trusted.

Links: the resume folder may be a symbolic link to a folder elsewhere (a larger disk): the
checkpoints are written there, and removed from there at the end; the link and the folder it
points to stay. A link to a missing folder, or a parent that is a broken link, is one
:class:`~lexgraph.core.errors.DataError` naming it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lexgraph.core.errors import DataError
from lexgraph.core.provenance import digest_path, fingerprint
from lexgraph.training.checkpoint import (
    FORMAT,
    MANIFEST,
    Damaged,
    frozen_state,
    load_trained_state,
    not_finite,
    read_manifest,
    recorded_digests,
    save_hashed,
    states_digest,
    trained_keys,
    trained_state,
    verified_load,
    write_manifest,
)

log = logging.getLogger(__name__)

FINGERPRINT = MANIFEST
#: where, in DVC's tmp folder, the checkpoints of a run in an experiment's temporary copy go
EXPERIMENT_RESUME = "resume"


def checkpoint_dir(out: str | Path, digest: str | None = None) -> Path:
    """The resume folder of a stage whose model output is ``out`` and whose fingerprint is
    ``digest``: ``.<name>.resume`` beside ``out``, or, when ``out`` lies in a copy that DVC runs
    an experiment in, a folder of DVC's tmp folder keyed by ``out``'s path in the copy and
    ``digest`` (module docstring)."""
    out = Path(out)
    copy = experiment_copy(out)
    if copy is None:
        return out.parent / f".{out.name}.resume"
    root, dvc_tmp = copy
    key = "--".join(Path(os.path.abspath(out)).relative_to(root).parts)
    return dvc_tmp / EXPERIMENT_RESUME / (f"{key}.{digest[:16]}" if digest else key)


def experiment_copy(path: str | Path) -> tuple[Path, Path] | None:
    """``(the copy's root, DVC's tmp folder)`` when ``path`` lies in a temporary copy of a
    workspace that DVC runs an experiment in (``dvc exp run --temp``: ``<tmp>/exps/standalone/
    tmpXXXX``; a queued one: ``<tmp>/exps/tmpXXXX``), else ``None``: the nearest folder above
    ``path`` with a ``.dvc`` folder is the workspace, and it is such a copy when it lies there."""
    for root in Path(os.path.abspath(path)).parents:
        if (root / ".dvc").is_dir():
            parent = root.parent
            if parent.name == "standalone":
                parent = parent.parent
            return (root, parent.parent) if parent.name == "exps" else None
    return None


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


class Resume:
    """The resume folder of one stage run; :meth:`next_fit` hands each :func:`fit` its point."""

    def __init__(self, directory: Path, digest: str, rank: int = 0) -> None:
        self.directory, self.digest, self.rank = directory, digest, rank
        self.fits = 0

    def next_fit(self) -> ResumePoint:
        self.fits += 1
        return ResumePoint(self.directory, self.fits, self.rank, self.digest)


class ResumePoint:
    """The checkpoints of one :func:`fit`: the common state (main process) and each process's own."""

    def __init__(self, directory: Path, index: int, rank: int, digest: str = "") -> None:
        self.directory, self.index, self.rank, self.digest = directory, index, rank, digest
        self.common = directory / f"fit-{index}.pt"
        self.start_digest: str | None = None  # of the trained weights as this fit starts
        self.frozen_digest: str | None = None  # of the frozen weights

    def _own(self, epoch: int, rank: int | None = None) -> Path:
        return self.directory / f"fit-{self.index}.rank-{self.rank if rank is None else rank}.epoch-{epoch}.pt"

    def save(self, common: dict[str, Any] | None, own: dict[str, Any], epoch: int, runtime) -> None:
        """Write this process's state, then (main process, once every process has written)
        the common state and the digests; older own states are removed last."""
        save_hashed({"epoch": epoch, **own}, self._own(epoch))
        runtime.wait()
        if common is not None:
            recorded = recorded_digests(self.directory)
            others = {k: v for k, v in recorded.items() if not k.startswith(f"fit-{self.index}.")}
            ranks = {
                self._own(epoch, r).name: [digest_path(self._own(epoch, r))]
                for r in range(getattr(runtime, "world_size", 1))
            }
            previous = recorded.get(self.common.name, [])[:1]

            def both(new: str) -> None:  # while fit-k.pt is replaced, the old and the new are trusted
                write_manifest(self.directory, self.digest, {**recorded, **ranks, self.common.name: [new, *previous]})

            new = save_hashed({"epoch": epoch, **common}, self.common, before_rename=both)
            write_manifest(self.directory, self.digest, {**others, **ranks, self.common.name: [new]})
        runtime.wait()
        for old in self.directory.glob(f"fit-{self.index}.rank-{self.rank}.epoch-*.pt"):
            if old != self._own(epoch):
                old.unlink(missing_ok=True)

    def load(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """``(common, own)`` of the last saved epoch, or ``None`` when there is none; a file
        that is damaged, unreadable or missing raises :class:`Damaged`."""
        if not (self.common.exists() or self.common.is_symlink()):
            return None
        recorded = recorded_digests(self.directory)
        common = verified_load(self.common, recorded)
        own = self._own(common["epoch"])
        if not own.is_file():
            raise Damaged(self.directory, f"lacks {own.name}")
        return common, verified_load(own, recorded)

    def discard(self, runtime) -> None:
        """Remove this fit's checkpoint files (the common one by the main process)."""
        with contextlib.suppress(OSError):
            if runtime.is_main:
                self.common.unlink(missing_ok=True)
            for old in self.directory.glob(f"fit-{self.index}.rank-{self.rank}.epoch-*.pt"):
                old.unlink(missing_ok=True)


@contextlib.contextmanager
def resumable(out: str | Path, settings: Any, inputs: dict[str, Path], runtime=None) -> Iterator[Resume]:
    """The resume folder of the stage writing ``out``, for the fingerprint of ``settings``
    and ``inputs``; a folder of another fingerprint is emptied (logged); the checkpoints are
    removed when the block completes, kept when it raises (or the stage is killed)."""
    digest = fingerprint(settings, inputs)["digest"]
    directory = checkpoint_dir(out, digest)
    is_main = runtime is None or runtime.is_main
    if is_main:
        _claim(directory, digest)
    if runtime is not None:
        runtime.wait()
    yield Resume(directory, digest, 0 if runtime is None else runtime.rank)
    if runtime is not None:
        runtime.wait()
    if is_main:
        try:
            _empty(directory)
        except OSError as exc:
            log.warning(
                "resume: %s: the checkpoints could not be removed (%s); remove them by hand",
                directory,
                exc.strerror or exc,
            )


def _claim(directory: Path, digest: str) -> None:
    """Keep ``directory`` when it belongs to a run of ``digest`` (and of this :data:`FORMAT`),
    else empty it and record ``digest``."""
    record = read_manifest(directory)
    if record.get("digest") == digest and record.get("format") == FORMAT and directory.is_dir():
        return
    if directory.is_dir():
        if record.get("digest") == digest:
            log.info("resume: the checkpoints in %s were written by an older lexgraph; starting afresh", directory)
        else:
            log.info(
                "resume: the checkpoints in %s are of a run with other settings or inputs; starting afresh", directory
            )
    _make(directory, stale=directory.is_dir())
    if directory.is_symlink():
        log.info("resume: %s is a symbolic link: the checkpoints go to %s", directory, os.path.realpath(directory))
    write_manifest(directory, digest, {})


def _make(directory: Path, stale: bool) -> None:
    """Create the resume folder (through a symbolic link: its target), emptied first when it
    holds the ``stale`` checkpoints of another run; one :class:`DataError` naming what is in the
    way (a file, a broken link, a folder that cannot be written)."""
    step = "emptied of another run's checkpoints" if stale else "made"
    try:
        if stale:
            _empty(directory)
            step = "made"
        if directory.is_symlink() and not directory.exists():
            Path(os.path.realpath(directory)).mkdir()
        else:
            directory.mkdir(parents=True, exist_ok=True)  # a file there: FileExistsError
    except OSError as exc:
        broken = next((p for p in (directory, *directory.parents) if p.is_symlink() and not p.exists()), None)
        if broken is not None:
            why = f"{broken} is a broken symbolic link (to '{os.readlink(broken)}'); create its target or remove it"
        else:
            why = f"{exc.strerror or exc}; expected a folder or a symbolic link to one: fix or remove it"
        raise DataError(directory, f"the resume folder could not be {step}: {why}, and rerun") from None


def _ours(name: str) -> bool:
    """Whether ``name`` is a file this module writes in a resume folder (or its temporary)."""
    name = name.removeprefix(".") if name.endswith(".tmp") else name
    return name.startswith((f"{FINGERPRINT}", "fit-")) and (name.endswith((".pt", ".tmp")) or name == FINGERPRINT)


def _empty(directory: Path) -> None:
    """Remove the checkpoints: the folder, or for a symbolic link the checkpoint files in the
    folder it points to (the link, that folder and anything else in it stay)."""
    if directory.is_symlink():
        target = Path(os.path.realpath(directory))
        if target.is_dir():
            for entry in target.iterdir():
                if _ours(entry.name) and not entry.is_dir():
                    entry.unlink()
    elif directory.exists():
        shutil.rmtree(directory)


def _task_state(task) -> dict[str, Any]:
    return task.state_dict() if hasattr(task, "state_dict") else {}


def _check(loop, point: ResumePoint, common: dict[str, Any]) -> None:
    """Raise :class:`Damaged` unless ``common`` holds the weights ``loop`` trains, finite,
    saved over this run's frozen weights (and, when its best epoch is the untrained start,
    from this run's start). Its layout is this module's (:func:`save`): its bytes are those
    recorded when it was written, in a folder of this :data:`FORMAT` (:func:`_claim`)."""
    modules, best = common["modules"], common["best"]
    other = [type(m).__name__ for m, state in zip(loop.modules, modules) if set(state) != trained_keys(m)]
    key = not_finite(list(modules) + (best["states"] if isinstance(best["states"], list) else []))
    problems = [  # (whether it has the problem, the words): the first one found is raised
        (len(modules) != len(loop.modules), f"holds the weights of {len(modules)} modules, not {len(loop.modules)}"),
        (bool(other), f"holds other weights than {', '.join(other)} trains"),
        (
            common["frozen"] != point.frozen_digest,
            "was saved over other frozen weights than this run's (the model it starts from changed)",
        ),
        (
            best["states"] == "start" and best["start"] != point.start_digest,
            "keeps the untrained model as the best epoch, and this run starts from other weights",
        ),
        (key is not None, f"holds nan or infinite weights ('{key}')"),
    ]
    reason = next((words for found, words in problems if found), None)
    if reason is not None:
        raise Damaged(point.common, reason)


def _agree(runtime, ok: bool) -> bool:
    """Whether every process found its checkpoint usable."""
    if getattr(runtime, "world_size", 1) == 1:
        return ok
    flag = torch.tensor([1.0 if ok else 0.0], device=runtime.device)
    return int(runtime.all_reduce_sum(flag).item()) == runtime.world_size


def start(loop, point: ResumePoint | None) -> tuple[int, dict[str, float]]:
    """``(first epoch to train, the untrained model's dev metrics)``: from the last checkpoint
    of ``point`` (restored into ``loop``, logged), else from the start (epoch 0 evaluated). A
    checkpoint that is damaged or does not fit is discarded with one log line naming it."""
    if point is None:
        return 1, loop.epoch_zero()
    point.start_digest = states_digest([trained_state(m) for m in loop.modules])
    point.frozen_digest = states_digest([frozen_state(m) for m in loop.modules])
    saved, problem = None, None
    try:
        saved = point.load()
        if saved is not None:
            _check(loop, point, saved[0])
    except Damaged as damaged:
        saved, problem = None, damaged
    if not _agree(loop.runtime, problem is None):
        saved = None
        if problem is not None and (loop.runtime.is_main or problem.path != point.common):
            log.warning("resume: %s %s; this training starts afresh (the checkpoint is discarded)", *problem.args)
        point.discard(loop.runtime)
    if saved is None:
        return 1, loop.epoch_zero()
    common, own = saved
    best_states = common["best"]["states"]
    if best_states == "start":
        best_states = [trained_state(m, copy=True) for m in loop.modules]
    for module, state in zip(loop.modules, common["modules"]):
        load_trained_state(module, state)
    if best_states == "current":
        best_states = common["modules"]
    loop.optimizer.load_state_dict(common["optimizer"])
    loop.scheduler.load_state_dict(common["scheduler"])
    if loop.scaler is not None and common["scaler"] is not None:
        loop.scaler.load_state_dict(common["scaler"])
    best = loop.best
    best.epoch, best.score, best.metrics = (common["best"][k] for k in ("epoch", "score", "metrics"))
    best._states = best_states
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
    began = time.perf_counter()
    best = loop.best
    common = None
    if loop.runtime.is_main:
        states: Any = best._states
        if states is not None and best.epoch == epoch:
            states = "current"  # the weights saved under "modules"
        elif states is not None and best.epoch == 0 and states_digest(states) == point.start_digest:
            states = "start"  # the weights this fit starts from: a rerun builds them again
        common = {
            "format": FORMAT,
            "modules": [trained_state(m) for m in loop.modules],
            "frozen": point.frozen_digest,
            "optimizer": loop.optimizer.state_dict(),
            "scheduler": loop.scheduler.state_dict(),
            "scaler": loop.scaler.state_dict() if loop.scaler is not None else None,
            "best": {
                "epoch": best.epoch,
                "score": best.score,
                "metrics": best.metrics,
                "states": states,
                "start": point.start_digest,
            },
            "history": loop.history,
            "step_losses": loop.step_losses,
            "global_step": loop.global_step,
            "initial": initial,
        }
    point.save(common, {"random": random_states(), "task": _task_state(loop.task)}, epoch, loop.runtime)
    if loop.runtime.is_main:
        log.info(
            "%s: epoch %d saved to %s (%.0f MB, %.1f s)",
            loop.config.name,
            epoch,
            point.common,
            point.common.stat().st_size / 1e6,
            time.perf_counter() - began,
        )

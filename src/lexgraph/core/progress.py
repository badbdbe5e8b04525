"""Progress reporting: a tqdm bar on a terminal, periodic log lines elsewhere.

``dvc repro`` logs and CI capture stderr; a tqdm bar there writes ``\\r``-separated
redraws into one huge line. Every progress report of lexgraph goes through
:class:`Progress` (:func:`progress` to wrap an iterable, :func:`progress_bar` to count
by hand): it draws a tqdm bar only when stderr is a TTY and otherwise logs
``desc: i/n unit (s)`` at most every ``every`` seconds (the first line after ``first`` seconds,
when given), plus a last line when the loop took that long; with ``rate``, each line adds the
units per second and, before the end, about how long is left (``lexgraph index``: articles/s
and the expected end within its first 2 s). :func:`quiet_third_party_bars` silences the bars of the Hugging Face
libraries (transformers' "Loading weights", huggingface_hub downloads, datasets) off a
TTY; :func:`lexgraph.core.stage.setup_logging` calls it.

Pipeline-wide: :func:`log_stage_start` (called by :func:`lexgraph.core.stage.run_stage`) logs
``stage train_gnn@gdsr (14 of 22)``, the stage's place in the order ``dvc repro`` runs the
whole pipeline (:func:`pipeline_order`, read from ``dvc.yaml``).
"""

from __future__ import annotations

import logging
import os
import posixpath
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger("lexgraph.core.progress")
stage_log = logging.getLogger("lexgraph")  # the logger of run_stage's "stage ... done" line

#: Environment variables that switch the Hugging Face libraries' bars off (read at their import).
HF_PROGRESS_ENV = ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS")


def stderr_is_tty() -> bool:
    """True when stderr is a terminal (where a tqdm bar redraws in place)."""
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # replaced or closed stream
        return False


class Progress:
    """A tqdm-like progress report: iterate it, or call :meth:`update`; :meth:`set_postfix`
    adds values (a loss) to the bar or the log line; :meth:`close` or ``with`` ends it.

    ``disable=True`` reports nothing at all (small inputs). ``first``: seconds before the first log
    line (default ``every``); ``rate``: lines say units per second and the time left. A count may
    grow by fractions (units measured by their share of the work, such as tokens)."""

    def __init__(
        self,
        iterable: Iterable[T] | None = None,
        desc: str = "",
        total: int | None = None,
        unit: str = "it",
        every: float = 30.0,
        disable: bool = False,
        leave: bool = True,
        first: float | None = None,
        rate: bool = False,
    ) -> None:
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.iterable, self.desc, self.total, self.unit, self.every = iterable, desc, total, unit, every
        self.disable, self.rate = bool(disable), bool(rate)
        self.count: float = 0
        self._postfix = ""
        self._closed = False
        self._bar = None
        if not self.disable and stderr_is_tty():
            from tqdm.auto import tqdm

            self._bar = tqdm(iterable, desc=desc, total=total, unit=unit, leave=leave, disable=False)
        self._start = time.monotonic()
        self._next = self._start + (every if first is None else first)

    def __iter__(self) -> Iterator[T]:
        if self.iterable is None:
            raise TypeError("this Progress has no iterable; call update() instead")
        if self._bar is not None:
            yield from self._bar
            return
        for item in self.iterable:
            yield item
            self.update(1)
        self.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _line(self, done: bool) -> None:
        elapsed = time.monotonic() - self._start
        total = self.total if self.total is not None else "?"
        log.info(
            "%s: %d/%s %s %s %.0f s%s%s",
            self.desc,
            self.count,
            total,
            self.unit,
            "done in" if done else "after",
            elapsed,
            self._speed(elapsed, done),
            f" ({self._postfix})" if self._postfix else "",
        )

    def _speed(self, elapsed: float, done: bool) -> str:
        """``, 12.5 article/s, about 3 min 40 s left`` (``rate`` only; the time left while not done)."""
        if not self.rate or elapsed <= 0 or self.count <= 0:
            return ""
        speed = self.count / elapsed
        left = "" if done or self.total is None else f", about {duration((self.total - self.count) / speed)} left"
        return f", {speed:.1f} {self.unit}/s{left}"

    def update(self, n: float = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)
            return
        self.count += n
        if self.disable:
            return
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.every
            self._line(done=False)

    def set_postfix(self, refresh: bool = True, **values: Any) -> None:
        if self._bar is not None:
            self._bar.set_postfix(refresh=refresh, **values)
        else:
            self._postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        elif not self.disable and time.monotonic() - self._start >= self.every:
            self._line(done=True)


def progress(
    iterable: Iterable[T],
    desc: str,
    total: int | None = None,
    every: float = 30.0,
    *,
    unit: str = "it",
    disable: bool = False,
    leave: bool = True,
) -> Progress:
    """Iterate ``iterable`` reporting progress (see the module docstring)."""
    return Progress(iterable, desc, total, unit=unit, every=every, disable=disable, leave=leave)


def progress_bar(total: int | None, desc: str, **options: Any) -> Progress:
    """A :class:`Progress` counted by hand with :meth:`Progress.update` (``options``: its keywords)."""
    return Progress(None, desc, total, **options)


def duration(seconds: float) -> str:
    """``seconds`` for a reader: ``45 s``, ``3 min 40 s``, ``2 h 05 min``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def quiet_third_party_bars() -> None:
    """Off a TTY, switch off the progress bars of transformers, huggingface_hub and datasets:
    through their environment variables (unless the user set them) for libraries not yet
    imported, and through their own switches for those already imported."""
    if stderr_is_tty():
        return
    hub, datasets = (
        os.environ.setdefault(name, "1").strip().lower() in ("1", "true", "yes", "on") for name in HF_PROGRESS_ENV
    )  # False: the user asked for bars
    if hub and "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if hub and "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if datasets and "datasets" in sys.modules:
        from datasets.utils import disable_progress_bars as disable_datasets_bars

        disable_datasets_bars()


def _stage_paths(body: dict, keys: tuple[str, ...], item: object, key: object) -> list[tuple[str, ...]]:
    """The paths a stage lists under ``keys`` (an entry is a path or ``{path: options}``), with
    a ``foreach`` stage's ``${item}``, ``${key}`` and (a mapping item's) ``${item.<name>}`` filled
    in, as path parts below dvc.yaml."""
    wdir = str(body.get("wdir", "."))
    fields = item.items() if isinstance(item, dict) else ()
    found = []
    for name in keys:
        for entry in body.get(name) or []:
            path = str(next(iter(entry)) if isinstance(entry, dict) else entry)
            path = path.replace("${item}", str(item)).replace("${key}", str(key))
            for field, value in fields:
                path = path.replace(f"${{item.{field}}}", str(value))
            if "${" in path:  # another interpolation: not resolved here
                raise TypeError(f"{path} is interpolated")
            found.append(tuple(p for p in posixpath.normpath(posixpath.join(wdir, path)).split("/") if p != "."))
    return found


def _expanded(stages: dict):
    """``(name, deps, outs)`` per stage of dvc.yaml's ``stages``, ``foreach`` stages expanded
    (``train_gnn@gdsr``: a list's values or a mapping's keys name them)."""
    for name, body in stages.items():
        if "foreach" not in body:
            yield name, _stage_paths(body, ("deps",), None, None), _stage_paths(body, OUTPUTS, None, None)
            continue
        values = body["foreach"]
        if isinstance(values, str):  # an interpolated ${...} list: not resolved here
            raise TypeError(f"foreach of {name} is {values!r}")
        scalar = (str, int, float, bool)
        pairs = (
            values.items()
            if isinstance(values, dict)
            else [(v if isinstance(v, scalar) else i, v) for i, v in enumerate(values)]
        )
        for key, item in pairs:
            do = body["do"]
            yield f"{name}@{key}", _stage_paths(do, ("deps",), item, key), _stage_paths(do, OUTPUTS, item, key)


#: what a dvc.yaml stage writes
OUTPUTS = ("outs", "metrics", "plots")


def pipeline_order(dvc_yaml: str | os.PathLike) -> list[str] | None:
    """The stages of ``dvc_yaml`` in the order a full ``dvc repro`` runs them, ``foreach`` stages
    expanded (``train_gnn@gdsr``): DVC's plan, a depth-first post-order over the stages in file
    order, each after the stages whose outputs overlap its deps. ``None`` when the file is
    missing or holds something this does not read (a ``matrix`` stage, an interpolated
    ``foreach``): a progress line then goes without its position, never fails a stage."""
    import yaml

    try:
        stages = yaml.safe_load(Path(dvc_yaml).read_text(encoding="utf-8"))["stages"]
        if any("matrix" in body for body in stages.values()):
            return None
        expanded = list(_expanded(stages))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError, AttributeError, StopIteration):
        return None

    def overlaps(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
        return a[: len(b)] == b or b[: len(a)] == a

    upstream = {
        name: [other for dep in deps for other, _, outs in expanded if any(overlaps(dep, out) for out in outs)]
        for name, deps, _ in expanded
    }
    order: list[str] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        seen.add(name)
        for other in upstream[name]:
            if other not in seen:
                visit(other)
        order.append(name)

    for name in upstream:
        if name not in seen:
            visit(name)
    return order


def log_stage_start() -> None:
    """Under ``dvc repro`` (``$DVC_STAGE`` set), log that the stage starts and its place in the
    run: ``stage train_dsr (10 of 22)``. The stage is ``$DVC_STAGE`` (``train_gnn@gdsr``, or
    ``../dvc.yaml:train_dsr`` when ``dvc repro`` was started in another directory); the
    pipeline, the ``dvc.yaml`` of the working directory (DVC runs a command in its dvc.yaml's
    directory); a stage not found there logs its name alone. A driver run by hand (no
    ``$DVC_STAGE``) is no part of a run and logs nothing here: its error stays the one line
    on stderr."""
    stage = os.environ.get("DVC_STAGE", "").rpartition(":")[2]
    if not stage:
        return
    order = pipeline_order("dvc.yaml") or []
    if stage in order:
        stage_log.info("stage %s (%d of %d)", stage, order.index(stage) + 1, len(order))
    else:
        stage_log.info("stage %s", stage)


__all__ = [
    "Progress",
    "log_stage_start",
    "pipeline_order",
    "progress",
    "progress_bar",
    "quiet_third_party_bars",
    "stderr_is_tty",
]

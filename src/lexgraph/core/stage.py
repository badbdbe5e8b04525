"""Shared plumbing for the thin stage drivers in ``stages/``.

A driver declares its stage (every stage alike) and hands it to :func:`run_stage`::

    STAGE = Stage("bm25", section="bm25", paths=Bm25Paths, settings=Bm25Config.from_params, run=run_bm25)

    if __name__ == "__main__":
        sys.exit(run_stage(STAGE))

Every stage's entry has one signature, ``run(paths, config, context)``: its paths dataclass (one
required ``--<field>`` option per field, :func:`add_paths`), its typed settings and a
:class:`StageContext` (seed, device, variant). A stage run once per variant (``train_gnn``,
``rerank``) declares its ``variants`` (the ``--variant`` option) and its settings callable returns
each variant's settings, all checked up front; ``run`` receives the variant's.

``run_stage`` parses the command line (``--params``, ``--variant`` and one option per paths field: :func:`parser_of`),
loads ``params.yaml`` (unknown top-level sections and a bad ``base`` are errors), builds
the section's typed settings with ``stage.settings`` so that a bad value fails before seeding (which
imports torch) and before any work, then configures logging, logs the stage's place in
the run under ``dvc repro`` (``stage train_dsr (10 of 22)``, :func:`lexgraph.core.progress.log_stage_start`),
sets determinism, seeds everything and calls ``stage.run(paths, config, context)`` with
those typed settings, not the raw section. A :class:`LexgraphError` becomes one line on stderr and exit
status 2 (outputs are written atomically, so nothing is left half-written or overwritten);
an interrupt, one line and status 130.

Under ``dvc repro`` a stage stops when DVC goes away (``timeout 60 dvc repro`` sends SIGTERM to
DVC alone, which does not pass it on): :func:`watch_parent` notes the processes from this one up
to DVC (the first ancestor whose environment lacks this ``$DVC_STAGE``: a shell or a launcher
such as ``accelerate launch`` in between carries it), and a thread polls them; once one of them
is gone or re-parented, the stop is requested (:func:`lexgraph.core.errors.request_stop`, so that
no atomic write renames its output after that) and SIGTERM sent to this process, which
``run_stage`` turns into an interrupt: one line, status 130, previous outputs as they were.
A DVC already gone when the stage starts is caught too: the topmost process of the stage no
longer shares its parent's process group (DVC starts commands in its own group).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

from lexgraph.core import layout
from lexgraph.core.config import load_params, seed_everything, set_deterministic
from lexgraph.core.errors import Stopped, check_stop, reported, request_stop, stop_reason
from lexgraph.core.progress import log_stage_start
from lexgraph.core.provenance import Role, path_roles, recording

log = logging.getLogger("lexgraph")

P = TypeVar("P")


@dataclass(frozen=True)
class StageContext:
    """What a stage's entry receives beside its paths and settings."""

    #: ``base.seed`` (everything is seeded with it before the entry runs)
    seed: int
    #: ``base.device`` as written (``auto``, ``cpu``, ``cuda``): :meth:`torch_device` resolves it
    device: str
    #: the ``--variant`` of a stage run once per variant (``train_gnn``, ``rerank``), else None
    variant: str | None = None

    def torch_device(self):
        """The torch device ``device`` names (``auto``: CUDA when present)."""
        from lexgraph.core.config import resolve_device

        return resolve_device(self.device)


@dataclass(frozen=True)
class Stage:
    """One stage of ``dvc.yaml`` as its driver (``stages/<name>.py``) declares it."""

    #: the stage's name in ``dvc.yaml`` (its log and error lines' label)
    name: str
    #: the params.yaml section its settings are read from
    section: str
    #: its paths dataclass: one required ``--<field>`` option per field (dvc.yaml writes them all)
    paths: type
    #: the raw section -> the typed settings (a bad value fails here, before seeding and any work);
    #: for a stage with ``variants``, a mapping of each variant to its settings
    settings: Callable[[dict], Any]
    #: the entry: ``run(paths, config, context)``
    run: Callable[[Any, Any, StageContext], Any]
    #: the ``--variant`` choices of a stage run once per variant (empty: none)
    variants: tuple[str, ...] = ()
    #: False for a stage that never runs torch (fetch, clean, BM25): it neither imports nor seeds it
    #: (importing torch takes 2 to 4 s here, longer than such a stage's refusal of a bad input)
    uses_torch: bool = True


def stage_paths(stage: str, roles: dict[str, Role] | None = None) -> type:
    """The paths dataclass of ``stage`` (frozen, one ``Path`` field per path, given by keyword; the
    order is --help's): its paths and their marks are its entry in the stage table
    (:data:`lexgraph.core.layout.STAGE_PATHS`, from ``stages.toml``), or ``roles``. dvc.yaml's
    command gives them all (:func:`add_paths`)."""
    marks = layout.STAGE_PATHS[stage] if roles is None else roles
    fields = [(name, Annotated[Path, mark]) for name, mark in marks.items()]
    title = "".join(word.title() for word in stage.split("_"))
    doc = f"The ``{stage}`` stage's paths (``dvc.yaml``'s command names them all)."
    module = sys._getframe(1).f_globals["__name__"]  # as dataclasses.make_dataclass does from 3.12
    return dataclasses.make_dataclass(
        f"{title}Paths", fields, frozen=True, kw_only=True, namespace={"__doc__": doc, "__module__": module}
    )


def add_paths(parser: argparse.ArgumentParser, paths: type) -> None:
    """One required ``--<field>`` option per field of the dataclass ``paths`` (a stage's paths
    object), with the help of the field's mark (:func:`lexgraph.core.provenance.path_roles`):
    dvc.yaml writes them all."""
    for name, role in path_roles(paths).items():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=Path, required=True, help=role.help)


def paths_from(paths: type[P], args: argparse.Namespace) -> P:
    """The paths object of ``args`` (the options :func:`add_paths` declared)."""
    return paths(**{f.name: getattr(args, f.name) for f in dataclasses.fields(paths)})


#: the loggers that log at the level asked for (``base.log_level``, the CLI's INFO): lexgraph's own
#: (a stage driver's ``lexgraph.<stage>`` included: train_dsr's summary line); every other library
#: logs at WARNING or above, so
#: torch's ``FakeTensor cache stats`` at exit, uvicorn's start-up lines and the like stay out of the logs
OWN_LOGGERS: tuple[str, ...] = ("lexgraph",)
#: libraries whose warnings are noise for a stage (retries, lock files, hub downloads): ERROR only
NOISY_LOGGERS: tuple[str, ...] = ("httpx", "urllib3", "filelock", "fsspec", "datasets", "huggingface_hub")


def setup_logging(level: str = "INFO") -> None:
    """Log lines on stderr: :data:`OWN_LOGGERS` at ``level``, every other logger at WARNING (or
    ``level`` when higher), :data:`NOISY_LOGGERS` at ERROR; off a TTY (CI, `dvc repro` captured) no
    third-party progress bar either (:func:`lexgraph.core.progress.quiet_third_party_bars`), so no
    ``\\r`` redraws. A process whose root logger has a handler already (an application that
    configured logging, pytest) keeps its levels, as :func:`logging.basicConfig` leaves it."""
    from lexgraph.core.progress import quiet_third_party_bars

    own = getattr(logging, level.upper(), logging.INFO)
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=max(own, logging.WARNING),  # the root's level: what a foreign logger passes on
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            datefmt="%H:%M:%S",
        )
        for name in OWN_LOGGERS:
            logging.getLogger(name).setLevel(own)
    for noisy in NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.ERROR)
    quiet_third_party_bars()


def parser_of(stage: Stage) -> argparse.ArgumentParser:
    """The command line of ``stage``: ``--params``, ``--variant`` when it has variants, and one
    required option per field of its paths (:func:`add_paths`)."""
    own = not stage.run.__module__.startswith("lexgraph.")  # a driver's run wrapper: its docstring is its help
    parser = argparse.ArgumentParser(description=(stage.run.__doc__ or "").strip() if own else None)
    parser.add_argument("--params", default="params.yaml", help="parameters file (default: params.yaml)")
    if stage.variants:
        parser.add_argument("--variant", required=True, choices=stage.variants)
    add_paths(parser, stage.paths)
    return parser


def run_stage(stage: Stage, argv: list[str] | None = None) -> int:
    """Run ``stage`` from the command line ``argv`` (default: ``sys.argv``): its exit status
    (0; 2 after a one-line error; 130 after an interrupt). The parser's description is the docstring
    of a driver's own ``run`` wrapper; ``tests/test_stage_startup.py`` checks that a stage with
    ``uses_torch=False`` never imports torch."""
    args = parser_of(stage).parse_args(argv)
    paths = paths_from(stage.paths, args)
    variant = getattr(args, "variant", None)

    def run() -> None:
        watch_parent()  # under `dvc repro`: stop when DVC is gone (already gone: Stopped here)
        base, params = load_params(stage.section, args.params)
        settings = stage.settings(params)  # a bad value fails here, before seeding (torch) and any work
        setup_logging(base.log_level)
        log_stage_start()  # under `dvc repro`: "stage train_dsr (10 of 22)", where the run stands
        if stage.uses_torch:
            set_deterministic(base.deterministic)
        seed_everything(base.seed, with_torch=stage.uses_torch)
        start = time.perf_counter()
        context = StageContext(seed=base.seed, device=base.device, variant=variant)
        # its directory outputs record its settings and inputs (lexgraph.core.provenance.recording)
        with recording(stage.name, {"config": settings, "seed": base.seed}, paths):
            stage.run(paths, settings[variant] if stage.variants else settings, context)  # (paths, config, context)
        log.info("stage %s done in %.1f s", stage.name, time.perf_counter() - start)

    with _terminate_interrupts():
        return reported(stage.name, run)


#: how often the watcher thread looks at the processes up to DVC (seconds)
WATCH_INTERVAL_S = 0.5


def _stat(pid: int | str) -> tuple[str, int, int, int] | None:
    """``(state, ppid, pgid, start time)`` of a process from ``/proc`` (``None``: no such process)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[2]), int(fields[19])


def _dvc_stage(pid: int | str) -> str | None:
    """``$DVC_STAGE`` in the environment a process started with (``None``: unset or unreadable)."""
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/environ", "rb") as fh:
            for item in fh.read().split(b"\0"):
                if item.startswith(b"DVC_STAGE="):
                    return os.fsdecode(item[len(b"DVC_STAGE=") :])
    return None


def _dvc_chain() -> list[tuple[int, int, int]] | None:
    """``(pid, ppid, start time)`` of this process and each ancestor up to DVC's child (the
    processes that carry this ``$DVC_STAGE``); ``None`` when not run by DVC (no ``$DVC_STAGE``
    at start, or no ``/proc``). Raises :class:`Stopped` when DVC is already gone."""
    stage = _dvc_stage("self")
    if not stage:
        return None
    chain, pid = [], os.getpid()
    while True:
        own = _stat(pid)
        parent = _stat(own[1]) if own is not None and own[1] > 0 else None
        if own is None or parent is None:
            break
        chain.append((pid, own[1], own[3]))
        if _dvc_stage(own[1]) == stage:  # a shell or launcher between DVC and this process
            pid = own[1]
            continue
        if parent[2] == own[2] and parent[0] not in "ZX":  # DVC: its child is in its process group
            return chain
        break  # DVC's child re-parented (to init, a subreaper): DVC is gone
    request_stop("its `dvc` process was gone before it started; its outputs are left as they were")
    check_stop()
    return None


def _chain_broken(chain: list[tuple[int, int, int]]) -> bool:
    """Whether a process of ``chain`` is gone or no longer the child of the one above it."""
    for pid, ppid, start in chain:
        now = _stat(pid)
        if now is None or now[0] in "ZX" or now[1] != ppid or now[3] != start:
            return True
    return False


def watch_parent(interval: float = WATCH_INTERVAL_S) -> None:
    """Under ``dvc repro``, stop this process (SIGTERM to itself, after
    :func:`lexgraph.core.errors.request_stop`) once DVC or a process between it and this one is
    gone (module docstring); a DVC already gone raises :class:`Stopped` here."""
    chain = _dvc_chain()
    if not chain:
        return

    def watch() -> None:
        while not _chain_broken(chain):
            time.sleep(interval)
        request_stop("its `dvc` process is gone; its outputs are left as they were")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="lexgraph-watch-dvc", daemon=True).start()


_INTERRUPTED: list[int] = []  # the signal that interrupted the stage: later ones are ignored


def _terminate(signum, frame):  # noqa: ARG001 - signal handler signature
    if _INTERRUPTED:  # already stopping (a SIGTERM to the group, then the watcher's): no second interrupt
        return
    _INTERRUPTED.append(signum)
    reason = stop_reason()
    raise Stopped(reason) if reason else KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def _terminate_interrupts():
    """Within the block (the whole stage), SIGTERM and SIGHUP interrupt like Ctrl-C (a
    :class:`Stopped` with its reason when a stop was requested), once: a later one, while the
    stage stops, is ignored (no second interrupt in its cleanup); unless already handled."""
    previous = {}
    _INTERRUPTED.clear()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) == signal.SIG_DFL:
                previous[sig] = signal.signal(sig, _terminate)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

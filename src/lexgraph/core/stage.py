"""Shared plumbing for the thin stage drivers in ``stages/``.

A driver is (every stage alike; :func:`add_paths` declares the stage's paths dataclass)::

    def configure(parser):
        add_paths(parser, Bm25Paths)

    def main(args, base, config):  # config: the Bm25Config that run_stage built
        run_bm25(paths_from(Bm25Paths, args), config)

    if __name__ == "__main__":
        from lexgraph.core.stage import run_stage

        sys.exit(run_stage("bm25", main, configure, config=Bm25Config.from_params))

``run_stage`` parses the command line (``--params`` and the options ``configure`` adds),
loads ``params.yaml`` (unknown top-level sections and a bad ``base`` are errors), builds
the section's typed config with ``config`` so that a bad value fails before seeding (which
imports torch) and before any work, then configures logging, logs the stage's place in
the run under ``dvc repro`` (``stage train_dsr (10 of 22)``, :func:`lexgraph.core.progress.log_stage_start`),
sets determinism, seeds everything and calls ``main(args, base, config)`` with that typed
config, not the raw section. A :class:`LexgraphError` becomes one line on stderr and exit
status 2 (outputs are written atomically, so nothing is left half-written or overwritten);
an interrupt, one line and status 130.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from lexgraph.core.config import Base, load_params, seed_everything, set_deterministic
from lexgraph.core.errors import reported
from lexgraph.core.progress import log_stage_start

log = logging.getLogger("lexgraph")

P = TypeVar("P")


def add_paths(parser: argparse.ArgumentParser, paths: type) -> None:
    """One required ``--<field>`` option per field of the dataclass ``paths`` (a stage's paths
    object), with the field's ``metadata["help"]``: dvc.yaml writes them all."""
    for f in dataclasses.fields(paths):
        parser.add_argument(
            f"--{f.name.replace('_', '-')}", dest=f.name, type=Path, required=True, help=f.metadata.get("help")
        )


def paths_from(paths: type[P], args: argparse.Namespace) -> P:
    """The paths object of ``args`` (the options :func:`add_paths` declared)."""
    return paths(**{f.name: getattr(args, f.name) for f in dataclasses.fields(paths)})


def setup_logging(level: str = "INFO") -> None:
    """Log lines on stderr; off a TTY (CI, `dvc repro` captured) no third-party progress bar
    either (:func:`lexgraph.core.progress.quiet_third_party_bars`), so no ``\\r`` redraws."""
    from lexgraph.core.progress import quiet_third_party_bars

    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("httpx", "urllib3", "filelock", "fsspec", "datasets", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    quiet_third_party_bars()


def run_stage(
    section: str,
    main: Callable[[argparse.Namespace, Base, Any], None],
    configure: Callable[[argparse.ArgumentParser], None],
    argv: list[str] | None = None,
    name: str | None = None,
    *,
    config: Callable[[dict], Any],
) -> int:
    """Run a stage driver; ``name`` (default: ``section``) labels its log and error lines;
    ``config`` (the section's ``XConfig.from_params``) builds the typed config up front, and
    ``main(args, base, config)`` receives it."""
    name = name or section
    parser = argparse.ArgumentParser(description=(main.__doc__ or "").strip() or None)
    parser.add_argument("--params", default="params.yaml", help="parameters file (default: params.yaml)")
    configure(parser)
    args = parser.parse_args(argv)

    def run() -> None:
        base, params = load_params(section, args.params)
        settings = config(params)  # a bad value fails here, before seeding (torch) and any work
        setup_logging(base.log_level)
        log_stage_start()  # under `dvc repro`: "stage train_dsr (10 of 22)", where the run stands
        set_deterministic(base.deterministic)
        seed_everything(base.seed)
        start = time.perf_counter()
        main(args, base, settings)
        log.info("stage %s done in %.1f s", name, time.perf_counter() - start)

    return reported(name, run)

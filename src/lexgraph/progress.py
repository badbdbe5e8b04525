"""Progress reporting: a tqdm bar on a terminal, periodic log lines elsewhere.

``dvc repro`` logs and CI capture stderr; a tqdm bar there writes ``\\r``-separated
redraws into one huge line. :func:`progress` draws a bar only when stderr is a TTY and
otherwise logs ``desc: i/n`` at most every ``every`` seconds (and at the end).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")
log = logging.getLogger("lexgraph.progress")


def progress(iterable: Iterable[T], desc: str, total: int | None = None, every: float = 30.0) -> Iterator[T]:
    """Iterate ``iterable`` reporting progress (see the module docstring)."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    if sys.stderr.isatty():
        from tqdm.auto import tqdm

        yield from tqdm(iterable, desc=desc, total=total)
        return
    start = last = time.monotonic()
    count = 0
    for item in iterable:
        yield item
        count += 1
        now = time.monotonic()
        if now - last >= every:
            last = now
            log.info("%s: %d/%s (%.0f s)", desc, count, total if total is not None else "?", now - start)
    if time.monotonic() - start >= every:
        log.info("%s: %d/%s done in %.0f s", desc, count, total if total is not None else "?", time.monotonic() - start)

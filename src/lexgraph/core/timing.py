"""Variants timed in turns, for the benchmarks' ratios measured in one run (speed goals are ratios
against peers measured together, never absolute times across runs)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any


def interleaved(
    variants: Mapping[str, Callable[[], Any]], repeat: int
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Seconds of each of ``repeat`` rounds of every variant, run in turns (the order rotated each
    round, so that no variant always runs first or after the same one), and each one's last output."""
    names = list(variants)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    out: dict[str, Any] = {}
    for round_ in range(repeat):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            start = time.perf_counter()
            out[name] = variants[name]()
            seconds[name].append(time.perf_counter() - start)
    return seconds, out


def rate_rows(seconds: Mapping[str, list[float]], items: int, base: str) -> dict[str, dict[str, Any]]:
    """Per variant: ``items`` per second at its median round, that rate over ``base``'s, and the rounds."""
    rate = {name: items / statistics.median(s) for name, s in seconds.items()}
    return {
        name: {
            "articles_per_s": round(rate[name], 2),
            "ratio": round(rate[name] / rate[base], 3),
            "seconds": [round(s, 2) for s in seconds[name]],
        }
        for name in seconds
    }

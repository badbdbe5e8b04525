"""What machine a measurement ran on, in words, for the records benchmarks write."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s first ``model name``; elsewhere the platform's)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(threads: int | None = None) -> str:
    """``"<cores> cores, <model>"``, and torch's ``threads`` when given."""
    text = f"{os.cpu_count()} cores, {cpu_model()}"
    return text if threads is None else f"{text}; torch threads: {threads}"

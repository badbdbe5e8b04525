"""A script (``benchmarks/<name>.py``, ``stages/<name>.py``) run in the test's own process as
``python script args`` runs it: its ``__main__`` block included, without the 2 to 5 s a fresh
interpreter spends importing torch, transformers and polars before the script refuses an argument."""

from __future__ import annotations

import logging
import os
import runpy
import sys
from pathlib import Path


def run_script(script: str | Path, *args: str | Path, cwd: str | Path | None = None) -> int:
    """Run ``script`` with ``args`` as ``__main__`` in this process (``sys.argv`` and, when given,
    the working directory ``cwd`` set for the run, then restored, and torch's deterministic mode,
    which a stage sets from ``base.deterministic``, and the logging tree: every logger's level,
    handlers, propagation and disabled flag, as a script's ``basicConfig`` or its quieting of a
    library's logger would otherwise outlive it); its exit status as the interpreter would give
    it: ``SystemExit(None)`` 0, an integer that integer, any other value written to stderr (capsys
    and capfd see it) and 1. Any other exception propagates: a traceback fails the test."""
    old_argv, old_cwd, torch_flags, loggers = sys.argv, os.getcwd(), _torch_flags(), _loggers()
    sys.argv = [str(script), *map(str, args)]
    try:
        if cwd is not None:
            os.chdir(cwd)
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as stop:
        code = stop.code
    else:
        code = None
    finally:
        sys.argv = old_argv
        os.chdir(old_cwd)
        _restore_torch_flags(torch_flags)
        _restore_loggers(loggers)
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    sys.stderr.flush()
    return 1


def _torch_flags() -> tuple[bool, bool, bool, bool] | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )


def _restore_torch_flags(flags: tuple[bool, bool, bool, bool] | None) -> None:
    torch = sys.modules.get("torch")
    if torch is None:
        return
    enabled, warn_only, cudnn_deterministic, cudnn_benchmark = flags or (False, False, False, False)
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    torch.backends.cudnn.deterministic = cudnn_deterministic
    torch.backends.cudnn.benchmark = cudnn_benchmark


_LoggerState = tuple[int, list[logging.Handler], bool, bool]


def _loggers() -> dict[str, _LoggerState]:
    named = {name: logging.getLogger(name) for name in list(logging.root.manager.loggerDict)}
    named[""] = logging.root
    return {name: (lg.level, list(lg.handlers), lg.propagate, lg.disabled) for name, lg in named.items()}


def _restore_loggers(before: dict[str, _LoggerState]) -> None:
    """Loggers as they were; one the script created is reset to a fresh logger's state."""
    for name in list(logging.root.manager.loggerDict) + [""]:
        logger = logging.getLogger(name) if name else logging.root
        level, handlers, propagate, disabled = before.get(name, (logging.NOTSET, [], True, False))
        logger.setLevel(level)
        logger.handlers[:] = handlers
        logger.propagate, logger.disabled = propagate, disabled

"""Errors a user can act on.

Every problem caused by input (a file, a row, a column, a parameter) or by the
environment (hub unreachable) raises :class:`LexgraphError` with one sentence that
names the culprit and what was expected. Stage drivers turn it into a one-line
message on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


class LexgraphError(Exception):
    """An error with a message meant for the user, not a traceback."""


class DataError(LexgraphError):
    """Bad input data: names the file, row and/or column and what was expected."""

    def __init__(self, path, message: str, *, row=None, column=None):
        where = str(path)
        if row is not None:
            where += f", row {row}"
        if column is not None:
            where += f", column '{column}'"
        super().__init__(f"{where}: {message}")
        self.path, self.row, self.column = path, row, column


class ConfigError(LexgraphError):
    """A bad value in params.yaml (or a profile)."""


class SettingError(ConfigError):
    """A setting that does not fit the model it configures (chunk heads that do not divide its
    width, a length below what its tokenizer needs), found where the model is built: ``setting``
    names the constructor argument, so that the code that built the model from params.yaml
    names the key (:func:`lexgraph.core.settings.settings_of`)."""

    def __init__(self, setting: str, value, expected: str):
        super().__init__(f"{setting} = {value!r}, expected {expected}")
        self.setting, self.value, self.expected = setting, value, expected


class HubUnreachableError(LexgraphError):
    """The Hugging Face hub could not be reached."""


class Stopped(KeyboardInterrupt):
    """An interrupt with a reason for the user (the parent ``dvc repro`` is gone): reported as
    ``lexgraph <name>: interrupted: <reason>``."""


_STOP: list[str] = []  # the reason the process was asked to stop, process-wide (first one wins)


def request_stop(reason: str) -> None:
    """Ask the whole process to stop: no output is committed after this
    (:func:`lexgraph.core.io.atomic_path` calls :func:`check_stop` right before each rename)."""
    if not _STOP:
        _STOP.append(reason)


def stop_reason() -> str | None:
    """Why a stop was requested (:func:`request_stop`), or ``None``."""
    return _STOP[0] if _STOP else None


def check_stop() -> None:
    """Raise :class:`Stopped` if a stop was requested."""
    if _STOP:
        raise Stopped(_STOP[0])


#: exit statuses of a command that failed on a LexgraphError, and of one interrupted by Ctrl-C
EXIT_ERROR, EXIT_INTERRUPTED = 2, 130


def path_error(exc: OSError) -> LexgraphError | None:
    """One line for an :class:`OSError` that names a path (what was done to it is in the
    reason), or None for one that names none (left to show as the programming error it is)."""
    if exc.filename is None:
        return None
    where = str(exc.filename)
    if len(where) > 200:
        where = f"{where[:100]}…{where[-60:]} ({len(where)} characters)"
    return LexgraphError(f"{where}: {exc.strerror or exc}; expected a path the file system accepts")


def reported(name: str, call: Callable[[], int | None]) -> int:
    """Run ``call`` for the command or stage ``lexgraph <name>``: its exit status (0 when it
    returns None), a :class:`LexgraphError` or an :class:`OSError` naming a path
    (:func:`path_error`) as one line on stderr (status 2), Ctrl-C as one line (130)."""
    try:
        return call() or 0
    except OSError as exc:
        error = path_error(exc)
        if error is None:
            raise
        print(f"lexgraph {name}: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except LexgraphError as exc:
        print(f"lexgraph {name}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt as exc:
        why = f": {exc}" if isinstance(exc, Stopped) else ""
        print(f"lexgraph {name}: interrupted{why}", file=sys.stderr)
        return EXIT_INTERRUPTED

"""Errors a user can act on.

Every problem caused by input (a file, a row, a column, a parameter) or by the
environment (hub unreachable) raises :class:`LexgraphError` with one sentence that
names the culprit and what was expected. Stage drivers turn it into a one-line
message on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations


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


class HubUnreachableError(LexgraphError):
    """The Hugging Face hub could not be reached."""

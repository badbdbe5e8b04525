"""Reading text a user wrote: the rules every reader of params, questions and CSVs shares.

One home for the checks that are easy to get subtly wrong in each reader separately:

* :func:`load_yaml` refuses a key repeated in one mapping (PyYAML keeps the last one
  silently; DVC refuses such a file, so a stage run outside DVC must too);
* :func:`json_object` refuses a key repeated in one JSON object (``json.loads`` keeps the
  last one);
* :func:`json_lines` splits on ``\\n`` only: U+2028, U+0085 and the other characters
  that ``str.splitlines`` treats as line ends are valid inside a JSON string;
* :func:`id_problem` / :func:`text_problem` say what is wrong with an identifier (it is
  written into TREC runs, whitespace-separated) or a text (it must encode as UTF-8).

Each returns or raises plain ``ValueError`` / a reason string; the caller words the
one-line error naming its file, row and key.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any, Iterator

import yaml


class DuplicateKeyError(ValueError):
    """A mapping repeats a key; ``key`` and ``line`` (1-based, where known) say which."""

    def __init__(self, key: Any, line: int | None = None, where: str = "") -> None:
        at = f" on line {line}" if line is not None else ""
        super().__init__(f"key {key!r} appears twice{where}{at}; expected each key once")
        self.key, self.line = key, line


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key repeated within one mapping."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # PyYAML reports unhashable keys itself
            if key in seen:
                raise DuplicateKeyError(key, key_node.start_mark.line + 1)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``, refusing duplicate keys (:class:`DuplicateKeyError`)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(key)
        out[key] = value
    return out


def json_object(line: str) -> Any:
    """``json.loads(line)`` refusing a key repeated within an object (:class:`DuplicateKeyError`);
    malformed JSON raises ``json.JSONDecodeError`` as usual."""
    return json.loads(line, object_pairs_hook=_unique_pairs)


def json_lines(text: str) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a JSON-lines text, split on ``\\n`` only (a trailing
    ``\\r`` is dropped); blank lines are skipped."""
    for n, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if line.strip():
            yield n, line


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored and written as UTF-8 (a lone surrogate such as
    ``\\udc80``, which JSON escapes and undecodable command-line bytes produce), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"holds {text[exc.start]!r} at character {exc.start + 1}, a lone surrogate that is not valid Unicode text"
    return None


def id_problem(value: str) -> str | None:
    """Why ``value`` is not usable as an identifier (question or article id), or None:
    ids are written into whitespace-separated TREC runs, so they must be non-empty,
    valid Unicode, and free of whitespace and control characters (NUL included)."""
    if not value:
        return "is empty"
    problem = text_problem(value)
    if problem:
        return problem
    for i, ch in enumerate(value):
        if ch.isspace():
            return f"holds whitespace ({ch!r}) at character {i + 1}"
        if unicodedata.category(ch) in ("Cc", "Cf", "Co", "Cn"):
            return f"holds the control or unassigned character {ch!r} at character {i + 1}"
    return None

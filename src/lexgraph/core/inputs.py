"""Reading text a user wrote: the rules every reader of params, questions and CSVs shares.

One home for the checks that are easy to get subtly wrong in each reader separately:

* :func:`load_yaml` refuses a key repeated in one mapping (PyYAML keeps the last one
  silently; DVC refuses such a file, so a stage run outside DVC must too);
* :func:`json_object` refuses a key repeated in one JSON object (``json.loads`` keeps the
  last one);
* :func:`json_lines` splits on ``\\n`` only: U+2028, U+0085 and the other characters
  that ``str.splitlines`` treats as line ends are valid inside a JSON string;
* :func:`id_problem` / :func:`text_problem` say what is wrong with an identifier (it is
  written into TREC runs, whitespace-separated) or a text (it must encode as UTF-8);
* :func:`require_directory` is the one rule for a directory the user names (a params.yaml
  key such as ``fetch.local_dir``, an option such as ``--workspace``): a file, nothing or a
  broken link there is one line naming the key or option, the path as :func:`shown_path`
  writes it (spaces, quotes and newlines visible) and what was expected.

Each returns or raises plain ``ValueError`` / a reason string; the caller words the
one-line error naming its file, row and key. One exception, for JSON files a stage writes
and a later stage reads (``metrics/bm25_tune.json``, ``models/*/*.json``), which a user
damages by hand or an interrupted copy truncates: :func:`read_json_object` raises the
one-line :class:`~lexgraph.core.errors.DataError` itself (the file, what is wrong, what was
expected, which stage to rerun), since every such reader words it the same way.
"""

from __future__ import annotations

import json
import math
import os
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from lexgraph.core.errors import DataError, LexgraphError
from lexgraph.core.io import unreadable


class DuplicateKeyError(ValueError):
    """A mapping repeats a key: ``key``, ``line`` (1-based, where known) and ``first_line``
    (its first occurrence) say which; ``parents`` are the keys of the mappings that hold it,
    from the top (:func:`load_yaml` fills them in), so :attr:`dotted` is the key as a user
    names it (``gnn.temperature``)."""

    def __init__(
        self,
        key: Any,
        line: int | None = None,
        where: str = "",
        parents: tuple[str, ...] = (),
        first_line: int | None = None,
    ) -> None:
        at = f" on line {line}" if line is not None else ""
        super().__init__(f"key {key!r} appears twice{where}{at}; expected each key once")
        self.key, self.line, self.parents, self.first_line = key, line, tuple(parents), first_line

    @property
    def dotted(self) -> str:
        """The repeated key with the keys above it: ``gnn.kd.weight``."""
        return ".".join([*self.parents, str(self.key)])

    @property
    def located(self) -> str:
        """The repeated key and its lines, for a one-line error naming a YAML file:
        ``key 'gnn.kd.weight' appears twice, again on line 26 (first on line 25)``."""
        again = f", again on line {self.line}" if self.line is not None else ""
        first = f" (first on line {self.first_line})" if self.first_line is not None else ""
        return f"key '{self.dotted}' appears twice{again}{first}"


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
                raise DuplicateKeyError(key, key_node.start_mark.line + 1, first_line=seen[key] + 1)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``, refusing duplicate keys (:class:`DuplicateKeyError`, its
    ``parents`` filled in)."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except DuplicateKeyError as exc:
        if exc.line is not None:
            exc.parents = _parents_of_line(text, exc.line)
        raise


def _parents_of_line(text: str, line: int) -> tuple[str, ...]:
    """The keys of the mappings above the repeated key that starts on ``line`` (1-based)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)  # nodes only: composing keeps duplicates
    except yaml.YAMLError:
        return ()
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, tuple[str, ...]]] = [(root, ())] if root is not None else []
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            names = [k.value if isinstance(k, yaml.ScalarNode) else None for k, _ in node.value]
            for key_node, _ in node.value:
                if (
                    key_node.start_mark.line + 1 == line
                    and isinstance(key_node, yaml.ScalarNode)
                    and names.count(key_node.value) > 1
                ):
                    return path
            stack += [(v, (*path, str(n))) for n, (_, v) in zip(names, node.value)]
        elif isinstance(node, yaml.SequenceNode):
            stack += [(v, (*path, str(i))) for i, v in enumerate(node.value)]
    return ()


def yaml_problem(exc: yaml.YAMLError) -> str:
    """One line saying what is wrong with a YAML text and where (PyYAML's own message spans
    several lines, with the text quoted): ``expected ',' or ']', but got '<stream end>' at
    line 2, column 1``."""
    if isinstance(exc, yaml.reader.ReaderError):
        return f"unacceptable character {chr(exc.character)!r} at character {exc.position + 1}"
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"


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
        return (
            f"holds {text[exc.start]!r} at character {exc.start + 1}, a lone surrogate that is not valid Unicode text"
        )
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


def shown_path(path: str | os.PathLike) -> str:
    """``path`` quoted with Python's escapes, so that a space, a quote, a newline or an
    undecodable byte in it is visible and the error stays on one line: ``'my data/x\\ny'``."""
    return repr(os.fspath(path))


def require_directory(
    path: str | os.PathLike, *, label: str, expected: str, error: type[LexgraphError] = LexgraphError
) -> Path:
    """``path`` as a :class:`~pathlib.Path` if it is a readable directory; otherwise ``error``
    with one line: ``<label> <path> is a file; expected <expected>`` (``label`` names the key
    or option: ``params.yaml: 'fetch.local_dir' =`` or ``--workspace``)."""
    reason = unreadable(Path(path), directory=True)
    if reason is None:
        return Path(path)
    what = "does not exist" if reason == "missing" else f"is {reason}"
    raise error(f"{label} {shown_path(path)} {what}; expected {expected}")


# ---------------------------------------------------------------------------
# JSON one stage writes and another reads
# ---------------------------------------------------------------------------

#: ``(test, what it expects)`` of one key of a JSON object: :func:`read_json_object`'s ``keys``.
KeyCheck = tuple[Callable[[Any], bool], str]


def finite_number(value: Any) -> bool:
    """A JSON number that is not a bool, nan or infinite (``json`` reads ``NaN`` and ``Infinity``)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)[:60]


def read_json(path: str | Path, *, what: str, fix: str, missing_ok: bool = False) -> Any:
    """The JSON value in ``path``, a file another stage wrote. Nothing at ``path``
    (``missing_ok``): None. Otherwise a missing file, a directory, a symbolic link loop or
    a broken one, an unreadable file, bytes that are not UTF-8, an empty or truncated file, a
    key repeated within an object (``json.loads`` would keep the last one silently):
    a :class:`DataError` naming the file, saying what is wrong and ``what`` was expected,
    then ``fix`` (e.g. "rerun `dvc repro bm25_tune`")."""
    path = Path(path)
    reason = unreadable(path)
    if reason == "missing" and missing_ok:
        return None
    problem = "not found" if reason == "missing" else f"is {reason}" if reason else None
    if problem is None:
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            problem = f"not valid UTF-8 ({exc.reason} at byte {exc.start})"
        except OSError as exc:
            problem = f"cannot be read ({exc.strerror})"
        else:
            if not text.strip():
                problem = "is empty"
            else:
                try:
                    return json_object(text)
                except DuplicateKeyError as exc:
                    problem = str(exc).removesuffix("; expected each key once")
                except json.JSONDecodeError as exc:
                    problem = (
                        f"not valid JSON, truncated or corrupt ({exc.msg} at line {exc.lineno}, column {exc.colno})"
                    )
    raise DataError(path, f"{problem}; expected {what}; {fix}")


def read_json_object(
    path: str | Path,
    *,
    what: str,
    fix: str,
    keys: dict[str, KeyCheck] | None = None,
    optional: dict[str, KeyCheck] | None = None,
    missing_ok: bool = False,
) -> dict[str, Any] | None:
    """:func:`read_json` of a JSON object; ``keys`` maps the keys the caller reads to their
    check, ``optional`` those it reads when present. Another JSON value than an object, a
    missing key or a value that fails its check is a :class:`DataError` worded the same way."""
    value = read_json(path, what=what, fix=fix, missing_ok=missing_ok)
    if value is None and missing_ok:
        return None

    def bad(problem: str) -> DataError:
        return DataError(path, f"{problem}; expected {what}; {fix}")

    if not isinstance(value, dict):
        raise bad(f"holds {_show(value)}, not a JSON object")
    for key, (_test, expected) in (keys or {}).items():
        if key not in value:
            raise bad(f"key '{key}' is missing ({expected})")
    for key, (test, expected) in {**(keys or {}), **(optional or {})}.items():
        if key in value and not test(value[key]):
            raise bad(f"key '{key}' = {_show(value[key])}, not {expected}")
    return value

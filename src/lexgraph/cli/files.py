"""The ``lexgraph search`` command's files: the ``--questions`` JSON-lines file it reads
(:func:`read_questions_jsonl`) and the ``--run`` path it may write (:func:`check_run_path`).
The rules they enforce are those of :mod:`lexgraph.cli.main`'s docstring. Each is checked by one
function that returns its first refusal, raised in one place."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from lexgraph.core.errors import DataError, LexgraphError
from lexgraph.core.inputs import DuplicateKeyError, id_problem, json_lines, json_object, text_problem
from lexgraph.core.io import read_only
from lexgraph.core.layout import MANAGED_ROOTS


def _show(value) -> str:
    """``value`` as JSON for a message, at most 60 characters; lone surrogates and control
    characters escaped (the message goes to a terminal)."""
    text = json.dumps(value, ensure_ascii=False)
    if not text.isprintable():
        text = json.dumps(value)
    return text[:60]


class _Refusal(NamedTuple):
    """Why the questions file is refused: the words after its name, the row (line) and key."""

    words: str
    row: int | None = None
    column: str | None = None


def read_questions_jsonl(path: Path) -> tuple[list[str], list[str]]:
    """``(ids, questions)`` from a JSON-lines file whose lines have ``id`` and ``question``.

    ``id``: a string or an integer, unique in the file, without whitespace or control
    characters (it is written into the TREC run); ``question``: a non-empty string of valid
    Unicode text. A key may appear once per object. Lines end at ``\n`` only (U+2028 and
    U+0085 are text inside a JSON string; :func:`lexgraph.core.inputs.json_lines`). Errors name
    the file, its row (line) and the key.
    """
    read = _questions(path)
    if isinstance(read, _Refusal):
        raise DataError(path, read.words, row=read.row, column=read.column)
    return read


def _questions(path: Path) -> tuple[list[str], list[str]] | _Refusal:
    """:func:`read_questions_jsonl`'s ``(ids, questions)``, or the first thing wrong with the file."""
    if not path.is_file():
        what = "not a file" if path.exists() else "file not found"
        return _Refusal(f"{what}; expected the --questions JSON-lines file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        return _Refusal(f"not valid UTF-8 ({exc.reason} at byte {exc.start})")
    ids: list[str] = []
    questions: list[str] = []
    first_row: dict[str, int] = {}
    for n, line in json_lines(text):
        try:
            rec = json_object(line)
        except DuplicateKeyError as exc:
            return _Refusal(f"key {_show(exc.key)} appears twice; expected each key once per line", n)
        except json.JSONDecodeError as exc:
            return _Refusal(f"not valid JSON ({exc.msg})", n)
        missing = [k for k in ("id", "question") if not isinstance(rec, dict) or k not in rec]
        if missing:
            return _Refusal(f"expected an object with keys 'id' and 'question' (missing {missing})", n)
        raw_id, question = rec["id"], rec["question"]
        if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)):
            return _Refusal(f"got {_show(raw_id)}, expected a string or an integer", n, "id")
        qid = str(raw_id)
        if problem := id_problem(qid):
            expected = "expected a non-empty id without whitespace or control characters"
            return _Refusal(f"id {_show(raw_id)} {problem}; {expected}", n, "id")
        if qid in first_row:
            return _Refusal(f"id {_show(qid)} already used on row {first_row[qid]}; expected unique ids", n, "id")
        if not isinstance(question, str) or not question.strip():
            return _Refusal(f"got {_show(question)}, expected a non-empty string", n, "question")
        if problem := text_problem(question):
            return _Refusal(f"the question {problem}; expected valid Unicode text", n, "question")
        first_row[qid] = n
        ids.append(qid)
        questions.append(question)
    if not ids:
        return _Refusal("no questions; expected one JSON object per line with 'id' and 'question'")
    return ids, questions


def _looks_like_trec_run(path: Path) -> bool:
    """True for an empty file or one whose first line is ``qid Q0 docid rank score tag``."""
    with open(path, "rb") as fh:
        head = fh.read(4096)
    if not head.strip():
        return True
    if b"\0" in head:
        return False
    try:
        first = head.decode("utf-8").splitlines()[0].split()
    except (UnicodeDecodeError, IndexError):
        return False
    if len(first) != 6 or first[1] != "Q0":
        return False
    try:
        int(first[3]), float(first[4])
    except ValueError:
        return False
    return True


def check_run_path(run: str, questions: str | None, workspace: Path) -> Path:
    """Refuse a ``--run`` target that is not a writable new file or earlier TREC run: a
    directory, the questions file (the same file: a path, a symbolic link or a hard link to
    it), a path DVC owns (its cache, a ``.dvc`` directory, the workspace's ``data/`` and
    ``models/``, an output that ``dvc.yaml``, ``dvc.lock`` or a ``*.dvc`` file tracks:
    :func:`lexgraph.core.tracked.dvc_owner`), a place that is not
    writable or a read-only file (no write bit: refused even for root, who ignores mode
    bits), a file with several hard links (it may share its inode with DVC's cache), or
    any existing file that is not a TREC run. Symlinks are resolved first."""
    path = Path(run)
    problem = _run_problem(path, questions, workspace)
    if problem:
        raise LexgraphError(f"--run {run}{problem}")
    return path


def _run_problem(path: Path, questions: str | None, workspace: Path) -> str | None:
    """Why ``--run path`` may not be written (the words after ``--run RUN``), or None."""
    from lexgraph.core.tracked import MANAGED, dvc_owner

    if path.is_dir():
        return " is a directory; expected the path of the TREC run file to write"
    if questions is not None and path.exists() and Path(questions).exists() and path.samefile(questions):
        return " is the --questions file; refusing to overwrite an input, expected a separate output path"
    owner = dvc_owner(path, workspace)
    if owner:
        managed = " and ".join(f"{root}/" for root in MANAGED_ROOTS)  # data/ and models/
        outside = managed if owner.endswith(MANAGED) else "DVC's cache and the outputs it tracks"
        return f" {owner}; refusing to write there, expected a path outside {outside}"
    parent = path.resolve().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f": {parent} is not a directory; expected a writable path for the TREC run"
    if locked := read_only(parent):
        return f": directory {parent} is not writable ({locked}); expected a writable path"
    if not path.exists():
        return None
    if not path.is_file():
        return " is not a regular file; expected the path of the TREC run file to write"
    links = path.stat().st_nlink
    if links > 1:
        return (
            f" has {links} hard links (it may share its content with DVC's cache or another file); "
            "refusing to overwrite it, expected a new path or a file with a single link"
        )
    if locked := read_only(path):
        return f" is read-only ({locked}); refusing to overwrite it, expected a writable path"
    if not _looks_like_trec_run(path):
        return " exists and is not a TREC run; refusing to overwrite it, expected a new path or an earlier run"
    return None

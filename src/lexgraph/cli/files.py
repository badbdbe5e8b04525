"""The ``lexgraph search`` command's files: the ``--questions`` JSON-lines file it reads
(:func:`read_questions_jsonl`) and the ``--run`` path it may write (:func:`check_run_path`).
The rules they enforce are those of :mod:`lexgraph.cli.main`'s docstring."""

from __future__ import annotations

import json
from pathlib import Path

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


def read_questions_jsonl(path: Path) -> tuple[list[str], list[str]]:
    """``(ids, questions)`` from a JSON-lines file whose lines have ``id`` and ``question``.

    ``id``: a string or an integer, unique in the file, without whitespace or control
    characters (it is written into the TREC run); ``question``: a non-empty string of valid
    Unicode text. A key may appear once per object. Lines end at ``\n`` only (U+2028 and
    U+0085 are text inside a JSON string; :func:`lexgraph.core.inputs.json_lines`). Errors name
    the file, its row (line) and the key.
    """
    if not path.is_file():
        raise DataError(
            path,
            "file not found; expected the --questions JSON-lines file"
            if not path.exists()
            else "not a file; expected the --questions JSON-lines file",
        )
    ids, questions, first_row = [], [], {}
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(path, f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    for n, line in json_lines(text):
        try:
            rec = json_object(line)
        except DuplicateKeyError as exc:
            raise DataError(
                path, f"key {_show(exc.key)} appears twice; expected each key once per line", row=n
            ) from None
        except json.JSONDecodeError as exc:
            raise DataError(path, f"not valid JSON ({exc.msg})", row=n) from None
        if not isinstance(rec, dict) or "id" not in rec or "question" not in rec:
            missing = [k for k in ("id", "question") if not isinstance(rec, dict) or k not in rec]
            raise DataError(path, f"expected an object with keys 'id' and 'question' (missing {missing})", row=n)
        raw_id, question = rec["id"], rec["question"]
        if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)):
            raise DataError(path, f"got {_show(raw_id)}, expected a string or an integer", row=n, column="id")
        qid = str(raw_id)
        problem = id_problem(qid)
        if problem:
            raise DataError(
                path,
                f"id {_show(raw_id)} {problem}; expected a non-empty id without whitespace or control characters",
                row=n,
                column="id",
            )
        if qid in first_row:
            raise DataError(
                path, f"id {_show(qid)} already used on row {first_row[qid]}; expected unique ids", row=n, column="id"
            )
        if not isinstance(question, str) or not question.strip():
            raise DataError(path, f"got {_show(question)}, expected a non-empty string", row=n, column="question")
        problem = text_problem(question)
        if problem:
            raise DataError(path, f"the question {problem}; expected valid Unicode text", row=n, column="question")
        first_row[qid] = n
        ids.append(qid)
        questions.append(question)
    if not ids:
        raise DataError(path, "no questions; expected one JSON object per line with 'id' and 'question'")
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
    from lexgraph.core.tracked import MANAGED, dvc_owner

    path = Path(run)
    if path.is_dir():
        raise LexgraphError(f"--run {run} is a directory; expected the path of the TREC run file to write")
    if questions is not None and path.exists() and Path(questions).exists() and path.samefile(questions):
        raise LexgraphError(
            f"--run {run} is the --questions file; refusing to overwrite an input, expected a separate output path"
        )
    owner = dvc_owner(path, workspace)
    if owner:
        managed = " and ".join(f"{root}/" for root in MANAGED_ROOTS)  # data/ and models/
        outside = managed if owner.endswith(MANAGED) else "DVC's cache and the outputs it tracks"
        raise LexgraphError(f"--run {run} {owner}; refusing to write there, expected a path outside {outside}")
    parent = path.resolve().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise LexgraphError(f"--run {run}: {parent} is not a directory; expected a writable path for the TREC run")
    locked = read_only(parent)
    if locked:
        raise LexgraphError(f"--run {run}: directory {parent} is not writable ({locked}); expected a writable path")
    if path.exists():
        if not path.is_file():
            raise LexgraphError(f"--run {run} is not a regular file; expected the path of the TREC run file to write")
        links = path.stat().st_nlink
        if links > 1:
            raise LexgraphError(
                f"--run {run} has {links} hard links (it may share its content with DVC's cache "
                "or another file); refusing to overwrite it, expected a new path or a file with "
                "a single link"
            )
        locked = read_only(path)
        if locked:
            raise LexgraphError(
                f"--run {run} is read-only ({locked}); refusing to overwrite it, expected a writable path"
            )
        if not _looks_like_trec_run(path):
            raise LexgraphError(
                f"--run {run} exists and is not a TREC run; refusing to overwrite it, "
                "expected a new path or an earlier run"
            )
    return path

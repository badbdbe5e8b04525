"""Whether an artefact still matches the workspace it is read from.

Every directory artefact a stage writes records what it was built from
(:data:`lexgraph.core.provenance.RECORD`: the stage, the digest of its settings, the path and
digest of each input). Before a system searches, :func:`check_built_from` compares each
recorded input with the workspace's file of that path, and follows the inputs that are
themselves recorded artefacts (``models/gnn_hgraph`` → ``data/embed`` → ``models/dsr`` →
``data/clean/articles.parquet``), as ``dvc repro`` would: an input that changed since (an
article's text edited and only ``fetch`` and ``clean`` rerun; ``models/dsr`` retrained alone)
refuses the search in one line naming the artefact, the input and ``dvc repro``. Refused, not
warned: the search would rank with the old index while it shows the new texts.

An artefact written before lexgraph recorded provenance has no record: one warning line (per
process) names them, and the search goes on unchecked.

Cost: an input that is itself a recorded artefact is compared by its record
(:func:`lexgraph.core.provenance.identity`: the record holds the digest of the artefact's files),
so only plain files (``data/clean/*.parquet``, ``data/negatives``, ...) are read whole; their
digests are cached within the process by (size, modification time, inode), so a system built
on others (``hybrid``, the re-rankers) or a stage loading several digests each input once.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from lexgraph.core import layout
from lexgraph.core.errors import DataError, LexgraphError
from lexgraph.core.provenance import ABSENT, RECORD, digest_path, identity

log = logging.getLogger(__name__)

_DIGESTS: dict[str, tuple[tuple, str]] = {}
_WARNED: set[str] = set()


def _signature(path: Path) -> tuple | None:
    """What changes when ``path`` (a file, or every file below a directory) changes."""
    try:
        if path.is_file():
            info = path.stat()
            return (info.st_size, info.st_mtime_ns, info.st_ino)
        if path.is_dir():
            files = []
            for root, _dirs, names in os.walk(path):
                for name in names:
                    info = os.stat(os.path.join(root, name))
                    files.append((os.path.join(root, name), info.st_size, info.st_mtime_ns, info.st_ino))
            return tuple(sorted(files))
    except OSError:
        return None
    return None


def current_digest(path: Path) -> str:
    """:func:`lexgraph.core.provenance.identity` of ``path``: a recorded artefact's record, else
    its files' digest, cached while their sizes, times and inodes stay the same."""
    if (path / RECORD).is_file():
        return identity(path)
    key = os.path.realpath(path)
    signature = _signature(path)
    if signature is None:
        return digest_path(path) if path.exists() else ABSENT
    cached = _DIGESTS.get(key)
    if cached is not None and cached[0] == signature:
        return cached[1]
    digest = digest_path(path)
    _DIGESTS[key] = (signature, digest)
    return digest


def _stage(artefact: Path, record: dict) -> str:
    artifact = layout.producer(artefact)
    return artifact.stage if artifact else str(record.get("stage", "?"))


def read_record(artefact: Path) -> dict | None:
    """The provenance record of the directory ``artefact`` (``None``: it has none)."""
    path = artefact / RECORD
    if not path.is_file():
        return None
    remedy = f"rerun `dvc repro --force {_stage(artefact, {})}` to rewrite it"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DataError(
            path,
            f"unreadable ({type(exc).__name__}); expected the JSON record of what {artefact} was built from; {remedy}",
        ) from None
    inputs = record.get("inputs") if isinstance(record, dict) else None
    if not isinstance(inputs, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("path"), str) and isinstance(v.get("digest"), str)
        for v in inputs.values()
    ):
        raise DataError(path, f'expected {{"inputs": {{name: {{"path": ..., "digest": ...}}}}}}; {remedy}')
    return record


def _where(workspace: Path, recorded: str) -> Path:
    path = Path(recorded)
    return path if path.is_absolute() else workspace / path


def check_built_from(artefacts: Iterable[Path], workspace: str | Path) -> None:
    """Refuse (:class:`LexgraphError`) when an input that one of ``artefacts`` (directories in
    ``workspace``), or an artefact it was built on, recorded has changed in ``workspace``; warn
    once about those that have no record (module docstring)."""
    workspace = Path(workspace)
    todo: list[tuple[Path, Path | None]] = [(Path(a), None) for a in artefacts]
    seen: set[str] = set()
    unrecorded: list[str] = []
    while todo:
        artefact, user = todo.pop(0)
        if os.path.realpath(artefact) in seen or not artefact.is_dir():
            continue  # a missing artefact is its loader's to report
        seen.add(os.path.realpath(artefact))
        record = read_record(artefact)
        if record is None:
            if user is None:  # an input folder without a record (data/sample, ...) is no artefact
                unrecorded.append(str(artefact))
            continue
        for entry in record["inputs"].values():
            path = _where(workspace, entry["path"])
            current = current_digest(path)
            if current != entry["digest"]:
                raise LexgraphError(_stale(artefact, user, path, current, _stage(artefact, record)))
            if path.is_dir():
                todo.append((path, artefact))
    new = [name for name in unrecorded if name not in _WARNED]
    if new:
        _WARNED.update(new)
        log.warning(
            "%s: no record of what %s built from (written before lexgraph kept one); not checked against "
            "the workspace, `dvc repro --force` the stage%s that wrote %s to record it",
            ", ".join(new),
            "it was" if len(new) == 1 else "they were",
            "" if len(new) == 1 else "s",
            "it" if len(new) == 1 else "them",
        )


def _stale(artefact: Path, user: Path | None, path: Path, current: str, stage: str) -> str:
    used = f" (which {user} is built on)" if user is not None else ""
    if current == ABSENT:
        change = f"{path}, which the workspace no longer has"
    else:
        change = f"another {path} than the workspace holds now (it changed after stage {stage} ran)"
    return f"{artefact}{used} was built from {change}; run `dvc repro` to rebuild it"

"""``index.json``: what an index of another corpus (``lexgraph index``) holds and which of the
workspace's models built it; and the record by which a command proves a folder is its own output.

An index directory has the workspace's layout for the corpus side only (``data/clean``,
``models/bm25``, ``data/embed``, ...: :mod:`lexgraph.systems.corpus_index`); the systems that
search it take everything else (query encoders, graph settings, fusion, re-ranker weights) from
the workspace. ``index.json`` records, per system, the digest of each workspace artefact its
vectors were made with (each system's declared ``index_models``, :func:`lexgraph.core.provenance.identity`), so that
:func:`check_index` refuses, in one line naming ``index.json`` and the artefact, to search an
index with models that changed after it was built (their vectors would not match the questions').

It also lists the index's own files with their SHA-256 and its folders (:func:`own_files`, format
v2): :func:`read_index` checks the tables every system reads (``data/clean``) and refuses a file
under ``data/`` or ``models/`` that the record does not list, :func:`check_index` the files of the
system it is asked for (its declared ``index_side``), so that a key deleted, swapped or duplicated in
``keys.parquet`` or a vector changed after indexing is one line naming the file and `lexgraph
index` to rebuild, never served. A v1 index (no list) is refused the same way.

The same list proves that a folder is a command's own earlier output before it is replaced
(:func:`check_replaceable`, for ``lexgraph index --out`` and ``lexgraph export OUT``): the record
carries the command's format marker, and every entry of the folder is the record, a file or a
folder it lists (or what the command allows besides, the index's resumable blocks). Anything else
(an unknown file, a link, a record without the marker) is refused in one line naming the folder
and the first foreign entry, and nothing is deleted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

from lexgraph.core import layout
from lexgraph.core.errors import DataError, LexgraphError
from lexgraph.core.inputs import DuplicateKeyError, json_object, shown_path
from lexgraph.core.provenance import digest_path, identity
from lexgraph.core.settings import Expect, Str, describe

INDEX_FILE = "index.json"
FORMAT = "lexgraph-index"
#: 2: the record lists the index's own files with their SHA-256 (v1 did not: refused, rebuilt)
VERSION = 2


def _rebuild(directory: Path) -> str:
    """The remedy for a missing or damaged index ``directory`` (which the new run replaces)."""
    return f"run `lexgraph index --corpus FILE --out {shown_path(directory)}` to build it"


def _elsewhere(directory: Path) -> str:
    """The remedy for a directory ``lexgraph index`` cannot tell for its own (it would not replace it)."""
    return f"remove {shown_path(directory)} and run `lexgraph index --corpus FILE --out DIR`, or index into a new DIR"


#: the index's tables every system reads (articles, headings, the user's keys)
SHARED: tuple[str, ...] = (layout.CLEAN.path.as_posix(),)

#: one part of a relative path: not empty, ``.`` or ``..``, no slash, backslash or NUL
_PART = r"(?:[^/\\\x00.][^/\\\x00]*|\.[^/\\\x00.][^/\\\x00]*|\.\.[^/\\\x00]+)"
#: a relative POSIX path inside a folder (not absolute; no ``..``, ``.``, empty part or backslash)
RelPath = Annotated[Str, StringConstraints(pattern=rf"^{_PART}(?:/{_PART})*$")]
Sha256 = Annotated[Str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Files = Annotated[dict[RelPath, Sha256], Expect("a mapping of the relative paths of its files to their SHA-256")]
Folders = Annotated[frozenset[RelPath], Expect("a list of the relative paths of its folders")]


class Listing(BaseModel):
    """The files and folders a record lists (:func:`own_files`); its other keys are the record's own."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    files: Files
    folders: Folders


class IndexRecord(BaseModel):
    """``index.json`` as searching reads it (:func:`index_record` writes it): the marker, the
    format's version, per system the digest of each workspace artefact it was indexed with, and
    the index's own files and folders. The corpus and the counts are the user's to read."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    format: Annotated[Literal["lexgraph-index"], Expect(f"{FORMAT!r}, the marker of `lexgraph index`")]
    version: Annotated[Literal[2], Expect(f"{VERSION}, the format that lists the digests of the index's files")]
    systems: Annotated[dict[Str, dict[Str, Str]], Expect("a mapping of each system to its artefacts' digests")]
    files: Files
    folders: Folders
    snapshot: Annotated[
        str | None, Expect("the date YYYY-MM-DD the indexed law is in force on (lexgraph index --snapshot)")
    ] = None
    precision: Annotated[
        Literal["fp32", "bf16"], Expect("fp32 or bf16, the chunk encoder's number format (lexgraph index --precision)")
    ] = "fp32"


def model_digests(system: str, workspace: str | Path) -> dict[str, str]:
    """``{artefact: digest}`` of the workspace artefacts ``system`` is indexed with (its declaration's
    :attr:`~lexgraph.methods.system.System.index_models`)."""
    from lexgraph.methods.catalog import declared

    return {path: identity(Path(workspace, path)) for path in declared(system).index_models}


# --- a folder's own files --------------------------------------------------------------------------


def own_files(root: Path, record: str) -> dict[str, Any]:
    """``{"files": {path: sha256}, "folders": [path, ...]}`` of everything under ``root`` (relative
    POSIX paths, sorted) but the record file ``record`` itself: what a command lists in its record
    before its output replaces an earlier one. A writer leaves no link (a reader refuses one)."""
    files: dict[str, str] = {}
    folders: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath).relative_to(root)
        folders.extend((base / name).as_posix() for name in dirnames)
        for name in sorted(filenames):
            rel = (base / name).as_posix()
            if rel != record:
                files[rel] = digest_path(Path(dirpath, name))
    return {"files": dict(sorted(files.items())), "folders": sorted(folders)}


def listed(record: Any) -> Listing | None:
    """The files and folders a record lists (:func:`own_files`), or None when it lists none or not
    in that form."""
    try:
        return Listing.model_validate(record)
    except ValidationError:
        return None


Allowed = Callable[[str, os.DirEntry], bool]


def first_foreign(
    root: Path, files: Collection[str], folders: Collection[str], record: str | None, allowed: Allowed | None = None
) -> str | None:
    """The first entry under ``root`` (relative path, in sorted order, a folder before what it
    holds) that is neither the record ``record`` (at the top), nor a regular file of ``files``, nor
    a folder of ``folders``, nor ``allowed(path, entry)``; None when there is none. A symbolic link,
    a pipe or a device is never listed."""

    def visit(directory: Path, prefix: str) -> str | None:
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            raise LexgraphError(
                f"{shown_path(directory)} cannot be read ({exc.strerror or exc}); "
                "refusing to replace it, expected a readable directory"
            ) from None
        for entry in entries:
            rel = prefix + entry.name
            if allowed is not None and allowed(rel, entry):
                if entry.is_dir(follow_symlinks=False):  # what it holds is checked too
                    found = visit(Path(entry.path), rel + "/")
                    if found is not None:
                        return found
                continue
            if entry.is_symlink():
                return rel
            if entry.is_dir(follow_symlinks=False):
                if rel not in folders:
                    return rel
                found = visit(Path(entry.path), rel + "/")
                if found is not None:
                    return found
            elif not entry.is_file(follow_symlinks=False) or (rel not in files and rel != record):
                return rel
        return None

    return visit(root, "")


def read_record(path: Path) -> Any:
    """The JSON value of a record file, or None when it is not one (unreadable, not UTF-8 JSON, a
    key given twice, not a regular file)."""
    if path.is_symlink() or not path.is_file():
        return None
    try:
        return json_object(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, DuplicateKeyError, RecursionError):
        return None


def check_replaceable(
    out: Path, *, record: str, marker: str, label: str, what: str, allowed: Allowed | None = None
) -> None:
    """Refuse, in one line naming ``out`` and its first foreign entry, to replace the directory
    ``out`` unless it is provably an earlier output (``what``: "an earlier index") of the command
    whose record file ``record`` carries ``"format": marker``: an empty directory, or one whose
    every entry is that record, a file or folder it lists, or ``allowed``. Nothing is deleted."""
    foreign = _foreign(out, record, marker, what, allowed) if out.is_dir() else None
    if foreign:
        raise LexgraphError(
            f"{label} {shown_path(out)} holds {foreign}; refusing to replace the directory, nothing was deleted; "
            f"expected a new directory or {what}"
        )


def _foreign(out: Path, record: str, marker: str, what: str, allowed: Allowed | None) -> str | None:
    """The first entry of the directory ``out`` that shows it is not an earlier output
    (:func:`check_replaceable`) and why, or None."""
    path = out / record
    if not (path.exists() or path.is_symlink()):
        foreign = first_foreign(out, set(), set(), None, allowed)
        return None if foreign is None else f"{shown_path(foreign)}, which is not a file of {what} (no {record} there)"
    value = read_record(path)
    if not isinstance(value, dict) or value.get("format") != marker:
        return f'{shown_path(record)}, which is not the record of {what} (no "format": "{marker}")'
    found = listed(value)
    if found is None:
        return (
            f"{shown_path(record)}, which lists none of the files beside it (written by an earlier lexgraph, "
            "or edited), so they cannot be told from yours"
        )
    foreign = first_foreign(out, found.files, found.folders, record, allowed)
    return (
        None if foreign is None else f"{shown_path(foreign)}, which is not a file of {what} ({record} does not list it)"
    )


# --- the index's record ---------------------------------------------------------------------------


def index_record(
    corpus: Path, sha256: str, counts: dict[str, Any], systems: dict[str, dict[str, str]], own: dict[str, Any]
) -> dict:
    """The content of ``index.json``: the corpus file's name and digest, counts, per system the
    digests of :func:`model_digests`, and the index's own files and folders (:func:`own_files`)."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "corpus": {"file": corpus.name, "sha256": sha256},
        **counts,
        "systems": systems,
        **own,
    }


#: (path, size, mtime, ctime, inode) -> the SHA-256 found: a file checked once per process
_VERIFIED: dict[tuple, str] = {}


def _damage(path: Path, digest: str) -> str | None:
    """How the listed file ``path`` differs from what the record says of it (``digest``), or None."""
    if path.is_symlink() or not path.is_file():
        what = "missing" if not (path.exists() or path.is_symlink()) else "not a regular file"
        return f"{what}, though {INDEX_FILE} lists it: the index is damaged"
    info = path.stat()
    key = (str(path.resolve()), info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)
    if _VERIFIED.get(key) != digest:
        found = digest_path(path)
        if found != digest:
            return (
                f"changed since `lexgraph index` wrote it (SHA-256 {found[:12]}…, {INDEX_FILE} records "
                f"{digest[:12]}…): damaged or edited"
            )
        _VERIFIED[key] = digest
    return None


def _verify(directory: Path, files: dict[str, str], prefixes: tuple[str, ...]) -> None:
    """Check the listed files under ``prefixes`` against their recorded SHA-256."""
    for rel, digest in files.items():
        if any(rel.startswith(prefix + "/") for prefix in prefixes):
            damage = _damage(directory / rel, digest)
            if damage:
                raise DataError(directory / rel, f"{damage}; {_rebuild(directory)} again")


def read_index(directory: str | Path) -> IndexRecord:
    """``directory/index.json``, read through :class:`IndexRecord` (a directory without one is not
    an index), with the tables every system reads (:data:`SHARED`) checked against their recorded
    digests and no file under ``data/`` or ``models/`` that the record does not list."""
    directory = Path(directory)
    path = directory / INDEX_FILE
    if not path.is_file():
        raise DataError(path, f"not found; expected an index written by `lexgraph index` ({_rebuild(directory)})")
    value = read_record(path)
    try:
        record = IndexRecord.model_validate(value)
    except ValidationError as exc:
        why = describe(IndexRecord, value, "", exc) if isinstance(value, dict) else "it holds no JSON object"
        raise DataError(path, f"not a record of `lexgraph index` v{VERSION}: {why}; {_elsewhere(directory)}") from None
    managed = tuple(layout.MANAGED_ROOTS)

    def outside(rel: str, entry: os.DirEntry) -> bool:  # search reads data/ and models/ only
        return rel.split("/")[0] not in managed

    foreign = first_foreign(directory, record.files, record.folders, INDEX_FILE, outside)
    if foreign is not None:
        raise DataError(
            directory / foreign,
            f"not a file of this index ({INDEX_FILE} does not list it; search reads what is under "
            f"{' and '.join(m + '/' for m in managed)}); move it out of {shown_path(directory)}",
        )
    _verify(directory, record.files, SHARED)
    return record


def read_verified(directory: str | Path, prefixes: tuple[str, ...]) -> IndexRecord:
    """:func:`read_index`, with the listed files under ``prefixes`` checked against their SHA-256 too
    (what an update reuses of an earlier index)."""
    record = read_index(directory)
    _verify(Path(directory), record.files, prefixes)
    return record


def check_index(directory: str | Path, system: str, workspace: str | Path) -> None:
    """Refuse (one line naming ``index.json`` or the damaged file) to search ``system`` over the
    index ``directory`` when the index lacks it, its files (its declared ``index_side``) changed since they were
    written, or it was built by other models than ``workspace`` holds now."""
    from lexgraph.methods.catalog import declared

    spec = declared(system)
    record = read_index(directory)
    built = record.systems.get(system)
    problem = None
    if built is None:
        why = spec.off_in(Path(workspace))
        held = ", ".join(record.systems) or "no system"
        problem = (
            f"no {system} in this index: {system} is switched off in the workspace ({why})"
            if why
            else f"no {system} in this index (it holds {held}); run `lexgraph index` with --systems {system}"
        )
    else:
        _verify(Path(directory), record.files, spec.index_side)
        changed = (a for a, digest in sorted(built.items()) if identity(Path(workspace, a)) != digest)
        artefact = next(changed, None)
        if artefact is not None:
            problem = (
                f"{system} was indexed with another {artefact} than the workspace {workspace} holds now "
                "(a different model built this index); run `lexgraph index` again with this workspace"
            )
    if problem:
        raise LexgraphError(f"{Path(directory) / INDEX_FILE}: {problem}")

"""What an artefact is built from: digests of a stage's settings and of its input files.

A stage's *fingerprint* is the SHA-256 of its settings (the typed config and the ``base``
values that change results, as canonical JSON) and of the content of every input its paths
object names (:func:`stage_inputs`: every field marked :class:`Input`). Two runs
with the same fingerprint compute the same thing; a changed setting or input changes it.

Uses: a training stage's resume checkpoint (:mod:`lexgraph.training.resume`) resumes only a
run of the same fingerprint, and a model artefact records the digests of what it was built
from, so that a reader can tell when the workspace has moved on.

A directory's digest covers the relative names and bytes of every file below it, in sorted
order, so it does not depend on the file system's listing order, modes or times. A missing
input digests to ``"absent"`` (a stage may name an input it does not read under its settings).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

ABSENT = "absent"
_BLOCK = 1 << 20


@dataclasses.dataclass(frozen=True)
class Input:
    """The mark of a stage's input path, in its paths dataclass's type:
    ``articles: Annotated[Path, Input("clean articles (Parquet)")]``. Digested into the stage's
    fingerprint; ``help`` is its ``--option``'s help."""

    help: str


@dataclasses.dataclass(frozen=True)
class Output:
    """The mark of a path the stage writes: not an input. A directory output records what it was
    built from (:data:`RECORD`, :func:`recording`) unless ``record=False`` (the fetched and cleaned
    data, whose layout is the data set's, and the runs)."""

    help: str
    record: bool = True


@dataclasses.dataclass(frozen=True)
class Workspace:
    """The mark of a path naming a whole workspace (the stage reads some of its artefacts): not
    digested as one input; the stage fingerprints what it reads of it."""

    help: str


Role = Input | Output | Workspace


@functools.cache
def path_roles(paths: type) -> dict[str, Role]:
    """The mark of each field of a stage's paths dataclass, in field order. A field without one is
    a programming error (every path is an input, an output or a workspace)."""
    hints = typing.get_type_hints(paths, include_extras=True)
    roles = {}
    for f in dataclasses.fields(paths):
        marks = [m for m in getattr(hints[f.name], "__metadata__", ()) if isinstance(m, Role)]
        if len(marks) != 1:
            raise TypeError(f"{paths.__name__}.{f.name}: expected Annotated[Path, Input|Output|Workspace(help)]")
        roles[f.name] = marks[0]
    return roles


def stage_inputs(paths: Any) -> dict[str, Path]:
    """The input paths of a stage's paths object: its fields marked :class:`Input`."""
    return {
        name: Path(getattr(paths, name)) for name, role in path_roles(type(paths)).items() if isinstance(role, Input)
    }


def _update_file(digest, path: Path) -> None:
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            digest.update(block)


def digest_path(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, or of a directory's files (relative names, sizes and bytes,
    sorted by name); ``"absent"`` for a missing path."""
    path = Path(path)
    if not path.exists():
        return ABSENT
    digest = hashlib.sha256()
    if path.is_file():
        _update_file(digest, path)
        return digest.hexdigest()
    files = sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        name = file.relative_to(path).as_posix().encode("utf-8", "surrogateescape")
        digest.update(b"%d:%s:%d:" % (len(name), name, file.stat().st_size))
        _update_file(digest, file)
    return digest.hexdigest()


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return {name: _plain(getattr(value, name)) for name in type(value).model_fields}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return value.as_posix()
    if hasattr(value, "dtype") and hasattr(value, "tobytes"):  # an array: its type, shape and bytes
        return {
            "dtype": str(value.dtype),
            "shape": list(value.shape),
            "sha256": hashlib.sha256(value.tobytes()).hexdigest(),
        }
    return value


def settings_digest(settings: Any) -> str:
    """SHA-256 of ``settings`` (dataclasses, mappings, lists, scalars) as canonical JSON."""
    text = json.dumps(_plain(settings), sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def fingerprint(settings: Any, inputs: Mapping[str, str | os.PathLike]) -> dict[str, Any]:
    """``{"settings": digest, "inputs": {name: digest}, "digest": the two together}`` (an input
    that is a recorded artefact is digested by its record: :func:`identity`)."""
    record: dict[str, Any] = {
        "settings": settings_digest(settings),
        "inputs": {name: identity(path) for name, path in sorted(inputs.items())},
    }
    record["digest"] = settings_digest(record)
    return record


# --- what an artefact records, and the check that the workspace still holds it -----------------

#: the record a stage leaves in each directory output it writes (inside the same atomic write)
RECORD = "provenance.json"


@dataclasses.dataclass
class _Stage:
    """The stage this process runs (:func:`recording`): its name, settings, inputs and outputs."""

    name: str
    settings: Any
    inputs: dict[str, Path]
    outputs: frozenset[Path]
    record: dict[str, Any] | None = None


_STAGE: _Stage | None = None


def _resolved(path: str | os.PathLike) -> Path:
    return Path(os.path.realpath(path))


@contextlib.contextmanager
def recording(name: str, settings: Any, paths: Any) -> Iterator[None]:
    """Within the block (a stage's run, :func:`lexgraph.core.stage.run_stage`), every directory
    output of ``paths`` (a stage's paths object: its :class:`Output` fields, but ``record=False``) that
    :func:`lexgraph.core.io.atomic_path` writes gets :data:`RECORD`: the stage ``name``, the digest
    of ``settings`` and the digest of every input of ``paths`` (:func:`stage_inputs`)."""
    global _STAGE
    outputs = frozenset(
        _resolved(getattr(paths, name))
        for name, role in path_roles(type(paths)).items()
        if isinstance(role, Output) and role.record
    )
    previous, _STAGE = _STAGE, _Stage(name, settings, stage_inputs(paths), outputs)
    try:
        yield
    finally:
        _STAGE = previous


def reads(path: str | os.PathLike) -> None:
    """Within :func:`recording`, count the artefact ``path`` among the stage's inputs: a stage
    that reads a whole workspace (:class:`Workspace`: hybrid, rerank) notes each artefact it loads
    (:func:`lexgraph.systems.registry.load_retriever` does), so that its record names them too."""
    stage = _STAGE
    if stage is not None and stage.record is None:
        stage.inputs[f"read {_recorded_path(Path(path))}"] = Path(path)


def _recorded_path(path: Path) -> str:
    """An input's path as the record keeps it: relative to the working directory (the workspace,
    under ``dvc repro``) when it lies below it, else absolute."""
    absolute = Path(os.path.abspath(path))
    with contextlib.suppress(ValueError):
        return absolute.relative_to(Path.cwd()).as_posix()
    return absolute.as_posix()


def identity(path: str | os.PathLike) -> str:
    """What an input is, as a record keeps it: for a directory with :data:`RECORD` (an artefact
    a stage wrote), ``record:`` and the SHA-256 of that record, which holds the digest of the
    artefact's own files (so reading an artefact of gigabytes costs one small file); otherwise
    :func:`digest_path`."""
    record = Path(path) / RECORD
    if record.is_file():
        return "record:" + hashlib.sha256(record.read_bytes()).hexdigest()
    return digest_path(path)


def stamp(directory: Path, target: Path) -> None:
    """Write :data:`RECORD` into ``directory`` (the temporary that becomes ``target``) when
    ``target`` is a directory output of the stage being recorded; nothing otherwise. The record:
    ``stage``, ``settings`` (their digest), ``inputs`` (``{name: {"path", "digest"}}``, the digest
    by :func:`identity`) and ``output`` (the digest of the files beside it)."""
    stage = _STAGE
    if stage is None or _resolved(target) not in stage.outputs:
        return
    if stage.record is None:  # the inputs are digested once, whatever the number of outputs
        stage.record = {
            "stage": stage.name,
            "settings": settings_digest(stage.settings),
            "inputs": {
                name: {"path": _recorded_path(path), "digest": identity(path)}
                for name, path in sorted(stage.inputs.items())
            },
        }
    record = {**stage.record, "output": digest_path(directory)}  # its own files, before the record
    text = json.dumps(record, indent=2, sort_keys=True, ensure_ascii=True) + "\n"
    (directory / RECORD).write_text(text, encoding="utf-8")

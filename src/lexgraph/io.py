"""Atomic outputs and validated inputs.

Stages write into a temporary sibling and rename it over the target only when the
whole output is complete, so a failure never leaves half-written outputs behind.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

from lexgraph.errors import DataError

log = logging.getLogger(__name__)


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; move it onto ``target`` on success.

    With ``directory=True`` the yielded path is an (empty, existing) directory and the
    whole directory replaces ``target``. On any exception the temporary is removed and
    ``target`` is left as it was.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        tmp = Path(name)
    umask = os.umask(0)
    os.umask(umask)
    try:
        yield tmp
        tmp.chmod((0o777 if directory else 0o666) & ~umask)
        if directory:
            if target.exists():
                old = target.with_name(f".{target.name}.old")
                shutil.rmtree(old, ignore_errors=True)
                target.rename(old)
                tmp.rename(target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                tmp.rename(target)
        else:
            os.replace(tmp, target)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise


def write_json(obj: Any, target: str | os.PathLike) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n", encoding="utf-8")


def write_text(text: str, target: str | os.PathLike) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_parquet(df, target: str | os.PathLike) -> None:
    """Write a polars DataFrame atomically (no timestamps: byte-identical for equal data)."""
    with atomic_path(target) as tmp:
        df.write_parquet(tmp, compression="zstd", statistics=False)


def read_parquet(path: str | os.PathLike, required: Iterable[str] = ()):
    """Read a Parquet file and check it has the ``required`` columns."""
    import polars as pl

    path = Path(path)
    if not path.is_file():
        raise DataError(path, "file not found")
    try:
        df = pl.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - any reader failure is a bad file for the user
        raise DataError(path, f"not a readable Parquet file ({type(exc).__name__}: {exc})") from exc
    require_columns(df, required, path)
    return df


def require_columns(df, required: Iterable[str], path) -> None:
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise DataError(path, f"missing column(s) {missing}; found {df.columns}")

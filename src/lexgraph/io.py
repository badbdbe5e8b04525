"""Atomic outputs and validated inputs.

Stages write into a temporary sibling and rename it over the target only when the
whole output is complete, so a failure never leaves half-written outputs behind, and a
directory output is replaced as a whole: no file of a previous run survives a rerun.
This is what makes ``persist: true`` on every output of ``dvc.yaml`` safe (DVC then no
longer deletes outputs before a stage runs, so a stage that fails keeps its previous
outputs; see README, "When a stage fails").
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterable, Iterator

from lexgraph.errors import DataError

log = logging.getLogger(__name__)


_DEFERRED_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def _interrupt(signum, frame):  # noqa: ARG001 - signal handler signature
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise KeyboardInterrupt like SIGINT does, so
    that the temporary output is removed (``dvc repro`` killed, a CI job cancelled)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_DFL:
            previous[sig] = signal.signal(sig, _interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Block SIGINT/SIGTERM/SIGHUP for the few renames of a directory swap, so that an
    interrupt cannot fall between moving the old output away and moving the new one in."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _DEFERRED_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _restore_interrupted_swap(target: Path) -> None:
    """A swap killed between its two renames (SIGKILL, power loss) leaves the previous
    output in ``.<name>.old`` and none at ``target``: put it back."""
    old = target.with_name(f".{target.name}.old")
    if not target.exists() and old.is_dir():
        log.warning("%s: restoring the previous output from %s (an earlier run was killed)", target, old)
        old.rename(target)


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; move it onto ``target`` on success.

    With ``directory=True`` the yielded path is an (empty, existing) directory and the
    whole directory replaces ``target`` (no file of the previous ``target`` survives). On
    any exception, Ctrl-C, SIGTERM or SIGHUP included, the temporary is removed and
    ``target`` is left as it was.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if directory:
        _restore_interrupted_swap(target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        tmp = Path(name)
    umask = os.umask(0)
    os.umask(umask)
    try:
        with _sigterm_interrupts():
            yield tmp
            tmp.chmod((0o777 if directory else 0o666) & ~umask)
            if directory:
                old = target.with_name(f".{target.name}.old")
                shutil.rmtree(old, ignore_errors=True)
                with _signals_deferred():
                    if target.exists() or target.is_symlink():
                        target.rename(old)
                    tmp.rename(target)
                    shutil.rmtree(old, ignore_errors=True)
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


def save_tensors(tensors: dict, target: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file whose bytes depend only on its content.

    ``safetensors.torch.save_file`` serialises ``__metadata__`` from a hash map whose order
    changes from one process to the next, so two runs of a stage gave equal tensors but
    different bytes (and DVC saw a change). The header is re-serialised here with sorted
    keys; tensor data and offsets are the library's. Written atomically.
    """
    import struct

    from safetensors.torch import save

    blob = save(dict(sorted(tensors.items())), metadata=dict(sorted((metadata or {}).items())) or None)
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + length])
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)  # data stays 8-byte aligned, as the library writes it
    with atomic_path(target) as tmp:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            f.write(blob[8 + length :])


def load_tensors(target: str | os.PathLike, what: str, remedy: str) -> dict:
    """Read a safetensors file; a missing, truncated or corrupt one is a one-sentence
    :class:`DataError` naming ``target``, ``what`` it holds and the ``remedy``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(target)
    if not path.is_file():
        raise DataError(path, f"{what} not found; {remedy}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as exc:
        reason = str(exc).removeprefix("Error while deserializing header: ")
        raise DataError(path, f"truncated or corrupt {what} ({reason}); {remedy}") from None

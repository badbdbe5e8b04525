"""Atomic outputs and validated inputs.

Stages write into a temporary sibling and rename it over the target only when the
whole output is complete, so a failure never leaves half-written outputs behind, and a
directory output is replaced as a whole: no file of a previous run survives a rerun.
This is what makes ``persist: true`` on every output of ``dvc.yaml`` safe (DVC then no
longer deletes outputs before a stage runs, so a stage that fails keeps its previous
outputs; see README, "When a stage fails"). A write that fails (disk full, quota,
read-only file system, permission, I/O error) is a :class:`DataError` naming the output,
the reason and what to do, e.g. "run.trec: not written, no space left on device; free
space and rerun".

Temporaries are named ``.<name>.<host>.<pid>.<random>.tmp`` (``<host>``: the host name and
the pid namespace, so that a pid means one process). A writer killed outright (``kill
-9``, OOM, power loss) leaves its temporary behind; every write removes, in its output's
directory, the temporaries of this naming whose ``<host>`` is this one and whose
``<pid>`` no longer runs (``os.kill(pid, 0)`` finds no process). A temporary of a live
process (a concurrent ``lexgraph search --run`` of the same file, this process) or of
another host (a shared file system) is never touched: two writers of one target both
finish, the last rename wins. Temporaries of the older naming (``.<name>.<random>.tmp``,
no pid to ask) are removed when they belong to the output being written and are older
than :data:`LEGACY_TMP_AGE_S` (a day).

Links and modes, one rule for every writer (stage outputs, ``lexgraph search --run``,
``lexgraph regress --update``): a target that is a symbolic link is written through, the
file (or directory) it points to is replaced and the link kept; a read-only target (no write
bit, or not writable by this process) is refused in one sentence and left as it was; the new
output has the permission bits of the one it replaces (the umask's default for a new one), and
every file and directory inside a directory output has the umask's default (0644 / 0755 under
umask 022), whatever mode its writer gave it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import re
import shutil
import signal
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from lexgraph.core.errors import DataError, LexgraphError, check_stop
from lexgraph.core.provenance import stamp

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


#: what to do when writing an output fails with one of these errnos (else: the system's words)
_WRITE_REMEDIES = {
    errno.ENOSPC: "no space left on device; free space and rerun",
    errno.EDQUOT: "disk quota exceeded; free space (or raise the quota) and rerun",
    errno.EROFS: "read-only file system; write to a writable location (or remount it read-write) and rerun",
    errno.EACCES: "permission denied; make {dir} writable and rerun",
    errno.EPERM: "operation not permitted; make {dir} writable and rerun",
    errno.EIO: "input/output error (a failing disk or a lost network mount); check the device and rerun",
    errno.EFBIG: "file too large for the file system; write to another file system and rerun",
    errno.ENAMETOOLONG: "file name too long; choose a shorter path",
}
_OS_ERROR_CODE = re.compile(r"\(os error (\d+)\)")  # how Rust writers (safetensors, polars) report one


def _write_errno(exc: BaseException) -> int | None:
    """The errno of a failed write: an :class:`OSError`'s own, or the ``(os error N)`` that a
    Rust writer (safetensors, polars) puts in its message; ``None`` if there is none."""
    if isinstance(exc, OSError):
        return exc.errno
    match = _OS_ERROR_CODE.search(str(exc))
    return int(match.group(1)) if match else None


def _write_error(target: Path, exc: BaseException, tmp: Path | None) -> DataError | None:
    """A failed write as one sentence naming ``target`` (``None``: not a write failure, e.g. an
    input that the block could not read, or already a :class:`LexgraphError`)."""
    if isinstance(exc, LexgraphError) or not isinstance(exc, Exception):
        return None
    code = _write_errno(exc)
    if isinstance(exc, OSError) and exc.filename is not None:
        where = Path(os.fsdecode(exc.filename))
        ours = (
            where in (target, target.parent)
            or where.name.startswith(f".{target.name}.")
            or (tmp is not None and (where == tmp or tmp in where.parents))
        )
        if not ours:
            return None  # about another file: not ours to relabel
    elif code is None:
        return None
    if code in _WRITE_REMEDIES:
        what = _WRITE_REMEDIES[code].format(dir=target.parent)
    else:
        reason = (
            os.strerror(code).lower() if code else (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__)
        )
        what = f"{reason}; fix that and rerun"
    return DataError(target, f"not written, {what} (any previous version is left as it was)")


#: temporaries of the older naming (no pid in it) are removed once older than this
LEGACY_TMP_AGE_S = 24 * 3600
_RANDOM = r"[a-z0-9_]{8}"  # tempfile's 8 random characters
_NAME_MAX = 255  # bytes of a file name on the usual file systems


@functools.lru_cache(maxsize=1)
def _host() -> str:
    """This host (and pid namespace: pids of two containers are not comparable), as a
    file-name token without dots."""
    token = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:32] or "host"
    with contextlib.suppress(OSError, ValueError):
        token += "-" + format(int(re.sub(r"\D", "", os.readlink("/proc/self/ns/pid"))), "x")
    return token


def _tmp_prefix(name: str) -> str:
    """``.<name>.<host>.<pid>.`` (``name`` cut so that the whole stays a legal file name)."""
    tag = f".{_host()}.{os.getpid()}."
    room = _NAME_MAX - len(os.fsencode(tag)) - 1 - 8 - len(".tmp")
    raw = os.fsencode(name)
    return f".{os.fsdecode(raw[:room]) if len(raw) > room else name}{tag}"


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (in doubt: yes)."""
    if pid <= 0 or pid == os.getpid():
        return pid > 0
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: someone else's process
        return True
    return True


def _writer_gone(name: str, target: Path, entry: os.DirEntry) -> str | None:
    """Why the writer of ``name``, a file next to ``target``, is gone (it is one of the
    temporaries the module docstring describes and may be removed), or None."""
    ours = re.fullmatch(rf"\..+\.{re.escape(_host())}\.(\d+)\.{_RANDOM}\.tmp", name)
    if ours:
        return None if _alive(int(ours.group(1))) else f"its writer, pid {ours.group(1)}, is gone"
    if not re.fullmatch(rf"\.{re.escape(target.name)}\.{_RANDOM}\.tmp", name):
        return None  # another host's, another output's older-naming one, or not a temporary
    with contextlib.suppress(OSError):
        if time.time() - entry.stat(follow_symlinks=False).st_mtime < LEGACY_TMP_AGE_S:
            return None
    return "older than a day"


def _sweep_stale_temporaries(target: Path) -> None:
    """Remove the temporaries that killed writers left next to ``target`` (module docstring)."""
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return
    for entry in entries:
        why = _writer_gone(entry.name, target, entry)
        if why:
            log.warning("%s: removing a temporary left by an interrupted run (%s)", target.parent / entry.name, why)
            _remove(target.parent / entry.name)


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; move it onto ``target`` on success.

    With ``directory=True`` the yielded path is an (empty, existing) directory and the
    whole directory replaces ``target`` (no file of the previous ``target`` survives). On
    any exception, Ctrl-C, SIGTERM or SIGHUP included, the temporary is removed and
    ``target`` is left as it was, and so it is when a stop was requested
    (:func:`lexgraph.core.errors.request_stop`: the parent ``dvc repro`` is gone). A write
    that fails for want of disk space, quota or permission (any :class:`OSError` about the
    output, or a writer's ``(os error N)``) raises a :class:`DataError` naming ``target``, the
    reason and what to do.
    """
    target = _write_through(Path(target))
    tmp: Path | None = None
    try:
        mode = _replacement_mode(target, directory)
        target.parent.mkdir(parents=True, exist_ok=True)
        _sweep_stale_temporaries(target)
        if directory:
            _restore_interrupted_swap(target)
            tmp = Path(tempfile.mkdtemp(prefix=_tmp_prefix(target.name), suffix=".tmp", dir=target.parent))
        else:
            fd, name = tempfile.mkstemp(prefix=_tmp_prefix(target.name), suffix=".tmp", dir=target.parent)
            os.close(fd)
            tmp = Path(name)
        with _sigterm_interrupts():
            yield tmp
            if directory:
                stamp(tmp, target)  # what a stage's directory output was built from (lexgraph.core.provenance)
                _default_modes(tmp)
            tmp.chmod(mode)
            if directory:
                _swap_directory(tmp, target)
            else:
                with _signals_deferred():
                    check_stop()  # a stop requested (the parent `dvc repro` gone): keep the previous output
                    os.replace(tmp, target)
    except BaseException as exc:
        if tmp is not None:
            _remove(tmp)
        error = _write_error(target, exc, tmp)
        if error is not None:
            raise error from exc
        raise


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _write_through(target: Path) -> Path:
    """``target``, or for a symbolic link the file it points to (module docstring: links)."""
    if not target.is_symlink():
        return target
    resolved = Path(os.path.realpath(target))
    if resolved.is_symlink():
        raise DataError(target, "a symbolic link loop; not written, expected a file or a link to one")
    return resolved


def read_only(path: Path) -> str | None:
    """Why ``path`` (which exists) may not be written, as ``"mode 0444"``, or None: not writable
    (a directory: not enterable) by this process, or no write bit for anyone (root writes such a
    file anyway; DVC's cache files are mode 0444). The one rule of every writer and of the CLI's
    checks before a search."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if not os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0)) or not mode & 0o222:
        return f"mode {mode:04o}"
    return None


def _replacement_mode(target: Path, directory: bool) -> int:
    """The permission bits of the output that replaces ``target``: those of the previous
    ``target``, or the umask's default for a new one; a read-only ``target`` (no write bit
    for anyone, or not writable by this process) is refused."""
    try:
        info = target.stat()
    except FileNotFoundError:
        return (0o777 if directory else 0o666) & ~_umask()
    locked = read_only(target)
    if locked:
        raise DataError(
            target,
            f"read-only ({locked}); refusing to overwrite it, expected a writable path "
            "(make it writable, or write elsewhere)",
        )
    return stat.S_IMODE(info.st_mode) & 0o777


def _default_modes(root: Path) -> None:
    """Give every file and directory below ``root`` the umask's default mode (0644 and 0755
    under umask 022; executables keep an x bit): writers that go through a temporary file
    (``mkstemp``, safetensors) leave 0600 behind."""
    umask = _umask()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            info = os.lstat(path)  # a symbolic link is left alone, and so is what it points to
            if stat.S_ISDIR(info.st_mode) or (stat.S_ISREG(info.st_mode) and info.st_mode & 0o111):
                os.chmod(path, 0o777 & ~umask)
            elif stat.S_ISREG(info.st_mode):
                os.chmod(path, 0o666 & ~umask)


def _remove(path: Path) -> None:
    """Remove a file or directory tree, quietly (a cleanup must not hide the first error)."""
    with contextlib.suppress(OSError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _swap_directory(tmp: Path, target: Path) -> None:
    """Move the directory ``tmp`` onto ``target``: the previous one goes to ``.<name>.old``
    first and comes back if the second rename fails."""
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    with _signals_deferred():
        check_stop()  # a stop requested (the parent `dvc repro` gone): keep the previous output
        moved = target.exists() or target.is_symlink()
        if moved:
            target.rename(old)
        try:
            tmp.rename(target)
        except BaseException:
            if moved:
                old.rename(target)
            raise
        shutil.rmtree(old, ignore_errors=True)


def json_text(obj: Any, *, indent: int | None = 2, sort_keys: bool = False, ensure_ascii: bool = False) -> str:
    """``json.dumps(obj, ...)`` plus a final newline: by default two-space indent, keys in their
    order, non-ASCII characters as they are. The arguments are ``json.dumps``'s, so a writer
    keeps its file's bytes (``indent=None``: one line; ``ensure_ascii=True``: ``\\u`` escapes)."""
    return json.dumps(obj, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys) + "\n"


def write_json(
    obj: Any, target: str | os.PathLike, *, indent: int | None = 2, sort_keys: bool = False, ensure_ascii: bool = False
) -> None:
    """:func:`json_text` of ``obj`` written to ``target`` atomically, UTF-8 (missing parent
    directories are created)."""
    with atomic_path(target) as tmp:
        tmp.write_text(json_text(obj, indent=indent, sort_keys=sort_keys, ensure_ascii=ensure_ascii), encoding="utf-8")


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


def unreadable(path: Path, directory: bool = False) -> str | None:
    """Why ``path`` is not a readable file (``directory``: directory); ``None`` if it is;
    ``"missing"`` if nothing is there (a broken symbolic link is not nothing)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            return f"a broken symbolic link (to '{os.readlink(path)}')"
        return "missing"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link loop"
        if exc.errno == errno.ENOTDIR:
            return "below a path that is not a directory"
        return f"unreadable ({exc.strerror or exc})"
    if directory and not stat.S_ISDIR(mode):
        return "a file" if stat.S_ISREG(mode) else "not a directory"
    if not directory and not stat.S_ISREG(mode):
        return "a directory" if stat.S_ISDIR(mode) else "not a regular file"
    try:
        if directory:
            os.listdir(path)
        else:
            with open(path, "rb"):
                pass
    except PermissionError:
        return "not readable (permission denied)"
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    return None


def check_file(
    path: str | os.PathLike, what: str, remedy: str, *, optional: bool = False, directory: bool = False
) -> bool:
    """Check that ``path`` is a readable file (``directory=True``: directory); a missing one
    (unless ``optional``: then ``False``), a symbolic link loop, a directory instead of a
    file, an unreadable one is a one-sentence :class:`DataError` naming ``path``, ``what``
    it holds and the ``remedy``. ``True`` when it is there."""
    path = Path(path)
    reason = unreadable(path, directory)
    if reason is None:
        return True
    if reason == "missing":
        if optional:
            return False
        raise DataError(path, f"{what} not found; {remedy}")
    expected = "a readable directory" if directory else "a readable file"
    if reason.startswith("not readable"):  # another user's file: a rebuild is theirs to run
        chmod = f"chmod -R a+rX {path}" if directory else f"chmod a+r {path}"
        remedy = f"make it readable (`{chmod}`, by its owner), or {remedy}"
    raise DataError(path, f"{what} is {reason}, expected {expected}; {remedy}")


def load_tensors(target: str | os.PathLike, what: str, remedy: str) -> dict:
    """Read a safetensors file; a missing, unreadable, truncated or corrupt one is a
    one-sentence :class:`DataError` naming ``target``, ``what`` it holds and the ``remedy``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(target)
    check_file(path, what, remedy)
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as exc:
        reason = str(exc).removeprefix("Error while deserializing header: ")
        raise DataError(path, f"truncated or corrupt {what} ({reason}); {remedy}") from None

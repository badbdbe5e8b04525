"""lexgraph.core.io.save_tensors: safetensors files whose bytes depend only on their content."""

import json
import struct

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from lexgraph.core.io import save_tensors


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {"vectors": torch.randn(5, 3, generator=g), "ids": torch.arange(5), "offsets": torch.tensor([0, 2, 5])}


def test_same_content_same_bytes(tmp_path):
    # safetensors' own writer orders __metadata__ from a randomly seeded hash map: ten writes
    # of six keys in one process gave ten different byte strings before this writer
    metadata = {k: f"value {k}" for k in "fedcba"}
    blobs = set()
    for i in range(10):
        path = tmp_path / f"t{i}.safetensors"
        save_tensors(_tensors(), path, metadata)
        blobs.add(path.read_bytes())
    assert len(blobs) == 1


def test_round_trip_header_sorted_and_aligned(tmp_path):
    path = tmp_path / "t.safetensors"
    tensors = _tensors()
    save_tensors(tensors, path, {"z": "1", "a": "2"})
    loaded = load_file(path)
    assert set(loaded) == set(tensors)
    for name, tensor in tensors.items():
        assert torch.equal(loaded[name], tensor)
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"a": "2", "z": "1"}
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    assert length % 8 == 0
    header = raw[8 : 8 + length].decode().rstrip(" ")
    assert list(json.loads(header)) == sorted(json.loads(header))
    assert list(json.loads(header)["__metadata__"]) == ["a", "z"]


def test_no_metadata(tmp_path):
    path = tmp_path / "t.safetensors"
    save_tensors({"x": torch.ones(2)}, path)
    with safe_open(str(path), "pt") as f:
        assert not f.metadata()
    assert torch.equal(load_file(path)["x"], torch.ones(2))


def test_load_tensors_names_the_file_and_the_remedy(tmp_path):
    import pytest

    from lexgraph.core.errors import DataError
    from lexgraph.core.io import load_tensors

    path = tmp_path / "e.safetensors"
    with pytest.raises(DataError, match=r"e\.safetensors.*embeddings file not found; run it"):
        load_tensors(path, "embeddings file", "run it")
    save_tensors(_tensors(), path, {"a": "1"})
    assert torch.equal(load_tensors(path, "embeddings file", "run it")["ids"], torch.arange(5))
    path.write_bytes(path.read_bytes()[:100])  # truncated inside the header
    with pytest.raises(DataError, match=r"truncated or corrupt embeddings file \(.*\); run it"):
        load_tensors(path, "embeddings file", "run it")


# ---------------------------------------------------------------------------
# issue 18: a write that fails (full disk, quota, read-only, permission, I/O) is one
# sentence naming the output and what to do; the previous output stays byte-identical
# ---------------------------------------------------------------------------

import errno  # noqa: E402
import os  # noqa: E402

import pytest  # noqa: E402

from lexgraph.core.errors import DataError  # noqa: E402
from lexgraph.core.io import atomic_path  # noqa: E402

WRITE_ERRORS = [
    (errno.ENOSPC, "no space left on device; free space and rerun"),
    (errno.EDQUOT, "disk quota exceeded"),
    (errno.EROFS, "read-only file system"),
    (errno.EACCES, "permission denied; make"),
    (errno.EIO, "input/output error"),
    (errno.EFBIG, "file too large"),
]


def _previous(tmp_path, directory: bool):
    """An earlier output (a file, or a directory with a file) and its bytes."""
    target = tmp_path / ("out" if directory else "out.json")
    if directory:
        target.mkdir()
        (target / "kept.bin").write_bytes(b"previous run")
        return target, {"kept.bin": b"previous run"}
    target.write_bytes(b'{"previous": true}\n')
    return target, {"": target.read_bytes()}


def _bytes(target, directory: bool):
    return {p.name: p.read_bytes() for p in target.iterdir()} if directory else {"": target.read_bytes()}


@pytest.mark.parametrize("directory", [False, True], ids=["file", "directory"])
@pytest.mark.parametrize("code, words", WRITE_ERRORS, ids=[errno.errorcode[c] for c, _ in WRITE_ERRORS])
def test_failed_write_names_the_output_and_the_reason(tmp_path, code, words, directory):
    target, before = _previous(tmp_path, directory)
    with pytest.raises(DataError) as err:
        with atomic_path(target, directory=directory) as tmp:
            with open(tmp / "new.bin" if directory else tmp, "wb") as fh:
                fh.write(b"half of the new outp")  # mid-write
                raise OSError(code, os.strerror(code))
    message = str(err.value)
    assert message.startswith(f"{target}: not written, ") and words in message and "\n" not in message
    assert "previous version is left as it was" in message
    assert _bytes(target, directory) == before  # the earlier output, byte for byte
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # the temporary is gone


def test_failed_write_of_a_rust_writer_is_named_too(tmp_path):
    """safetensors and polars report the errno inside their own exception's text."""
    target, before = _previous(tmp_path, False)
    with pytest.raises(DataError, match=r"out\.json: not written, no space left on device"):
        with atomic_path(target):
            raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert _bytes(target, False) == before and [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_failed_write_creating_the_temporary(tmp_path, monkeypatch):
    import tempfile

    target, before = _previous(tmp_path, False)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / ".out.json.x.tmp"))

    monkeypatch.setattr(tempfile, "mkstemp", full)
    with pytest.raises(DataError, match=r"out\.json: not written, no space left on device"):
        with atomic_path(target):
            raise AssertionError("not reached")
    assert _bytes(target, False) == before


def test_an_input_error_inside_the_block_is_not_relabelled(tmp_path):
    """An OSError about another file (an input read within the block) is not a write failure."""
    target, before = _previous(tmp_path, True)
    with pytest.raises(FileNotFoundError):
        with atomic_path(target, directory=True):
            open(tmp_path / "missing-input.csv", encoding="utf-8")
    assert _bytes(target, True) == before and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_failed_directory_swap_puts_the_previous_output_back(tmp_path, monkeypatch):
    from pathlib import Path

    target, before = _previous(tmp_path, True)
    rename = Path.rename

    def failing(self, dest):
        if Path(dest) == target and self.name.endswith(".tmp"):  # the new output's move into place
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(self))
        return rename(self, dest)

    monkeypatch.setattr(Path, "rename", failing)
    with pytest.raises(DataError, match="input/output error"):
        with atomic_path(target, directory=True) as tmp:
            (tmp / "new.bin").write_bytes(b"this run")
    monkeypatch.undo()
    assert _bytes(target, True) == before and [p.name for p in tmp_path.iterdir()] == ["out"]


# ---------------------------------------------------------------------------
# issue 18: temporaries that killed writers left are removed by the next write; those of
# live writers (a concurrent run of the same target) are not
# ---------------------------------------------------------------------------

import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from conftest import ROOT  # noqa: E402

WRITER = """
import sys
from pathlib import Path
from lexgraph.core.io import atomic_path
target, kind, text = sys.argv[1:]
with atomic_path(target, directory=kind == "dir") as tmp:
    (tmp / "part.txt" if kind == "dir" else tmp).write_text(text, encoding="utf-8")
    print(tmp, flush=True)
    sys.stdin.readline()  # half-way: until told to finish (or killed)
"""


def _writer(target: Path, kind: str, text: str) -> tuple[subprocess.Popen, Path]:
    """A process half-way through ``atomic_path(target)``, and its temporary."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(target), kind, text],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    return proc, Path(proc.stdout.readline().strip())


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_next_write_removes_what_killed_writers_left(tmp_path, caplog):
    (tmp_path / "run.trec").write_text("previous\n", encoding="utf-8")
    writers = [
        _writer(target, kind, "half") for target, kind in ((tmp_path / "run.trec", "file"), (tmp_path / "bm25", "dir"))
    ]
    for proc, _ in writers:  # both half-way, then killed outright
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    killed = [tmp for _, tmp in writers]
    assert all(tmp.exists() for tmp in killed) and killed[1].is_dir()  # the litter of kill -9
    legacy_old, legacy_new = tmp_path / ".run.trec.abcd_123.tmp", tmp_path / ".run.trec.zyxw9876.tmp"
    legacy_old.write_text("left by a run before this naming", encoding="utf-8")
    os.utime(legacy_old, (time.time() - 2 * 86400,) * 2)
    legacy_new.write_text("perhaps still written by an older lexgraph", encoding="utf-8")
    elsewhere = tmp_path / f".run.trec.otherhost-1.{_dead_pid()}.abcdefgh.tmp"  # another host's: pid unknowable
    elsewhere.write_text("", encoding="utf-8")

    from lexgraph.core.io import write_text

    write_text("this run\n", tmp_path / "run.trec")
    assert not any(tmp.exists() for tmp in killed)
    assert not legacy_old.exists() and legacy_new.exists() and elsewhere.exists()
    assert (tmp_path / "run.trec").read_text(encoding="utf-8") == "this run\n"
    assert sum("left by an interrupted run" in r.getMessage() for r in caplog.records) == 3


def test_temporaries_of_live_writers_are_kept(tmp_path):
    """Two writers of one target at once (two `lexgraph search --run same.trec`): neither removes
    the other's temporary, both finish, the last one's output stays."""
    from lexgraph.core.io import write_text

    target = tmp_path / "same.trec"
    child, child_tmp = _writer(target, "file", "child\n")
    try:
        with atomic_path(tmp_path / "mine.trec") as own:  # this process's own, half-way too
            own.write_text("mine\n", encoding="utf-8")
            write_text("parent\n", target)
            assert own.exists() and child_tmp.exists()
        assert target.read_text(encoding="utf-8") == "parent\n"
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=60) == 0
    finally:
        child.kill()
    assert target.read_text(encoding="utf-8") == "child\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.trec", "same.trec"]


def test_temporary_names_carry_host_and_pid_and_stay_legal(tmp_path):
    from lexgraph.core.io import _host

    with atomic_path(tmp_path / "run.trec") as tmp:
        assert tmp.name.startswith(f".run.trec.{_host()}.{os.getpid()}.") and tmp.name.endswith(".tmp")
    long = "é" * 120 + ".trec"  # 245 bytes: the temporary's name is cut, not refused
    with atomic_path(tmp_path / long) as tmp:
        tmp.write_text("x", encoding="utf-8")
        assert len(os.fsencode(tmp.name)) <= 255
    assert (tmp_path / long).read_text(encoding="utf-8") == "x"


# ---------------------------------------------------------------------------
# issue 18: reading a file that is a loop, a directory, a broken link, corrupt
# ---------------------------------------------------------------------------


def test_read_json_names_what_is_wrong(tmp_path):
    from lexgraph.core.inputs import read_json_object
    from lexgraph.core.io import check_file

    def read(**kw):
        return read_json_object(path, what="the settings", fix="rerun it", **kw)

    path = tmp_path / "settings.json"
    assert read(missing_ok=True) is None
    with pytest.raises(DataError, match=r"settings\.json: not found; expected the settings; rerun it$"):
        read()
    path.symlink_to("settings.json")
    with pytest.raises(DataError, match=r"settings\.json: is a symbolic link loop; expected the settings; rerun it$"):
        read(missing_ok=True)  # a loop is not an absent file
    path.unlink()
    path.symlink_to("gone.json")
    with pytest.raises(DataError, match=r"is a broken symbolic link \(to 'gone\.json'\)"):
        read(missing_ok=True)
    path.unlink()
    path.mkdir()
    with pytest.raises(DataError, match=r"settings\.json: is a directory; expected the settings"):
        read()
    path.rmdir()
    path.write_text('{"a": ', encoding="utf-8")
    with pytest.raises(
        DataError, match=r"not valid JSON, truncated or corrupt \(.*\); expected the settings; rerun it$"
    ):
        read()
    with pytest.raises(
        DataError,
        match=r"settings\.json: the model directory is a file, expected a readable "
        r"directory",
    ):
        check_file(path, "the model directory", "rerun it", directory=True)


def test_load_tensors_on_a_symbolic_link_loop(tmp_path):
    from lexgraph.core.io import load_tensors

    path = tmp_path / "e.safetensors"
    path.symlink_to("e.safetensors")
    with pytest.raises(
        DataError,
        match=r"e\.safetensors: embeddings file is a symbolic link loop, expected a "
        r"readable file; run it",
    ):
        load_tensors(path, "embeddings file", "run it")


def test_write_json_keeps_each_writers_format(tmp_path):
    """``write_json`` is ``json.dumps`` + a final newline, atomically, UTF-8: its default
    (two-space indent, keys in order, characters as they are) and the formats the writers
    routed through it keep (sorted keys, ``\\u`` escapes, one line)."""
    from lexgraph.core.io import json_text, write_json

    obj = {"b": "requête", "a": [1, 0.5, None], "c": {"z": True, "y": "×"}}
    for kwargs, same in (
        ({}, dict(indent=2, ensure_ascii=False)),
        ({"ensure_ascii": True}, dict(indent=2)),
        ({"sort_keys": True, "ensure_ascii": True}, dict(indent=2, sort_keys=True)),
        ({"sort_keys": True}, dict(indent=2, sort_keys=True, ensure_ascii=False)),
        ({"indent": None}, dict(ensure_ascii=False)),
        ({"indent": None, "ensure_ascii": True}, {}),
    ):
        path = tmp_path / "sub" / "out.json"
        write_json(obj, path, **kwargs)
        assert path.read_bytes() == (json.dumps(obj, **same) + "\n").encode("utf-8"), kwargs
        assert json_text(obj, **kwargs) == json.dumps(obj, **same) + "\n"
    assert [p.name for p in path.parent.iterdir()] == ["out.json"]  # no temporary left


def test_the_sweep_leaves_what_no_rule_names(tmp_path, caplog):
    """One rule per naming: this host's with a dead pid (any output), the older naming's of the
    output being written after a day; nothing else, however old, is a temporary to remove."""
    from lexgraph.core.io import write_text

    day_old = time.time() - 2 * 86400
    kept = [
        tmp_path / ".other.trec.abcdefgh.tmp",  # older naming, another output
        tmp_path / ".notes.tmp",  # a user's dot file
        tmp_path / f".run.trec.{_dead_pid()}.abcdefgh.tmp",  # a pid but no host
        tmp_path / ".run.trec.ABCDEFGH.tmp",  # not tempfile's characters
    ]
    for path in kept:
        path.write_text("keep", encoding="utf-8")
        os.utime(path, (day_old, day_old))
    write_text("this run\n", tmp_path / "run.trec")
    assert all(path.exists() for path in kept)
    assert not any("left by an interrupted run" in r.getMessage() for r in caplog.records)

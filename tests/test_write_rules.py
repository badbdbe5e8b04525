"""Writes through links and modes (issue 28, class 6): one rule for every writer, stage
outputs, ``lexgraph search --run`` and ``lexgraph regress --update`` alike
(``lexgraph.core.io``'s docstring): a symbolic link is written through and kept, a
read-only target is refused in one sentence and left as it was, a rewritten output keeps
its mode, and the files of a directory output get the umask's default mode."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch

from helpers_cli import ARTICLES, write_articles
from lexgraph.cli.main import main
from lexgraph.core.errors import DataError
from lexgraph.core.io import atomic_path, write_text
from lexgraph.search.bm25 import BM25

OLD = "old Q0 1 1 1.000000 bm25\n"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask():
    """Set the process umask for the test (``umask(0o077)``), restored afterwards."""
    previous = os.umask(0o022)
    os.umask(previous)
    yield os.umask
    os.umask(previous)


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry below ``root``: a link's target, a file's bytes and mode."""
    out = {}
    for p in sorted(root.rglob("*")):
        key = str(p.relative_to(root))
        if p.is_symlink():
            out[key] = ("link", os.readlink(p))
        elif p.is_file():
            out[key] = ("file", p.read_bytes(), mode(p))
    return out


# ---------------------------------------------------------------------------
# the writer (lexgraph.core.io.atomic_path and the write_* built on it)
# ---------------------------------------------------------------------------


def test_a_link_is_written_through_and_kept(tmp_path):
    (tmp_path / "real.txt").write_text("old\n", encoding="utf-8")
    (tmp_path / "link.txt").symlink_to("real.txt")
    write_text("new\n", tmp_path / "link.txt")
    assert os.readlink(tmp_path / "link.txt") == "real.txt"
    assert (tmp_path / "real.txt").read_text(encoding="utf-8") == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.txt", "real.txt"]


def test_a_link_to_a_directory_output_is_written_through_and_kept(tmp_path):
    (tmp_path / "store" / "model").mkdir(parents=True)
    (tmp_path / "store" / "model" / "stale.bin").write_bytes(b"old")
    (tmp_path / "model").symlink_to(tmp_path / "store" / "model")
    with atomic_path(tmp_path / "model", directory=True) as tmp:
        (tmp / "weights.bin").write_bytes(b"new")
    assert (tmp_path / "model").is_symlink()
    assert sorted(p.name for p in (tmp_path / "store" / "model").iterdir()) == ["weights.bin"]


@pytest.mark.parametrize("directory", [False, True], ids=["file", "directory"])
def test_a_read_only_target_is_refused_in_one_sentence(tmp_path, directory):
    target = tmp_path / "out"
    if directory:
        target.mkdir()
        (target / "a.bin").write_bytes(b"old")
    else:
        target.write_text("old\n", encoding="utf-8")
    target.chmod(0o555 if directory else 0o444)
    before = snapshot(tmp_path)
    try:
        with pytest.raises(DataError) as err, atomic_path(target, directory=directory) as tmp:
            raise AssertionError(f"the block ran, {tmp}")
    finally:
        target.chmod(0o755 if directory else 0o644)
    message = str(err.value)
    assert message.startswith(f"{target}: read-only (mode 0{'555' if directory else '444'})"), message
    assert "refusing to overwrite it" in message and "\n" not in message
    target.chmod(0o555 if directory else 0o444)
    assert snapshot(tmp_path) == before


def test_a_read_only_link_target_is_refused(tmp_path):
    (tmp_path / "real.txt").write_text("old\n", encoding="utf-8")
    (tmp_path / "real.txt").chmod(0o444)
    (tmp_path / "link.txt").symlink_to("real.txt")
    before = snapshot(tmp_path)
    with pytest.raises(DataError, match=r"real\.txt: read-only \(mode 0444\)"):
        write_text("new\n", tmp_path / "link.txt")
    assert snapshot(tmp_path) == before


def test_a_rewritten_file_keeps_its_mode_and_a_new_one_gets_the_umasks(tmp_path, umask):
    (tmp_path / "shared.txt").write_text("old\n", encoding="utf-8")
    (tmp_path / "shared.txt").chmod(0o644)
    (tmp_path / "private.txt").write_text("old\n", encoding="utf-8")
    (tmp_path / "private.txt").chmod(0o600)
    umask(0o077)
    for name in ("shared.txt", "private.txt", "new.txt"):
        write_text("new\n", tmp_path / name)
    assert (mode(tmp_path / "shared.txt"), mode(tmp_path / "private.txt"), mode(tmp_path / "new.txt")) == (
        0o644,
        0o600,
        0o600,
    )
    umask(0o022)
    write_text("new\n", tmp_path / "fresh.txt")
    assert mode(tmp_path / "fresh.txt") == 0o644


def test_model_files_of_a_directory_output_get_the_umasks_mode(tmp_path, tiny_model_dir, umask):
    """safetensors (and any writer through mkstemp) writes 0600: another user could not load
    the dsr model that the bm25 one beside it serves."""
    from safetensors.torch import save_file

    from lexgraph.models.encoders import QueryEncoder

    umask(0o022)
    encoder = QueryEncoder.from_pretrained(tiny_model_dir, max_length=32, token_pooling="mean")
    with atomic_path(tmp_path / "dsr", directory=True) as tmp:
        encoder.save_pretrained(tmp / "query_encoder")
        save_file({"w": torch.zeros(2)}, str(tmp / "hierarchical.safetensors"))
    weights = tmp_path / "dsr" / "query_encoder" / "model.safetensors"
    assert weights.is_file()
    modes = {str(p.relative_to(tmp_path)): oct(mode(p)) for p in (tmp_path / "dsr").rglob("*")}
    assert modes == {k: ("0o755" if (tmp_path / k).is_dir() else "0o644") for k in modes}
    assert mode(tmp_path / "dsr") == 0o755


def test_links_inside_a_directory_output_are_left_alone(tmp_path, umask):
    umask(0o022)
    (tmp_path / "outside.bin").write_bytes(b"x")
    (tmp_path / "outside.bin").chmod(0o600)
    (tmp_path / "outside").mkdir(mode=0o700)
    with atomic_path(tmp_path / "out", directory=True) as tmp:
        (tmp / "file.lnk").symlink_to(tmp_path / "outside.bin")
        (tmp / "dir.lnk").symlink_to(tmp_path / "outside")
    assert (mode(tmp_path / "outside.bin"), mode(tmp_path / "outside")) == (0o600, 0o700)


def test_an_unreadable_model_file_names_chmod_before_a_rebuild(tmp_path, monkeypatch):
    """Another user's 0600 weights: the remedy is theirs to make readable, or a rebuild
    (which now writes 0644), not a rebuild alone."""
    import builtins
    import errno

    from lexgraph.core.io import check_file

    path = tmp_path / "model.safetensors"
    path.write_bytes(b"x")
    real_open = builtins.open

    def refusing(file, *args, **kwargs):  # root reads anything: refuse the open instead of chmod 000
        if Path(file) == path:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refusing)
    with pytest.raises(DataError) as err:
        check_file(path, "this model file", "rerun `dvc repro train_dsr` (or `dvc checkout`) to restore it")
    assert str(err.value) == (
        f"{path}: this model file is not readable (permission denied), expected a readable file; make it "
        f"readable (`chmod a+r {path}`, by its owner), or rerun `dvc repro train_dsr` (or `dvc checkout`) to restore it"
    )


# ---------------------------------------------------------------------------
# the commands: search --run, regress --update
# ---------------------------------------------------------------------------


@pytest.fixture
def ws(tmp_path, monkeypatch):
    write_articles(tmp_path, ARTICLES)
    BM25().fit_texts(list(ARTICLES.values()), list(ARTICLES)).save(tmp_path / "models" / "bm25")
    (tmp_path / "q.jsonl").write_text(json.dumps({"id": "a", "question": "Qui paie le loyer ?"}) + "\n")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "real.trec").write_text(OLD, encoding="utf-8")
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "bm25.json").write_text(json.dumps({"test": {"recall@100": 0.4, "map": 0.1}}))
    (tmp_path / "exp.yaml").write_text("tolerance: 0.01\nsystems:\n  bm25:\n    test: {recall@100: 0.3, map: 0.1}\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def search(ws: Path, run: str) -> list[str]:
    return ["search", "--questions", str(ws / "q.jsonl"), "--run", run, "--workspace", str(ws)]


def regress_update(ws: Path, expected: str) -> list[str]:
    return ["regress", "--update", "--expected", expected, "--metrics-dir", str(ws / "metrics")]


def test_run_through_a_link_updates_its_target_and_keeps_the_link(ws):
    (ws / "link.trec").symlink_to(Path("runs") / "real.trec")
    assert main(search(ws, str(ws / "link.trec"))) == 0
    assert os.readlink(ws / "link.trec") == str(Path("runs") / "real.trec")
    text = (ws / "runs" / "real.trec").read_text(encoding="utf-8")
    assert text != OLD and text.startswith("a Q0 ")


def test_a_rewritten_run_keeps_its_mode_under_umask_077(ws, umask):
    (ws / "runs" / "real.trec").chmod(0o644)
    umask(0o077)
    assert main(search(ws, str(ws / "runs" / "real.trec"))) == 0
    assert (ws / "runs" / "real.trec").read_text(encoding="utf-8") != OLD
    assert mode(ws / "runs" / "real.trec") == 0o644


def test_regress_update_refuses_a_read_only_expected_file(ws, capsys):
    (ws / "exp.yaml").chmod(0o444)
    before = snapshot(ws)
    assert main(regress_update(ws, str(ws / "exp.yaml"))) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "lexgraph regress: error: " in line]
    assert len(lines) == 1, err
    assert "exp.yaml: read-only (mode 0444); refusing to overwrite it" in lines[0]
    assert "Traceback" not in err
    assert snapshot(ws) == before


def test_regress_update_through_a_link_updates_its_target_and_keeps_the_link(ws):
    (ws / "expected").mkdir()
    (ws / "exp.yaml").rename(ws / "expected" / "sample.yaml")
    (ws / "exp.yaml").symlink_to(Path("expected") / "sample.yaml")
    assert main(regress_update(ws, str(ws / "exp.yaml"))) == 0
    assert (ws / "exp.yaml").is_symlink()
    assert "recall@100: 0.4" in (ws / "expected" / "sample.yaml").read_text(encoding="utf-8")


@pytest.mark.parametrize("command", ["search", "regress"])
def test_a_symbolic_link_loop_is_refused_in_one_sentence(ws, command, capsys):
    (ws / "loop.trec").symlink_to("loop.trec")
    before = snapshot(ws)
    argv = search(ws, str(ws / "loop.trec")) if command == "search" else regress_update(ws, str(ws / "loop.trec"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if f"lexgraph {command}: error: " in line]
    assert len(lines) == 1, err
    assert "loop.trec: a symbolic link loop; not written" in lines[0]
    assert "Traceback" not in err
    assert snapshot(ws) == before

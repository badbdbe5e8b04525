"""Stopping `dvc repro` stops its stage (issue 28): `timeout 60 dvc repro` sends SIGTERM to DVC
alone, which does not pass it on; the stage (lexgraph.core.stage.run_stage) notices that DVC is
gone, stops with one line and leaves its previous outputs byte-identical. Checked with real
`dvc repro` in a tiny scratch DVC project whose one stage runs through run_stage.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, NoPaths
from helpers_dvc import sh

STAGE = """
import os, sys, time
from pathlib import Path

from dataclasses import dataclass
from typing import Annotated

from lexgraph.core.io import write_json
from lexgraph.core.provenance import Output
from lexgraph.core.stage import Stage, run_stage


@dataclass(frozen=True)
class Paths:
    out: Annotated[Path, Output("the stage's output")]


def main(paths, settings, context):
    Path("started").write_text(str(os.getpid()))
    end = time.monotonic() + float(os.environ.get("LEXGRAPH_TEST_SECONDS", "20"))
    while time.monotonic() < end:  # the stage's work
        time.sleep(0.05)
    write_json({"run": "new"}, paths.out)


if __name__ == "__main__":
    while os.environ.get("LEXGRAPH_TEST_WAIT") and not Path("go").exists():
        time.sleep(0.05)
    code = run_stage(Stage("work", "bm25", Paths, dict, main))
    Path("exit_status.part").write_text(str(code))
    os.replace("exit_status.part", "exit_status")  # whole: the test polls for the file
    sys.exit(code)
"""

DIRECT = "python stage.py --out out.json"
THROUGH_SHELL = "sh -c 'python stage.py --out out.json; exit $?'"  # a shell stays between DVC and the stage
OLD = b'{"run": "old"}\n'
GONE_LINE = "lexgraph work: interrupted: its `dvc` process is gone; its outputs are left as they were"


def project(root: Path, cmd: str) -> dict:
    """A tiny DVC project: one stage `work` (``cmd``) with a previous output ``out.json``."""
    root.mkdir()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT / "src"),
        "DVC_NO_ANALYTICS": "1",
    }
    for key in ("DVC_STAGE", "LEXGRAPH_TEST_WAIT", "LEXGRAPH_TEST_SECONDS"):
        env.pop(key, None)
    sh(["dvc", "init", "--no-scm", "-q"], root, env)
    (root / "params.yaml").write_bytes((ROOT / "params.yaml").read_bytes())
    (root / "stage.py").write_text(STAGE, encoding="utf-8")
    (root / "dvc.yaml").write_text(
        f'stages:\n  work:\n    cmd: "{cmd}"\n    deps: [stage.py]\n'
        "    outs:\n      - out.json: {persist: true, cache: false}\n",
        encoding="utf-8",
    )
    (root / "out.json").write_bytes(OLD)
    return env


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except FileNotFoundError:
        return True


def wait_for(check, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while not check() and time.monotonic() < end:
        time.sleep(0.05)
    return check()


def files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}


@pytest.mark.slow  # dvc and a stage in subprocesses, three times: ~12 s on 2 cores
@pytest.mark.parametrize(
    ("cmd", "victim"),
    [(DIRECT, "dvc"), (THROUGH_SHELL, "dvc"), (THROUGH_SHELL, "launcher")],
    ids=["direct", "through-shell", "launcher-killed"],
)
def test_sigterm_to_dvc_alone_stops_the_stage(tmp_path, cmd, victim):
    """SIGTERM to DVC alone (or to the shell/launcher between it and the stage, alone)."""
    root = tmp_path / "p"
    env = project(root, cmd)
    before = files(root)
    log = (tmp_path / "log").open("w")
    proc = subprocess.Popen(["dvc", "repro"], cwd=root, env=env, start_new_session=True, stdout=log, stderr=log)
    stage_pid = None
    try:
        assert wait_for(lambda: (root / "started").is_file() or proc.poll() is not None, 60)
        assert proc.poll() is None, (tmp_path / "log").read_text()
        stage_pid = int((root / "started").read_text())
        with open(f"/proc/{stage_pid}/stat", encoding="ascii") as fh:
            launcher = int(fh.read().rsplit(")", 1)[1].split()[1])
        assert cmd == DIRECT or launcher != proc.pid, "no shell between DVC and the stage"
        os.kill(proc.pid if victim == "dvc" else launcher, signal.SIGTERM)  # what `timeout` sends: to DVC alone
        proc.wait(timeout=15)
        assert wait_for(lambda: gone(stage_pid), 10), "the stage runs on after DVC is gone"
        assert wait_for((root / "exit_status").is_file, 5)
    finally:
        if stage_pid and not gone(stage_pid):
            os.kill(stage_pid, signal.SIGKILL)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    text = (tmp_path / "log").read_text()
    assert (root / "exit_status").read_text() == "130"
    assert [line for line in text.splitlines() if line.startswith("lexgraph ")] == [GONE_LINE], text
    assert "Traceback" not in text, text
    after = files(root)
    assert after.pop("started") and after.pop("exit_status")
    assert after == before  # out.json (the previous output) and the inputs byte-identical, no dvc.lock
    assert not [p.name for p in root.iterdir() if p.name.endswith(".tmp")]


def test_stage_whose_dvc_is_gone_before_it_starts_does_nothing(tmp_path):
    """The race: DVC (here the shell standing for it) gone before the stage sets its watch up."""
    root = tmp_path / "p"
    env = project(root, DIRECT)
    before = files(root)
    script = "(while [ ! -e go ]; do sleep 0.05; done; python stage.py --out out.json) >log 2>&1 &"
    sh(["sh", "-c", script], root, {**env, "DVC_STAGE": "work"})  # returns at once: the stage is orphaned
    (root / "go").touch()
    assert wait_for((root / "exit_status").is_file, 60), (root / "log").read_text()
    text = (root / "log").read_text()
    assert (root / "exit_status").read_text() == "130"
    lines = [line for line in text.splitlines() if line.startswith("lexgraph ")]
    assert lines == [
        "lexgraph work: interrupted: its `dvc` process was gone before it started; its outputs are left as they were"
    ], text
    assert "Traceback" not in text, text
    assert not (root / "started").exists()
    after = files(root)
    for extra in ("go", "log", "exit_status"):
        after.pop(extra)
    assert after == before


@pytest.mark.slow  # a subprocess that loads the CLI or a stage: ~5 s on 2 cores
def test_stage_under_dvc_runs_to_the_end(tmp_path):
    """No false alarm: a stage whose DVC stays runs on (past several polls) and writes."""
    root = tmp_path / "p"
    env = project(root, THROUGH_SHELL)
    sh(["dvc", "repro"], root, {**env, "LEXGRAPH_TEST_SECONDS": "1.5"})
    assert (root / "exit_status").read_text() == "0"
    assert (root / "out.json").read_bytes() == b'{\n  "run": "new"\n}\n'


def test_no_atomic_rename_once_a_stop_is_requested(tmp_path, monkeypatch):
    """The stop also takes effect right before each atomic rename (file and directory)."""
    from lexgraph.core import errors
    from lexgraph.core.io import atomic_path, write_json

    monkeypatch.setattr(errors, "_STOP", [])
    (tmp_path / "out.json").write_bytes(OLD)
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "a").write_bytes(OLD)
    errors.request_stop("its `dvc` process is gone")
    with pytest.raises(errors.Stopped, match="dvc"):
        write_json({"run": "new"}, tmp_path / "out.json")
    with pytest.raises(errors.Stopped):
        with atomic_path(tmp_path / "dir", directory=True) as tmp:
            (tmp / "b").write_bytes(b"new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "out.json"]
    assert (tmp_path / "out.json").read_bytes() == OLD
    assert [p.name for p in (tmp_path / "dir").iterdir()] == ["a"]
    assert errors.reported("work", lambda: errors.check_stop()) == errors.EXIT_INTERRUPTED


def test_a_second_sigterm_while_stopping_is_ignored(tmp_path):
    """SIGTERM to DVC's process group reaches the stage, then its watcher sends one more: the
    stage's cleanup is not interrupted a second time (which could end in a traceback)."""
    from lexgraph.core.stage import Stage, run_stage

    done = tmp_path / "cleanup-done"

    def main(paths, settings, context):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            done.touch()

    argv = ["--params", str(ROOT / "params.yaml")]
    assert run_stage(Stage("work", "bm25", NoPaths, dict, main), argv) == 130
    assert done.is_file()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL

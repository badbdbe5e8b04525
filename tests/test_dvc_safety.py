"""`dvc repro` never loses outputs, and the cheap stages are byte-for-byte deterministic.

DVC deletes a stage's outputs before running it unless they are `persist: true`; every output
of dvc.yaml is, and the stages replace each output atomically and as a whole
(lexgraph.core.io.atomic_path). Checked here in a scratch copy of the repository (git clone + the
working tree's changes, so what is checked out is what is tested):

- a stage that fails (a bad row in data/sample, a bad value in params.yaml) or is interrupted
  (Ctrl-C, SIGTERM) leaves its previous outputs, the `cache: false` metrics included, and
  dvc.lock byte-identical, and says why in one line, without a traceback;
- a rerun leaves nothing of the previous outputs behind (no stale file survives);
- two `dvc repro -f` runs of the cheap stages give byte-identical outputs and dvc.lock.

The scratch repository runs real `dvc repro` (about 2 minutes in all on 2 cores): slow.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from helpers_dvc import digest, scratch_copy, sh

# the cheap stages (seconds each) and the targets that run all of them
CHEAP = ["fetch", "clean", "bm25_tune", "bm25", "build_graph", "generate_queries", "mine_negatives"]
CHEAP_TARGETS = ["bm25", "build_graph", "mine_negatives"]


def pipeline() -> dict[str, dict]:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]


def output_entries(stage: dict) -> list[tuple[str, dict]]:
    """``(path, flags)`` of every output of a stage (outs, metrics and plots)."""
    stage = stage.get("do", stage)
    out = []
    for kind in ("outs", "metrics", "plots"):
        for entry in stage.get(kind, []):
            if isinstance(entry, str):
                out.append((entry, {}))
            else:
                ((path, flags),) = entry.items()
                out.append((path, flags or {}))
    return out


def stage_outputs(names: list[str]) -> list[str]:
    stages = pipeline()
    return [path for name in names for path, _ in output_entries(stages[name])]


def test_every_output_is_persistent():
    """Without `persist: true`, `dvc repro` deletes an output before its stage runs: a failure
    then loses it, and a `cache: false` metric cannot even be restored by `dvc checkout`."""
    missing = [
        f"{name}: {path}"
        for name, stage in pipeline().items()
        for path, flags in output_entries(stage)
        if flags.get("persist") is not True
    ]
    assert not missing, f"outputs without `persist: true` in dvc.yaml: {missing}"


# ----------------------------------------------------------------------------- atomic_path


def test_directory_output_is_replaced_whole(tmp_path):
    from lexgraph.core.io import atomic_path

    target = tmp_path / "out"
    target.mkdir()
    (target / "stale.bin").write_bytes(b"previous run")
    with atomic_path(target, directory=True) as tmp:
        (tmp / "new.bin").write_bytes(b"this run")
    assert sorted(p.name for p in target.iterdir()) == ["new.bin"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_failed_write_keeps_the_previous_output_and_no_temporary(tmp_path):
    from lexgraph.core.io import atomic_path

    target = tmp_path / "out"
    target.mkdir()
    (target / "kept.bin").write_bytes(b"previous run")
    with pytest.raises(ValueError):
        with atomic_path(target, directory=True) as tmp:
            (tmp / "half.bin").write_bytes(b"half")
            raise ValueError("bad row")
    assert sorted(p.name for p in target.iterdir()) == ["kept.bin"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.skipif(signal.getsignal(signal.SIGTERM) != signal.SIG_DFL, reason="SIGTERM already handled here")
def test_sigterm_while_writing_removes_the_temporary(tmp_path):
    from lexgraph.core.io import atomic_path

    (tmp_path / "out.json").write_text("previous", encoding="utf-8")
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(tmp_path / "out.json") as tmp:
            tmp.write_text("half", encoding="utf-8")
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    assert (tmp_path / "out.json").read_text(encoding="utf-8") == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the default is back


def test_swap_killed_between_its_renames_is_recovered(tmp_path):
    """SIGKILL (or power loss) between moving the old output away and the new one in."""
    from lexgraph.core.io import atomic_path

    old = tmp_path / ".out.old"
    old.mkdir()
    (old / "kept.bin").write_bytes(b"previous run")
    with pytest.raises(ValueError):
        with atomic_path(tmp_path / "out", directory=True):
            raise ValueError("the rerun fails too")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["kept.bin"]
    assert not old.exists()


# ----------------------------------------------------------------------------- scratch repo


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> tuple[Path, dict]:
    """A scratch repository with `fetch` and `clean` reproduced; the stages import its own code."""
    dest = tmp_path_factory.mktemp("safety") / "lexgraph"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(dest / "src"),
        "HF_HUB_OFFLINE": "1",
    }
    env.pop("LEXGRAPH_TEST_HANG", None)
    scratch_copy(dest, env)
    sh(["dvc", "repro", "clean"], dest, env)
    return dest, env


def leftovers(root: Path) -> list[str]:
    """Temporaries of lexgraph.core.io.atomic_path (``.<name>.*.tmp``, ``.<name>.old``) left anywhere."""
    return sorted(
        str(p.relative_to(root))
        for top in ("data", "models", "metrics")
        if (root / top).is_dir()
        for p in (root / top).rglob(".*")
        if p.name.endswith((".tmp", ".old"))
    )


CLEAN_OUTPUTS = ["data/raw", "data/clean", "metrics/data.json"]


def snapshot(root: Path) -> tuple[dict[str, str], bytes]:
    return digest(root, CLEAN_OUTPUTS), (root / "dvc.lock").read_bytes()


def reproduced(root: Path, env: dict) -> tuple[dict[str, str], bytes]:
    """The snapshot of `fetch` and `clean` up to date (whatever an earlier test left)."""
    sh(["dvc", "repro", "clean"], root, env)
    for rel in CLEAN_OUTPUTS:
        assert (root / rel).exists(), rel
    return snapshot(root)


def assert_one_line_error(proc: subprocess.CompletedProcess, prefix: str) -> str:
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text
    assert "Traceback" not in text, text
    errors = [line for line in text.splitlines() if line.startswith("lexgraph ")]
    assert len(errors) == 1 and errors[0].startswith(prefix), text
    return errors[0]


@pytest.mark.slow
def test_stage_failing_on_a_bad_source_row_keeps_every_output(repo):
    dest, env = repo
    before = reproduced(dest, env)
    csv_path = dest / "data/sample/questions_dev.csv"
    original = csv_path.read_text(encoding="utf-8")
    lines = original.splitlines()
    first_id = lines[1].split(",", 1)[0]
    try:
        csv_path.write_text(original + lines[1] + "\n", encoding="utf-8")  # row 1 again: a duplicate id
        proc = sh(["dvc", "repro", "clean"], dest, env, ok=False)
    finally:
        csv_path.write_text(original, encoding="utf-8")
    error = assert_one_line_error(proc, "lexgraph fetch: error: data/sample/questions_dev.csv, ")
    row = len(lines)  # the appended row: data rows are numbered from 1 below the header
    assert (
        f"row {row}, column 'id': question id {first_id} is already used by row 1 of "
        f"data/sample/questions_dev.csv (line 2)" in error
    )
    assert f"(row {row} starts on line {row + 1})" in error
    assert snapshot(dest) == before
    assert leftovers(dest) == []


@pytest.mark.slow
def test_stage_failing_on_a_bad_param_keeps_every_output(repo):
    dest, env = repo
    before = reproduced(dest, env)
    params = dest / "params.yaml"
    original = params.read_text(encoding="utf-8")
    assert "  min_words: 3 " in original
    try:
        params.write_text(original.replace("  min_words: 3 ", "  min_words: three ", 1), encoding="utf-8")
        proc = sh(["dvc", "repro", "clean"], dest, env, ok=False)
    finally:
        params.write_text(original, encoding="utf-8")
    error = assert_one_line_error(proc, "lexgraph clean: error: ")
    assert "min_words" in error
    assert snapshot(dest) == before  # metrics/data.json (cache: false) included
    assert leftovers(dest) == []


@pytest.mark.slow
def test_stage_failing_on_a_corrupt_input_keeps_every_output(repo):
    """clean fails on its own input (data/raw) while fetch is not rerun (`-s`)."""
    dest, env = repo
    before = reproduced(dest, env)
    raw = dest / "data/raw/questions.parquet"
    original = raw.read_bytes()
    try:
        raw.write_bytes(original[: len(original) // 2])
        proc = sh(["dvc", "repro", "-s", "clean"], dest, env, ok=False)
    finally:
        raw.write_bytes(original)
    assert_one_line_error(proc, "lexgraph clean: error: data/raw/questions.parquet: not a readable Parquet file")
    assert snapshot(dest) == before
    assert leftovers(dest) == []


HOOK = """
import os, sys
if os.environ.get("LEXGRAPH_TEST_HANG") and sys.argv and sys.argv[0].endswith("stages/clean.py"):
    import time
    import polars

    _write = polars.DataFrame.write_parquet

    def write_parquet(self, path, *args, **kwargs):
        _write(self, path, *args, **kwargs)
        with open(os.environ["LEXGRAPH_TEST_HANG"], "w") as fh:  # half the output is written: signal me
            fh.write(str(os.getpid()))
        time.sleep(120)

    polars.DataFrame.write_parquet = write_parquet
"""


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_stage_interrupted_mid_write_keeps_every_output(repo, tmp_path, sig):
    """Ctrl-C (SIGINT to the foreground process group) or SIGTERM to it (a CI job cancelled)
    while clean has written half of its new output: the previous output stays, no temporary
    is left behind, and the next `dvc repro` is a no-op."""
    dest, env = repo
    before = reproduced(dest, env)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(textwrap.dedent(HOOK), encoding="utf-8")
    marker = tmp_path / "writing"
    hang_env = {**env, "PYTHONPATH": f"{hook}{os.pathsep}{env['PYTHONPATH']}", "LEXGRAPH_TEST_HANG": str(marker)}
    proc = subprocess.Popen(
        ["dvc", "repro", "-f", "-s", "clean"],
        cwd=dest,
        env=hang_env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (marker.is_file() and marker.read_text()) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.is_file(), (
            f"clean never started writing:\n{proc.communicate()[0] if proc.poll() is not None else ''}"
        )
        stage_pid = int(marker.read_text())
        assert [p.name for p in (dest / "data").iterdir() if p.name.startswith(".clean.")], "no temporary output"
        os.killpg(proc.pid, sig)
        output = proc.communicate(timeout=60)[0]
        deadline = time.monotonic() + 60
        while not gone(stage_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gone(stage_pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0, output
    assert "Traceback" not in output, output
    assert snapshot(dest) == before
    assert leftovers(dest) == []
    again = sh(["dvc", "repro", "clean"], dest, env)
    assert "Running stage" not in again.stdout + again.stderr
    assert snapshot(dest) == before


@pytest.mark.slow
def test_rerun_replaces_directory_outputs_whole(repo):
    """With `persist: true` DVC no longer empties an output directory before its stage runs:
    the stage itself must leave nothing of the previous run behind."""
    dest, env = repo
    before = reproduced(dest, env)
    for rel in ("data/raw/stale.parquet", "data/clean/stale.parquet"):
        (dest / rel).write_bytes(b"left over from a previous run")
    out = sh(["dvc", "repro", "clean"], dest, env)
    assert re.findall(r"Running stage '([^']+)'", out.stdout + out.stderr) == ["fetch", "clean"]
    assert not (dest / "data/raw/stale.parquet").exists() and not (dest / "data/clean/stale.parquet").exists()
    assert snapshot(dest) == before
    assert leftovers(dest) == []


@pytest.mark.slow
def test_forced_reruns_of_the_cheap_stages_are_byte_identical(repo):
    dest, env = repo
    outputs = stage_outputs(CHEAP)
    runs = []
    for _ in range(2):
        out = sh(["dvc", "repro", "-f", *CHEAP_TARGETS], dest, env)
        ran = re.findall(r"Running stage '([^']+)'", out.stdout + out.stderr)
        assert sorted(ran) == sorted(CHEAP), out.stdout  # -f: every one really ran (no run-cache restore)
        runs.append((digest(dest, outputs), (dest / "dvc.lock").read_bytes()))
    (first, lock1), (second, lock2) = runs
    assert set(first) == set(second) and len(first) >= len(outputs)
    changed = sorted(path for path in first if first[path] != second[path])
    assert not changed, f"outputs that differ between two `dvc repro -f`: {changed}"
    assert lock1 == lock2

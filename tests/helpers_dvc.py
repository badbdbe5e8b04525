"""Scratch repositories for the DVC tests (test_dvc_safety, test_dvc_remote): run a command,
clone the working tree, digest outputs; and a stage driver run in this process."""

from __future__ import annotations

import hashlib
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def sh(cmd: list[str], cwd: Path, env: dict, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if ok:
        assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def scratch_copy(dest: Path, env: dict) -> None:
    """A clone of ROOT's HEAD with ROOT's uncommitted changes (modified, new, deleted files) on top."""
    sh(["git", "clone", "-q", str(ROOT), str(dest)], ROOT, env)
    changed = sh(["git", "ls-files", "-z", "-m", "-o", "--exclude-standard"], ROOT, env).stdout.split("\0")
    deleted = set(sh(["git", "ls-files", "-z", "-d"], ROOT, env).stdout.split("\0"))
    for rel in filter(None, changed):
        target = dest / rel
        if rel in deleted:
            target.unlink(missing_ok=True)
        elif (ROOT / rel).is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, target)


def digest(root: Path, paths: list[str]) -> dict[str, str]:
    """md5 of every file under ``paths`` (files or directories), by relative path."""
    out = {}
    for rel in paths:
        path = root / rel
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for f in files:
            out[str(f.relative_to(root))] = hashlib.md5(f.read_bytes()).hexdigest()
    return out


def run_stage_in_process(script: str | Path, *args: str) -> int | str | None:
    """Run the stage driver ``script`` (``stages/<name>.py``) with ``args`` in this process, as
    ``python script args`` would (monkeypatches apply); its exit status (SystemExit's code)."""
    old, sys.argv = sys.argv, [str(script), *map(str, args)]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as stop:
        return stop.code
    finally:
        sys.argv = old
    return 0

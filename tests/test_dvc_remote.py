"""The shared cache (README "Shared cache"): outputs pushed to a DVC remote are pulled by a
fresh clone, which then has nothing to reproduce.

A scratch copy of the repository reproduces the cheap stages (fetch, clean, bm25_tune,
bm25), commits its dvc.lock and pushes to a local-directory remote configured the way the
README says (``dvc remote add -d --local``); a fresh ``git clone`` of it adds the same
remote, pulls, and then ``dvc status`` and ``dvc repro`` find nothing to do and the pulled
outputs are byte-identical to the pushed ones.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from helpers_dvc import digest, scratch_copy, sh

STAGES = ["fetch", "clean", "bm25_tune", "bm25"]
OUTPUTS = ["data/raw", "data/clean", "models/bm25", "metrics/bm25_tune.json"]


@pytest.mark.slow
def test_push_clone_pull_then_nothing_to_reproduce(tmp_path):
    origin, fresh, remote = tmp_path / "origin", tmp_path / "fresh", tmp_path / "remote"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(origin / "src"),
        "HF_HUB_OFFLINE": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.org",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.org",
    }
    env.pop("LEXGRAPH_TEST_HANG", None)
    scratch_copy(origin, env)
    sh(["dvc", "repro", "bm25"], origin, env)
    sh(["git", "add", "-A"], origin, env)
    # the committed dvc.lock may already be the one `dvc repro` writes (reproduction is exact)
    sh(["git", "commit", "-q", "--allow-empty", "-m", "outputs of the cheap stages"], origin, env)
    pushed = digest(origin, OUTPUTS)
    assert any(k.startswith("models/bm25/") for k in pushed)

    sh(["dvc", "remote", "add", "-d", "--local", "shared", str(remote)], origin, env)
    sh(["dvc", "push", *STAGES], origin, env)
    assert any(remote.rglob("*")), "nothing was pushed"

    sh(["git", "clone", "-q", str(origin), str(fresh)], tmp_path, env)
    env["PYTHONPATH"] = str(fresh / "src")
    assert not (fresh / "models/bm25").exists()
    assert sh(["dvc", "status", *STAGES], fresh, env).stdout.strip() != "Data and pipelines are up to date."
    sh(["dvc", "remote", "add", "-d", "--local", "shared", str(remote)], fresh, env)
    sh(["dvc", "pull", *STAGES], fresh, env)
    assert digest(fresh, OUTPUTS) == pushed
    status = sh(["dvc", "status", *STAGES], fresh, env).stdout
    assert "Data and pipelines are up to date." in status, status
    repro = sh(["dvc", "repro", "bm25"], fresh, env)
    out = repro.stdout + repro.stderr
    assert "Running stage" not in out, out
    assert digest(fresh, OUTPUTS) == pushed
    assert sh(["git", "status", "--porcelain"], fresh, env).stdout.strip() == ""  # dvc.lock untouched

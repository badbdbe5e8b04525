"""The documented way back from `dvc exp apply` (issue 40, item 1): on a workspace reproduced on
another CPU, the committed dvc.lock names other hashes than the machine's own outputs, and
"`git checkout -- params.yaml dvc.lock metrics && dvc checkout`" deleted them (models/ 1.5 GB ->
465 MB, rc 255). No document may recommend a checkout of dvc.lock followed by `dvc checkout`; the
recipes they give instead (the `baseline` experiment, or `git checkout -- params.yaml && dvc repro`)
keep, on a scratch DVC repository, an output whose hash differs from the committed dvc.lock, and
`dvc metrics diff baseline <exp>` shows the experiment's effect alone, not the machine's drift."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from helpers_dvc import sh

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BASELINE = "dvc exp run --temp -n baseline"
BACK = "dvc exp apply baseline"
BACK_BY_REPRO = "git checkout -- params.yaml && dvc repro"
DIFF = "dvc metrics diff baseline layers2"
#: a git checkout that restores dvc.lock, then (in the same command, code block or paragraph) `dvc checkout`
LOCK_THEN_CHECKOUT = re.compile(r"\bgit (checkout|restore)\b[^\n`]*\bdvc\.lock\b.*?\bdvc checkout\b", re.S)


def _commands(text: str) -> list[str]:
    """Each code block, and each paragraph's inline code spans joined in order."""
    blocks = re.findall(r"```[^\n]*\n(.*?)```", text, re.S)
    prose = re.sub(r"```.*?```", "\n\n", text, flags=re.S)
    spans = ["\n".join(re.findall(r"`([^`]+)`", paragraph)) for paragraph in re.split(r"\n\s*\n", prose)]
    return [*blocks, *spans]


def test_no_document_restores_dvc_lock_and_then_runs_dvc_checkout():
    found = [
        f"{doc.relative_to(ROOT)}: {match.group(0)!r}"
        for doc in DOCS
        for command in _commands(doc.read_text(encoding="utf-8"))
        for match in LOCK_THEN_CHECKOUT.finditer(command)
    ]
    assert not found, found
    assert LOCK_THEN_CHECKOUT.search(
        "\n".join(_commands("to go back, `git checkout -- params.yaml dvc.lock metrics && dvc checkout`."))
    )  # what the README said


@pytest.mark.parametrize("doc", ["README.md", "docs/cli.md"])
def test_the_documents_give_the_safe_recipes(doc):
    """The recipes run below, as the README and docs/cli.md write them; no command compares an
    experiment with HEAD's metrics (another machine's run)."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    commands = "\n".join(_commands(text))
    for recipe in (BASELINE, BACK, BACK_BY_REPRO, DIFF):
        assert recipe in commands, (doc, recipe)
    blocks = "\n".join(re.findall(r"```[^\n]*\n(.*?)```", text, re.S))
    assert "dvc metrics diff HEAD" not in blocks and "dvc metrics diff baseline" in blocks


GEN = """\
import json, os, yaml
x = yaml.safe_load(open("params.yaml"))["x"]
machine = os.environ["MACHINE"]
os.makedirs("out", exist_ok=True)
open("out/model.bin", "w").write(f"model x={x} on {machine}\\n" * 100)
os.makedirs("metrics", exist_ok=True)
json.dump({"score": x + (0.001 if machine == "b" else 0)}, open("metrics/m.json", "w"))
"""
DVC_YAML = """\
stages:
  gen:
    cmd: python gen.py
    deps: [gen.py]
    params: [x]
    outs:
      - out:
          persist: true
    metrics:
      - metrics/m.json:
          cache: false
"""


@pytest.fixture(scope="module")
def reproduced_elsewhere(tmp_path_factory):
    """A DVC repository committed on machine "a", reproduced on machine "b": its `out/` and
    metrics differ from the committed dvc.lock's, whose outputs this cache never held."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path_factory.mktemp("way_back") / "repo"
    root.mkdir()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "DVC_NO_ANALYTICS": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    sh(["git", "init", "-q"], root, env)
    sh(["dvc", "init", "-q"], root, env)
    (root / "gen.py").write_text(GEN, encoding="utf-8")
    (root / "params.yaml").write_text("x: 1\n", encoding="utf-8")
    (root / "dvc.yaml").write_text(DVC_YAML, encoding="utf-8")
    sh(["dvc", "repro", "-q"], root, {**env, "MACHINE": "a"})
    sh(["git", "add", "-A"], root, env)
    sh(["git", "commit", "-qm", "reproduced on machine a"], root, env)
    shutil.rmtree(root / ".dvc" / "cache")
    shutil.rmtree(root / "out")
    env["MACHINE"] = "b"
    sh(["dvc", "repro", "-q"], root, env)  # this machine's own run: dvc.lock and metrics now differ from HEAD's
    assert sh(["git", "status", "--short"], root, env).stdout.split() == ["M", "dvc.lock", "M", "metrics/m.json"]
    sh(["bash", "-c", BASELINE], root, env)
    sh(["dvc", "exp", "run", "--temp", "-q", "-n", "layers2", "-S", "x=2"], root, env)
    return root, env


def _out(root: Path) -> str:
    path = root / "out" / "model.bin"
    return path.read_text(encoding="utf-8").splitlines()[0] if path.is_file() else "deleted"


@pytest.mark.slow
def test_the_documented_way_back_keeps_this_machines_outputs(reproduced_elsewhere, tmp_path):
    root, env = reproduced_elsewhere
    diff = json.loads(sh(["bash", "-c", DIFF + " --json"], root, env).stdout)
    assert diff["metrics/m.json"]["score"]["diff"] == pytest.approx(1.0)  # the experiment's effect alone
    drift = json.loads(sh(["dvc", "metrics", "diff", "HEAD", "layers2", "--json"], root, env).stdout)
    assert drift["metrics/m.json"]["score"]["diff"] == pytest.approx(1.001)  # HEAD: machine a's run
    old = "git checkout -- params.yaml dvc.lock metrics && dvc checkout"  # the README's recipe before
    for n, recipe in enumerate((BACK, BACK_BY_REPRO, old)):
        copy = tmp_path / f"copy{n}"
        shutil.copytree(root, copy, symlinks=True)
        sh(["dvc", "exp", "apply", "-q", "layers2"], copy, env)
        assert _out(copy) == "model x=2 on b"
        proc = sh(["bash", "-c", recipe], copy, env, ok=False)
        if recipe == old:  # this machine's output is gone
            assert proc.returncode != 0 and _out(copy) == "deleted"
            continue
        assert proc.returncode == 0, proc.stderr
        assert _out(copy) == "model x=1 on b", recipe  # back, with this machine's output
        assert (copy / "params.yaml").read_text(encoding="utf-8") == "x: 1\n"
        assert json.loads((copy / "metrics" / "m.json").read_text(encoding="utf-8")) == {"score": 1.001}
        assert "up to date" in sh(["dvc", "status"], copy, env).stdout

"""The stages that never run torch (fetch, clean, bm25_tune, bm25: ``run_stage(uses_torch=False)``)
run to the end without importing it: importing torch took 2 to 4 s here, most of each such stage's
refusal of a bad input (the fast suite runs dozens), and of its start under ``dvc repro``."""

from __future__ import annotations

import subprocess
import sys

import yaml

from conftest import ROOT, sample_params

# run a stage script as its own process would, then say whether torch was ever imported, and the exit status
RUNNER = (
    "import runpy, sys\n"
    "sys.argv = sys.argv[1:]\n"
    "try:\n"
    "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
    "except SystemExit as stop:\n"
    "    print('torch' in sys.modules, stop.code)\n"
)
LOCAL = {"source": "local", "dev_fraction": 0.34, "synthetic": False, "negatives": False}


def _run(cwd, script: str, *args: str) -> tuple[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(ROOT / "stages" / script), "--params", "params.yaml", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )
    return done.stdout.strip(), done.stderr


def test_fetch_clean_and_bm25_run_without_importing_torch(tmp_path, bsard_dir):
    params = sample_params()
    params["fetch"] = {**params["fetch"], **LOCAL, "local_dir": str(bsard_dir)}
    params["bm25_tune"] = {**params["bm25_tune"], "k1": [1.2], "b": [0.75]}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    steps = [
        ("fetch.py", "--out", "data/raw"),
        ("clean.py", "--raw", "data/raw", "--out", "data/clean", "--metrics", "metrics/data.json"),
        (
            "bm25_tune.py",
            *("--articles", "data/clean/articles.parquet", "--questions", "data/clean/questions.parquet"),
            *("--best", "metrics/bm25_tune.json", "--grid", "metrics/bm25_tune.csv"),
        ),
        ("bm25.py", "--articles", "data/clean/articles.parquet", "--tuned", "metrics/bm25_tune.json"),
    ]
    for script, *args in steps:
        if script == "bm25.py":
            args += ["--out", "models/bm25"]
        said, err = _run(tmp_path, script, *args)
        assert said == "False 0", f"{script}: {said!r}\n{err}"
    assert (tmp_path / "models" / "bm25").is_dir()


def test_a_stage_that_runs_torch_still_seeds_it(tmp_path):
    """The default: ``run_stage`` seeds torch before ``main`` (what every training stage relies on)."""
    script = (
        "import dataclasses, sys, torch\n"
        "from lexgraph.core.stage import Stage, run_stage\n"
        "NoPaths = dataclasses.make_dataclass('NoPaths', [])\n"
        "def main(paths, settings, context):\n"
        "    print(torch.rand(1).item(), torch.are_deterministic_algorithms_enabled())\n"
        "sys.exit(run_stage(Stage('base', 'base', NoPaths, lambda raw: None, main)))\n"
    )
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"base": sample_params()["base"]}), encoding="utf-8")
    runs = [
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
        for _ in range(2)
    ]
    assert all(run.returncode == 0 for run in runs), runs[0].stderr
    deterministic = str(sample_params()["base"]["deterministic"])
    assert runs[0].stdout == runs[1].stdout and runs[0].stdout.split()[1] == deterministic

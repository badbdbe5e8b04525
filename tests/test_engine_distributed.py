"""Data parallelism of the training engine: 2 gloo processes on CPU (``torchrun``) give
the loss curve and weights of 1 process at the same global batch (2 x 4 vs 1 x 8), and
so does gradient accumulation (1 process, 2 micro-batches of 4). A different global
batch (1 x 4) gives a visibly different curve, so the tolerance can tell them apart."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, write_params
from engine_worker import train
from lexgraph.training.engine import Runtime

# float32 sums in another order (per-process partial gradients, then an all-reduce):
# observed differences ~1e-7; a wrong split (1 x 4 instead of 1 x 8) moves losses by > 0.05
TOLERANCE = 1e-5


def _close(a: dict, b: dict) -> bool:
    return (
        len(a["step_losses"]) == len(b["step_losses"])
        and np.allclose(a["step_losses"], b["step_losses"], rtol=0, atol=TOLERANCE)
        and np.allclose(a["weights"], b["weights"], rtol=0, atol=TOLERANCE)
    )


def test_accumulation_matches_the_whole_batch_and_a_smaller_batch_does_not():
    runtime = Runtime("cpu")
    whole = train(runtime, batch=8)
    accumulated = train(runtime, batch=8, accumulation=2)
    uneven = train(runtime, batch=8, accumulation=3)  # micro-batches of 3, 3, 2: weighted by size
    smaller = train(runtime, batch=4)
    assert len(whole["step_losses"]) == 10 and whole["best_epoch"] in (0, 1, 2)
    assert _close(whole, accumulated)
    assert _close(whole, uneven)
    assert not _close(whole, smaller)
    assert max(abs(a - b) for a, b in zip(whole["step_losses"], smaller["step_losses"])) > 100 * TOLERANCE


@pytest.mark.slow
def test_two_gloo_processes_match_one_process_at_the_same_global_batch(tmp_path):
    out = tmp_path / "two.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]),
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(ROOT / "tests" / "engine_worker.py"),
        str(out),
        "--runs",
        "8:1",
        "8:2",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two, two_accumulated = json.loads(out.read_text())
    assert two["world_size"] == 2
    one = train(Runtime("cpu"), batch=8)
    assert _close(one, two), (one["step_losses"], two["step_losses"])
    assert _close(one, two_accumulated)  # 2 processes x 2 micro-batches of 2
    assert one["best_epoch"] == two["best_epoch"]
    assert not _close(train(Runtime("cpu"), batch=4), two)


@pytest.mark.slow
def test_a_stage_under_torchrun_writes_its_outputs_once(tmp_path):
    """``base.launcher: torchrun ...`` wraps a stage command: both processes train, the main
    one alone writes (atomic directory + metrics), the other leaves nothing behind."""
    import polars as pl

    texts = [f"Article {i}: le bail du locataire et le contrat du propriétaire, alinéa {i}." for i in range(60)]
    articles = tmp_path / "articles.parquet"
    pl.DataFrame({"id": list(range(60)), "article": texts}).write_parquet(articles)
    section = dict(
        mode="scratch",
        vocab_size=200,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        max_length=16,
        max_steps=4,
        batch_size=8,
        warmup_ratio=0.25,
        log_every=2,
    )
    params = write_params(tmp_path / "params.yaml", base={"seed": 1, "device": "cpu"}, pretrain=section)
    out, metrics = tmp_path / "models" / "pretrain", tmp_path / "metrics" / "pretrain.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(ROOT / "stages" / "pretrain.py"),
        "--params",
        str(params),
        "--articles",
        str(articles),
        "--out",
        str(out),
        "--metrics",
        str(metrics),
        "--plot",
        str(tmp_path / "metrics" / "pretrain_curve.csv"),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = json.loads(metrics.read_text())
    assert written["steps"] == 4 and np.isfinite(written["eval_loss"])
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["pretrain"]  # no temp dir left
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("lexgraph-rank-")]
    assert proc.stderr.count("stage pretrain done") == 2  # both processes ran the stage


@pytest.mark.slow
def test_two_processes_killed_after_an_epoch_resume_to_the_uninterrupted_weights(tmp_path):
    """Resuming under a multi-process launch: both processes die at the start of epoch 3 (after
    epoch 2's checkpoint); the rerun resumes (the main process's shared state, each process's
    own random and task states) and ends with the weights of a run that was never killed."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]),
        "OMP_NUM_THREADS": "1",
    }

    def launch(out, *extra):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        cmd += [str(ROOT / "tests" / "engine_worker.py"), str(out), "--runs", "8:1", "--epochs", "4", *extra]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)

    # never killed: --die-at beyond the last epoch switches the per-process noise on all the same
    whole = launch(tmp_path / "whole.json", "--resume", str(tmp_path / "w"), "--die-at", "99")
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = launch(tmp_path / "killed.json", "--resume", str(tmp_path / "k"), "--die-at", "3")
    assert killed.returncode != 0 and not (tmp_path / "killed.json").exists()
    saved = sorted(p.name for p in (tmp_path / "k" / ".model.resume").iterdir())
    assert saved == ["fingerprint.json", "fit-1.pt", "fit-1.rank-0.epoch-2.pt", "fit-1.rank-1.epoch-2.pt"]
    resumed = launch(tmp_path / "killed.json", "--resume", str(tmp_path / "k"), "--die-at", "99")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "regression: resumed after epoch 2 of 4" in resumed.stderr
    (a,), (b,) = json.loads((tmp_path / "whole.json").read_text()), json.loads((tmp_path / "killed.json").read_text())
    assert a["weights"] == b["weights"] and a["step_losses"] == b["step_losses"]
    assert not (tmp_path / "k" / ".model.resume").exists()

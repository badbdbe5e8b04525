"""The real user's path, offline on CPU: ``cp profiles/paper.yaml params.yaml && dvc repro``.

A scratch copy of the project runs the paper profile end to end with stand-ins that
``tests/paper_fixture.py`` builds from the embedded sample: tiny random CamemBERT and mT5
checkpoints (real architectures, unigram tokenizers trained here) and a local directory that
``datasets`` loads as it loads the hub repo ``maastrichtlawtech/bsard`` (configs ``corpus``,
``questions`` with ``train``/``test``/``synthetic``, BM25 negatives; synthetic ids 1..N that
overlap the train ids, as on the hub), cut to ``paper_fixture.SIZES`` (120 train and 40 test
questions, 100 synthetic, 600 articles) so that the run fits CI's 15 minutes on 2 cores.

Params changed against profiles/paper.yaml, and nothing else (asserted below):

- model names: ``pretrain.model``, ``dsr.base_model``, ``queries.model`` → the tiny checkpoints;
- the data source: ``fetch.hub_repo`` → the local hub-layout directory (``fetch.source`` stays ``hub``);
- step and epoch counts, wherever they occur: ``max_steps`` 12, ``warmup_steps`` 2 (must stay
  below ``max_steps``), ``log_every`` 4, ``epochs`` 2 (``dsr``, ``rerank``, the GNN variants),
  ``epochs_lge``/``epochs_qabisar`` 2, ``queries.per_article`` 1;
- the device: ``base.device`` → ``cpu``.

Then each stage must have done the paper's work, read from its outputs: MLM steps taken,
doc2query questions written, the refits' epochs, a KD term in QABISAR's loss, the LGE's layers
and heads, non-zero gradients on MVCL's PLM, and metrics for every system of
``evaluate.systems``. A placeholder output (``disabled.json``) or a skipped setting fails.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests import paper_fixture as pf
from tests.conftest import ROOT


#: the whole run (fixtures + `dvc repro`) must fit CI's budget (issue 24: 15 min on 2 cores)
BUDGET_S = 15 * 60


def flatten(node, prefix: str = "") -> dict:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out or {prefix.rstrip("."): {}}
    return {prefix.rstrip("."): node}


def profile() -> dict:
    return yaml.safe_load(pf.PROFILE.read_text(encoding="utf-8"))


def allowed(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) or fnmatch.fnmatchcase(f"x.{key}", pattern) for pattern in pf.CHANGED)


def test_params_change_only_what_offline_cpu_forces(tmp_path):
    models = {"camembert": tmp_path / "camembert", "mt5": tmp_path / "mt5"}
    params = flatten(pf.paper_params(models, tmp_path / "bsard"))
    reference = flatten(profile())
    assert set(params) == set(reference)
    changed = {k for k in params if params[k] != reference[k]}
    assert all(allowed(k) for k in changed), sorted(k for k in changed if not allowed(k))
    # the switches that decide the paper's code paths are the profile's own
    assert params["fetch.source"] == "hub" and params["fetch.synthetic"] is True
    assert params["pretrain.mode"] == "continue" and params["queries.generator"] == "doc2query"
    assert params["fetch.hub_repo"] == str(tmp_path / "bsard") and params["base.device"] == "cpu"


# --------------------------------------------------------------------------- the run


def sh(cmd: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)


@pytest.fixture(scope="module")
def paper_run(tmp_path_factory):
    """The project copied, the stand-ins built, params.yaml = the adapted profile, `dvc repro`."""
    start = time.monotonic()
    base = tmp_path_factory.mktemp("paper")
    dest = pf.copy_project(base / "lexgraph")
    params = pf.build_all(base / "fixtures")
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(dest / "src"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(base / "hf"), "TOKENIZERS_PARALLELISM": "false"}
    proc = sh(["dvc", "repro"], dest, env)
    elapsed = time.monotonic() - start
    (base / "repro.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    return {"dest": dest, "params": params, "proc": proc, "elapsed": elapsed, "env": env}


def read(run, rel: str):
    path = run["dest"] / rel
    assert path.is_file(), f"{rel} missing"
    return json.loads(path.read_text(encoding="utf-8"))


def stage_names(dest: Path) -> list[str]:
    pipeline = yaml.safe_load((dest / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    names = []
    for name, stage in pipeline.items():
        items = stage.get("foreach")
        names += [f"{name}@{item}" for item in items] if items else [name]
    return names


@pytest.mark.slow
@pytest.mark.paper  # not in CI yet (issue 24 open: 19 min 48 s on a loaded 2-core box); `pytest -m paper`
@pytest.mark.timeout(3600)
def test_repro_runs_every_stage_within_budget(paper_run):
    proc = paper_run["proc"]
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"dvc repro failed:\n{out[-6000:]}"
    ran = re.findall(r"Running stage '([^']+)'", out)
    assert sorted(ran) == sorted(stage_names(paper_run["dest"])), ran
    assert paper_run["elapsed"] < BUDGET_S, f"{paper_run['elapsed']:.0f} s"


@pytest.mark.slow
@pytest.mark.paper  # not in CI yet (issue 24 open: 19 min 48 s on a loaded 2-core box); `pytest -m paper`
def test_no_stage_wrote_a_placeholder(paper_run):
    found = sorted(str(p.relative_to(paper_run["dest"])) for p in paper_run["dest"].glob("[dm]*/**/disabled.json"))
    assert found == []


@pytest.mark.slow
@pytest.mark.paper  # not in CI yet (issue 24 open: 19 min 48 s on a loaded 2-core box); `pytest -m paper`
def test_fetch_read_the_hub_layout_with_synthetic_questions(paper_run):
    import polars as pl

    questions = pl.read_parquet(paper_run["dest"] / "data/raw/questions.parquet")
    counts = dict(questions.group_by("split").len().iter_rows())
    sizes = pf.SIZES
    assert counts.get("synthetic") == sizes["synthetic"] and counts.get("test") == sizes["test"], counts
    assert counts.get("dev", 0) > 0 and counts["train"] + counts["dev"] == sizes["train"], counts
    clean = pl.read_parquet(paper_run["dest"] / "data/clean/questions.parquet")
    assert clean["id"].n_unique() == clean.height


@pytest.mark.slow
@pytest.mark.paper  # not in CI yet (issue 24 open: 19 min 48 s on a loaded 2-core box); `pytest -m paper`
def test_pretrain_continued_mlm_for_its_steps(paper_run):
    metrics = read(paper_run, "metrics/pretrain.json")
    steps = paper_run["params"]["pretrain"]["max_steps"]
    assert metrics["mode"] == "continue", metrics
    assert metrics["steps"] == steps, metrics
    assert metrics["train_loss"] > 0 and metrics["eval_loss"] != metrics["eval_loss_initial"], metrics


@pytest.mark.slow
@pytest.mark.paper  # not in CI yet (issue 24 open: 19 min 48 s on a loaded 2-core box); `pytest -m paper`
def test_doc2query_wrote_questions(paper_run):
    import polars as pl

    queries = pl.read_parquet(paper_run["dest"] / "data/queries/synthetic.parquet")
    n_articles = pl.read_parquet(paper_run["dest"] / "data/clean/articles.parquet").height
    # per_article 1; a random tiny mT5 repeats itself, so deduplication keeps only part of them
    assert 0 < queries.height <= n_articles
    assert queries["id"].n_unique() == queries.height
    assert set(queries["split"]) == {"synthetic"}
    assert queries["question"].str.len_chars().min() > 0
    info = read(paper_run, "metrics/generate_queries.json") if (paper_run["dest"] / "metrics/generate_queries.json").is_file() else None
    if info is not None:
        assert info.get("generator") == "doc2query", info


@pytest.mark.slow
@pytest.mark.paper  # not in CI yet (issue 24 open: 19 min 48 s on a loaded 2-core box); `pytest -m paper`
def test_dsr_refit_trained_its_epochs(paper_run):
    metrics = read(paper_run, "metrics/train_dsr.json")
    epochs = paper_run["params"]["dsr"]["epochs"]
    refit = metrics.get("refit")
    assert refit, f"no refit recorded in metrics/train_dsr.json: {sorted(metrics)}"
    assert refit["epochs"] >= 1 and refit["epochs"] <= epochs, refit
    assert metrics["synthetic_pairs"] > 0, metrics


def gnn_metrics(run, variant: str) -> dict:
    return read(run, f"metrics/train_gnn_{variant}.json")


@pytest.mark.slow
@pytest.mark.paper  # not in CI yet (issue 24 open: 19 min 48 s on a loaded 2-core box); `pytest -m paper`
def test_gdsr_lge_has_the_papers_layers_and_heads_and_refits(paper_run):
    gnn = paper_run["params"]["gnn"]
    saved = read(paper_run, "models/gnn_gdsr/gnn.json")
    text = json.dumps(saved)
    layers = gnn.get("gdsr", {}).get("layers", gnn["layers"])
    assert re.search(rf'"(num_)?layers": {layers}\b', text), text[:2000]
    heads = gnn.get("gdsr", {}).get("heads", gnn.get("heads"))
    assert re.search(rf'"heads": {heads}\b', text), text[:2000]
    metrics = gnn_metrics(paper_run, "gdsr")
    assert metrics.get("refit"), f"G-DSR's appendix-B refit did not run: {metrics.get('refit')!r}"
    epochs = [r for r in metrics["history"] if r.get("loss") is not None]
    assert epochs, metrics["history"]


@pytest.mark.slow
@pytest.mark.paper  # not in CI yet (issue 24 open: 19 min 48 s on a loaded 2-core box); `pytest -m paper`
def test_qabisar_loss_has_a_kd_term(paper_run):
    metrics = gnn_metrics(paper_run, "qabisar")
    kd = [r.get("kd") for r in metrics["history"] if r.get("loss") is not None]
    # every trained epoch logs a KD part (rounded to 4 decimals: a near-zero epoch may read 0.0)
    assert kd and all(v is not None for v in kd) and any(v > 0 for v in kd), metrics["history"]
    assert any(r["loss"] != r.get("contrastive") for r in metrics["history"] if r.get("loss") is not None)


@pytest.mark.slow
@pytest.mark.paper  # not in CI yet (issue 24 open: 19 min 48 s on a loaded 2-core box); `pytest -m paper`
def test_mvcl_fine_tunes_its_plm(paper_run):
    metrics = read(paper_run, "metrics/rerank_mvcl.json")
    norms = [r.get("plm_grad_norm") for r in metrics["history"] if r.get("loss") is not None]
    assert norms and all(n is not None and n > 0 for n in norms), metrics["history"]


@pytest.mark.slow
@pytest.mark.paper  # not in CI yet (issue 24 open: 19 min 48 s on a loaded 2-core box); `pytest -m paper`
def test_every_system_has_metrics(paper_run):
    systems = paper_run["params"]["evaluate"]["systems"]
    for system in systems:
        metrics = read(paper_run, f"metrics/{system}.json")
        for split in paper_run["params"]["evaluate"]["splits"]:
            assert metrics[split]["recall@100"] >= 0 and "map" in metrics[split], (system, split)
    results = (paper_run["dest"] / "metrics/results.md").read_text(encoding="utf-8")
    assert all(system in results for system in systems)

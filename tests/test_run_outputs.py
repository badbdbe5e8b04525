"""Outputs that say which run made them (issue 28, class 2).

- ``evaluate`` owns one ``metrics/<system>.json`` per system of the registry (each a declared
  output of dvc.yaml): a run writes the metrics of the systems it scores and a placeholder for
  every other one, so no earlier run's metrics survive as this run's, and ``lexgraph regress``
  fails in one line naming the system and the file;
- a setting that names another setting's values (a significance baseline, ``evaluate.systems``)
  is checked when the config is read, one line naming both keys;
- an integral float where an integer is expected (``13.0``, as DVC's ``-S base.seed=13.0``
  writes it and as DVC compares it) is that integer; a non-integral one is refused.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import polars as pl
import pytest
import yaml

from conftest import ROOT, sample_params
from helpers_cli import ARTICLES, write_articles
from helpers_scripts import run_script
from lexgraph.core.config import Base
from lexgraph.core.errors import ConfigError
from lexgraph.core.settings import read_section
from lexgraph.methods.catalog import names
from lexgraph.search.bm25 import BM25

NOT_EVALUATED = {"evaluated": False, "reason": "not in evaluate.systems"}  # evaluate's placeholder
STALE = {"dev": {"recall@100": 0.5, "map": 0.25}, "test": {"recall@100": 0.5, "map": 0.25}}


@pytest.fixture
def ws(tmp_path) -> Path:
    """A BM25-only workspace (three articles, dev and test questions) whose metrics/ and
    data/runs/ hold a previous run of every system."""
    root = tmp_path / "ws"
    write_articles(root, ARTICLES)
    BM25(k1=1.2, b=0.75).fit_texts(list(ARTICLES.values()), list(ARTICLES)).save(root / "models" / "bm25")
    pl.DataFrame(
        {
            "id": [1, 2, 3, 4, 5, 6],
            "question": ["mur mitoyen", "le bail", "le loyer", "réparation du mur", "louage de choses", "bailleur"],
            "article_ids": [[1], [2], [3], [1], [2], [3]],
            "split": ["dev", "dev", "dev", "test", "test", "test"],
        },
        schema_overrides={"article_ids": pl.List(pl.Int64)},
    ).write_parquet(root / "data" / "clean" / "questions.parquet")
    (root / "metrics").mkdir()
    for system in names():
        (root / "metrics" / f"{system}.json").write_text(json.dumps(STALE), encoding="utf-8")
        (root / "data" / "runs" / system).mkdir(parents=True)
        (root / "data" / "runs" / system / "test.trec").write_text("1 Q0 1 1 1.0 stale\n", encoding="utf-8")
    return root


def _params(path: Path, **edits) -> Path:
    params = sample_params()
    params["base"]["device"] = "cpu"
    for dotted, value in edits.items():
        section, key = dotted.split(".", 1)
        params[section][key] = value
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    return path


def _evaluate(ws: Path, params: Path, capsys) -> subprocess.CompletedProcess:
    """``python stages/evaluate.py --params PARAMS ...`` on ``ws``, run in this process
    (tests/helpers_scripts.py: the driver as ``__main__``, from ROOT): its exit status and
    stderr. A fresh interpreter spent 5 to 9 s importing torch and the systems first."""
    argv = ["--questions", ws / "data/clean/questions.parquet", "--keys", ws / "data/clean/keys.parquet"]
    argv += ["--runs", ws / "data/runs"]
    argv += ["--metrics-dir", ws / "metrics", "--workspace", ws]
    capsys.readouterr()
    status = run_script(ROOT / "stages" / "evaluate.py", "--params", params, *argv, cwd=ROOT)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["evaluate.py"], status, out, err)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _one_error(proc: subprocess.CompletedProcess, stage: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith(f"lexgraph {stage}: error: ")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


# ---------------------------------------------------------------------------
# (a) evaluate owns metrics/<system>.json of every system; regress fails on one it did not score
# ---------------------------------------------------------------------------


def test_dvc_yaml_declares_a_metrics_file_for_every_system_evaluate_owns():
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]["evaluate"]
    declared = {next(iter(entry)) for entry in stage["metrics"]}
    assert {f"metrics/{system}.json" for system in names()} <= declared


def test_a_run_of_fewer_systems_leaves_no_metrics_of_an_earlier_run_and_regress_names_them(ws, tmp_path, capsys):
    from lexgraph.cli.main import main

    params = _params(tmp_path / "params.yaml", **{"evaluate.systems": ["bm25"], "evaluate.baselines": []})
    proc = _evaluate(ws, params, capsys)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (ws / "data" / "runs").iterdir()) == ["bm25", "dev.qrels", "test.qrels"]
    bm25 = json.loads((ws / "metrics" / "bm25.json").read_text(encoding="utf-8"))
    assert set(bm25) == {"dev", "test"} and bm25 != STALE
    for system in (s for s in names() if s != "bm25"):
        assert json.loads((ws / "metrics" / f"{system}.json").read_text(encoding="utf-8")) == NOT_EVALUATED, system

    expected = tmp_path / "expected.yaml"
    want = {"bm25": {"test": {"recall@100": bm25["test"]["recall@100"]}}, "gdsr": {"test": {"recall@100": 0.5}}}
    expected.write_text(yaml.safe_dump({"systems": want}), encoding="utf-8")
    before = _snapshot(ws) | {"expected": expected.read_bytes()}
    capsys.readouterr()
    assert main(["regress", "--expected", str(expected), "--metrics-dir", str(ws / "metrics")]) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("REGRESSION ")]
    assert lines == [
        f"REGRESSION gdsr: {ws / 'metrics' / 'gdsr.json'} holds no test metrics of this run (the last "
        "`dvc repro evaluate` did not score gdsr: not in evaluate.systems); expected gdsr's metrics from "
        "`dvc repro evaluate` with gdsr in evaluate.systems"
    ], err
    assert "Traceback" not in err
    assert _snapshot(ws) | {"expected": expected.read_bytes()} == before


@pytest.mark.parametrize(
    "content, why",
    [
        ({"enabled": False}, "the re-ranker is switched off: rerank.xrerank.enabled: false"),
        ({"evaluated": False, "reason": "not in evaluate.systems"}, "did not score xrerank: not in evaluate.systems"),
        ({"dev": {"map": 0.2}}, 'keys ["dev"]'),
    ],
)
def test_regress_says_once_that_a_system_has_no_metrics_of_the_splits_it_checks(tmp_path, content, why):
    from lexgraph.core.errors import DataError
    from lexgraph.evaluation.regression import expected_from_metrics, run_checks

    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "xrerank.json").write_text(json.dumps(content), encoding="utf-8")
    expected = tmp_path / "expected.yaml"
    expected.write_text(yaml.safe_dump({"systems": {"xrerank": {"test": {"map": 0.2, "recall@100": 0.4}}}}))
    outcome = run_checks(tmp_path / "metrics", expected)
    assert len(outcome.failures) == 1 and outcome.passed == 0 and outcome.total == 2, outcome
    assert outcome.failures[0].startswith("xrerank: ") and why in outcome.failures[0], outcome.failures
    if "dev" not in content:  # --update would write a system without scores, which the next check refuses
        with pytest.raises(DataError, match=r"cannot update the expected scores of 'xrerank'"):
            expected_from_metrics(tmp_path / "metrics", expected)


def test_regress_says_once_that_a_split_has_no_metrics_of_this_run(tmp_path):
    from lexgraph.evaluation.regression import run_checks

    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "bm25.json").write_text(json.dumps({"test": {"map": 0.2}}), encoding="utf-8")
    expected = tmp_path / "expected.yaml"
    want = {"test": {"map": 0.2}, "dev": {"map": 0.2, "recall@100": 0.4, "ndcg@10": 0.3}}
    expected.write_text(yaml.safe_dump({"systems": {"bm25": want}}), encoding="utf-8")
    outcome = run_checks(tmp_path / "metrics", expected)
    assert (outcome.passed, outcome.total) == (1, 4), outcome
    assert outcome.failures == [
        f"bm25/dev: {tmp_path / 'metrics' / 'bm25.json'} holds no dev metrics of this run; expected them from "
        "`dvc repro evaluate` with dev in evaluate.splits"
    ], outcome.failures


# ---------------------------------------------------------------------------
# (b) a baseline is one of the systems evaluate scores
# ---------------------------------------------------------------------------


def test_a_baseline_that_is_not_evaluated_is_refused_naming_both_keys(ws, tmp_path, capsys):
    params = _params(tmp_path / "params.yaml", **{"evaluate.systems": ["bm25"], "evaluate.baselines": ["bm25", "dsr"]})
    before = _snapshot(ws) | {"params": params.read_bytes()}
    line = _one_error(_evaluate(ws, params, capsys), "evaluate")
    assert (
        "params.yaml: 'evaluate.baselines' = ['bm25', 'dsr'], expected baselines among 'evaluate.systems' = "
        "['bm25'] (not evaluated: dsr; add them there, or remove them from the baselines)"
    ) in line, line
    assert _snapshot(ws) | {"params": params.read_bytes()} == before


def test_a_baseline_switched_off_is_refused_before_any_output(ws, tmp_path, capsys):
    (ws / "models" / "xrerank").mkdir()
    (ws / "models" / "xrerank" / "disabled.json").write_text('{"enabled": false}\n', encoding="utf-8")
    params = _params(
        tmp_path / "params.yaml", **{"evaluate.systems": ["bm25", "xrerank"], "evaluate.baselines": ["bm25", "xrerank"]}
    )
    before = _snapshot(ws) | {"params": params.read_bytes()}
    line = _one_error(_evaluate(ws, params, capsys), "evaluate")
    assert "'evaluate.baselines' = ['bm25', 'xrerank'] names xrerank, which 'rerank.xrerank.enabled: false'" in line
    assert _snapshot(ws) | {"params": params.read_bytes()} == before


@pytest.mark.parametrize(
    "edits, named",
    [
        (
            {"norms": [], "weights": [0.5]},
            "'hybrid.norms' = [], expected a non-empty list to go with 'hybrid.weights' = [0.5]",
        ),
        (
            {"norms": ["zmuv"], "weights": []},
            "'hybrid.weights' = [], expected a non-empty list to go with 'hybrid.norms' = ['zmuv']",
        ),
    ],
)
def test_a_fusion_setting_its_partner_leaves_unused_is_refused_naming_both_keys(edits, named):
    """A weighted sum needs a normalisation and a weight: RRF alone would run, the other key ignored."""
    from lexgraph.methods.hybrid.system import HybridConfig

    with pytest.raises(ConfigError) as info:
        HybridConfig.from_params({**sample_params()["hybrid"], **edits})
    message = str(info.value)
    assert message.startswith(f"params.yaml: {named} (a weighted sum needs a normalisation and a weight)"), message
    assert message.endswith(", or both empty (RRF only)") and "\n" not in message, message


# ---------------------------------------------------------------------------
# (c) 13.0 is 13 where an integer is expected (as DVC compares them); 13.5 is refused
# ---------------------------------------------------------------------------


def test_an_integral_float_is_read_as_the_integer_and_a_fraction_is_refused():
    base = sample_params()["base"]
    seed = read_section(Base, {**base, "seed": 13.0}, "base").seed
    assert seed == 13 and type(seed) is int
    with pytest.raises(
        ConfigError, match=r"^params\.yaml: 'base\.seed' = 13\.5, expected an integer in \[0, 4294967295\]$"
    ):
        read_section(Base, {**base, "seed": 13.5}, "base")
    with pytest.raises(
        ConfigError, match=r"^params\.yaml: 'base\.seed' = inf, expected an integer in \[0, 4294967295\]$"
    ):
        read_section(Base, {**base, "seed": float("inf")}, "base")
    from lexgraph.methods.dsr.negatives import NegativesConfig

    negatives = copy.deepcopy(sample_params()["negatives"])
    config = NegativesConfig.from_params({**negatives, "k": 10.0, "depth": 5e2})
    assert (config.k, config.depth) == (10, 500) and type(config.k) is int and type(config.depth) is int


def test_what_dvc_holds_equal_to_true_or_false_is_read_as_it_and_other_numbers_are_refused():
    base = sample_params()["base"]
    for value, want in ((1, True), (0, False), (1.0, True), (0.0, False)):
        got = read_section(Base, {**base, "deterministic": value}, "base").deterministic
        assert got is want, (value, got)
    for value in (2, 0.5, -1):
        with pytest.raises(
            ConfigError, match=rf"^params\.yaml: 'base\.deterministic' = {value}, expected true or false$"
        ):
            read_section(Base, {**base, "deterministic": value}, "base")


def test_a_seed_written_as_13_0_runs_the_stage_as_13(ws, tmp_path, capsys):
    """``dvc exp run -S base.seed=13.0`` writes 13.0 and DVC sees no change from 13: the stages
    must read the same value, not refuse the file DVC left."""
    edits = {"evaluate.systems": ["bm25"], "evaluate.baselines": ["bm25"]}
    outputs = {}
    for seed in (13, 13.0):
        params = _params(tmp_path / f"params_{seed}.yaml", **edits)
        text = params.read_text(encoding="utf-8").replace("seed: 13\n", f"seed: {seed}\n")
        params.write_text(text, encoding="utf-8")
        proc = _evaluate(ws, params, capsys)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outputs[seed] = _snapshot(ws)
    assert outputs[13] == outputs[13.0]

"""Pipeline-wide progress (issue 25, item 6): under ``dvc repro`` each stage logs ``stage <name>
(k of N)`` when it starts, k and N from dvc.yaml in the order DVC runs the stages; without a
pipeline to read, the stage's name alone and no error; run by hand, no such line."""

from __future__ import annotations

import logging

import pytest

from conftest import ROOT, NoPaths, write_params
from lexgraph.core.progress import pipeline_order
from lexgraph.core.stage import Stage, run_stage

# file order is not run order: `embed` comes first in the file but needs `train`'s model, and
# `score@b` needs `score@a`'s output (a dict-valued foreach is named by its keys)
PIPELINE = """\
stages:
  embed:
    cmd: python embed.py
    deps: [models/train, data/clean]
    outs:
      - data/embed:
          persist: true
  prepare:
    cmd: python prepare.py
    deps: [data/raw.csv]
    outs: [data/clean]
  train:
    foreach: [small, big]
    do:
      cmd: python train.py ${item}
      deps: [data/clean/questions.csv]
      outs:
        - models/train/${item}
      metrics:
        - metrics/train_${item}.json:
            cache: false
  score:
    foreach:
      b: {after: a}
      a: {after: none}
    do:
      cmd: python score.py ${key}
      deps:
        - data/embed
        - metrics/score_${item.after}.json
      metrics:
        - metrics/score_${key}.json
"""


def _write(tmp_path, text: str):
    path = tmp_path / "dvc.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_projects_order_is_the_one_dvc_plans():
    """The order of the project's dvc.yaml is DVC's own plan for a full `dvc repro`
    (dvc.repo.reproduce.plan_repro), foreach stages expanded."""
    pytest.importorskip("dvc.repo")
    from dvc.repo import Repo
    from dvc.repo.reproduce import get_active_graph, plan_repro

    with Repo(str(ROOT)) as repo:
        planned = [stage.addressing for stage in plan_repro(get_active_graph(repo.index.graph))]
    order = pipeline_order(ROOT / "dvc.yaml")
    assert order == planned
    assert "train_gnn@gdsr" in order and order.index("encode_chunks") < order.index("zeroshot")


def test_dependencies_run_first_and_foreach_expands(tmp_path):
    """``${item}``, ``${key}`` and a mapping item's ``${item.<name>}`` paths resolved (dvc.yaml's
    train_gnn names each variant's first stage so); a stage comes after the stages whose outputs
    its deps are in or contain (``models/train`` holds ``models/train/small``); other
    interpolations (``${vars.after}``) leave the order unknown rather than guessed."""
    simple = PIPELINE.replace("metrics/score_${item.after}.json", "data/clean")
    assert pipeline_order(_write(tmp_path, simple)) == [
        "prepare",
        "train@small",
        "train@big",
        "embed",
        "score@b",
        "score@a",
    ]
    # score@b's dep metrics/score_${item.after}.json is score@a's output: it runs after it
    assert pipeline_order(_write(tmp_path, PIPELINE)) == [
        "prepare",
        "train@small",
        "train@big",
        "embed",
        "score@a",
        "score@b",
    ]
    assert pipeline_order(_write(tmp_path, PIPELINE.replace("${item.after}", "${vars.after}"))) is None


@pytest.mark.parametrize(
    "text",
    [
        None,  # no dvc.yaml
        "stages: [",  # not YAML
        "stages:\n  a:\n    matrix: {x: [1, 2]}\n    cmd: echo ${item.x}\n",
        "stages:\n  a:\n    foreach: ${names}\n    do: {cmd: echo}\n",
        "just text\n",
    ],
)
def test_a_pipeline_it_cannot_read_gives_no_order(tmp_path, text):
    path = tmp_path / "dvc.yaml"
    if text is not None:
        path.write_text(text, encoding="utf-8")
    assert pipeline_order(path) is None


def _run(tmp_path, caplog) -> list[str]:
    params = write_params(tmp_path / "params.yaml")
    with caplog.at_level(logging.INFO, logger="lexgraph"):
        stage = Stage("bm25", "bm25", NoPaths, dict, lambda paths, settings, context: None)
        code = run_stage(stage, ["--params", str(params)])
    assert code == 0
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("stage ")]


def test_run_stage_logs_its_place_in_the_pipeline(tmp_path, monkeypatch, caplog):
    """Under `dvc repro` (DVC_STAGE set by DVC, the command run in dvc.yaml's directory) the
    start line names the stage and its place; a foreach stage by its full name, also when DVC
    addresses it by its dvc.yaml's path (`dvc repro` started in a subdirectory)."""
    _write(tmp_path, PIPELINE.replace("metrics/score_${item.after}.json", "data/clean"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DVC_STAGE", "train@big")
    lines = _run(tmp_path, caplog)
    assert lines[0] == "stage train@big (3 of 6)"
    assert lines[1].startswith("stage bm25 done in ")
    monkeypatch.setenv("DVC_STAGE", "../dvc.yaml:score@a")
    caplog.clear()
    assert _run(tmp_path, caplog)[0] == "stage score@a (6 of 6)"


def test_run_stage_without_a_known_place(tmp_path, monkeypatch, caplog):
    """Under DVC with no dvc.yaml to read, or one that does not name the stage: the name alone,
    no error. A driver run by hand (no DVC_STAGE) adds no line: its error stays one line."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DVC_STAGE", "bm25")
    assert _run(tmp_path, caplog)[0] == "stage bm25"
    _write(tmp_path, PIPELINE.replace("${item.after}", "${vars.after}"))  # unreadable order
    caplog.clear()
    assert _run(tmp_path, caplog)[0] == "stage bm25"
    _write(tmp_path, PIPELINE.replace("metrics/score_${item.after}.json", "data/clean"))
    caplog.clear()
    assert _run(tmp_path, caplog)[0] == "stage bm25"  # not one of its stages
    monkeypatch.delenv("DVC_STAGE")
    caplog.clear()
    assert [line.split(" done in ")[0] for line in _run(tmp_path, caplog)] == ["stage bm25"]

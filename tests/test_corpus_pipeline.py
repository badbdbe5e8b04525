"""End to end on a corpus of one's own: the real `dvc repro` of every stage of dvc.yaml on a
3-level JSON-lines corpus with string ids (tests/helpers_corpus.py) in data/corpus/, in a scratch
copy of the repository (git clone + the working tree's changes), with small step and epoch counts.

- every system's TREC runs and each split's qrels name the user's question and article ids, and
  every system has its metrics/<system>.json;
- data/corpus is fetch's dependency: editing the corpus file makes `dvc status` report fetch
  changed, and `dvc repro` reruns it.

Slow (a full `dvc repro`, minutes on 2 cores): run by CI.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from helpers_corpus import corpus_records, question_records, write_jsonl
from helpers_dvc import scratch_copy, sh

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

#: small runs: (section, key) -> value; train_gnn's and rerank's variants get the epochs too
SMALL = {
    ("dsr", "epochs"): 1,
    ("queries", "per_article"): 1,
    ("pretrain", "max_steps"): 6,
}
VARIANT_EPOCHS = {"gnn": ("gdsr", "qabisar", "hgraph", "hgraph_qa"), "rerank": ("xrerank", "mvcl")}


def corpus_params(dest: Path) -> None:
    """params.yaml of the scratch copy: the corpus source, small epoch and step counts."""
    params = yaml.safe_load((dest / "params.yaml").read_text(encoding="utf-8"))
    params["fetch"].update(
        source="corpus", corpus_file="data/corpus/corpus.jsonl", questions_file="data/corpus/questions.jsonl"
    )
    for (section, key), value in SMALL.items():
        params[section][key] = value
    for section, variants in VARIANT_EPOCHS.items():
        for variant in variants:
            params[section][variant]["epochs"] = 1
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> tuple[Path, dict, str]:
    """A scratch repository on the corpus with the whole pipeline reproduced; its `dvc repro` output."""
    dest = tmp_path_factory.mktemp("corpus") / "lexgraph"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(dest / "src"),
        "HF_HUB_OFFLINE": "1",
    }
    scratch_copy(dest, env)
    articles = corpus_records()
    write_jsonl(dest / "data/corpus/corpus.jsonl", articles)
    write_jsonl(dest / "data/corpus/questions.jsonl", question_records(articles))
    corpus_params(dest)
    out = sh(["dvc", "repro"], dest, env)
    return dest, env, out.stdout + out.stderr


def ran_stages(output: str) -> list[str]:
    return re.findall(r"Running stage '([^']+)'", output)


def test_every_stage_runs_and_every_systems_run_names_the_users_ids(repo):
    dest, _, out = repo
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    ran = {name.split("@")[0] for name in ran_stages(out)}
    assert ran == set(stages), out
    params = yaml.safe_load((dest / "params.yaml").read_text(encoding="utf-8"))
    systems = [s for s in params["evaluate"]["systems"] if params["rerank"].get(s, {}).get("enabled", True)]
    article_keys = {r["id"] for r in corpus_records()}
    questions = question_records(corpus_records())
    for split in params["evaluate"]["splits"]:
        wanted = {q["id"] for q in questions if q["split"] == split}
        qrels = [line.split() for line in (dest / f"data/runs/{split}.qrels").read_text().splitlines()]
        assert qrels == [
            [q["id"], "0", a, "1"]
            for q in questions
            if q["split"] == split
            for a in sorted(q["article_ids"], key=[r["id"] for r in corpus_records()].index)
        ]
        for system in systems:
            run = [line.split() for line in (dest / f"data/runs/{system}/{split}.trec").read_text().splitlines()]
            assert {r[0] for r in run} == wanted, (system, split)
            assert {r[2] for r in run} <= article_keys and len({r[2] for r in run}) > 2, (system, split)
    for system in systems:
        metrics = json.loads((dest / f"metrics/{system}.json").read_text())
        assert 0 <= metrics["test"]["recall@100"] <= 1, system


def test_editing_the_corpus_file_reruns_fetch(repo):
    dest, env, _ = repo
    assert "Data and pipelines are up to date" in sh(["dvc", "status", "fetch"], dest, env).stdout
    articles = corpus_records()
    articles[5]["text"] += " Modifié."
    write_jsonl(dest / "data/corpus/corpus.jsonl", articles)
    status = sh(["dvc", "status", "fetch"], dest, env).stdout
    assert re.search(r"fetch:\s+changed deps:\s+modified:\s+data/corpus", status), status
    out = sh(["dvc", "repro", "clean"], dest, env)
    assert ran_stages(out.stdout + out.stderr) == ["fetch", "clean"]
    import polars as pl

    text = pl.read_parquet(dest / "data/raw/articles.parquet")["article"][5]
    assert text.endswith("Modifié.")

"""End to end on a corpus of one's own: the real `dvc repro` of every stage of dvc.yaml on a
3-level JSON-lines corpus with string ids (tests/helpers_corpus.py) in data/corpus/, in a scratch
copy of the repository (git clone + the working tree's changes), with small step and epoch counts.

- every system's TREC runs and each split's qrels name the user's question and article ids, and
  every system has its metrics/<system>.json;
- `lexgraph export` of a dense system names its article vectors by the user's ids
  (article_keys.json), and sentence-transformers ranks with it as the system's TREC run does;
- `lexgraph regress --update` writes the corpus's expected scores, which then reproduce (and the
  sample's do not);
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
    # MVCL (off on the sample: costly on CPU) runs too, on short inputs
    params["rerank"]["mvcl"].update(enabled=True, max_query_length=64, max_article_length=128)
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
    assert set(systems) == set(params["evaluate"]["systems"])  # every system, MVCL included
    gold = {q["id"]: set(q["article_ids"]) for q in questions if q["split"] == "test"}
    for system in systems:
        # the metrics, recomputed from the run and the gold by the user's ids
        run = [line.split() for line in (dest / f"data/runs/{system}/test.trec").read_text().splitlines()]
        recall = [len(gold[q] & {r[2] for r in run if r[0] == q and int(r[3]) <= 10}) / len(gold[q]) for q in gold]
        metrics = json.loads((dest / f"metrics/{system}.json").read_text())
        assert metrics["test"]["recall@10"] == pytest.approx(sum(recall) / len(recall), abs=1e-4), system


def test_an_export_names_its_article_vectors_by_the_users_ids(repo, tmp_path):
    from safetensors.numpy import load_file
    from sentence_transformers import SentenceTransformer

    dest, env, _ = repo
    out = tmp_path / "export"
    sh(
        [sys.executable, "-m", "lexgraph.cli", "export", "--system", "dsr", "--workspace", str(dest), str(out)],
        dest,
        env,
    )
    keys = json.loads((out / "article_keys.json").read_text(encoding="utf-8"))
    ids = load_file(str(out / "article_vectors.safetensors"))["ids"].tolist()
    assert keys == [r["id"] for r in corpus_records()] and ids == list(range(len(keys)))
    assert json.loads((out / "lexgraph_export.json").read_text(encoding="utf-8"))["article_keys"] == "article_keys.json"
    # the export's top-5 for each test question, by the user's ids, is the dsr run's
    # the export's article side is its own module (lexgraph_st.py), which sentence-transformers runs when trusted
    model = SentenceTransformer(str(out), device="cpu", trust_remote_code=True)
    vectors = load_file(str(out / "article_vectors.safetensors"))
    tests = [q for q in question_records(corpus_records()) if q["split"] == "test"]
    scores = model.encode_query([q["question"] for q in tests], convert_to_numpy=True) @ vectors["vectors"].T
    run = [line.split() for line in (dest / "data/runs/dsr/test.trec").read_text().splitlines()]
    for q, row in zip(tests, scores):
        top = [keys[i] for i in (-row).argsort(kind="stable")[:5]]
        assert top == [r[2] for r in run if r[0] == q["id"]][:5], q["id"]


def test_regress_keeps_the_corpus_own_expected_scores(repo):
    dest, env, _ = repo
    regress = [sys.executable, "-m", "lexgraph.cli", "regress"]
    sh([*regress, "--update", "--expected", "regression/corpus.yaml"], dest, env)
    expected = yaml.safe_load((dest / "regression/corpus.yaml").read_text(encoding="utf-8"))
    assert (
        expected["systems"]["dsr"]["test"]["recall@10"]
        == json.loads((dest / "metrics/dsr.json").read_text())["test"]["recall@10"]
    )
    assert (
        "all metrics in regression/corpus.yaml reproduce"
        in sh([*regress, "--expected", "regression/corpus.yaml"], dest, env).stdout
    )
    assert sh(regress, dest, env, ok=False).returncode == 1  # the sample's expected scores are not the corpus's


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

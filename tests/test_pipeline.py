"""End-to-end: `dvc repro` on the embedded sample in a scratch clone (slow; run by CI).

Checks what users rely on: the pipeline runs offline from a clean checkout, a second
`dvc repro` does nothing, an experiment reruns only the stages that depend on the changed
parameter, and every system's metrics reproduce regression/sample.yaml.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from lexgraph.evaluation.regression import check

# the module fixture runs a full `dvc repro` (~10 min on 2 cores); pytest-timeout counts fixture
# setup against the first test, so these tests get a budget that covers it
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


def sh(cmd: list[str], cwd: Path, env: dict) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout + proc.stderr


def ran_stages(output: str) -> list[str]:
    return re.findall(r"Running stage '([^']+)'", output)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> tuple[Path, dict]:
    """A clean clone of the committed repository with the pipeline reproduced in it."""
    dest = tmp_path_factory.mktemp("clone") / "lexgraph"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "HF_HUB_OFFLINE": "1",
    }
    sh(["git", "clone", "-q", str(ROOT), str(dest)], ROOT, env)
    # the working tree's dvc.yaml/params/code may be ahead of HEAD while developing: test what is checked out
    for rel in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / rel, dest / rel)
    sh(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "test", "--allow-empty"], dest, env)
    out = sh(["dvc", "repro"], dest, env)
    return dest, {"env": env, "first": out}


def test_repro_runs_every_stage_and_second_repro_is_a_noop(workspace):
    dest, ctx = workspace
    assert "fetch" in ran_stages(ctx["first"]) and "evaluate" in ran_stages(ctx["first"])
    again = sh(["dvc", "repro"], dest, ctx["env"])
    assert ran_stages(again) == [], again
    assert "Data and pipelines are up to date" in again


def test_metrics_reproduce_expected_scores(workspace):
    dest, _ = workspace
    assert check(dest / "metrics", ROOT / "regression" / "sample.yaml") == []


def test_the_hierarchy_systems_applied_to_the_workspace_corpus_give_its_saved_vectors(workspace):
    """lexgraph.methods.gnn.inductive (what `lexgraph index` and benchmarks/french_law.py apply to a
    new corpus) on the workspace's own articles, headings and train questions: hprior's and every
    graph encoder's saved article vectors, bit for bit."""
    import torch

    from lexgraph.core.io import read_parquet
    from lexgraph.encoding.embed import load_embeddings
    from lexgraph.methods.gnn import inductive
    from lexgraph.methods.hprior.system import hprior_vectors

    dest, _ = workspace
    clean = dest / "data" / "clean"
    questions = read_parquet(clean / "questions.parquet", ["id", "question", "article_ids", "split"])
    articles, headings = read_parquet(clean / "articles.parquet"), read_parquet(clean / "headings.parquet")
    embeddings = {
        n: load_embeddings(dest / "data" / "embed" / f"{n}.safetensors") for n in ("articles", "headings", "questions")
    }
    graph = inductive.corpus_graph(articles, headings, dest, questions=questions)
    saved = {"hprior": dest / "models" / "hprior"} | {
        v: dest / "models" / f"gnn_{v}" for v in ("gdsr", "qabisar", "hgraph", "hgraph_qa")
    }
    for system, directory in saved.items():
        ids, want = load_embeddings(directory / "article_embeddings.safetensors")
        if system == "hprior":
            got = hprior_vectors(dest, graph, *embeddings["articles"])
        else:
            got = inductive.graph_vectors(system, dest, graph, embeddings)
        assert (ids == graph.article_ids.numpy()).all() and torch.equal(got, want), system


def test_lexgraph_index_searches_an_unlabelled_corpus_with_every_system(workspace, tmp_path, capsys):
    """`lexgraph index` (issue 26, item 2) encodes an unlabelled corpus (60 of the sample's articles
    under new string ids and a 3-level hierarchy) with the trained workspace; `lexgraph search
    --index` then searches it with every system, naming the user's ids and heading paths; the
    index's DSR vectors are the workspace's own of those articles; mvcl (switched off) is one line."""
    import json

    import numpy as np
    import torch

    from lexgraph.cli.main import main
    from lexgraph.core.io import read_parquet
    from lexgraph.encoding.embed import load_embeddings, select_rows
    from lexgraph.methods.catalog import names

    dest, _ = workspace
    articles = read_parquet(dest / "data" / "clean" / "articles.parquet").head(60)
    records = [
        {"id": f"fr-{i:03d}", "text": text, "path": ["Code N", f"Livre {i % 2}", f"Titre {i % 5}"]}
        for i, text in enumerate(articles["article"].to_list())
    ]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    out = tmp_path / "idx"
    assert main(["index", "--workspace", str(dest), "--corpus", str(corpus), "--out", str(out), "--block", "25"]) == 0
    capsys.readouterr()
    ids, mine = load_embeddings(out / "data" / "embed" / "articles.safetensors")
    own = select_rows(
        *load_embeddings(dest / "data" / "embed" / "articles.safetensors"), articles["id"].to_numpy(), "", ""
    )
    assert np.array_equal(ids, np.arange(60)) and torch.allclose(mine, own, atol=1e-4)
    paths = {r["id"]: r["path"] for r in records}
    for system in names():
        argv = ["search", "--workspace", str(dest), "--index", str(out), "--system", system, "--json", "--top", "3"]
        status = main([*argv, "Qui peut porter atteinte à la vie privée d'autrui ?"])
        if system == "mvcl":
            assert status == 2 and "no mvcl in this index: mvcl is switched off" in capsys.readouterr().err
            continue
        assert status == 0, system
        hits = json.loads(capsys.readouterr().out)["hits"]
        assert len(hits) == 3 and all(paths[h["id"]] == h["path"] for h in hits), system


def test_the_code_civils_versions_answer_by_date_the_worked_example(workspace, tmp_path, capsys):
    """docs/cli.md, "The law as in force on a date": the Code civil's 3,211 versions
    (data/history, from fr-codes-history) indexed once with the sample's zeroshot encoder; "À partir
    de quel âge une femme peut-elle se marier ?" finds art. 144's 1970 text as of 2000-01-01 and its
    2006 text as of 2010-01-01, each in the top 5; "Deux hommes peuvent-ils se marier ?" finds
    art. 143 (2013-05-19) in the top 5 as of 2014-01-01, and no art. 143 at all as of 2012-01-01."""
    import json

    from lexgraph.cli.main import main

    dest, _ = workspace
    out = tmp_path / "code-civil"
    corpus = ROOT / "data" / "history" / "code-civil-versions.jsonl.gz"
    assert (
        main(["index", "--workspace", str(dest), "--corpus", str(corpus), "--out", str(out), "--systems", "zeroshot"])
        == 0
    )

    def hits(question: str, date: str, top: int) -> list[dict]:
        capsys.readouterr()
        argv = ["search", "--workspace", str(dest), "--index", str(out), "--system", "zeroshot", "--json"]
        assert main([*argv, "--top", str(top), "--as-of", date, question]) == 0
        return json.loads(capsys.readouterr().out)["hits"]

    woman = "À partir de quel âge une femme peut-elle se marier ?"
    for date, since, words in (
        ("2000-01-01", "1970-01-31", "la femme avant quinze"),
        ("2010-01-01", "2006-04-05", "L'homme et la femme"),
    ):
        found = [h for h in hits(woman, date, 5) if h["id"] == "144"]
        assert found and found[0]["version"]["valid_from"] == since and words in found[0]["snippet"], date
    men = "Deux hommes peuvent-ils se marier ?"
    found = [h for h in hits(men, "2014-01-01", 5) if h["id"] == "143"]
    assert found and found[0]["version"] == {
        "valid_from": "2013-05-19",
        "valid_to": None,
        "act": "LOI n°2013-404 du 17 mai 2013",
    }
    assert "143" not in {h["id"] for h in hits(men, "2012-01-01", 3000)}


@pytest.mark.parametrize("system", ["dsr", "zeroshot"])
def test_an_export_encoding_the_articles_itself_scores_the_systems_metrics(workspace, tmp_path, system):
    """Issue 41: the export of ``system`` in sentence-transformers, the articles encoded by the export
    itself (``encode_document``) and sentence-transformers' ``InformationRetrievalEvaluator`` on the
    sample's test split: recall@100, MAP@100 and nDCG@10 within 0.001 of ``metrics/<system>.json``
    (a user of the export's first release got R@100 66.0 instead of 72.5 for dsr)."""
    import json

    from helpers_export import COMPARED, st_metrics
    from lexgraph.systems.export import export_system

    dest, _ = workspace
    out = export_system(system, dest, tmp_path / "export")
    want = json.loads((dest / "metrics" / f"{system}.json").read_text(encoding="utf-8"))["test"]
    got = st_metrics(out, dest, "test")
    assert got == pytest.approx({name: want[name] for name in COMPARED}, abs=1e-3)


def test_mteb_evaluate_on_the_sample_gives_dsrs_metrics(workspace):
    """Issue 41: ``mteb.evaluate`` (mteb 2) of the adapter on the sample's test split as a custom
    retrieval task, both sides encoded through the adapter: DSR's recall@100, MAP@100 and nDCG@10."""
    import json

    import mteb

    from lexgraph.systems.mteb_adapter import MTEBEncoder, workspace_task

    dest, _ = workspace
    want = json.loads((dest / "metrics" / "dsr.json").read_text(encoding="utf-8"))["test"]
    result = mteb.evaluate(MTEBEncoder.load("dsr", dest), workspace_task(dest, "test"), cache=None)
    got = result.task_results[0].scores["test"][0]
    for ours, theirs in (("recall@100", "recall_at_100"), ("map@100", "map_at_100"), ("ndcg@10", "ndcg_at_10")):
        assert got[theirs] == pytest.approx(want[ours], abs=1e-3), ours


def test_french_law_benchmark_at_the_sample_size_gives_every_system_its_own_test_scores(workspace, tmp_path):
    """benchmarks/french_law.py (issue 26, item 3) with every system on the trained workspace and
    three distractors in a 3-level code: at the sample's own size each system scores exactly its
    metrics/<system>.json (test), at the larger size the graph holds the distractors' headings."""
    import gzip
    import json

    from conftest import load_benchmark

    fl = load_benchmark("french_law")
    dest, _ = workspace
    rows = [
        {"id": i, "code": "Code rural", "path": ["Livre Ier", f"Titre {i % 2}"], "text": f"Le bornage des champs {i}."}
        for i in range(3)
    ]
    corpus, out = tmp_path / "c.jsonl.gz", tmp_path / "out.json"
    with gzip.open(corpus, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    argv = ["--corpus", str(corpus), "--workspace", str(dest), "--out", str(out), "--resamples", "20"]
    assert fl.main([*argv, "--sizes", "2760", "all", "--cache", str(tmp_path / "cache")]) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["sizes"] == [2760, 2763]
    for system in fl.SYSTEMS:
        own = json.loads((dest / "metrics" / f"{system}.json").read_text(encoding="utf-8"))["test"]
        got = result["quality"][system]["2760"]
        assert got == {m: own[m] for m in got}, system
    graphs = {s["size"]: s for s in result["steps"] if s["step"] == "build graph"}
    assert graphs[2763]["headings"] == graphs[2760]["headings"] + 4  # Code rural, Livre Ier, Titre 0, Titre 1


def stage_pid(dest: Path, script: str) -> int | None:
    """The pid of the stage process running ``script`` in ``dest`` (``None``: none yet)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if script.encode() in cmdline and b"python" in cmdline and cwd == str(dest):
            return int(entry.name)
    return None


def locked_out(dest: Path, stage: str, out: str) -> str:
    lock = yaml.safe_load((dest / "dvc.lock").read_text(encoding="utf-8"))["stages"][stage]
    return next(o["md5"] for o in lock["outs"] if o["path"] == out)


@pytest.mark.parametrize(
    ("stage", "script", "out", "first"),
    [
        ("train_dsr", "stages/train_dsr.py", "models/dsr", "fit-1.pt"),
        ("train_gnn@gdsr", "stages/train_gnn.py", "models/gnn_gdsr", "fit-1.pt"),
    ],
)
def test_a_training_stage_killed_after_an_epoch_resumes_under_dvc_repro(workspace, stage, script, out, first):
    """Issue 28: SIGKILL to the stage after its first epoch under `dvc repro`; the rerun of
    `dvc repro` resumes (one log line), the model is byte-identical to the uninterrupted run's
    (dvc.lock's hash from the fixture's full run) and `dvc status` is clean afterwards."""
    dest, ctx = workspace
    expected = locked_out(dest, stage, out)
    shutil.rmtree(dest / out)  # what makes `dvc repro` run the stage again
    checkpoint = dest / Path(out).parent / f".{Path(out).name}.resume" / first
    log = (dest.parent / f"{Path(out).name}.log").open("w")
    proc = subprocess.Popen(["dvc", "repro", stage], cwd=dest, env=ctx["env"], stdout=log, stderr=log)
    try:
        end = time.monotonic() + 1200
        while not checkpoint.is_file() and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.2)
        assert checkpoint.is_file(), (dest.parent / f"{Path(out).name}.log").read_text()[-3000:]
        pid = stage_pid(dest, script)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=120) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert checkpoint.is_file() and not (dest / out).exists()
    again = sh(["dvc", "repro", stage], dest, ctx["env"])
    assert re.search(r"resumed after epoch \d+ of \d+ from ", again), again[-3000:]
    assert "starting afresh" not in again
    assert locked_out(dest, stage, out) == expected
    assert not checkpoint.parent.exists()
    assert "Data and pipelines are up to date" in sh(["dvc", "status"], dest, ctx["env"])


def test_experiment_reruns_only_dependent_stages(workspace):
    dest, ctx = workspace
    sh(["git", "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A"], dest, ctx["env"])
    sh(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "repro"], dest, ctx["env"])
    out = sh(["dvc", "exp", "run", "-S", "bm25.k1=1.2"], dest, ctx["env"])
    # hybrid fuses BM25, and the re-rankers may re-rank any system (rerank.first_stage): all follow BM25
    assert sorted(ran_stages(out)) == ["bm25", "evaluate", "hybrid", "rerank@mvcl", "rerank@xrerank"], out
    diff = sh(["dvc", "metrics", "diff"], dest, ctx["env"])
    assert "metrics/bm25.json" in diff


def test_gnn_layers_experiment_reruns_only_the_stages_downstream_of_the_gnn(workspace):
    dest, ctx = workspace
    sh(["git", "checkout", "-q", "--", "params.yaml", "dvc.lock"], dest, ctx["env"])
    sh(["dvc", "checkout", "-q"], dest, ctx["env"])
    out = sh(["dvc", "exp", "run", "-S", "gnn.layers=2"], dest, ctx["env"])
    # hybrid (dense: best) and the re-rankers may use either graph system
    assert sorted(ran_stages(out)) == [
        "evaluate",
        "hybrid",
        "rerank@mvcl",
        "rerank@xrerank",
        "train_gnn@gdsr",
        "train_gnn@hgraph",
        "train_gnn@hgraph_qa",
        "train_gnn@qabisar",
    ], out
    diff = sh(["dvc", "metrics", "diff"], dest, ctx["env"])
    assert all(f"metrics/{name}.json" in diff for name in ("gdsr", "qabisar", "hgraph", "hgraph_qa"))

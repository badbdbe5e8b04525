"""Artefacts record what they were built from; a search refuses when the workspace has moved on
(issue 28, class 3: stale artefacts; lexgraph.core.provenance, lexgraph.core.staleness)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import pytest

from conftest import load_benchmark, write_params
from helpers_cli import ARTICLES, write_articles
from lexgraph.cli.main import main as cli
from lexgraph.core import staleness
from lexgraph.core.errors import LexgraphError
from lexgraph.core.io import atomic_path
from lexgraph.core.provenance import RECORD, Input, Output, digest_path, recording
from lexgraph.core.stage import StageContext, run_stage
from lexgraph.methods.bm25.system import Bm25Config, Bm25Paths, run_bm25
from lexgraph.methods.catalog import declared, systems
from lexgraph.search.bm25 import BM25


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _bm25_stage(ws: Path) -> int:
    """`python stages/bm25.py` as dvc.yaml runs it, in ``ws`` (paths relative to the workspace)."""
    driver = load_benchmark("bm25", "stages")
    write_params(ws / "params.yaml", bm25={"k1": 1.2, "b": 0.75})
    argv = ["--params", "params.yaml", "--articles", "data/clean/articles.parquet"]
    argv += ["--tuned", "metrics/bm25_tune.json", "--out", "models/bm25"]
    return run_stage(driver.STAGE, argv)


@pytest.fixture
def bm25_ws(tmp_path, monkeypatch):
    """A workspace whose BM25 index the bm25 stage built (so it carries its provenance)."""
    monkeypatch.chdir(tmp_path)
    write_articles(tmp_path, ARTICLES)
    assert _bm25_stage(tmp_path) == 0
    return tmp_path


def test_a_stage_records_its_inputs_inside_its_output(bm25_ws, tmp_path_factory):
    record = json.loads((bm25_ws / "models/bm25" / RECORD).read_text(encoding="utf-8"))
    assert record["stage"] == "bm25" and len(record["settings"]) == 64
    assert record["inputs"] == {
        "articles": {"path": "data/clean/articles.parquet", "digest": digest_path("data/clean/articles.parquet")},
        "tuned": {"path": "metrics/bm25_tune.json", "digest": "absent"},
    }
    # the index's own files are the bytes the writer alone writes: the record is a new file beside them
    direct = tmp_path_factory.mktemp("direct")
    run_bm25(
        Bm25Paths(articles=bm25_ws / "data/clean/articles.parquet", tuned=direct / "none.json", out=direct / "bm25"),
        _config(),
        StageContext(seed=0, device="cpu"),
    )
    written = _snapshot(bm25_ws / "models/bm25")
    assert written.pop(RECORD) and written == _snapshot(direct / "bm25")
    assert record["output"] == digest_path(direct / "bm25")  # the digest of its own files
    # deterministic: a rerun writes the same record
    before = _snapshot(bm25_ws / "models/bm25")
    assert _bm25_stage(bm25_ws) == 0 and _snapshot(bm25_ws / "models/bm25") == before


def _config() -> Bm25Config:
    return Bm25Config(k1=1.2, b=0.75)


def test_search_refuses_an_index_built_from_other_article_texts(bm25_ws, capsys):
    assert cli(["search", "--workspace", str(bm25_ws), "--top", "1", "Qui paie le loyer ?"]) == 0
    capsys.readouterr()
    # an article's text changed, same ids (fetch and clean rerun alone): the index is stale
    write_articles(bm25_ws, {**ARTICLES, 2: "Le bail est un contrat écrit."})
    before = _snapshot(bm25_ws)
    assert cli(["search", "--workspace", str(bm25_ws), "--top", "1", "Qui paie le loyer ?"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("lexgraph search: error: ")]
    assert lines == [
        f"lexgraph search: error: {bm25_ws / 'models/bm25'} was built from another "
        f"{bm25_ws / 'data/clean/articles.parquet'} than the workspace holds now (it changed after stage bm25 "
        "ran); run `dvc repro` to rebuild it"
    ], err
    assert _snapshot(bm25_ws) == before


def test_search_refuses_when_an_input_appears_or_goes(bm25_ws, capsys):
    (bm25_ws / "metrics").mkdir()
    (bm25_ws / "metrics/bm25_tune.json").write_text('{"k1": 0.9, "b": 0.4}\n', encoding="utf-8")  # appeared
    assert cli(["search", "--workspace", ".", "--top", "1", "loyer"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        "lexgraph search: error: models/bm25 was built from another metrics/bm25_tune.json than the workspace "
        "holds now (it changed after stage bm25 ran); run `dvc repro` to rebuild it"
    )
    (bm25_ws / "metrics/bm25_tune.json").unlink()
    (bm25_ws / "data/clean/articles.parquet").unlink()
    with pytest.raises(LexgraphError, match=r"built from data/clean/articles.parquet, which the workspace no longer"):
        staleness.check_built_from([Path("models/bm25")], ".")


def test_an_artefact_without_a_record_is_searched_with_one_warning(tmp_path, caplog, capsys):
    write_articles(tmp_path, ARTICLES)
    BM25().fit_texts(list(ARTICLES.values()), list(ARTICLES)).save(tmp_path / "models" / "bm25")
    staleness._WARNED.clear()
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            assert cli(["search", "--workspace", str(tmp_path), "--top", "1", "loyer"]) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"{tmp_path / 'models/bm25'}: no record of what it was built from (written before lexgraph kept one); "
        "not checked against the workspace, `dvc repro --force` the stage that wrote it to record it"
    ]


def test_a_damaged_record_is_named(bm25_ws):
    (bm25_ws / "models/bm25" / RECORD).write_text('{"inputs": []}\n', encoding="utf-8")
    with pytest.raises(LexgraphError, match=r"models/bm25/provenance.json: expected .*`dvc repro --force bm25`"):
        staleness.check_built_from([Path("models/bm25")], ".")


def _stage(name: str, out: str, content: bytes, **inputs: str) -> None:
    """Write the directory ``out`` as a stage reading ``inputs`` would, recording them."""
    import dataclasses

    fields = [(k, Annotated[Path, Input(k)]) for k in inputs]
    paths_type = dataclasses.make_dataclass("P", [*fields, ("out", Annotated[Path, Output("out")])])
    with recording(name, {"seed": 1}, paths_type(**{k: Path(v) for k, v in inputs.items()}, out=Path(out))):
        with atomic_path(out, directory=True) as tmp:
            (tmp / "weights.bin").write_bytes(content)


def test_a_graph_system_is_refused_after_its_query_encoder_or_corpus_moved_on(tmp_path, monkeypatch):
    """hgraph_qa references models/dsr's query encoder: `dvc repro -s train_dsr` alone makes it stale,
    and so does an article text changed under data/embed (followed through embed's record)."""
    monkeypatch.chdir(tmp_path)
    write_articles(tmp_path, ARTICLES)
    _stage("train_dsr", "models/dsr", b"dsr 1", articles="data/clean/articles.parquet")
    _stage("embed", "data/embed", b"vectors 1", dsr="models/dsr", articles="data/clean/articles.parquet")
    _stage("train_gnn", "models/gnn_hgraph_qa", b"gnn 1", embed="data/embed", dsr="models/dsr")
    used = [a.under(".") for a in declared("hgraph_qa").reads]
    staleness.check_built_from(used, ".")  # all current

    _stage("train_dsr", "models/dsr", b"dsr 2", articles="data/clean/articles.parquet")  # retrained alone
    with pytest.raises(LexgraphError) as caught:
        staleness.check_built_from(used, ".")
    assert str(caught.value) == (
        "models/gnn_hgraph_qa was built from another models/dsr than the workspace holds now "
        "(it changed after stage train_gnn@hgraph_qa ran); run `dvc repro` to rebuild it"
    )
    _stage("embed", "data/embed", b"vectors 2", dsr="models/dsr", articles="data/clean/articles.parquet")
    _stage("train_gnn", "models/gnn_hgraph_qa", b"gnn 2", embed="data/embed", dsr="models/dsr")
    staleness.check_built_from(used, ".")

    write_articles(tmp_path, {**ARTICLES, 3: "Le locataire paie le loyer."})  # clean rerun alone
    with pytest.raises(LexgraphError) as caught:
        staleness.check_built_from([Path("models/gnn_hgraph_qa")], ".")
    assert str(caught.value).startswith(  # followed through the artefacts it is built on, in order
        "models/dsr (which models/gnn_hgraph_qa is built on) was built from another data/clean/articles.parquet"
    )


def test_every_system_names_the_artefacts_it_reads_and_the_stage_that_builds_them():
    """Each declaration's ``reads`` are artefacts of the layout, and its ``stage`` writes one of them."""
    from lexgraph.core import layout

    known = {a.path for a in layout.ARTIFACTS.values()}
    for name, spec in systems().items():
        assert spec.reads and all(a.path in known for a in spec.reads), name
        assert spec.stage in {a.stage for a in spec.reads}, name


def test_a_stage_that_loads_systems_records_them(bm25_ws):
    """hybrid (and rerank) read whole systems from the workspace: its record names what it loaded,
    so a BM25 index rebuilt after the fusion was tuned makes models/hybrid stale."""
    from lexgraph.systems.registry import load_retriever

    _stage_loading("hybrid", "models/hybrid", lambda: load_retriever("bm25", ".", "cpu"))
    record = json.loads((bm25_ws / "models/hybrid" / RECORD).read_text(encoding="utf-8"))
    assert record["inputs"]["read models/bm25"]["digest"].startswith("record:")
    staleness.check_built_from([Path("models/hybrid")], ".")
    write_params(bm25_ws / "params.yaml", bm25={"k1": 2.0, "b": 0.75})
    driver = load_benchmark("bm25", "stages")
    argv = ["--articles", "data/clean/articles.parquet", "--tuned", "metrics/bm25_tune.json", "--out", "models/bm25"]
    assert run_stage(driver.STAGE, argv) == 0  # k1 2.0
    with pytest.raises(LexgraphError, match=r"^models/hybrid was built from another models/bm25 than"):
        staleness.check_built_from([Path("models/hybrid")], ".")


def _stage_loading(name: str, out: str, load) -> None:
    import dataclasses

    from lexgraph.core.provenance import Workspace

    fields = [("workspace", Annotated[Path, Workspace("ws")]), ("out", Annotated[Path, Output("o")])]
    paths_type = dataclasses.make_dataclass("P", fields)
    with recording(name, {"seed": 1}, paths_type(workspace=Path("."), out=Path(out))):
        load()
        with atomic_path(out, directory=True) as tmp:
            (tmp / "hybrid.json").write_text("{}\n", encoding="utf-8")

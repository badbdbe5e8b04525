"""`lexgraph export` (issue 26, item 4): a dense system as a folder that sentence-transformers
loads, reproducing lexgraph's own query vectors (cosine >= 0.9999) and its top-10 with the
exported article vectors; the MTEB-style `encode`; bad input in one line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import yaml

from conftest import ROOT, TINY_WORDS
from helpers_cli import write_articles
from lexgraph.cli.main import main
from lexgraph.core.layout import ARTICLE_EMBEDDINGS
from lexgraph.encoding.embed import save_embeddings

N_ARTICLES = 40
QUESTIONS = [
    "le bail du contrat",
    "la loi du mariage ?",
    "divorce et enfant",
    "les articles de la loi",
    "contrat de bail, loyer",
    "enfant",
    "qui paie le mur mitoyen ?",
    "mariage, divorce, enfant, loi, contrat, bail et article",
]


def _articles() -> dict[int, str]:
    """Articles of 12 to 40 words: one to three chunks of the tiny DSR's article encoder."""
    rng = np.random.default_rng(0)
    return {100 + 7 * i: " ".join(rng.choice(TINY_WORDS, size=12 + i % 29)) for i in range(N_ARTICLES)}


def _write_questions(root) -> None:
    import polars as pl

    ids = sorted(_articles())
    rng = np.random.default_rng(1)
    gold = [sorted(int(a) for a in rng.choice(ids, size=1 + i % 3, replace=False)) for i in range(len(QUESTIONS))]
    pl.DataFrame(
        {"id": list(range(1, len(QUESTIONS) + 1)), "question": QUESTIONS, "article_ids": gold, "split": ["test"] * 8},
        schema_overrides={"article_ids": pl.List(pl.Int64)},
    ).write_parquet(root / "data" / "clean" / "questions.parquet")


def _write_dsr(root, articles: dict[int, str]) -> None:
    """A tiny DSR as train_dsr and embed leave it: its query encoder (mean pooling, an E5-like
    ``query: `` prefix), a hierarchical article encoder on the frozen base checkpoint saved as a
    reference (``passage: `` in every chunk, a random chunk Transformer, max pooling) and the
    article vectors that encoder gives."""
    from lexgraph.models.article_encoder import HierarchicalArticleEncoder
    from lexgraph.models.encoders import QueryEncoder

    pretrain = root / "models" / "pretrain"
    encoder = QueryEncoder.from_pretrained(pretrain, max_length=32, token_pooling="mean")
    encoder.prefix = "query: "
    encoder.save_pretrained(root / "models" / "dsr" / "query_encoder")
    torch.manual_seed(0)
    article = HierarchicalArticleEncoder.from_pretrained(
        pretrain,
        max_chunk_length=24,
        max_document_length=72,
        pooling="max",
        num_layers=1,
        num_heads=2,
        token_pooling="mean",
        prefix="passage: ",
        freeze_backbone=True,
    ).eval()
    article.save_pretrained(root / "models" / "dsr" / "article_encoder", backbone_source="models/pretrain")
    vectors = article.encode(list(articles.values()), batch_size=4, show_progress=False)  # (n, dim)
    save_embeddings(root / "data" / "embed" / "articles.safetensors", list(articles), vectors)


@pytest.fixture(scope="module")
def export_ws(tiny_model_dir, tmp_path_factory):
    """A workspace with a tiny ``dsr`` (cosine), the base checkpoint's ``zeroshot`` (its stage run) and a
    tiny ``gdsr`` (the DSR query encoder, dot product), article ids not 0..n-1, test questions,
    metrics and params."""
    from lexgraph.methods.zeroshot.system import ZeroshotConfig, zeroshot_embeddings

    root = tmp_path_factory.mktemp("export_ws")
    articles = _articles()
    write_articles(root, articles)
    _write_questions(root)
    shutil.copy(ROOT / "params.yaml", root / "params.yaml")
    shutil.copytree(tiny_model_dir, root / "models" / "pretrain")
    _write_dsr(root, articles)
    config = ZeroshotConfig.from_params(yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8"))["zeroshot"])
    zeroshot_embeddings(
        root / "models" / "pretrain",
        root / "data" / "clean" / "articles.parquet",
        root / "data" / "zeroshot",
        config,
        "cpu",
        None,
    )
    torch.manual_seed(0)
    gnn = root / "models" / "gnn_gdsr"
    save_embeddings(gnn / ARTICLE_EMBEDDINGS, list(articles), 3 * torch.randn(N_ARTICLES, 16))
    (gnn / "gnn.json").write_text(json.dumps({"similarity": "dot"}), encoding="utf-8")
    (root / "metrics").mkdir()
    metrics = {"dev": {"recall@100": 0.5, "map": 0.25}, "test": {"recall@100": 0.6, "map": 0.3}}
    (root / "metrics" / "dsr.json").write_text(json.dumps(metrics), encoding="utf-8")
    return root


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("system", ["dsr", "zeroshot", "gdsr"])
def test_sentence_transformers_encodes_queries_and_articles_as_lexgraph(export_ws, tmp_path, system):
    """``SentenceTransformer(OUT)``: ``encode_query`` (and a plain ``encode``) gives lexgraph's query
    vectors, ``encode_document`` of the article texts lexgraph's article vectors (both cosine >=
    0.9999) and so lexgraph's top-10; a graph system's ``encode_document`` refuses in one line."""
    from safetensors.numpy import load_file
    from sentence_transformers import SentenceTransformer

    from lexgraph.systems.export import VECTORS
    from lexgraph.systems.registry import load_retriever

    out = tmp_path / "export"
    assert main(["export", "--system", system, "--workspace", str(export_ws), str(out)]) == 0
    model = SentenceTransformer(str(out), device="cpu", trust_remote_code=True)
    retriever = load_retriever(system, export_ws, "cpu")
    own = retriever.encode(QUESTIONS).numpy()  # (n, dim)
    got = model.encode_query(QUESTIONS, convert_to_numpy=True)  # (n, dim)
    assert _cosines(got, own).min() >= 0.9999
    np.testing.assert_allclose(model.encode(QUESTIONS, convert_to_numpy=True), got, atol=1e-6)
    shipped = load_file(str(out / VECTORS))
    assert shipped["ids"].dtype == np.int64 and shipped["ids"].tolist() == sorted(_articles())
    texts = [_articles()[i] for i in shipped["ids"].tolist()]
    if system == "gdsr":
        with pytest.raises(ValueError) as refused:
            model.encode_document(texts[:2])
        assert "\n" not in str(refused.value) and "`lexgraph index`" in str(refused.value)
        articles = shipped["vectors"]
    else:
        articles = model.encode_document(texts, batch_size=5, convert_to_numpy=True)  # (na, dim)
        assert _cosines(articles, shipped["vectors"]).min() >= 0.9999
    scores = got @ articles.T  # (n, na)
    top = shipped["ids"][np.argsort(-scores, axis=1, kind="stable")[:, :10]]
    want, _ = retriever.search(QUESTIONS, 10)
    np.testing.assert_array_equal(top, want)
    settings = json.loads((out / "config_sentence_transformers.json").read_text(encoding="utf-8"))
    assert settings["similarity_fn_name"] == ("dot" if system == "gdsr" else "cosine")
    if system != "zeroshot":  # the tiny base checkpoint has no family prefix
        assert (
            settings["prompts"] == {"query": "query: ", "document": ""} and settings["default_prompt_name"] == "query"
        )


def test_an_export_loads_without_a_missing_weights_report_and_is_byte_identical(export_ws, tmp_path):
    """No "MISSING … newly initialized" report when sentence-transformers loads an export (the pooler
    lexgraph never uses is neither saved nor built), and two exports of one workspace are equal byte
    for byte (the vectors' metadata in sorted order)."""
    import io
    import logging

    from sentence_transformers import SentenceTransformer

    from lexgraph.systems.export import export_system

    first, second = export_system("dsr", export_ws, tmp_path / "a"), export_system("dsr", export_ws, tmp_path / "b")
    assert _tree(first) == _tree(second)
    said = io.StringIO()
    handler = logging.StreamHandler(said)
    library = logging.getLogger("transformers")  # its load report is a warning of this logger's tree
    library.addHandler(handler)
    level = library.level
    library.setLevel(logging.WARNING)  # what the report needs, whatever ran before in this process
    try:
        SentenceTransformer(str(first), device="cpu", trust_remote_code=True)
        config = json.loads((first / "query_0_Transformer" / "sentence_bert_config.json").read_text(encoding="utf-8"))
        config.pop("model_kwargs")  # what the report looks like: the same load, the pooler built
        (first / "query_0_Transformer" / "sentence_bert_config.json").write_text(json.dumps(config), encoding="utf-8")
        clean = said.getvalue()
        SentenceTransformer(str(first), device="cpu", trust_remote_code=True)
    finally:
        library.removeHandler(handler)
        library.setLevel(level)
    assert "MISSING" in said.getvalue()[len(clean) :]  # the check can see a report
    assert "MISSING" not in clean and "newly initialized" not in clean, clean


def test_mteb_evaluate_on_the_workspace_task_gives_lexgraphs_metrics(export_ws):
    """``mteb.evaluate`` (mteb 2) of the adapter on the workspace's test split as a custom retrieval
    task: MTEB encodes both sides through the adapter, ranks and scores; its recall@100, MAP@100 and
    nDCG@10 equal lexgraph's own scores of the system's search (``evaluate_run``), each side the
    system's own."""
    import mteb

    from lexgraph.core.io import read_parquet
    from lexgraph.data.schema import split_questions
    from lexgraph.metrics.ir import evaluate_run
    from lexgraph.systems.mteb_adapter import MTEBEncoder, workspace_task
    from lexgraph.systems.registry import load_retriever

    qids, texts, qrels = split_questions(read_parquet(export_ws / "data" / "clean" / "questions.parquet"), "test")
    for system in ("dsr", "gdsr"):
        ids, _ = load_retriever(system, export_ws, "cpu").search(texts, N_ARTICLES)
        want = evaluate_run({q: row.tolist() for q, row in zip(qids, ids)}, qrels)
        task = workspace_task(export_ws, "test")
        result = mteb.evaluate(MTEBEncoder.load(system, export_ws), task, cache=None, show_progress_bar=False)
        got = result.task_results[0].scores["test"][0]
        for ours, theirs in (("recall@100", "recall_at_100"), ("map@100", "map_at_100"), ("ndcg@10", "ndcg_at_10")):
            assert got[theirs] == pytest.approx(want[ours], abs=1e-4), (system, ours)


def test_the_model_card(export_ws, tmp_path):
    from lexgraph.systems.export import export_system

    out = export_system("dsr", export_ws, tmp_path / "export")
    card = (out / "README.md").read_text(encoding="utf-8")
    assert card.startswith("---\nlibrary_name: sentence-transformers\n")
    assert "- fr" in card.split("---")[1]
    assert "| test | 0.3000 | 0.6000 |" in card  # metrics/dsr.json
    assert "\ndsr:\n" in card and "\nembed:\n" in card and "\ngnn:" not in card  # the exact params
    assert "data/embed/articles.safetensors" in card
    export_system("dsr", export_ws, out)  # an earlier export is replaced


def _one_line(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


def test_bad_input_is_one_line(export_ws, tmp_path, capsys):
    out = str(tmp_path / "out")
    ws = ["--workspace", str(export_ws)]
    assert "unknown system 'dpr'" in _one_line(capsys, ["export", "--system", "dpr", *ws, out])
    err = _one_line(capsys, ["export", "--system", "bm25", *ws, out])
    assert "bm25 is sparse (BM25 over the analysed article texts" in err and "not a dense encoder" in err
    bare = tmp_path / "bare"
    write_articles(bare, {1: "le bail"})
    err = _one_line(capsys, ["export", "--system", "hprior", "--workspace", str(bare), out])
    assert "hprior article embeddings not found; run `dvc repro hprior` first" in err
    (tmp_path / "file").write_text("x", encoding="utf-8")
    assert "is a file" in _one_line(capsys, ["export", "--system", "dsr", *ws, str(tmp_path / "file")])
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep", encoding="utf-8")
    err = _one_line(capsys, ["export", "--system", "dsr", *ws, str(tmp_path / "mine")])
    assert "holds 'notes.txt', which is not a file of an earlier export" in err
    assert (tmp_path / "mine" / "notes.txt").read_text(encoding="utf-8") == "keep"
    inside = str(export_ws / "models" / "dsr_export")
    assert "refusing to write there" in _one_line(capsys, ["export", "--system", "dsr", *ws, inside])
    assert not (tmp_path / "out").exists()


def _tree(root) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def exported(export_ws, tmp_path_factory):
    from lexgraph.systems.export import export_system

    return export_system("dsr", export_ws, tmp_path_factory.mktemp("exported") / "export")


def _web_app(root, _exported):
    (root / "src").mkdir(parents=True)
    (root / "lexgraph_export.json").write_text("{}", encoding="utf-8")
    (root / "notes.txt").write_text("keep", encoding="utf-8")
    (root / "src" / "app.js").write_text("console.log(1)", encoding="utf-8")


def _mine_in(rel):
    def make(root, exported):
        shutil.copytree(exported, root)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("my own notes", encoding="utf-8")

    return make


def _without(key):
    def make(root, exported):
        shutil.copytree(exported, root)
        manifest = json.loads((root / "lexgraph_export.json").read_text(encoding="utf-8"))
        manifest.pop(key, None)
        (root / "lexgraph_export.json").write_text(json.dumps(manifest), encoding="utf-8")

    return make


FOREIGN = {  # a folder OUT must not replace -> the first foreign entry named
    "a record {}": (_web_app, "'lexgraph_export.json', which is not the record of an earlier export"),
    "user's file in an export": (_mine_in("notes.txt"), "'notes.txt', which is not a file of an earlier export"),
    "user's file in its folders": (_mine_in("1_Normalize/x.txt"), "'1_Normalize/x.txt'"),
    "a manifest without the marker": (_without("format"), "which is not the record of an earlier export"),
    "a manifest of an earlier lexgraph": (_without("files"), "which lists none of the files beside it"),
}


@pytest.mark.parametrize("case", list(FOREIGN))
def test_a_folder_that_is_not_provably_an_export_is_never_replaced(export_ws, exported, tmp_path, capsys, case):
    """OUT replaces an earlier export only when its manifest carries the export's marker and the
    folder holds exactly the files it lists: anything else is one line naming the folder and the
    first foreign entry, and nothing is deleted."""
    target = tmp_path / "target"
    make, named = FOREIGN[case]
    make(target, exported)
    before = _tree(target)
    err = _one_line(capsys, ["export", "--system", "dsr", "--workspace", str(export_ws), str(target)])
    assert f"OUT '{target}' holds " in err and named in err and "nothing was deleted" in err, err
    assert _tree(target) == before


def test_an_export_lists_its_own_files_and_is_replaced(export_ws, exported, tmp_path):
    from lexgraph.core.provenance import digest_path
    from lexgraph.systems.export import export_system

    manifest = json.loads((exported / "lexgraph_export.json").read_text(encoding="utf-8"))
    assert manifest["format"] == "lexgraph-export"
    own = [rel for rel in _tree(exported) if rel != "lexgraph_export.json"]
    assert manifest["files"] == {rel: digest_path(exported / rel) for rel in own}
    assert set(manifest["folders"]) == {p.relative_to(exported).as_posix() for p in exported.rglob("*") if p.is_dir()}
    target = tmp_path / "export"
    shutil.copytree(exported, target)
    (target / "README.md").write_text("edited card", encoding="utf-8")  # a listed file: the export's own
    export_system("gdsr", export_ws, target)
    assert json.loads((target / "lexgraph_export.json").read_text(encoding="utf-8"))["system"] == "gdsr"


def test_lexgraph_mteb_writes_mtebs_results_and_says_offline_in_one_line(export_ws, tmp_path, capsys, monkeypatch):
    """``lexgraph mteb`` on the workspace's task writes MTEB's result files (its ResultCache layout,
    the task's scores inside); a registry task whose data set is on the hub, offline, is one line."""
    out = tmp_path / "results"
    assert main(["mteb", "--system", "dsr", "--workspace", str(export_ws), str(out)]) == 0
    assert "LexgraphWorkspace.test test: main score (nDCG@10) " in capsys.readouterr().out
    (result,) = [p for p in out.rglob("LexgraphWorkspace.test.json")]
    scores = json.loads(result.read_text(encoding="utf-8"))["scores"]["test"][0]
    assert {"ndcg_at_10", "map_at_100", "recall_at_100", "main_score"} <= set(scores)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    err = _one_line(
        capsys, ["mteb", "--system", "dsr", "--workspace", str(export_ws), "--task", "BSARDRetrieval.v2", str(out)]
    )
    assert "MTEB task BSARDRetrieval.v2: its data set could not be loaded (HF_HUB_OFFLINE is set" in err
    assert "not a task of mteb" in _one_line(
        capsys, ["mteb", "--system", "dsr", "--workspace", str(export_ws), "--task", "BSARD3", str(out)]
    )

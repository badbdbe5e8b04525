"""`lexgraph export` (issue 26, item 4): a dense system as a folder that sentence-transformers
loads, reproducing lexgraph's own query vectors (cosine >= 0.9999) and its top-10 with the
exported article vectors; the MTEB-style `encode`; bad input in one line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from conftest import ROOT, TINY_WORDS
from helpers_cli import write_articles
from lexgraph.cli.main import main
from lexgraph.encoding.embed import ARTICLE_EMBEDDINGS, save_embeddings

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
    rng = np.random.default_rng(0)
    return {100 + 7 * i: " ".join(rng.choice(TINY_WORDS, size=8)) for i in range(N_ARTICLES)}


@pytest.fixture(scope="module")
def export_ws(tiny_model_dir, tmp_path_factory):
    """A workspace with a tiny ``dsr`` (mean pooling, an E5-like ``query: `` prefix, cosine) and a
    tiny ``gdsr`` (the DSR query encoder, dot product), article ids not 0..n-1, metrics and params."""
    from lexgraph.models.encoders import QueryEncoder

    root = tmp_path_factory.mktemp("export_ws")
    articles = _articles()
    write_articles(root, articles)
    shutil.copy(ROOT / "params.yaml", root / "params.yaml")
    encoder = QueryEncoder.from_pretrained(tiny_model_dir, max_length=32, token_pooling="mean")
    encoder.prefix = "query: "
    encoder.save_pretrained(root / "models" / "dsr" / "query_encoder")
    torch.manual_seed(0)
    save_embeddings(root / "data" / "embed" / "articles.safetensors", list(articles), torch.randn(N_ARTICLES, 16))
    gnn = root / "models" / "gnn_gdsr"
    save_embeddings(gnn / ARTICLE_EMBEDDINGS, list(articles), 3 * torch.randn(N_ARTICLES, 16))
    (gnn / "gnn.json").write_text(json.dumps({"similarity": "dot"}), encoding="utf-8")
    (root / "metrics").mkdir()
    metrics = {"dev": {"recall@100": 0.5, "map": 0.25}, "test": {"recall@100": 0.6, "map": 0.3}}
    (root / "metrics" / "dsr.json").write_text(json.dumps(metrics), encoding="utf-8")
    return root


@pytest.mark.parametrize("system", ["dsr", "gdsr"])
def test_sentence_transformers_loads_an_export_and_reproduces_lexgraph(export_ws, tmp_path, system):
    from safetensors.numpy import load_file
    from sentence_transformers import SentenceTransformer

    from lexgraph.systems.export import VECTORS, QueryEncoderModel
    from lexgraph.systems.registry import load_retriever

    out = tmp_path / "export"
    assert main(["export", "--system", system, "--workspace", str(export_ws), str(out)]) == 0
    model = SentenceTransformer(str(out), device="cpu")
    got = model.encode(QUESTIONS, convert_to_numpy=True)  # (n, dim)
    retriever = load_retriever(system, export_ws, "cpu")
    own = retriever.encode(QUESTIONS).numpy()  # (n, dim)
    cosine = (got * own).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(own, axis=1)
    assert cosine.min() >= 0.9999
    articles = load_file(str(out / VECTORS))
    assert articles["ids"].dtype == np.int64 and articles["ids"].tolist() == sorted(_articles())
    scores = got @ articles["vectors"].T  # (n, na)
    top = articles["ids"][np.argsort(-scores, axis=1, kind="stable")[:, :10]]
    want, _ = retriever.search(QUESTIONS, 10)
    np.testing.assert_array_equal(top, want)
    mteb = QueryEncoderModel.load(system, export_ws, "cpu").encode(QUESTIONS, batch_size=3, task_name="BSARD")
    assert mteb.dtype == np.float32 and mteb.shape == own.shape
    np.testing.assert_allclose(mteb @ articles["vectors"].T, scores, atol=1e-4)
    settings = json.loads((out / "config_sentence_transformers.json").read_text(encoding="utf-8"))
    assert settings["similarity_fn_name"] == ("cosine" if system == "dsr" else "dot")
    assert settings["prompts"] == {"query": "query: "} and settings["default_prompt_name"] == "query"


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
    assert "bm25 is a sparse BM25 index, not a dense encoder" in err
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
    "user's file in its folders": (_mine_in("2_Normalize/x.txt"), "'2_Normalize/x.txt'"),
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

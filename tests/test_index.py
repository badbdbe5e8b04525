"""`lexgraph index` / `lexgraph search --index` (issue 26, item 2): a corpus of one's own, without
questions, encoded with a trained (tiny) workspace's models. The index's bm25, zeroshot and dsr
rank as a brute-force search over the new corpus (BM25 refitted with the workspace's k1 and b;
cosine over the articles encoded from scratch); hits name the user's ids and heading paths; an
interrupted index resumes from its finished blocks to the same vectors; bad input is one line.
Every system over a real trained workspace: tests/test_pipeline.py (slow)."""

from __future__ import annotations

import json
import logging
import re
import shutil

import numpy as np
import polars as pl
import pytest
import torch
from safetensors import safe_open

from helpers_workspace import build_tiny_workspace, random_texts
from lexgraph.cli.main import main

N_CORPUS = 23
QUESTIONS = ["le bail du contrat", "divorce et enfant", "la loi du mariage", "contrat de bail, loyer"]


@pytest.fixture(scope="module")
def tiny_ws(tiny_model_dir, tmp_path_factory):
    return build_tiny_workspace(tmp_path_factory.mktemp("index_ws"), tiny_model_dir)


def _write_corpus(path, texts: list[str]) -> list[dict]:
    records = [
        {"id": f"c-{i:02d}", "text": text, "path": ["Code Z", f"Livre {i % 2}", *([f"Titre {i % 3}"] if i % 4 else [])]}
        for i, text in enumerate(texts)
    ]
    records.append({"id": "short", "text": "loi", "path": []})  # dropped by clean.min_words
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return records[:-1]


@pytest.fixture(scope="module")
def indexed(tiny_ws, tmp_path_factory):
    root = tmp_path_factory.mktemp("index")
    records = _write_corpus(root / "corpus.jsonl", random_texts(N_CORPUS, 2))
    out = root / "idx"
    args = ["index", "--workspace", str(tiny_ws), "--corpus", str(root / "corpus.jsonl"), "--out", str(out)]
    assert main([*args, "--device", "cpu", "--block", "7"]) == 0
    return out, records


def _top(scores: np.ndarray, ids: np.ndarray, k: int) -> np.ndarray:
    order = np.lexsort((np.broadcast_to(ids, scores.shape), -scores), axis=1)[:, :k]  # ties: the lower id
    return ids[order]


def test_index_searches_as_brute_force_over_the_new_corpus(tiny_ws, indexed):
    from lexgraph.data.clean import clean_text
    from lexgraph.methods.zeroshot.system import ZeroshotConfig, article_encoder, load_system
    from lexgraph.models.dsr import DSR
    from lexgraph.search.bm25 import BM25
    from lexgraph.systems.registry import load_retriever

    out, records = indexed
    texts = [clean_text(r["text"])[0] for r in records]
    ids = np.arange(len(records))  # lexgraph's ids: file order
    k = 10
    reference = BM25(k1=0.9, b=0.4).fit_texts(texts, ids.tolist())
    got = load_retriever("bm25", tiny_ws, "cpu", corpus=out).search(QUESTIONS, k)
    want = reference.search(QUESTIONS, k)
    assert (got[1] > 0).sum() > 10  # the questions match articles
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)

    dsr = DSR.load(tiny_ws / "models" / "dsr")  # the article side from the texts, not from chunk caches
    from lexgraph.core.config import load_params

    config = ZeroshotConfig.from_params(load_params("zeroshot", tiny_ws / "params.yaml")[1])
    zeroshot = article_encoder(tiny_ws / "models" / "pretrain", config).eval()
    brute = {
        "dsr": (dsr.encode_queries(QUESTIONS), dsr.encode_articles(texts)),
        "zeroshot": (load_system(tiny_ws, "cpu").encode(QUESTIONS), zeroshot.encode(texts)),
    }
    for system, (queries, articles) in brute.items():
        scores = torch.nn.functional.normalize(queries, dim=-1) @ torch.nn.functional.normalize(articles, dim=-1).T
        retriever = load_retriever(system, tiny_ws, "cpu", corpus=out)
        top, top_scores = retriever.search(QUESTIONS, k)
        np.testing.assert_allclose(top_scores, np.sort(scores.numpy(), axis=1)[:, ::-1][:, :k], atol=1e-5)
        assert (top == _top(scores.numpy(), ids, k)).mean() > 0.95, system  # near-ties may swap


def test_hits_name_the_users_ids_and_heading_paths(tiny_ws, indexed, tmp_path, capsys):
    out, records = indexed
    by_id = {r["id"]: r for r in records}
    for system in ("bm25", "zeroshot", "dsr"):
        argv = ["search", "--workspace", str(tiny_ws), "--index", str(out), "--system", system, "--json", "--top", "5"]
        assert main([*argv, QUESTIONS[0]]) == 0
        hits = json.loads(capsys.readouterr().out)["hits"]
        assert len(hits) == 5
        for hit in hits:
            assert hit["id"] in by_id, system
            assert hit["path"] == by_id[hit["id"]]["path"], system
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"id": f"q{i}", "question": q}) + "\n" for i, q in enumerate(QUESTIONS)))
    run = tmp_path / "dsr.trec"
    argv = ["search", "--workspace", str(tiny_ws), "--index", str(out), "--system", "dsr", "--k", "4"]
    assert main([*argv, "--questions", str(questions), "--run", str(run)]) == 0
    lines = [line.split() for line in run.read_text().splitlines()]
    assert len(lines) == 4 * len(QUESTIONS) and {line[2] for line in lines} <= set(by_id)
    record = json.loads((out / "index.json").read_text())

    assert record["articles"] == len(records) and record["corpus"]["file"] == "corpus.jsonl"
    assert sorted(record["systems"]) == ["bm25", "dsr", "zeroshot"]
    keys = pl.read_parquet(out / "data" / "clean" / "keys.parquet")
    assert "short" not in keys["key"].to_list()  # dropped by clean, as the workspace's clean stage drops it


def test_an_interrupted_index_resumes_from_its_blocks(tiny_ws, indexed, tmp_path, monkeypatch, caplog):
    import lexgraph.encoding.chunk_blocks as blocks
    from lexgraph.encoding.embed import load_embeddings

    done, records = indexed
    corpus = done.parent / "corpus.jsonl"
    out = tmp_path / "idx"
    calls = []
    real = blocks.encode_chunk_table

    def interrupted(*args, **kwargs):
        calls.append(len(args[1]))
        if calls == [7, 7, 7]:  # Ctrl-C in the third block, once
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(blocks, "encode_chunk_table", interrupted)
    argv = ["index", "--workspace", str(tiny_ws), "--corpus", str(corpus), "--out", str(out), "--device", "cpu"]
    assert main([*argv, "--block", "7"]) == 130  # "lexgraph index: interrupted", as Ctrl-C
    assert not (out / "index.json").exists() and len(list(out.glob(".partial/*/articles-*"))) == 2
    calls.clear()
    with caplog.at_level(logging.INFO):
        assert main([*argv, "--block", "7"]) == 0
    assert calls == [7, 2, 7, 2]  # the articles' third and fourth blocks, then the 9 headings
    assert any("2 of 4 blocks already encoded" in r.getMessage() for r in caplog.records)
    assert not (out / ".partial").exists()
    for name in ("data/embed/articles.safetensors", "data/zeroshot/articles.safetensors"):
        a, b = load_embeddings(out / name), load_embeddings(done / name)
        assert np.array_equal(a[0], b[0]) and torch.equal(a[1], b[1]), name


def test_index_says_what_it_indexes_before_loading_anything(tiny_ws, tmp_path, monkeypatch, caplog):
    """Issue 41, item 5a: `lexgraph index` printed nothing for 144 s. Its first line names the corpus,
    the index and the workspace once the arguments are checked, before torch is imported
    (``resolve_device``, refused here, imports it) and before any model loads."""
    import lexgraph.core.config as config
    from lexgraph.core.errors import LexgraphError

    def refused(*args, **kwargs):
        raise LexgraphError("no device in this test")

    corpus = tmp_path / "corpus.jsonl"
    _write_corpus(corpus, random_texts(5, 3))
    monkeypatch.setattr(config, "resolve_device", refused)
    argv = ["index", "--workspace", str(tiny_ws), "--corpus", str(corpus), "--out", str(tmp_path / "idx")]
    with caplog.at_level(logging.INFO, logger="lexgraph"):
        assert main([*argv, "--systems", "bm25", "dsr"]) == 2
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("lexgraph")]
    assert lines == [
        f"index: indexing {str(corpus)!r} into {str(tmp_path / 'idx')!r} with the models of "
        f"{str(tiny_ws.resolve())!r} (bm25, dsr); torch and the models load first"
    ]
    assert not (tmp_path / "idx").exists()


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_bad_input_is_one_line(tiny_ws, indexed, tmp_path, capsys):
    out, records = indexed
    bad = tmp_path / "dup.jsonl"
    bad.write_text(json.dumps(records[0]) + "\n" + json.dumps(records[0]) + "\n", encoding="utf-8")
    argv = ["index", "--workspace", str(tiny_ws), "--corpus", str(bad), "--out", str(tmp_path / "x")]
    assert main(argv) == 2
    line = _error(capsys)
    assert str(bad) in line and "'c-00' is already used" in line
    assert not (tmp_path / "x").exists()

    other = tmp_path / "other"
    (other / "notes").mkdir(parents=True)
    assert main([*argv[:4], str(out.parent / "corpus.jsonl"), "--out", str(other)]) == 2
    assert "which is not a file of an earlier index (no index.json there)" in _error(capsys)

    inside = tiny_ws / "models" / "idx"  # under the workspace's models/, which DVC owns
    assert main([*argv[:4], str(out.parent / "corpus.jsonl"), "--out", str(inside)]) == 2
    assert "refusing to write there" in _error(capsys) and not inside.exists()

    search = ["search", "--workspace", str(tiny_ws), "--index", str(out), QUESTIONS[0]]
    assert main([*search, "--system", "gdsr"]) == 2
    assert "index.json: no gdsr in this index (it holds bm25, dsr, zeroshot)" in _error(capsys)

    ws = tmp_path / "ws"
    shutil.copytree(tiny_ws, ws)  # the workspace's DSR retrained after indexing
    settings = ws / "models" / "dsr" / "dsr.json"
    settings.write_text(settings.read_text().replace('"temperature": 0.05', '"temperature": 0.1'), encoding="utf-8")
    assert main(["search", "--workspace", str(ws), "--index", str(out), "--system", "dsr", QUESTIONS[0]]) == 2
    line = _error(capsys)
    assert f"{out / 'index.json'}: dsr was indexed with another models/dsr than the workspace" in line
    assert main(["search", "--workspace", str(ws), "--index", str(out), "--system", "bm25", QUESTIONS[0]]) == 0


def test_a_corpus_without_headings_indexes(tiny_ws, tmp_path, capsys):
    """Paths all empty (a flat corpus): no heading to encode, the articles are searched as well."""
    corpus = tmp_path / "flat.csv"
    rows = [f'a{i},"{text}",[]' for i, text in enumerate(random_texts(12, 3))]
    corpus.write_text("id,text,path\n" + "\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "idx"
    argv = ["index", "--workspace", str(tiny_ws), "--corpus", str(corpus), "--out", str(out), "--systems", "dsr"]
    assert main(argv) == 0
    assert json.loads((out / "index.json").read_text())["headings"] == 0
    capsys.readouterr()
    search = ["search", "--workspace", str(tiny_ws), "--index", str(out), "--system", "dsr", "--json", "--top", "12"]
    assert main([*search, QUESTIONS[1]]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert sorted(h["id"] for h in hits) == sorted(f"a{i}" for i in range(12)) and all(h["path"] == [] for h in hits)


def test_each_graph_system_is_indexed_on_the_vectors_of_its_own_first_stage(tmp_path, monkeypatch):
    """A graph encoder trained on QABISAR's own first stage (gnn.json's ``first_stage``:
    models/dsr_qabisar) is applied to the corpus vectors of that DSR (data/embed_qabisar, written
    once), the others (and one trained before the key existed) to G-DSR's DSR's (data/embed)."""
    from lexgraph.core import layout
    from lexgraph.encoding.embed import load_embeddings, save_embeddings
    from lexgraph.methods.catalog import declared
    from lexgraph.methods.gnn import inductive
    from lexgraph.methods.gnn import system as gnn
    from lexgraph.systems import corpus_index

    ws, root = tmp_path / "ws", tmp_path / "idx"
    recorded = {"gdsr": "models/dsr", "qabisar": "models/dsr_qabisar", "hgraph": None}
    for system, first in recorded.items():
        layout.GNN[system].under(ws).mkdir(parents=True)
        saved = {"similarity": "cosine", **({"first_stage": first} if first else {})}
        layout.GNN[system].under(ws, "gnn.json").write_text(json.dumps(saved), encoding="utf-8")
    assert gnn.first_stage("qabisar", ws) == layout.DSR_QABISAR
    assert gnn.first_stage("hgraph", ws) == layout.DSR
    ids = np.array([4, 9])
    written = []

    def fake_embed(articles, headings, chunks, workspace, out, device, dsr=layout.DSR):
        written.append(dsr)
        for name in ("articles", "headings"):  # each DSR's vectors: a constant of its own
            save_embeddings(out / f"{name}.safetensors", ids, torch.full((2, 3), float(len(str(dsr.path)))))

    class Graph:
        article_ids = torch.tensor(ids)

    monkeypatch.setattr(corpus_index, "write_embed", fake_embed)
    monkeypatch.setattr(inductive, "corpus_graph", lambda *a: Graph())
    monkeypatch.setattr(inductive, "graph_vectors", lambda system, ws, g, embeddings, device: embeddings["articles"][1])
    job = corpus_index.IndexJob(None, None, ws, root, root / ".partial", "cpu", 1, None)
    job._chunks = (None,)  # a fine-tuned chunk encoder: no chunk vectors to write
    job.embed(layout.DSR)  # dsr's side, written before the graph systems' (the registry's order)
    for system in recorded:
        declared(system).index(job)
    assert written == [layout.DSR, layout.DSR_QABISAR]  # data/embed_qabisar written once, for qabisar
    for system, dsr in (("gdsr", layout.DSR), ("qabisar", layout.DSR_QABISAR), ("hgraph", layout.DSR)):
        _, vectors = load_embeddings(layout.GNN[system].under(root, "article_embeddings.safetensors"))
        assert vectors.eq(len(str(dsr.path))).all(), system


# --- issue 40: hostile input, round five ----------------------------------------------------------


def _tree(root) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _web_app(root, _indexed_out=None):
    (root / "src").mkdir(parents=True)
    (root / "index.json").write_text('{"name": "my web app"}', encoding="utf-8")
    (root / "notes.txt").write_text("keep", encoding="utf-8")
    (root / "src" / "app.js").write_text("console.log(1)", encoding="utf-8")


def _user_file_in_index(root, indexed_out, rel):
    shutil.copytree(indexed_out, root)
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text("my own notes", encoding="utf-8")


def _record_edit(root, indexed_out, change):
    shutil.copytree(indexed_out, root)
    record = json.loads((root / "index.json").read_text(encoding="utf-8"))
    change(record)
    (root / "index.json").write_text(json.dumps(record), encoding="utf-8")


def _link_in_index(root, indexed_out):
    shutil.copytree(indexed_out, root)
    (root / "data" / "clean" / "elsewhere").symlink_to(indexed_out.parent)


FOREIGN = {  # a folder --out must not replace -> the first foreign entry named
    "web app with an index.json": (_web_app, "'index.json', which is not the record of an earlier index"),
    "user's file in an index": (lambda r, o: _user_file_in_index(r, o, "notes.txt"), "'notes.txt'"),
    "user's file deep in an index": (lambda r, o: _user_file_in_index(r, o, "data/clean/mine.txt"), "mine.txt'"),
    "user's folder in the blocks": (lambda r, o: _user_file_in_index(r, o, ".partial/mine/a.txt"), "'.partial/mine'"),
    "record without the marker": (
        lambda r, o: _record_edit(r, o, lambda rec: rec.pop("format")),
        "which is not the record of an earlier index",
    ),
    "record listing no files (v1)": (
        lambda r, o: _record_edit(r, o, lambda rec: [rec.pop("files", None), rec.update(version=1)]),
        "which lists none of the files beside it",
    ),
    "a link in an index": (_link_in_index, "'data/clean/elsewhere'"),
}


@pytest.mark.parametrize("case", list(FOREIGN))
def test_a_folder_that_is_not_provably_an_index_is_never_replaced(tiny_ws, indexed, tmp_path, capsys, case):
    """`--out` replaces an earlier index only when index.json carries the index's marker and the
    folder holds exactly what it lists (or an interrupted run's blocks): anything else is one line
    naming the folder and the first foreign entry, and nothing is deleted."""
    out, _ = indexed
    target = tmp_path / "target"
    make, named = FOREIGN[case]
    make(target, out)
    before = _tree(target)
    argv = ["index", "--workspace", str(tiny_ws), "--corpus", str(out.parent / "corpus.jsonl"), "--out", str(target)]
    assert main([*argv, "--systems", "bm25"]) == 2
    line = _error(capsys)
    assert f"--out '{target}' holds " in line and named in line and "nothing was deleted" in line, line
    assert _tree(target) == before


def test_an_earlier_index_is_replaced_and_lists_its_own_files(tiny_ws, indexed, tmp_path, capsys):
    """Exactly its own files (an interrupted run's blocks besides) is an earlier index: replaced whole."""
    out, _ = indexed
    record = json.loads((out / "index.json").read_text(encoding="utf-8"))
    assert record["format"] == "lexgraph-index" and record["version"] == 2
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*")}
    assert set(record["files"]) | set(record["folders"]) | {"index.json"} == on_disk
    target = tmp_path / "idx"
    shutil.copytree(out, target)
    blocks = target / ".partial" / ("0" * 32)
    blocks.mkdir(parents=True)
    (blocks / "articles-0000000000.safetensors").write_bytes(b"block")
    argv = ["index", "--workspace", str(tiny_ws), "--corpus", str(out.parent / "corpus.jsonl"), "--out", str(target)]
    assert main([*argv, "--systems", "bm25"]) == 0
    assert sorted(json.loads((target / "index.json").read_text(encoding="utf-8"))["systems"]) == ["bm25"]
    assert not (target / "data" / "embed").exists() and not (target / ".partial").exists()


DAMAGE = {  # a change to an index's files after `lexgraph index` wrote them -> the file search names
    "deleted key": ("bm25", "data/clean/keys.parquet", lambda df: df.slice(1)),
    "swapped keys": (
        "bm25",
        "data/clean/keys.parquet",
        lambda df: df.with_columns(pl.Series("key", [df["key"][1], df["key"][0], *df["key"][2:]])),
    ),
    "duplicated key": (
        "bm25",
        "data/clean/keys.parquet",
        lambda df: df.with_columns(pl.Series("key", [df["key"][0], *df["key"][:-1]])),
    ),
    "edited article": (
        "dsr",
        "data/clean/articles.parquet",
        lambda df: df.with_columns(pl.col("article").str.replace("^", "x ")),
    ),
}


def _scale_one_vector(path, factor=1e30):
    from lexgraph.encoding.embed import load_embeddings, save_embeddings

    ids, vectors = load_embeddings(path)
    vectors[3] *= factor
    save_embeddings(path, ids, vectors)


@pytest.mark.parametrize("case", [*DAMAGE, "vector scaled by 1e30", "unlisted file", "v1 index"])
def test_a_damaged_index_is_refused_before_use(tiny_ws, indexed, tmp_path, capsys, case):
    """The index records the SHA-256 of its own files; `search --index` (and `serve --index`, through
    the same checks) verifies those it reads before use: one line naming the file and `lexgraph index`."""
    from lexgraph.core.errors import LexgraphError
    from lexgraph.systems.registry import load_retriever

    out, _ = indexed
    damaged = tmp_path / "idx"
    shutil.copytree(out, damaged)
    if case in DAMAGE:
        system, rel, change = DAMAGE[case]
        change(pl.read_parquet(damaged / rel)).write_parquet(damaged / rel)
        named = f"{damaged / rel}: changed since `lexgraph index` wrote it"
    elif case == "vector scaled by 1e30":
        system, rel = "dsr", "data/embed/articles.safetensors"
        _scale_one_vector(damaged / rel)
        named = f"{damaged / rel}: changed since `lexgraph index` wrote it"
    elif case == "unlisted file":
        system = "dsr"
        (damaged / "data" / "embed_qabisar").mkdir()
        (damaged / "data" / "embed_qabisar" / "articles.safetensors").write_bytes(b"x")
        named = f"{damaged / 'data' / 'embed_qabisar'}: not a file of this index (index.json does not list it"
    else:
        system = "bm25"
        record = json.loads((damaged / "index.json").read_text(encoding="utf-8"))
        record.update(version=1)
        (damaged / "index.json").write_text(json.dumps(record), encoding="utf-8")
        named = f"{damaged / 'index.json'}: not a record of `lexgraph index` v2: 'version' = 1, expected 2, the format"
    argv = ["search", "--workspace", str(tiny_ws), "--index", str(damaged), "--system", system, "--json"]
    assert main([*argv, QUESTIONS[0]]) == 2
    line = _error(capsys)
    remedy = f"move it out of '{damaged}'" if case == "unlisted file" else "run `lexgraph index --corpus FILE --out"
    assert line.startswith(f"lexgraph search: error: {named}") and remedy in line, line
    with pytest.raises(LexgraphError, match=re.escape(named)):  # what `serve --index` loads each system with
        load_retriever(system, tiny_ws, "cpu", corpus=damaged)


def test_a_system_is_verified_on_its_own_files(tiny_ws, indexed, tmp_path, capsys):
    """A damaged DSR side leaves BM25 searchable: each system checks the files it reads."""
    out, _ = indexed
    damaged = tmp_path / "idx"
    shutil.copytree(out, damaged)
    _scale_one_vector(damaged / "data" / "embed" / "articles.safetensors")
    argv = ["search", "--workspace", str(tiny_ws), "--index", str(damaged), "--json"]
    assert main([*argv, "--system", "bm25", QUESTIONS[0]]) == 0
    capsys.readouterr()
    assert main([*argv, "--system", "dsr", QUESTIONS[0]]) == 2
    assert "data/embed/articles.safetensors: changed since" in _error(capsys)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e30])
def test_an_unusable_vector_is_refused_at_write_time(tiny_ws, indexed, tmp_path, capsys, monkeypatch, value):
    """A model that gives a non-finite or absurd vector (here: DSR's article encoder, for one article)
    leaves no index: one line naming the file, the tensor and the row; an earlier index stays."""
    import lexgraph.encoding.chunks as chunks

    real = chunks.embed_from_chunks

    def broken(*args, **kwargs):
        vectors = real(*args, **kwargs).clone()
        vectors[2, 0] = value
        return vectors

    monkeypatch.setattr(chunks, "embed_from_chunks", broken)
    out, _ = indexed
    target = tmp_path / "idx"
    shutil.copytree(out, target)
    before = _tree(target)
    argv = ["index", "--workspace", str(tiny_ws), "--corpus", str(out.parent / "corpus.jsonl"), "--out", str(target)]
    assert main([*argv, "--systems", "dsr"]) == 2
    line = _error(capsys)
    assert f"{target / 'data' / 'embed' / 'articles.safetensors'}: tensor 'embeddings', row 2 holds" in line, line
    assert "the index was not written" in line
    assert {k: v for k, v in _tree(target).items() if not k.startswith(".partial/")} == before  # blocks kept


def test_a_stale_workspace_is_refused_before_any_encoding(tiny_ws, indexed, tmp_path, capsys, monkeypatch):
    """`lexgraph index` checks the workspace as `search --index` would, before reading the corpus."""
    from lexgraph.core.provenance import RECORD
    from lexgraph.systems import corpus_index

    ws = tmp_path / "ws"
    shutil.copytree(tiny_ws, ws)
    stale = {"stage": "bm25", "inputs": {"articles": {"path": "data/clean/articles.parquet", "digest": "0" * 64}}}
    (ws / "models" / "bm25" / RECORD).write_text(json.dumps(stale), encoding="utf-8")

    def never(*args, **kwargs):
        raise AssertionError("the corpus was read and encoded for a stale workspace")

    monkeypatch.setattr(corpus_index, "clean_corpus", never)
    out, _ = indexed
    argv = ["index", "--workspace", str(ws), "--corpus", str(out.parent / "corpus.jsonl"), "--out", str(tmp_path / "x")]
    assert main(argv) == 2
    line = _error(capsys)
    assert f"{ws / 'models' / 'bm25'} was built from another {ws / 'data' / 'clean' / 'articles.parquet'}" in line
    assert not (tmp_path / "x").exists()


def _surrogate_corpus(path, field):
    records = [{"id": f"a{i}", "text": "le bail du contrat de location", "path": ["Code", "Livre"]} for i in range(6)]
    records[3] = {**records[3], **({"path": ["Code", "Li\udc80vre"]} if field == "path" else {field: "le \udc80 bail"})}
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


@pytest.mark.parametrize("field", ["text", "path", "title"])
def test_a_lone_surrogate_in_a_corpus_text_is_one_line(tiny_ws, tmp_path, capsys, field):
    corpus = tmp_path / "c.jsonl"
    _surrogate_corpus(corpus, field)
    argv = ["index", "--workspace", str(tiny_ws), "--corpus", str(corpus), "--out", str(tmp_path / "x")]
    assert main(argv) == 2
    line = _error(capsys)
    assert f"{corpus}, row 4, column '{field}': " in line and "lone surrogate" in line, line
    assert "Traceback" not in line and not (tmp_path / "x").exists()


@pytest.mark.parametrize("kind", ["fifo", "devnull", "directory"])
def test_a_corpus_that_is_no_file_is_said_as_what_it_is(tiny_ws, tmp_path, capsys, kind):
    import os

    if kind == "fifo":
        corpus = tmp_path / "corpus.jsonl"
        os.mkfifo(corpus)
        said = "a named pipe (FIFO), not a regular file"
    elif kind == "devnull":
        corpus, said = "/dev/null", "a character device (such as /dev/null), not a regular file"
    else:
        corpus, said = tmp_path, "a directory, not a regular file"
    argv = ["index", "--workspace", str(tiny_ws), "--corpus", str(corpus), "--out", str(tmp_path / "x")]
    assert main(argv) == 2
    line = _error(capsys)
    assert f"{corpus}: {said}; expected a JSON-lines, CSV or Parquet file" in line and "not found" not in line


# --- issue 44: an index that follows the law article by article --------------------------------


def _counting_encoder(monkeypatch) -> list[int]:
    """Texts the chunk backbone encodes, per call (lexgraph.encoding.chunk_blocks' encode_chunk_table),
    each call in shape-stable batches (a text's vectors then do not depend on its companions)."""
    from lexgraph.encoding import chunk_blocks

    calls: list[int] = []
    real = chunk_blocks.encode_chunk_table

    def counted(encoder, ids, texts, *args, **kwargs):
        assert kwargs.get("stable") is True
        calls.append(len(texts))
        return real(encoder, ids, texts, *args, **kwargs)

    monkeypatch.setattr(chunk_blocks, "encode_chunk_table", counted)
    return calls


def test_an_update_encodes_only_what_changed_and_equals_a_fresh_index(tiny_ws, tmp_path, monkeypatch, caplog):
    """An amended corpus (3 articles amended, 2 repealed, 2 new, the rest moved down a row) indexed
    over the earlier index encodes the 5 new texts only, and gives the very bytes of a fresh index
    of the amended corpus: every table, vector and index.json."""
    texts = random_texts(N_CORPUS, 7)
    _write_corpus(tmp_path / "v1.jsonl", texts)
    amended = list(texts)
    for i in (2, 9, 15):
        amended[i] = texts[i] + " bail loyer"  # amended
    del amended[20], amended[4]  # repealed
    amended = [*random_texts(2, 99), *amended]  # new, in front: every later row moves
    _write_corpus(tmp_path / "v2.jsonl", amended)
    args = ["index", "--workspace", str(tiny_ws), "--device", "cpu", "--block", "4"]
    assert main([*args, "--corpus", str(tmp_path / "v1.jsonl"), "--out", str(tmp_path / "idx")]) == 0
    calls = _counting_encoder(monkeypatch)
    with caplog.at_level(logging.INFO, logger="lexgraph.systems.corpus_index"):
        assert main([*args, "--corpus", str(tmp_path / "v2.jsonl"), "--out", str(tmp_path / "idx")]) == 0
    assert sum(calls) == 5  # 3 amended + 2 new articles; no heading is new
    assert f"articles: {len(amended) - 5} of {len(amended)} reused from the earlier index, 5 encoded" in caplog.text
    calls.clear()
    assert main([*args, "--corpus", str(tmp_path / "v2.jsonl"), "--out", str(tmp_path / "fresh")]) == 0
    assert sum(calls) > len(amended)  # every article and heading encoded
    updated, fresh = _tree(tmp_path / "idx"), _tree(tmp_path / "fresh")
    assert updated.keys() == fresh.keys()
    assert [rel for rel in updated if updated[rel] != fresh[rel]] == []
    with safe_open(str(tmp_path / "idx" / "data" / "chunks" / "articles.safetensors"), "pt") as fh:
        assert fh.metadata()["batching"].startswith("stable rows=")  # what the next update checks


def test_a_damaged_earlier_index_is_not_reused(tiny_ws, tmp_path, monkeypatch, caplog):
    """Chunk vectors edited after indexing are never copied into the next index: every text is encoded."""
    _write_corpus(tmp_path / "c.jsonl", random_texts(9, 8))
    args = ["index", "--workspace", str(tiny_ws), "--device", "cpu", "--corpus", str(tmp_path / "c.jsonl")]
    assert main([*args, "--out", str(tmp_path / "idx")]) == 0
    chunks = tmp_path / "idx" / "data" / "chunks" / "articles.safetensors"
    data = bytearray(chunks.read_bytes())
    data[-1] ^= 1  # the last byte of the last vector
    chunks.write_bytes(bytes(data))
    calls = _counting_encoder(monkeypatch)
    with caplog.at_level(logging.INFO, logger="lexgraph.systems.corpus_index"):
        assert main([*args, "--out", str(tmp_path / "idx")]) == 0
    assert "nothing of the earlier index" in caplog.text and sum(calls) >= 9
    assert main([*args, "--out", str(tmp_path / "fresh")]) == 0
    assert _tree(tmp_path / "idx") == _tree(tmp_path / "fresh")


def test_an_update_with_nothing_to_reuse_or_no_headings_equals_a_fresh_index(tiny_ws, tmp_path, monkeypatch):
    """A flat corpus (no heading: an empty table both times) indexed again into its own DIR, then
    another corpus of which no text is in the earlier index: each equals a fresh index of it."""
    flat = tmp_path / "flat.csv"
    rows = [f'a{i},"{text}",[]' for i, text in enumerate(random_texts(6, 4))]
    flat.write_text("id,text,path\n" + "\n".join(rows) + "\n", encoding="utf-8")
    other = tmp_path / "other.jsonl"
    _write_corpus(other, random_texts(8, 5))
    args = ["index", "--workspace", str(tiny_ws), "--device", "cpu", "--systems", "dsr"]
    assert main([*args, "--corpus", str(flat), "--out", str(tmp_path / "idx")]) == 0
    calls = _counting_encoder(monkeypatch)
    assert main([*args, "--corpus", str(flat), "--out", str(tmp_path / "idx")]) == 0
    assert sum(calls) == 0  # all six articles reused, no heading
    assert main([*args, "--corpus", str(flat), "--out", str(tmp_path / "fresh_flat")]) == 0
    assert _tree(tmp_path / "idx") == _tree(tmp_path / "fresh_flat")
    calls.clear()
    assert main([*args, "--corpus", str(other), "--out", str(tmp_path / "idx")]) == 0
    reencoded = sum(calls)
    assert main([*args, "--corpus", str(other), "--out", str(tmp_path / "fresh_other")]) == 0
    assert reencoded == sum(calls) - reencoded > 8  # every article and heading, as a fresh run
    assert _tree(tmp_path / "idx") == _tree(tmp_path / "fresh_other")

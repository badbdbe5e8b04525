"""fetch: the three sources, the dev carve, and bad inputs (clear errors, no outputs left)."""

from __future__ import annotations

import subprocess
import sys

import polars as pl
import pytest

from conftest import ROOT, section, write_params, write_questions
from lexgraph.core.errors import ConfigError, DataError, HubUnreachableError
from lexgraph.data.fetch import FetchConfig, carve_dev, fetch

PARAMS = {"source": "local", "dev_fraction": 0.34, "synthetic": False, "hub_repo": "x", "revision": None}


def fetch_config(values: dict) -> FetchConfig:
    """The ``fetch`` section of params.yaml with ``values`` (a complete, typed section)."""
    return FetchConfig.from_params(section("fetch", **values))


def test_sample_source_reads_embedded_sample_with_its_ids_and_splits():
    articles, questions, negatives = fetch(
        fetch_config({"source": "sample", "sample_dir": str(ROOT / "data/sample")}), seed=1
    )
    assert articles.height == 2760
    assert articles["id"].to_list() == list(range(1, 2761))
    counts = dict(questions.group_by("split").len().iter_rows())
    assert counts == {"train": 225, "dev": 39, "test": 66}
    # ids kept from the source
    first = questions.filter(pl.col("id") == 1).row(0, named=True)
    assert first["split"] == "train" and first["article_ids"] == "1029,1094"
    assert negatives.height == 0


def test_local_source_carves_dev_and_reads_negatives(bsard_dir):
    articles, questions, negatives = fetch(
        fetch_config({**PARAMS, "local_dir": str(bsard_dir), "synthetic": True, "negatives": True}), seed=3
    )
    assert articles.height == 5 and articles["code"].to_list()[3] == "Code B"
    splits = dict(questions.group_by("split").len().iter_rows())
    assert splits["train"] + splits.get("dev", 0) == 6 and splits["test"] == 2 and splits["synthetic"] == 2
    assert sorted(negatives.filter(pl.col("split") == "train")["question_id"].to_list()) == [1, 2]
    assert negatives.filter(pl.col("split") == "synthetic")["article_ids"].to_list() == [[3]]


def test_hub_source_through_datasets_load_dataset(hub_dir):
    """The real `datasets.load_dataset` path, pointed at a local copy of the hub's layout."""
    params = {**PARAMS, "source": "hub", "hub_repo": str(hub_dir), "synthetic": True, "negatives": True}
    articles, questions, negatives = fetch(fetch_config(params), seed=3)
    local = fetch(fetch_config({**PARAMS, "local_dir": str(hub_dir), "synthetic": True, "negatives": True}), seed=3)
    assert negatives.height == 3
    assert articles.sort("id").equals(local[0].sort("id"))
    assert questions.sort("split", "id").equals(local[1].sort("split", "id"))
    assert negatives.sort("split", "question_id").equals(local[2].sort("split", "question_id"))


def test_hub_unreachable_is_one_sentence(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubUnreachableError) as err:
        fetch(fetch_config({**PARAMS, "source": "hub", "hub_repo": "maastrichtlawtech/bsard"}), seed=1)
    msg = str(err.value)
    assert "fetch.source=local" in msg and "\n" not in msg


def test_dev_carve_is_deterministic_and_leak_free():
    qs = [f"question numéro {i} ?" for i in range(200)] + ["Même texte ?"] * 5 + ["Déjà au test ?"]
    train = pl.DataFrame({"id": list(range(len(qs))), "question": qs})
    test = pl.DataFrame({"id": [999], "question": ["déjà   au TEST ?"]})
    a_train, a_dev = carve_dev(train, test, 0.2, seed=7)
    b_train, b_dev = carve_dev(train.reverse(), test, 0.2, seed=7)
    assert sorted(a_dev["id"].to_list()) == sorted(b_dev["id"].to_list())  # order-independent
    assert 20 < a_dev.height < 60
    assert not set(a_train["question"]) & set(a_dev["question"])  # no text in both
    assert "Déjà au test ?" not in a_dev["question"].to_list()
    _, other = carve_dev(train, test, 0.2, seed=8)
    assert sorted(other["id"].to_list()) != sorted(a_dev["id"].to_list())


def test_dev_carve_keeps_questions_that_are_the_same_question_together():
    """Texts equal under NFKC (full-width letters) are one question: never split between train
    and dev (fetch would then refuse the pair as leakage)."""
    qs = [f"question numéro {i} ?" for i in range(50)] + ["Le bail est-il résilié ?", "\uff2ce bail est-il résilié"]
    train = pl.DataFrame({"id": list(range(len(qs))), "question": qs})
    test = pl.DataFrame({"id": [999], "question": ["Autre question ?"]})
    for seed in range(30):
        _, dev = carve_dev(train, test, 0.3, seed=seed)
        in_dev = set(dev["id"].to_list())
        assert (50 in in_dev) == (51 in in_dev), seed


# ----------------------------------------------------------------------------- bad inputs


def test_unknown_source():
    with pytest.raises(ConfigError, match="fetch.source.*expected one of sample, hub, local"):
        fetch(fetch_config({**PARAMS, "source": "ftp"}), seed=1)


def test_missing_column(bsard_dir):
    text = (bsard_dir / "articles.csv").read_text(encoding="utf-8").replace("id,article,", "ident,article,", 1)
    (bsard_dir / "articles.csv").write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=r"articles\.csv: missing column\(s\) \['id'\]"):
        fetch(fetch_config({**PARAMS, "local_dir": str(bsard_dir)}), seed=1)


def test_empty_file(bsard_dir):
    (bsard_dir / "questions_train.csv").write_text("", encoding="utf-8")
    with pytest.raises(DataError, match=r"questions_train\.csv: file is empty"):
        fetch(fetch_config({**PARAMS, "local_dir": str(bsard_dir)}), seed=1)


def test_bad_encoding(bsard_dir):
    (bsard_dir / "questions_test.csv").write_bytes("id,question,article_ids\n1,Où est le mur ?,3\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"questions_test\.csv: not valid UTF-8 at byte \d+ \(line 2\)"):
        fetch(fetch_config({**PARAMS, "local_dir": str(bsard_dir)}), seed=1)


def test_non_integer_id(bsard_dir):
    write_questions(bsard_dir / "questions_test.csv", [(7, "ok ?", "3"), ("sept", "pas ok ?", "3")])
    with pytest.raises(DataError, match=r"questions_test\.csv, row 2, column 'id': id 'sept' is not an integer"):
        fetch(fetch_config({**PARAMS, "local_dir": str(bsard_dir)}), seed=1)


def _run_stage(tmp_path, params: dict):
    write_params(tmp_path / "params.yaml", base={"seed": 1, "device": "cpu"}, fetch=params)
    out = tmp_path / "raw"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "stages/fetch.py"), "--params", str(tmp_path / "params.yaml"), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    return proc, out


def test_stage_writes_outputs(tmp_path, bsard_dir):
    proc, out = _run_stage(tmp_path, {**PARAMS, "local_dir": str(bsard_dir)})
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["articles.parquet", "negatives.parquet", "questions.parquet"]


def test_stage_bad_input_exits_nonzero_with_one_line_and_no_outputs(tmp_path, bsard_dir):
    (bsard_dir / "articles.csv").write_text("", encoding="utf-8")
    proc, out = _run_stage(tmp_path, {**PARAMS, "local_dir": str(bsard_dir)})
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "articles.csv: file is empty" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".raw")]


def test_hub_style_synthetic_ids_overlapping_carved_dev_ids(tmp_path):
    """The hub numbers its synthetic questions 1..N over the train ids, some of which are carved
    into dev: every id must stay unique across all splits, ``clean`` must accept the result
    whatever the order of its rows, and each synthetic question keeps its BM25 negatives."""
    import json

    from conftest import write_bsard_layout
    from lexgraph.data.clean import clean

    root = write_bsard_layout(tmp_path / "hub")
    write_questions(
        root / "questions_train.csv",
        [(i, f"Question d'entraînement numéro {i} ?", str(1 + i % 5)) for i in range(1, 61)],
    )
    write_questions(root / "questions_test.csv", [(i, f"Question de test numéro {i} ?", "3") for i in range(61, 71)])
    write_questions(
        root / "questions_synthetic.csv", [(i, f"requête synthétique {i}", str(1 + i % 5)) for i in range(1, 41)]
    )
    (root / "negatives" / "bm25_negatives_synthetic.json").write_text(
        json.dumps({str(i): [1 + (i + 1) % 5] for i in range(1, 41)}), encoding="utf-8"
    )
    articles, questions, negatives = fetch(
        fetch_config({**PARAMS, "local_dir": str(root), "synthetic": True, "negatives": True, "dev_fraction": 0.3}),
        seed=3,
    )
    dev = questions.filter(pl.col("split") == "dev")
    assert len(set(dev["id"]) & set(range(1, 41))) > 5  # the carve took ids that the hub's synthetic ones also use
    assert questions["id"].is_unique().all()
    synthetic = questions.filter(pl.col("split") == "synthetic")
    assert synthetic["id"].to_list() == [i + 71 for i in range(1, 41)]  # past the largest human id, 70
    # the hub's negatives follow their question: hub id i is lexgraph id i + 71
    by_id = dict(
        zip(
            negatives.filter(pl.col("split") == "synthetic")["question_id"].to_list(),
            negatives.filter(pl.col("split") == "synthetic")["article_ids"].to_list(),
        )
    )
    for qid, text in zip(synthetic["id"].to_list(), synthetic["question"].to_list()):
        hub_id = int(text.rsplit(" ", 1)[1])
        assert by_id[qid] == [1 + (hub_id + 1) % 5]
    # clean accepts it, synthetic first or last
    for table in (questions, questions.reverse()):
        _, _, clean_q, _ = clean(articles, table, section("clean"))
        assert clean_q["id"].is_unique().all()
        assert sorted(clean_q["id"].to_list()) == sorted(questions["id"].to_list())


def test_synthetic_offset_depends_on_the_id_sets_only():
    from lexgraph.data.integrity import synthetic_offset

    assert synthetic_offset([5, 1, 3], [7, 8]) == 0  # disjoint: ids kept
    assert synthetic_offset([5, 1, 3], [1, 2]) == synthetic_offset([3, 5, 1], [2, 1]) == 6
    assert synthetic_offset([5, 1, 3], [-2, 1]) == 8  # -2 + 8 = 6 > 5


def test_the_hub_negatives_are_fetched_only_when_asked(bsard_dir, hub_dir):
    """fetch.negatives false (the default): not read, not downloaded; data/raw/negatives.parquet
    is then empty and mine_negatives mines every list. Never fetched and ignored."""
    for source in ({"local_dir": str(bsard_dir)}, {"source": "hub", "hub_repo": str(hub_dir)}):
        _, _, negatives = fetch(fetch_config({**PARAMS, **source, "synthetic": True, "negatives": False}), seed=3)
        assert negatives.height == 0 and negatives.columns == ["question_id", "split", "article_ids"]
    assert fetch_config({**PARAMS, "local_dir": "x"}).negatives is False


def test_duplicate_synthetic_question_id(bsard_dir):
    write_questions(bsard_dir / "questions_synthetic.csv", [(1, "a", "3"), (1, "b", "5")])
    with pytest.raises(DataError) as err:
        fetch(fetch_config({**PARAMS, "local_dir": str(bsard_dir), "synthetic": True}), seed=1)
    assert "row 2, column 'id': question id 1 is already used by row 1" in str(err.value)
    assert "expected each synthetic question id once" in str(err.value)


def test_synthetic_questions_may_reuse_human_ids(bsard_dir):
    """fetch renumbers synthetic ids that clash with human ones (past the largest, 8): not an error."""
    _, questions, negatives = fetch(
        fetch_config({**PARAMS, "local_dir": str(bsard_dir), "synthetic": True, "negatives": True}), seed=1
    )
    assert questions.filter(pl.col("split") == "synthetic")["id"].to_list() == [1 + 9, 2 + 9]
    assert negatives.filter(pl.col("split") == "synthetic")["question_id"].to_list() == [1 + 9]

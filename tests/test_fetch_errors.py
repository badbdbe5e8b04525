"""fetch's errors point to what the user edits, and the hub's failures read as one sentence.

- A bad row of a source file (data/sample/*.csv, a local BSARD copy, the hub's tables) is
  reported by fetch with that file, its 1-based data row (the header is not a row), the line
  the row starts on and the column, not as a row of the combined data/raw table;
- a duplicate id names the id and both rows;
- an unreachable hub gives one line on stderr, at once, not the hub client's retry logs.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from lexgraph.data.fetch import FetchConfig, fetch
from lexgraph.errors import DataError
from tests.conftest import ROOT, section, write_params, write_questions

PARAMS = {"source": "local", "dev_fraction": 0.34, "synthetic": False, "hub_repo": "x", "revision": None}


def fetch_config(values: dict) -> FetchConfig:
    """The ``fetch`` section of params.yaml with ``values`` (a complete, typed section)."""
    return FetchConfig.from_params(section("fetch", **values))


def fetch_local(root: Path, **extra):
    return fetch(fetch_config({**PARAMS, "local_dir": str(root), **extra}), seed=1)


def error_of(root: Path, **extra) -> str:
    with pytest.raises(DataError) as err:
        fetch_local(root, **extra)
    return str(err.value)


# ----------------------------------------------------------------------------- source rows


def test_duplicate_question_id_across_files_names_both_rows(bsard_dir):
    # questions_train.csv has ids 1..6 (rows 1..6); the test file reuses id 3 in its 2nd row
    write_questions(bsard_dir / "questions_test.csv", [(7, "Qui répare le mur ?", "3"), (3, "Et le loyer ?", "5")])
    msg = error_of(bsard_dir)
    assert msg == (
        f"{bsard_dir / 'questions_test.csv'}, row 2, column 'id': question id 3 is already used by row 3 of "
        f"{bsard_dir / 'questions_train.csv'} (line 4); expected each question id once across the train, dev and "
        "test questions (row 2 starts on line 3)"
    )


def test_duplicate_question_id_in_one_file(bsard_dir):
    write_questions(bsard_dir / "questions_test.csv", [(7, "a ?", "3"), (8, "b ?", "5"), (7, "c ?", "4")])
    msg = error_of(bsard_dir)
    assert msg.startswith(f"{bsard_dir / 'questions_test.csv'}, row 3, column 'id': question id 7 is already used "
                          f"by row 1 of {bsard_dir / 'questions_test.csv'} (line 2)")


def test_synthetic_questions_may_reuse_human_ids(bsard_dir):
    """clean renumbers synthetic ids that clash with human ones: not an error."""
    _, questions, _ = fetch_local(bsard_dir, synthetic=True)
    assert questions.filter(pl.col("split") == "synthetic")["id"].to_list() == [1, 2]


def test_duplicate_article_id_gives_lines_of_multiline_rows(bsard_dir):
    # article 1's text spans lines 2-3, so row 2 starts on line 4 and row 3 on line 5
    path = bsard_dir / "articles.csv"
    path.write_text(path.read_text(encoding="utf-8").replace("\n3,", "\n1,", 1), encoding="utf-8")
    msg = error_of(bsard_dir)
    assert msg == (
        f"{path}, row 3, column 'id': article id 1 is already used by row 1 of {path} (line 2); "
        "expected each article id once (row 3 starts on line 5)"
    )


@pytest.mark.parametrize(
    ("ids", "column", "expected"),
    [
        ("3,99", "article_ids", "question 8 cites article id(s) [99] that are not in {corpus}; expected ids of its "
                                "'id' column"),
        ("3,x4", "article_ids", "article id 'x4' is not an integer; expected a comma-separated list of integer "
                                "ids of {corpus}"),
        ("", "article_ids", "no relevant article ids; expected a comma-separated list of integer ids of {corpus}"),
    ],
    ids=["unknown", "not-integer", "empty"],
)
def test_bad_article_ids_name_the_question_file_row_and_line(bsard_dir, ids, column, expected):
    write_questions(bsard_dir / "questions_test.csv", [(7, "Qui répare le mur ?", "3"), (8, "Et le loyer ?", ids)])
    msg = error_of(bsard_dir)
    corpus = bsard_dir / "articles.csv"
    assert msg == (f"{bsard_dir / 'questions_test.csv'}, row 2, column '{column}': "
                   f"{expected.format(corpus=corpus)} (row 2 starts on line 3)")


def test_empty_question_text(bsard_dir):
    write_questions(bsard_dir / "questions_train.csv", [(1, "Qui ?", "3"), (2, "  ", "2")])
    msg = error_of(bsard_dir)
    assert msg == (f"{bsard_dir / 'questions_train.csv'}, row 2, column 'question': question 2 has no text; "
                   "expected the question (row 2 starts on line 3)")


def test_blank_line_is_a_row_with_an_empty_id(bsard_dir):
    path = bsard_dir / "questions_test.csv"
    text = path.read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join([text[0], text[1], "", text[2]]) + "\n", encoding="utf-8")
    msg = error_of(bsard_dir)
    assert msg == f"{path}, row 2, column 'id': the id is empty; expected an integer id (row 2 starts on line 3)"


def test_embedded_sample_error_names_the_sample_file(tmp_path):
    """The sample's own layout: the row of questions_dev.csv, not of data/raw/questions.parquet."""
    sample = tmp_path / "sample"
    shutil.copytree(ROOT / "data/sample", sample)
    path = sample / "questions_dev.csv"
    lines = path.read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join(lines + [lines[2]]) + "\n", encoding="utf-8")  # row 2 again
    qid = lines[2].split(",", 1)[0]
    with pytest.raises(DataError) as err:
        fetch(fetch_config({"source": "sample", "sample_dir": str(sample)}), seed=1)
    assert str(err.value) == (
        f"{path}, row {len(lines)}, column 'id': question id {qid} is already used by row 2 of {path} (line 3); "
        f"expected each question id once across the train, dev and test questions (row {len(lines)} starts on "
        f"line {len(lines) + 1})"
    )


def test_hub_table_rows_are_named_by_config_and_split(hub_dir):
    # `datasets` caches a local dataset under its directory's name, whatever the files hold, in a
    # cache directory read once per process: a name of its own keeps other tests' tables out
    repo = hub_dir.with_name("hub_duplicate_ids")
    hub_dir.rename(repo)
    write_questions(repo / "questions_test.csv", [(7, "a ?", "3"), (1, "b ?", "5")])
    with pytest.raises(DataError) as err:
        fetch(fetch_config({**PARAMS, "source": "hub", "hub_repo": str(repo)}), seed=1)
    assert str(err.value) == (
        f"{repo}@main (questions/test), row 2, column 'id': question id 1 is already used by row 1 of "
        f"{repo}@main (questions/train); expected each question id once across the train, dev and test questions"
    )


# ----------------------------------------------------------------------------- stage level


def run_fetch(tmp_path: Path, fetch_params: dict, env: dict | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    write_params(tmp_path / "params.yaml", base={"seed": 1, "device": "cpu"}, fetch=fetch_params)
    out = tmp_path / "raw"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "stages/fetch.py"), "--params", str(tmp_path / "params.yaml"), "--out", str(out)],
        capture_output=True, text=True, cwd=tmp_path, env=env,
    )
    return proc, out


def test_stage_bad_row_is_one_line_and_keeps_the_previous_output(tmp_path, bsard_dir):
    params = {**PARAMS, "local_dir": str(bsard_dir)}
    proc, out = run_fetch(tmp_path, params)
    assert proc.returncode == 0, proc.stderr
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    write_questions(bsard_dir / "questions_test.csv", [(7, "a ?", "3"), (2, "b ?", "5")])
    proc, out = run_fetch(tmp_path, params)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [
        f"lexgraph fetch: error: {bsard_dir / 'questions_test.csv'}, row 2, column 'id': question id 2 is already "
        f"used by row 2 of {bsard_dir / 'questions_train.csv'} (line 3); expected each question id once across the "
        "train, dev and test questions (row 2 starts on line 3)"
    ]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def closed_port() -> int:
    """A local port nothing listens on (connections are refused at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def offline_env(tmp_path: Path) -> dict:
    """Hub at a closed local port, HF_HUB_OFFLINE unset, an empty HF cache, no proxy."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"} and "proxy" not in k.lower()}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}", HF_HOME=str(tmp_path / "hf-home"),
               HF_HUB_DISABLE_TELEMETRY="1")
    return env


def test_stage_unreachable_hub_is_one_line_at_once(tmp_path):
    env = offline_env(tmp_path)
    start = time.monotonic()
    proc, out = run_fetch(tmp_path, {**PARAMS, "source": "hub", "hub_repo": "maastrichtlawtech/bsard",
                                     "revision": "main"}, env)
    elapsed = time.monotonic() - start
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0] == (
        "lexgraph fetch: error: could not load 'maastrichtlawtech/bsard' (params 'fetch.hub_repo'): the Hugging Face "
        f"hub at {env['HF_ENDPOINT']} cannot be reached from this machine and 'maastrichtlawtech/bsard' is not in "
        "the local Hugging Face cache; connect to the internet, or download the dataset's files and set "
        "fetch.source=local and fetch.local_dir=<that directory> in params.yaml"
    )
    assert elapsed < 30, f"{elapsed:.0f} s: the hub client retried"  # its retries take ~25 s
    assert not out.exists()


HUB_MODEL = """
import sys
from lexgraph.errors import LexgraphError
from lexgraph.stage import setup_logging

setup_logging("INFO")
from transformers import AutoTokenizer
from lexgraph.hub import from_pretrained

try:
    from_pretrained(AutoTokenizer.from_pretrained, "camembert-base", param="pretrain.model")
except LexgraphError as exc:
    print(f"lexgraph pretrain: error: {exc}", file=sys.stderr)
    sys.exit(2)
"""


def test_unreachable_hub_model_is_one_line_at_once(tmp_path):
    """The pretrain/generate_queries path (models from the hub), with the stages' logging."""
    env = offline_env(tmp_path)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", HUB_MODEL], capture_output=True, text=True, env=env, cwd=tmp_path)
    elapsed = time.monotonic() - start
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0] == (
        "lexgraph pretrain: error: could not load 'camembert-base' (params 'pretrain.model'): the Hugging Face hub at "
        f"{env['HF_ENDPOINT']} cannot be reached from this machine and 'camembert-base' is not in the local Hugging "
        "Face cache; connect to the internet with HF_HUB_OFFLINE unset, or run `hf download camembert-base` on a "
        "connected machine and copy the cache here, or set 'pretrain.model' to a local checkpoint directory"
    )
    assert elapsed < 30, f"{elapsed:.0f} s: the hub client retried"

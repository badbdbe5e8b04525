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

import pytest

from conftest import ROOT, section, write_params, write_questions
from helpers_config import LOCAL_FETCH
from lexgraph.core.errors import DataError
from lexgraph.data.fetch import FetchConfig, fetch

PARAMS = LOCAL_FETCH


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
    assert msg.startswith(
        f"{bsard_dir / 'questions_test.csv'}, row 3, column 'id': question id 7 is already used "
        f"by row 1 of {bsard_dir / 'questions_test.csv'} (line 2)"
    )


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
        (
            "3,99",
            "article_ids",
            "question 8 cites article id(s) [99] that are not in {corpus}; expected ids of its 'id' column",
        ),
        (
            "3,x4",
            "article_ids",
            "article id 'x4' is not an integer; expected a comma-separated list of integer ids of {corpus}",
        ),
        ("", "article_ids", "no relevant article ids; expected a comma-separated list of integer ids of {corpus}"),
        # issue 18: a cell that holds no id is one error whatever its commas; an empty item lost an id
        (",", "article_ids", "no relevant article ids; expected a comma-separated list of integer ids of {corpus}"),
        (" , ;", "article_ids", "no relevant article ids; expected a comma-separated list of integer ids of {corpus}"),
        (
            "3,,4",
            "article_ids",
            "article ids '3,,4' have an empty item (item 2 of 3); expected a comma-separated "
            "list of integer ids of {corpus}",
        ),
        (
            "3,",
            "article_ids",
            "article ids '3,' have an empty item (item 2 of 2); expected a comma-separated list "
            "of integer ids of {corpus}",
        ),
        # digits 0-9 only: Python's int() would read these as 3 and 3
        (
            "\u0663",
            "article_ids",
            "article id '\u0663' is not an integer; expected a comma-separated list of integer ids of {corpus}",
        ),
        (
            "3\x00",
            "article_ids",
            "article id '3\\x00' is not an integer; expected a comma-separated list of integer ids of {corpus}",
        ),
    ],
    ids=[
        "unknown",
        "not-integer",
        "empty",
        "comma-only",
        "separators-only",
        "empty-item",
        "trailing-comma",
        "arabic-digit",
        "nul",
    ],
)
def test_bad_article_ids_name_the_question_file_row_and_line(bsard_dir, ids, column, expected):
    write_questions(bsard_dir / "questions_test.csv", [(7, "Qui répare le mur ?", "3"), (8, "Et le loyer ?", ids)])
    msg = error_of(bsard_dir)
    corpus = bsard_dir / "articles.csv"
    assert msg == (
        f"{bsard_dir / 'questions_test.csv'}, row 2, column '{column}': "
        f"{expected.format(corpus=corpus)} (row 2 starts on line 3)"
    )


def test_empty_question_text(bsard_dir):
    write_questions(bsard_dir / "questions_train.csv", [(1, "Qui ?", "3"), (2, "  ", "2")])
    msg = error_of(bsard_dir)
    assert msg == (
        f"{bsard_dir / 'questions_train.csv'}, row 2, column 'question': question 2 has no text; "
        "expected the question (row 2 starts on line 3)"
    )


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


# ----------------------------------------------------------------------------- issue 18: integrity

COLUMNS = {
    "questions": "expected comma-separated columns id, question, article_ids and optionally category, "
    "subcategory, extra_description",
    "articles": "expected comma-separated columns id, article and optionally reference, law_type, code, book, "
    "part, act, chapter, section, subsection, description",
}
SHARED = (
    "expected each question text in only one of the train, dev and test splits (texts compared NFKC-normalised "
    "and casefolded, punctuation and spacing ignored)"
)


def files_of(root: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def refused(root: Path, **extra) -> str:
    """fetch's error on ``root``, checking that no input file was touched."""
    before = files_of(root)
    msg = error_of(root, **extra)
    assert files_of(root) == before and "\n" not in msg
    return msg


@pytest.mark.parametrize("name", ["articles.csv", "questions_train.csv"])
def test_duplicated_header_column_is_refused(bsard_dir, name):
    """`id,article,id,…` was read as `id_duplicated_0`: every reference became `Art. id 1`."""
    path = bsard_dir / name
    lines = path.read_text(encoding="utf-8").split("\n")
    header = lines[0].split(",")
    header[2] = "id"
    path.write_text("\n".join([",".join(header), *lines[1:]]), encoding="utf-8")
    assert (
        refused(bsard_dir)
        == f"{path}: column 'id' appears twice in the header (columns 1 and 3); expected each column once"
    )


def test_semicolon_separated_csv_names_the_expected_columns(bsard_dir):
    """Not polars' advice ("truncate_ragged_lines=True"): the file, and the columns expected."""
    path = bsard_dir / "questions_test.csv"
    path.write_text("id;question;article_ids\n7;Qui répare le mur ?;3,1\n8;Et le loyer ?;5\n", encoding="utf-8")
    assert refused(bsard_dir) == (
        f"{path}: the header 'id;question;article_ids' is a single column, so the file is "
        f"not comma-separated; {COLUMNS['questions']}"
    )


@pytest.mark.parametrize(
    ("row", "fields"),
    [('8,Et le loyer, la charge ?,Logement,Bail,,"5"', 7), ("8,Et le loyer ?", 2)],
    ids=["unquoted-comma", "short-row"],
)
def test_row_with_another_number_of_fields_than_the_header(bsard_dir, row, fields):
    path = bsard_dir / "questions_test.csv"
    path.write_text(
        path.read_text(encoding="utf-8").splitlines()[0] + '\n7,"Qui répare ?",,,,3\n' + row + "\n", encoding="utf-8"
    )
    assert refused(bsard_dir) == (
        f"{path}, row 2: {fields} fields where the header has 6; {COLUMNS['questions']} "
        "(a value holding a comma must be quoted) (row 2 starts on line 3)"
    )


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("7\x00", "holds the control or unassigned character '\\x00' at character 2"),
        (" 7", "holds whitespace (' ') at character 1"),
        ("7\t", "holds whitespace ('\\t') at character 2"),
        ("7\u00a0", "holds whitespace ('\\xa0') at character 2"),
        ("7\u200b", "holds the control or unassigned character '\\u200b' at character 2"),
    ],
    ids=["nul", "space", "tab", "nbsp", "zero-width-space"],
)
@pytest.mark.parametrize("name", ["questions_test.csv", "articles.csv"])
def test_id_with_whitespace_or_control_character_is_refused(bsard_dir, name, value, reason):
    """Ids are written into whitespace-separated TREC runs: refused, not stripped or misread."""
    path = bsard_dir / name
    if name == "articles.csv":  # article 3 is row 3 (line 5: article 1 spans two lines)
        path.write_text(path.read_text(encoding="utf-8").replace("\n3,", f"\n{value},", 1), encoding="utf-8")
        row, line = 3, 5
    else:
        write_questions(path, [(8, "Et le loyer ?", "5"), (value, "Qui répare le mur ?", "3")])
        row, line = 2, 3
    assert refused(bsard_dir) == (
        f"{path}, row {row}, column 'id': id {value!r} {reason}; expected an integer id "
        f"(row {row} starts on line {line})"
    )


@pytest.mark.parametrize(
    "text",
    [
        "Quand dois-je payer mon loyer ?",
        "quand dois-je  payer mon LOYER",
        "Quand dois-je payer mon loyer\u00a0?",
        "\uff31uand dois-je payer mon loyer ?",
    ],
    ids=["verbatim", "case-spacing-punctuation", "nbsp", "nfkc-fullwidth"],
)
def test_train_question_in_test_is_refused_naming_both_rows(bsard_dir, text):
    """Train question 3 (row 3 of questions_train.csv) copied into the test file: leakage. The
    local copy has no dev file, so this is checked after dev is carved from train."""
    write_questions(bsard_dir / "questions_test.csv", [(7, "Qui répare le mur mitoyen ?", "3"), (8, text, "5")])
    assert refused(bsard_dir) == (
        f"{bsard_dir / 'questions_test.csv'}, row 2, column 'question': question 8 (test) has the same text as "
        f"question 3 (train, row 3 of {bsard_dir / 'questions_train.csv'} (line 4)); {SHARED} (row 2 starts on line 3)"
    )


def test_train_question_in_dev_file_is_refused(bsard_dir):
    write_questions(bsard_dir / "questions_dev.csv", [(9, "Mon voisin peut-il refuser le bornage ?", "2")])
    assert refused(bsard_dir) == (
        f"{bsard_dir / 'questions_dev.csv'}, row 1, column 'question': question 9 (dev) has the same text as "
        f"question 2 (train, row 2 of {bsard_dir / 'questions_train.csv'} (line 3)); {SHARED} (row 1 starts on line 2)"
    )


def test_sample_with_a_train_question_copied_into_test_is_refused(tmp_path):
    """The embedded sample passes (no text in two splits); a verbatim copy is refused."""
    sample = tmp_path / "sample"
    shutil.copytree(ROOT / "data/sample", sample)
    train = (sample / "questions_train.csv").read_text(encoding="utf-8").splitlines()
    qid, rest = train[1].split(",", 1)
    test = sample / "questions_test.csv"
    rows = test.read_text(encoding="utf-8").splitlines()
    test.write_text("\n".join(rows + [f"9999,{rest}"]) + "\n", encoding="utf-8")
    before = files_of(sample)
    with pytest.raises(DataError) as err:
        fetch(fetch_config({"source": "sample", "sample_dir": str(sample)}), seed=1)
    assert files_of(sample) == before
    assert str(err.value) == (
        f"{test}, row {len(rows)}, column 'question': question 9999 (test) has the same text as question {qid} "
        f"(train, row 1 of {sample / 'questions_train.csv'} (line 2)); {SHARED} (row {len(rows)} starts on line "
        f"{len(rows) + 1})"
    )


def test_negatives_json_with_a_repeated_key_is_refused(bsard_dir):
    """json.loads kept the last list of question 1's negatives."""
    path = bsard_dir / "negatives" / "bm25_negatives_train.json"
    path.write_text('{"1": [2, 4], "2": [5], "1": [3]}', encoding="utf-8")
    assert refused(bsard_dir) == f"{path}: key '1' appears twice; expected each key once"


@pytest.mark.parametrize(
    ("negatives", "reason"),
    [
        (
            '{" 1": [2]}',
            "question ' 1': negatives must be integer article ids (id ' 1' holds whitespace (' ') at character 1; "
            "expected an integer id)",
        ),
        (
            '[{"question_id": 1, "article_ids": [2.5]}]',
            "question 1: negatives must be integer article ids (id 2.5 is not an integer; expected a non-negative "
            "integer id in decimal digits 0-9, without sign or leading zero, at most 2**63 - 1)",
        ),
        ("[3]", "row 1: expected a JSON object with keys question_id and article_ids (or negatives)"),
    ],
    ids=["id-with-space", "float-id", "record-not-object"],
)
def test_negatives_json_ids_are_integers(bsard_dir, negatives, reason):
    path = bsard_dir / "negatives" / "bm25_negatives_train.json"
    path.write_text(negatives, encoding="utf-8")
    msg = refused(bsard_dir)
    assert msg == (f"{path}, {reason}" if reason.startswith("row") else f"{path}: {reason}")


# The hub: `datasets` reads the repo's files (CSV via pandas, JSON lines via pyarrow). It caches a local
# dataset under its directory's name, in a cache read once per process: each test names its own directory.

JSONL_README = """---
configs:
- config_name: corpus
  data_files:
  - split: corpus
    path: articles.jsonl
- config_name: questions
  data_files:
  - split: train
    path: questions_train.jsonl
  - split: test
    path: questions_test.jsonl
---
"""


def jsonl_hub(hub_dir: Path, name: str, test_line: str) -> Path:
    """A hub repo whose tables are JSON lines (the whole repo: `datasets` infers one builder)."""
    repo = hub_dir.with_name(name)
    repo.mkdir()
    (repo / "README.md").write_text(JSONL_README, encoding="utf-8")
    (repo / "articles.jsonl").write_text(
        '{"id": 1, "article": "Le preneur paie le loyer."}\n{"id": 2, "article": "Le bail est un contrat."}\n',
        encoding="utf-8",
    )
    (repo / "questions_train.jsonl").write_text(
        '{"id": 1, "question": "Quand payer ?", "article_ids": "1"}\n', encoding="utf-8"
    )
    (repo / "questions_test.jsonl").write_text(
        '{"id": 2, "question": "Un bail ?", "article_ids": "2"}\n' + test_line, encoding="utf-8"
    )
    return repo


def hub_error(repo: Path) -> str:
    before = files_of(repo)
    with pytest.raises(DataError) as err:
        fetch(fetch_config({**PARAMS, "source": "hub", "hub_repo": str(repo)}), seed=1)
    assert files_of(repo) == before and "\n" not in str(err.value)
    return str(err.value)


def test_hub_json_lines_question_with_a_repeated_key_is_refused(hub_dir):
    repo = jsonl_hub(hub_dir, "hub_jsonl_repeated_key", '{"id": 3, "question": "Et ?", "article_ids": "2", "id": 4}\n')
    msg = hub_error(repo)
    assert msg.startswith(
        f"{repo}@main (questions): its files could not be read (JSON parse error: Column(/id) was specified twice"
    ), msg
    assert msg.endswith("expected UTF-8 CSV or JSON-lines files in BSARD's schema, each column or key once"), msg


def test_hub_json_lines_question_with_a_lone_surrogate_is_refused(hub_dir):
    repo = jsonl_hub(hub_dir, "hub_jsonl_surrogate", '{"id": 3, "question": "Et \\udc80 ?", "article_ids": "2"}\n')
    msg = hub_error(repo)
    assert (
        msg.startswith(f"{repo}@main (questions): its files could not be read (JSON parse error: ")
        and "surrogate" in msg
    ), msg


def test_hub_duplicated_header_column_is_refused(hub_dir):
    """pandas (the hub's CSV reader) renames the second `id` to `id.1`."""
    repo = hub_dir.with_name("hub_duplicated_header")
    hub_dir.rename(repo)
    path = repo / "articles.csv"
    path.write_text(
        path.read_text(encoding="utf-8").replace("id,article,reference,", "id,article,id,", 1), encoding="utf-8"
    )
    assert hub_error(repo) == (
        f"{repo}@main (corpus): column 'id' appears twice in the header (the second read as "
        "'id.1'); expected each column once"
    )


def test_hub_train_question_in_test_is_refused(hub_dir):
    repo = hub_dir.with_name("hub_shared_text")
    hub_dir.rename(repo)
    write_questions(repo / "questions_test.csv", [(7, "Qui répare le mur ?", "3"), (8, "Qu'est-ce qu'un bail", "4")])
    assert hub_error(repo) == (
        f"{repo}@main (questions/test), row 2, column 'question': question 8 (test) has the same text as question 5 "
        f"(train, row 5 of {repo}@main (questions/train)); {SHARED}"
    )


# ----------------------------------------------------------------------------- stage level


def run_fetch(tmp_path: Path, fetch_params: dict, env: dict | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    write_params(tmp_path / "params.yaml", base={"seed": 1, "device": "cpu"}, fetch=fetch_params)
    out = tmp_path / "raw"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "stages/fetch.py"), "--params", str(tmp_path / "params.yaml"), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    return proc, out


@pytest.mark.slow  # a subprocess that loads the CLI or a stage: ~5 s on 2 cores
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
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"} and "proxy" not in k.lower()
    }
    env.update(
        HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}", HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1"
    )
    return env


#: what the hub client's retries would add (huggingface_hub backs off 1, 2, 4, 8, 8 s: about 23 s of
#: sleep), against the same process with HF_HUB_OFFLINE=1 in the same test (which tries no network):
#: a difference of time, so that the check holds on a loaded machine where both runs are slow
RETRY_S = 12


def _no_hub(env: dict) -> dict:
    return {**env, "HF_HUB_OFFLINE": "1"}


def _timed(call) -> float:
    start = time.monotonic()
    call()
    return time.monotonic() - start


def test_stage_unreachable_hub_is_one_line_at_once(tmp_path):
    env = offline_env(tmp_path)
    start = time.monotonic()
    proc, out = run_fetch(
        tmp_path, {**PARAMS, "source": "hub", "hub_repo": "maastrichtlawtech/bsard", "revision": "main"}, env
    )
    elapsed = time.monotonic() - start
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0] == (
        "lexgraph fetch: error: could not load 'maastrichtlawtech/bsard' (params 'fetch.hub_repo'): the Hugging Face "
        f"hub at {env['HF_ENDPOINT']} cannot be reached from this machine and 'maastrichtlawtech/bsard' is not in "
        "the local Hugging Face cache; connect to the internet, or download the dataset's files and set "
        "fetch.source=local and fetch.local_dir=<that directory> in params.yaml"
    )
    peer = _timed(
        lambda: run_fetch(tmp_path, {**PARAMS, "source": "hub", "hub_repo": "x", "revision": "main"}, _no_hub(env))
    )
    assert elapsed - peer < RETRY_S, f"{elapsed:.0f} s against {peer:.0f} s offline: the hub client retried"
    assert not out.exists()


HUB_MODEL = """
import sys
from lexgraph.core.errors import LexgraphError
from lexgraph.core.stage import setup_logging

setup_logging("INFO")
from transformers import AutoTokenizer
from lexgraph.core.hub import from_pretrained

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
    peer = _timed(
        lambda: subprocess.run([sys.executable, "-c", HUB_MODEL], capture_output=True, env=_no_hub(env), cwd=tmp_path)
    )
    assert elapsed - peer < RETRY_S, f"{elapsed:.0f} s against {peer:.0f} s offline: the hub client retried"


@pytest.mark.parametrize(
    "case", ["duplicated-header", "semicolons", "shared-text", "nul-id", "comma-article-ids", "negatives-repeated-key"]
)
def test_stage_refuses_integrity_problems_in_one_line_keeping_inputs_and_outputs(tmp_path, bsard_dir, case):
    params = {**PARAMS, "local_dir": str(bsard_dir)}
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "questions.parquet").write_bytes(b"a previous output")
    outputs = files_of(tmp_path / "raw")
    test = bsard_dir / "questions_test.csv"
    if case == "duplicated-header":
        articles = bsard_dir / "articles.csv"
        articles.write_text(
            articles.read_text(encoding="utf-8").replace("id,article,reference,", "id,article,id,", 1), encoding="utf-8"
        )
        expected = f"{articles}: column 'id' appears twice"
    elif case == "semicolons":
        test.write_text("id;question;article_ids\n7;Qui ?;3,1\n", encoding="utf-8")
        expected = f"{test}: the header 'id;question;article_ids' is a single column"
    elif case == "shared-text":
        write_questions(test, [(7, "Qui répare le mur ?", "3"), (8, "Quand dois-je payer mon loyer ?", "5")])
        expected = f"{test}, row 2, column 'question': question 8 (test) has the same text as question 3 (train"
    elif case == "nul-id":
        write_questions(test, [(7, "Qui répare le mur ?", "3"), ("8\x00", "Et le loyer ?", "5")])
        expected = f"{test}, row 2, column 'id': id '8\\x00' holds the control or unassigned character"
    elif case == "comma-article-ids":
        write_questions(test, [(7, "Qui répare le mur ?", "3"), (8, "Et le loyer ?", ",")])
        expected = f"{test}, row 2, column 'article_ids': no relevant article ids"
    else:
        negatives = bsard_dir / "negatives" / "bm25_negatives_train.json"
        negatives.write_text('{"1": [2], "1": [4]}', encoding="utf-8")
        expected = f"{negatives}: key '1' appears twice"
    inputs = files_of(bsard_dir)
    proc, out = run_fetch(tmp_path, params)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert all(" INFO " in line for line in lines[:-1]), proc.stderr  # progress logs, then the one error line
    assert lines[-1].startswith(f"lexgraph fetch: error: {expected}"), lines[-1]
    assert files_of(bsard_dir) == inputs and files_of(out) == outputs

"""`lexgraph search` against a hostile environment (issue 28, class 7): a path the file system
refuses, an output encoding that cannot write the text, a closed stdin or stdout, stdout on a
full disk. Each is one line on stderr (or, for the encoding, escaped output), never a
traceback, and leaves every file of the workspace byte for byte as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from helpers_cli import ARTICLES, write_articles
from helpers_scripts import run_script
from lexgraph.search.bm25 import BM25

PREVIOUS_RUN = "old Q0 1 1 1.000000 bm25\n"


@pytest.fixture
def ws(tmp_path):
    """A workspace of the toy articles and their BM25 index, recorded as the bm25 stage records it."""
    from lexgraph.core.provenance import recording
    from lexgraph.methods.bm25.system import Bm25Paths

    write_articles(tmp_path, ARTICLES)
    out = tmp_path / "models" / "bm25"
    paths = Bm25Paths(
        articles=tmp_path / "data" / "clean" / "articles.parquet",
        tuned=tmp_path / "metrics" / "bm25_tune.json",
        out=out,
    )
    with recording("bm25", {}, paths):
        BM25().fit_texts(list(ARTICLES.values()), list(ARTICLES)).save(out)
    (tmp_path / "q.jsonl").write_text(json.dumps({"id": "a", "question": "Qui paie le loyer ?"}) + "\n")
    (tmp_path / "out.trec").write_text(PREVIOUS_RUN, encoding="utf-8")
    return tmp_path


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _search(ws: Path, *args: str, env: dict | None = None, **streams) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lexgraph.cli", "search", "--workspace", str(ws), *args],
        cwd=ws,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})},
        capture_output="stdout" not in streams,
        stderr=subprocess.PIPE if "stdout" in streams else None,
        timeout=120,
        **streams,
    )


def _search_here(ws: Path, capsys, monkeypatch, *args: str) -> subprocess.CompletedProcess:
    """``lexgraph search --workspace WS ARGS`` from ``ws`` in this process (``main``'s status and
    stderr), for a refusal that is about its wording and status, not about the process: a fresh
    interpreter spends ~4 s importing torch before it (``python -X importtime -m lexgraph.cli``)."""
    from lexgraph.cli.main import main

    monkeypatch.chdir(ws)
    capsys.readouterr()
    status = main(["search", "--workspace", str(ws), *args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["lexgraph", "search", *args], status, out, err)


def _one_line(proc: subprocess.CompletedProcess, *expected: str) -> None:
    err = proc.stderr.decode("utf-8", "replace") if isinstance(proc.stderr, bytes) else proc.stderr
    assert proc.returncode == 2, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lexgraph search: error: "), err
    for part in expected:
        assert part in lines[0], err


@pytest.mark.parametrize(
    "run",
    [
        "a" * 256,  # one name over NAME_MAX
        "a/" * 3000 + "x",  # a path over PATH_MAX
        "x" * 300 + "/out.trec",  # a directory name over NAME_MAX
    ],
    ids=["name-256", "path-max", "dir-name"],
)
def test_path_the_file_system_refuses(request, ws, run, capsys, monkeypatch):
    """In this process; the first case also as a real process (its exit status and stderr)."""
    before = snapshot(ws)
    if request.node.callspec.id == "name-256":
        proc = _search(ws, "--questions", "q.jsonl", "--run", run)
    else:
        proc = _search_here(ws, capsys, monkeypatch, "--questions", "q.jsonl", "--run", run)
    _one_line(proc, "File name too long", "expected a path the file system accepts")
    assert snapshot(ws) == before


def test_too_long_questions_path(ws, capsys, monkeypatch):
    before = snapshot(ws)
    _one_line(
        _search_here(ws, capsys, monkeypatch, "--questions", "q" * 300 + ".jsonl", "--json"), "File name too long"
    )
    assert snapshot(ws) == before


@pytest.mark.parametrize("encoding", ["ascii", "latin-1", "ascii:strict"])
@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
def test_output_encoding_that_cannot_write_the_text(ws, encoding, json_output):
    """Characters the encoding lacks are written as \\uXXXX: readable text, and valid JSON."""
    before = snapshot(ws)
    question = "réparation du mur … ’ 𝄞"
    proc = _search(ws, *(["--json"] if json_output else []), question, env={"PYTHONIOENCODING": encoding})
    assert proc.returncode == 0, proc.stderr
    assert b"Traceback" not in proc.stderr
    out = proc.stdout.decode(encoding.split(":")[0])
    if json_output:
        assert json.loads(out)["question"] == question
    else:
        assert "mitoyen" in out and "\\u2019" in out  # the question, echoed with its ’ escaped
    assert snapshot(ws) == before


def test_closed_stdout(ws):
    before = snapshot(ws)
    proc = subprocess.run(
        [sys.executable, "-m", "lexgraph.cli", "search", "--workspace", str(ws), "--json", "loyer"],
        cwd=ws,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.close(1),
    )
    _one_line(proc, "standard output is closed")
    assert snapshot(ws) == before


@pytest.mark.parametrize("flags", [[], ["--json"]], ids=["text", "json"])
def test_closed_stdin(ws, flags):
    before = snapshot(ws)
    proc = subprocess.run(
        [sys.executable, "-m", "lexgraph.cli", "search", "--workspace", str(ws), *flags],
        cwd=ws,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.close(0),
    )
    _one_line(proc, "standard input is closed")
    assert snapshot(ws) == before


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("flags", [["--json", "loyer"], ["loyer"], ["--questions", "q.jsonl", "--json"]])
def test_stdout_on_a_full_disk(ws, flags):
    before = snapshot(ws)
    with open("/dev/full", "w") as full:
        proc = _search(ws, *flags, stdout=full)
    _one_line(proc, "cannot write to standard output: No space left on device")
    assert snapshot(ws) == before


def test_a_stage_given_a_path_the_file_system_refuses_says_so_in_one_line(tmp_path, capsys):
    """The same rule for the stages (lexgraph.core.errors.reported): an OSError naming a path
    (here ENAMETOOLONG on clean's --raw) is one line, status 2, no traceback, nothing written.
    The driver runs in this process (tests/helpers_scripts.py: as ``__main__``, from tmp_path)."""
    raw = tmp_path / ("a" * 300)
    out = tmp_path / "clean"
    argv = ["--params", ROOT / "params.yaml", "--raw", raw, "--out", out, "--metrics", tmp_path / "m.json"]
    returncode = run_script(ROOT / "stages" / "clean.py", *argv, cwd=tmp_path)
    stderr = capsys.readouterr().err
    lines = [line for line in stderr.splitlines() if line.startswith("lexgraph clean:")]
    assert returncode == 2 and "Traceback" not in stderr, stderr
    assert len(lines) == 1 and "File name too long; expected a path the file system accepts" in lines[0]
    assert f"({len(str(raw)) + 17} characters)" in lines[0] and not out.exists() and not (tmp_path / "m.json").exists()


# issue 28, class 9: a locale that is not UTF-8 (Python's C-locale coercion and UTF-8 mode off)
C_LOCALE = {"LANG": "C", "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0", "PYTHONIOENCODING": ""}
UTF8_LOCALE = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONUTF8": "1", "PYTHONIOENCODING": ""}


@pytest.mark.slow  # a subprocess that loads the CLI or a stage: ~5 s on 2 cores
def test_a_c_locale_reads_a_utf8_question_argument_and_files_as_utf8(ws):
    """Under LANG=C the question "… l'âge …" reached lexgraph as lone surrogates and was refused
    ("a lone surrogate that is not valid Unicode text"); files were already read as UTF-8. Now the
    results, the --json output (escaped for the ASCII terminal) and the --run file are those of a
    UTF-8 locale, and a directory named in UTF-8 works for --questions and --run."""
    question = "Qui paie le loyer à l'âge de dix-huit ans ?"
    folder = ws / "questions été"
    folder.mkdir()
    (folder / "q.jsonl").write_text(json.dumps({"id": "é1", "question": question}) + "\n", encoding="utf-8")
    before = snapshot(ws)
    outputs = {}
    for name, env in (("c", C_LOCALE), ("utf8", UTF8_LOCALE)):
        one = _search(ws, "--json", "--top", "2", question, env=env)
        assert one.returncode == 0 and b"Traceback" not in one.stderr, one.stderr
        assert one.stdout.isascii() if name == "c" else True
        run = folder / f"{name}.trec"
        batch = _search(ws, "--questions", str(folder / "q.jsonl"), "--run", str(run), env=env)
        assert batch.returncode == 0, batch.stderr
        outputs[name] = (json.loads(one.stdout), run.read_bytes())
        run.unlink()
    assert outputs["c"] == outputs["utf8"]
    assert outputs["c"][0]["question"] == question and outputs["c"][0]["hits"]
    assert outputs["c"][1].startswith("é1 Q0 ".encode())
    assert snapshot(ws) == before


def test_a_c_locale_question_argument_that_is_not_utf8_is_one_line(ws):
    before = snapshot(ws)
    proc = _search(ws, os.fsdecode(b"loyer \xff"), env=C_LOCALE)
    _one_line(proc, "the question argument holds '\\udcff' at character 7", "expected a question in valid UTF-8")
    assert snapshot(ws) == before

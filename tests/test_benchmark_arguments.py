"""The benchmarks (``benchmarks/*.py``) on bad arguments (issue 28, class 7): a count of 0, a
corpus smaller than the top-k, an ``--out`` under a file, questions without ``article_ids``.
Each is refused before any work with one line on stderr naming the option, file or row and
what was expected, exit status 2, no traceback, and the files given left as they were.

The numeric options and the scale benchmark's missing artefact are refused in the test's own
process (tests/helpers_scripts.py: the script as ``__main__``, a traceback fails the test), where a
fresh interpreter would spend 2 to 5 s importing torch first; the unseen benchmark's refusals run
as real processes (exit status and stderr of the process itself)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from helpers_scripts import run_script
from lexgraph.core.arguments import at_least, fraction, non_negative_int, positive_int


def _bench(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _one_line(proc: subprocess.CompletedProcess, *expected: str) -> str:
    return _one_line_of(proc.returncode, proc.stderr, *expected)


def _one_line_of(status: int, stderr: str, *expected: str) -> str:
    assert status == 2, stderr
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    for part in expected:
        assert part in lines[0], stderr
    return lines[0]


@pytest.mark.parametrize(
    "script, args, expected",
    [
        ("scale.py", ["--n", "0"], "argument --n: expected an integer ≥ 100, got 0"),
        ("scale.py", ["--n", "50"], "argument --n: expected an integer ≥ 100, got 50"),
        ("scale.py", ["--repeat", "0"], "argument --repeat: expected an integer ≥ 1, got 0"),
        ("scale.py", ["--target", "0"], "argument --target: expected a number in (0, 1], got 0.0"),
        ("scale.py", ["--threads", "-1"], "argument --threads: expected an integer ≥ 0, got -1"),
        ("bm25.py", ["--repeat", "0"], "argument --repeat: expected an integer ≥ 1, got 0"),
        ("bm25.py", ["--copies", "0"], "argument --copies: expected an integer ≥ 1, got 0"),
        ("bm25.py", ["--queries", "0"], "argument --queries: expected an integer ≥ 1, got 0"),
        ("bm25.py", ["--index-repeat", "x"], "argument --index-repeat: expected an integer ≥ 1, got 'x'"),
        ("unseen.py", ["--resamples", "0"], "argument --resamples: expected an integer ≥ 1, got 0"),
        ("unseen.py", ["--k", "0"], "argument --k: expected an integer ≥ 1, got 0"),
        ("throughput.py", ["--steps", "0"], "argument --steps: expected an integer ≥ 1, got 0"),
        ("throughput.py", ["--warmup", "-1"], "argument --warmup: expected an integer ≥ 0, got -1"),
        ("throughput.py", ["--dsr-batch", "0"], "argument --dsr-batch: expected an integer ≥ 1, got 0"),
        ("gdsr_pairs.py", ["--fractions", "0"], "argument --fractions: expected a number in (0, 1], got 0.0"),
        ("gdsr_pairs.py", ["--synthetic", "0"], "argument --synthetic: expected an integer ≥ 1, got 0"),
        ("mvcl_lr.py", ["--fractions", "1.5"], "argument --fractions: expected a number in (0, 1], got 1.5"),
        ("hierarchy.py", ["--max-gap", "0"], "argument --max-gap: expected an integer ≥ 1, got 0"),
        ("serve.py", ["--seconds", "0"], "argument --seconds: expected an integer ≥ 1, got 0"),
        ("serve.py", ["--warmup", "-1"], "argument --warmup: expected an integer ≥ 0, got -1"),
        ("serve.py", ["--clients", "1", "0"], "argument --clients: expected an integer ≥ 1, got 0"),
        ("serve.py", ["--cli-questions", "1"], "argument --cli-questions: expected an integer ≥ 2, got 1"),
        ("serve.py", ["--top-repeat", "0"], "argument --top-repeat: expected an integer ≥ 1, got 0"),
    ],
)
def test_numeric_argument_out_of_range(tmp_path, capsys, script, args, expected):
    status = run_script(ROOT / "benchmarks" / script, *args, cwd=tmp_path)
    line = _one_line_of(status, capsys.readouterr().err, expected)
    assert line.startswith(f"{script}: error: ")
    assert not any(tmp_path.iterdir())  # nothing written


def _questions(tmp_path: Path, records) -> Path:
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_unseen_out_under_a_file(tmp_path):
    questions = _questions(tmp_path, [{"id": 1, "question": "q", "article_ids": [1]}])
    (tmp_path / "results").write_text("earlier\n", encoding="utf-8")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    proc = _bench(
        "unseen.py", "--out", str(tmp_path / "results" / "out.json"), "--questions", str(questions), cwd=tmp_path
    )
    _one_line(proc, "results/out.json", "is a file, not a directory")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize(
    "records, row",
    [
        ([{"id": 1, "question": "q", "article_ids": [1]}, {"id": 2, "question": "q"}], 2),
        ([{"id": 1, "question": "q", "article_ids": []}], 1),
        ([{"id": "x", "question": "q", "article_ids": [1]}], 1),
        (["not an object"], 1),
    ],
    ids=["missing", "empty", "bad-id", "not-object"],
)
def test_unseen_questions_without_article_ids(tmp_path, records, row):
    questions = _questions(tmp_path, records)
    before = questions.read_bytes()
    proc = _bench("unseen.py", "--out", str(tmp_path / "out.json"), "--questions", str(questions), cwd=tmp_path)
    _one_line(proc, f"q.jsonl, row {row}", "'article_ids'")
    assert questions.read_bytes() == before and not (tmp_path / "out.json").exists()


def test_argument_types():
    assert positive_int("3") == 3 and non_negative_int("0") == 0 and at_least(100)("100") == 100
    assert fraction("1") == 1.0
    for parse, text in [(positive_int, "0"), (positive_int, "1.5"), (non_negative_int, "-1"), (fraction, "1.01")]:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


def test_scale_without_the_sample_embeddings(tmp_path, capsys):
    """A missing artefact is one line naming it (the benchmark reads the workspace it lives in:
    run from a copy of the script whose ROOT has no data/embed)."""
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (bench / "scale.py").write_bytes((ROOT / "benchmarks" / "scale.py").read_bytes())
    status = run_script(bench / "scale.py", "--n", "100", "--skip-bm25", "--skip-hnsw", cwd=tmp_path)
    err = capsys.readouterr().err
    assert status == 1 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("scale.py: error: ") and "articles.safetensors" in lines[0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{bad", "not valid JSON, truncated or corrupt"),
        ('{"a": 1}', "key 'baseline' is missing"),
        (
            '{"baseline": "bm25", "systems": {"x": {"metrics": {}}}, "n_queries": 1, "n_resamples": 1, "seed": 1}',
            "key 'systems' = ",
        ),
    ],
    ids=["corrupt", "foreign", "no-metrics"],
)
def test_unseen_table_of_a_damaged_or_foreign_file(tmp_path, text, expected):
    saved = tmp_path / "unseen.json"
    saved.write_text(text, encoding="utf-8")
    proc = _bench("unseen.py", "--table", str(saved), cwd=tmp_path)
    line = _one_line(proc, str(saved), expected, "expected the JSON that benchmarks/unseen.py --out writes")
    assert proc.returncode == 2 and proc.stdout == "", line
    assert saved.read_text(encoding="utf-8") == text

"""`lexgraph search` / `lexgraph regress` on bad input: one sentence naming the argument,
file, row or key and what was expected, exit status 2, no traceback, and every file in
the workspace (inputs and earlier outputs) left byte for byte as it was (issue 9)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import torch

from conftest import ROOT
from helpers_cli import ARTICLES, write_articles
from lexgraph.cli.main import main
from lexgraph.encoding.embed import save_embeddings
from lexgraph.search.bm25 import BM25

PREVIOUS_RUN = "old Q0 1 1 1.000000 bm25\n"  # an earlier output that an error must leave intact


def write_questions(path: Path, records) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture
def ws(tmp_path):
    """A BM25 workspace, a valid questions file and an earlier run."""
    write_articles(tmp_path, ARTICLES)
    BM25().fit_texts(list(ARTICLES.values()), list(ARTICLES)).save(tmp_path / "models" / "bm25")
    write_questions(tmp_path / "q.jsonl", [{"id": "a", "question": "Qui paie le loyer ?"}])
    (tmp_path / "out.trec").write_text(PREVIOUS_RUN, encoding="utf-8")
    return tmp_path


@pytest.fixture
def dense_ws(ws, dense_model):
    """``ws`` plus the tiny ``dsr`` system."""
    shutil.copytree(dense_model, ws, dirs_exist_ok=True)
    return ws


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def truncate(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size // 2)


def no_retriever(*args, **kwargs):
    raise AssertionError("a system was loaded before the arguments were checked")


# ---------------------------------------------------------------------------
# every case: (id, workspace fixture, setup(ws) -> argv, substrings of the message)
# ---------------------------------------------------------------------------


def _q(ws: Path, *records) -> str:
    return str(write_questions(ws / "q.jsonl", records))


def _batch(ws: Path, questions: str, run: str, *extra: str) -> list[str]:
    return ["search", "--questions", questions, "--run", run, "--workspace", str(ws), *extra]


def _symlink(ws: Path) -> str:
    (ws / "link.trec").symlink_to(ws / "q.jsonl")
    return str(ws / "link.trec")


def _hardlink(ws: Path) -> str:
    os.link(ws / "q.jsonl", ws / "hard.trec")
    return str(ws / "hard.trec")


def _not_a_run(ws: Path) -> str:
    (ws / "notes.txt").write_text("my notes, not a run\n", encoding="utf-8")
    return str(ws / "notes.txt")


def _stale_bm25(ws: Path) -> None:
    corpus = {**ARTICLES, 920: "Le loyer du bail est payé au bailleur."}
    BM25().fit_texts(list(corpus.values()), list(corpus)).save(ws / "models" / "bm25")


def _stale_dense(ws: Path) -> None:
    save_embeddings(ws / "data" / "embed" / "articles.safetensors", [1, 2, 920], torch.randn(3, 16))


def _regress(ws: Path, expected: str | None = None, metrics: dict | None = None, raw_metrics: str | None = None):
    (ws / "metrics").mkdir(exist_ok=True)
    text = raw_metrics if raw_metrics is not None else json.dumps(metrics or {"test": {"recall@100": 0.4, "map": 0.1}})
    (ws / "metrics" / "bm25.json").write_text(text, encoding="utf-8")
    if expected is not None:
        (ws / "exp.yaml").write_text(expected, encoding="utf-8")
    return ["regress", "--expected", str(ws / "exp.yaml"), "--metrics-dir", str(ws / "metrics")]


# issue 18, round three: paths DVC owns, hard links and read-only files (mode bits hold even for root)


def _cached_run(ws: Path, store: str = ".dvc/cache", content: str = PREVIOUS_RUN) -> Path:
    """An earlier run (or another file) as DVC caches it: named by its hash, read-only."""
    path = ws / store / "files" / "md5" / "3b" / "8d5e3c0d61b07b1e7d6d9b0f3a2e5c1"
    path.parent.mkdir(parents=True)
    path.write_text(content, encoding="utf-8")
    path.chmod(0o444)
    return path


def _into_cache(ws: Path, content: str = PREVIOUS_RUN) -> str:
    return str(_cached_run(ws, content=content))


def _symlink_into_cache(ws: Path) -> str:
    (ws / "cached.trec").symlink_to(_cached_run(ws))
    return str(ws / "cached.trec")


def _configured_cache(ws: Path, name: str = "config", value: str = "../dvc-store") -> str:
    (ws / ".dvc").mkdir(exist_ok=True)
    (ws / ".dvc" / name).write_text(f"[core]\n    analytics = false\n[cache]\n    dir = {value}\n", encoding="utf-8")
    return str(_cached_run(ws, "dvc-store"))


def _dvc_yaml_output(ws: Path) -> str:
    (ws / "dvc.yaml").write_text(
        "stages:\n  export:\n    cmd: python export.py\n    outs:\n      - exports/runs:\n          persist: true\n",
        encoding="utf-8",
    )
    (ws / "exports" / "runs").mkdir(parents=True)
    (ws / "exports" / "runs" / "bm25.trec").write_text(PREVIOUS_RUN, encoding="utf-8")
    return str(ws / "exports" / "runs" / "bm25.trec")


def _dvc_yaml_template(ws: Path) -> str:
    (ws / "dvc.yaml").write_text(
        "stages:\n  report:\n    foreach: [bm25, dsr]\n    do:\n"
        "      cmd: python report.py ${item}\n      plots:\n"
        "        - reports/${item}.trec:\n            cache: false\n",
        encoding="utf-8",
    )
    return str(ws / "reports" / "hybrid.trec")


def _dvc_file_output(ws: Path) -> str:
    (ws / "shared" / "runs").mkdir(parents=True)
    (ws / "shared" / "runs.dvc").write_text(
        "outs:\n- md5: 0123456789abcdef0123456789abcdef.dir\n  path: runs\n", encoding="utf-8"
    )
    return str(ws / "shared" / "runs" / "new.trec")


def _hardlinked_run(ws: Path) -> str:
    (ws / "elsewhere").mkdir()
    os.link(ws / "out.trec", ws / "elsewhere" / "same.trec")
    return str(ws / "out.trec")


def _read_only_run(ws: Path) -> str:
    (ws / "out.trec").chmod(0o444)
    return str(ws / "out.trec")


def _read_only_dir(ws: Path) -> str:
    (ws / "ro").mkdir()
    (ws / "ro").chmod(0o555)
    return str(ws / "ro" / "r.trec")


SURROGATE_LINE = '{"id": "a", "question": "Qui paie le loyer \\udc80 ?"}'


GOOD_YAML = "tolerance: 0.01\nsystems:\n  bm25:\n    test: {recall@100: 0.4, map: 0.1}\n"

CASES = [
    # 1. --run must not overwrite the questions file (same path, relative path, symlink, hard link)
    (
        "run-is-questions",
        "ws",
        lambda ws: _batch(ws, str(ws / "q.jsonl"), str(ws / "q.jsonl")),
        ["--run", "q.jsonl", "is the --questions file", "expected a separate output path"],
    ),
    (
        "run-is-questions-relative",
        "ws",
        lambda ws: _batch(ws, "q.jsonl", "./data/../q.jsonl"),
        ["--run ./data/../q.jsonl", "is the --questions file"],
    ),
    (
        "run-is-questions-symlink",
        "ws",
        lambda ws: _batch(ws, str(ws / "q.jsonl"), _symlink(ws)),
        ["--run", "link.trec", "is the --questions file"],
    ),
    (
        "run-is-questions-hardlink",
        "ws",
        lambda ws: _batch(ws, str(ws / "q.jsonl"), _hardlink(ws)),
        ["--run", "hard.trec", "is the --questions file"],
    ),
    (
        "run-is-corpus",
        "ws",
        lambda ws: _batch(ws, str(ws / "q.jsonl"), str(ws / "data/clean/articles.parquet")),
        ["--run", "articles.parquet", "`dvc repro` manages", "expected a path outside data/ and models/"],
    ),
    (
        "run-is-not-a-run",
        "ws",
        lambda ws: _batch(ws, str(ws / "q.jsonl"), _not_a_run(ws)),
        ["--run", "notes.txt", "is not a TREC run", "expected a new path or an earlier run"],
    ),
    # 2. question and id types
    (
        "question-null",
        "ws",
        lambda ws: _batch(
            ws, _q(ws, {"id": "a", "question": "loyer"}, {"id": "b", "question": None}), str(ws / "out.trec")
        ),
        ["q.jsonl, row 2, column 'question'", "null", "expected a non-empty string"],
    ),
    (
        "question-list",
        "ws",
        lambda ws: _batch(ws, _q(ws, {"id": "a", "question": ["a", "b"]}), str(ws / "out.trec")),
        ["q.jsonl, row 1, column 'question'", '["a", "b"]', "expected a non-empty string"],
    ),
    (
        "question-blank",
        "ws",
        lambda ws: _batch(ws, _q(ws, {"id": "a", "question": "  "}), str(ws / "out.trec")),
        ["q.jsonl, row 1, column 'question'", "expected a non-empty string"],
    ),
    (
        "id-missing",
        "ws",
        lambda ws: _batch(ws, _q(ws, {"id": 1, "question": "loyer"}, {"question": "bail"}), str(ws / "out.trec")),
        ["q.jsonl, row 2", "expected an object with keys 'id' and 'question'", "missing ['id']"],
    ),
    (
        "id-null",
        "ws",
        lambda ws: _batch(ws, _q(ws, {"id": None, "question": "loyer"}), str(ws / "out.trec")),
        ["q.jsonl, row 1, column 'id'", "null", "expected a string or an integer"],
    ),
    (
        "id-duplicate",
        "ws",
        lambda ws: _batch(
            ws,
            _q(ws, {"id": "a", "question": "loyer"}, {"id": "b", "question": "bail"}, {"id": "a", "question": "mur"}),
            str(ws / "out.trec"),
        ),
        ["q.jsonl, row 3, column 'id'", 'id "a" already used on row 1', "expected unique ids"],
    ),
    # 4. ranking depths
    (
        "k-zero-dense",
        "dense_ws",
        lambda ws: _batch(ws, str(ws / "q.jsonl"), str(ws / "out.trec"), "--system", "dsr", "--k", "0"),
        ["--k must be ≥ 1 (got 0)"],
    ),
    (
        "k-negative",
        "ws",
        lambda ws: _batch(ws, str(ws / "q.jsonl"), str(ws / "out.trec"), "--k", "-5"),
        ["--k must be ≥ 1 (got -5)"],
    ),
    (
        "top-zero",
        "ws",
        lambda ws: ["search", "loyer", "--top", "0", "--workspace", str(ws)],
        ["--top must be ≥ 1 (got 0)"],
    ),
    (
        "top-zero-dense",
        "dense_ws",
        lambda ws: ["search", "--system", "dsr", "loyer", "--top", "0", "--workspace", str(ws)],
        ["--top must be ≥ 1 (got 0)"],
    ),
    (
        "empty-question-argument",
        "dense_ws",
        lambda ws: ["search", "--system", "dsr", " ", "--workspace", str(ws)],
        ["question argument is empty", "expected a non-empty question"],
    ),
    # 5. --run not writable as a file
    (
        "run-is-directory",
        "ws",
        lambda ws: _batch(ws, str(ws / "q.jsonl"), str(ws / "models")),
        ["--run", "models is a directory", "expected the path of the TREC run file"],
    ),
    (
        "run-under-a-file",
        "ws",
        lambda ws: _batch(ws, str(ws / "q.jsonl"), str(ws / "out.trec" / "x.trec")),
        ["--run", "out.trec is not a directory", "expected a writable path"],
    ),
    # 7. damaged artefacts
    (
        "truncated-query-encoder",
        "dense_ws",
        lambda ws: ["search", "--system", "dsr", "loyer", "--workspace", str(ws)],
        [
            "models/dsr/query_encoder/model.safetensors",
            "truncated or corrupt",
            "`dvc repro train_dsr`",
            "`dvc checkout`",
        ],
    ),
    # 7b. unreadable entries of the model directory (issue 18): named, with the stage that writes them
    (
        "query-encoder-tokenizer-loop",
        "dense_ws",
        lambda ws: _dsr_search(ws),
        [
            "models/dsr/query_encoder/tokenizer.json",
            "is a symbolic link loop, expected a readable file",
            "rerun `dvc repro train_dsr` (or `dvc checkout`) to restore it",
        ],
    ),
    (
        "query-encoder-config-is-a-directory",
        "dense_ws",
        lambda ws: _dsr_search(ws),
        ["models/dsr/query_encoder/config.json", "is a directory, expected a readable file", "`dvc repro train_dsr`"],
    ),
    (
        "query-encoder-config-missing",
        "dense_ws",
        lambda ws: _dsr_search(ws),
        ["models/dsr/query_encoder/config.json", "config.json not found", "`dvc repro train_dsr`"],
    ),
    (
        "query-encoder-config-broken-link",
        "dense_ws",
        lambda ws: _dsr_search(ws),
        ["models/dsr/query_encoder/config.json", "is a broken symbolic link", "`dvc repro train_dsr`"],
    ),
    (
        "query-encoder-without-vocabulary",
        "dense_ws",
        lambda ws: _dsr_search(ws),
        [
            "models/dsr/query_encoder",
            "no tokenizer vocabulary, expected one of tokenizer.json",
            "`dvc repro train_dsr`",
        ],
    ),
    (
        "query-encoder-without-weights",
        "dense_ws",
        lambda ws: _dsr_search(ws),
        ["models/dsr/query_encoder", "no model weights, expected model.safetensors", "`dvc repro train_dsr`"],
    ),
    (
        "query-encoder-corrupt-settings",
        "dense_ws",
        lambda ws: _dsr_search(ws),
        ["models/dsr/query_encoder/query_encoder.json", "truncated or corrupt", "`dvc repro train_dsr`"],
    ),
    (
        "query-encoder-is-a-file",
        "dense_ws",
        lambda ws: _dsr_search(ws),
        [
            "models/dsr/query_encoder",
            "the model directory is a file, expected a readable directory",
            "`dvc repro train_dsr`",
        ],
    ),
    (
        "truncated-embeddings",
        "dense_ws",
        lambda ws: ["search", "--system", "dsr", "loyer", "--workspace", str(ws)],
        ["data/embed/articles.safetensors", "truncated or corrupt", "`dvc repro`"],
    ),
    (
        "truncated-bm25-index",
        "ws",
        lambda ws: ["search", "loyer", "--workspace", str(ws)],
        ["models/bm25/index.npz", "truncated or corrupt", "`dvc repro bm25`"],
    ),
    # 8. models built on another corpus
    (
        "stale-bm25",
        "ws",
        lambda ws: ["search", "loyer bail", "--workspace", str(ws)],
        ["models/bm25 was built on a different corpus than", "data/clean/articles.parquet", "920", "run `dvc repro`"],
    ),
    (
        "stale-dense",
        "dense_ws",
        lambda ws: _batch(ws, str(ws / "q.jsonl"), str(ws / "out.trec"), "--system", "dsr"),
        [
            "data/embed/articles.safetensors was built on a different corpus than",
            "data/clean/articles.parquet",
            "920",
            "run `dvc repro`",
        ],
    ),
    # 10. --run inside DVC's cache or over a DVC-tracked output (issue 18: `--run .dvc/cache/...` overwrote a
    # cached run), a hard-linked or read-only file, a read-only directory (refused even for root)
    (
        "run-into-dvc-cache",
        "ws",
        lambda ws: _batch(ws, str(ws / "q.jsonl"), _into_cache(ws)),
        [
            "--run",
            ".dvc/cache/files/md5/3b/",
            "is inside",
            ".dvc, a directory only dvc writes",
            "refusing to write there, expected a path outside DVC's cache and the outputs it tracks",
        ],
    ),
    (
        "run-symlink-into-dvc-cache",
        "ws",
        lambda ws: _batch(ws, str(ws / "q.jsonl"), _symlink_into_cache(ws)),
        ["--run", "cached.trec is inside", ".dvc, a directory only dvc writes", "expected a path outside DVC's cache"],
    ),
    (
        "run-into-configured-cache",
        "ws",
        lambda ws: _batch(ws, str(ws / "q.jsonl"), _configured_cache(ws)),
        [
            "--run",
            "dvc-store/files/md5/3b/",
            "is inside DVC's cache",
            "dvc-store (cache.dir of",
            ".dvc/config)",
            "expected a path outside DVC's cache",
        ],
    ),
    (
        "run-into-configured-cache-local",
        "ws",
        lambda ws: _batch(ws, str(ws / "q.jsonl"), _configured_cache(ws, "config.local", str(ws / "dvc-store"))),
        ["--run", "is inside DVC's cache", "(cache.dir of", ".dvc/config.local)"],
    ),
    (
        "run-is-dvc-output",
        "ws",
        lambda ws: _batch(ws, str(ws / "q.jsonl"), _dvc_yaml_output(ws)),
        [
            "--run",
            "bm25.trec is inside exports/runs, an output of stage 'export' in",
            "dvc.yaml",
            "expected a path outside DVC's cache and the outputs it tracks",
        ],
    ),
    (
        "run-is-dvc-foreach-output",
        "ws",
        lambda ws: _batch(ws, str(ws / "q.jsonl"), _dvc_yaml_template(ws)),
        ["--run", "hybrid.trec matches reports/${item}.trec, an output of stage 'report' in", "dvc.yaml"],
    ),
    (
        "run-is-dvc-file-output",
        "ws",
        lambda ws: _batch(ws, str(ws / "q.jsonl"), _dvc_file_output(ws)),
        ["--run", "new.trec is inside runs, tracked by", "shared/runs.dvc"],
    ),
    (
        "run-is-dvc-lock",
        "ws",
        lambda ws: _batch(ws, str(ws / "q.jsonl"), str(ws / "dvc.lock")),
        ["--run", "is dvc.lock, one of DVC's own files"],
    ),
    (
        "run-is-hardlinked",
        "ws",
        lambda ws: _batch(ws, str(ws / "q.jsonl"), _hardlinked_run(ws)),
        ["--run", "out.trec has 2 hard links", "refusing to overwrite it", "expected a new path"],
    ),
    (
        "run-is-read-only",
        "ws",
        lambda ws: _batch(ws, str(ws / "q.jsonl"), _read_only_run(ws)),
        ["--run", "out.trec is read-only (mode 0444)", "refusing to overwrite it", "expected a writable path"],
    ),
    (
        "run-in-read-only-directory",
        "ws",
        lambda ws: _batch(ws, str(ws / "q.jsonl"), _read_only_dir(ws)),
        ["--run", "directory", "ro is not writable (mode 0555)", "expected a writable path"],
    ),
    (
        "regress-update-into-dvc-cache",
        "ws",
        lambda ws: [*_regress(ws), "--update", "--expected", _into_cache(ws, GOOD_YAML)],
        ["--expected", ".dvc, a directory only dvc writes", "refusing to rewrite it"],
    ),
    # 11. questions: a repeated key, control characters in an id, lone surrogates (issue 18)
    (
        "question-key-twice",
        "ws",
        lambda ws: _batch(
            ws,
            _q(ws, {"id": "a", "question": "loyer"}, '{"id": "b", "question": "loyer", "question": "bail"}'),
            str(ws / "out.trec"),
        ),
        ['q.jsonl, row 2: key "question" appears twice', "expected each key once"],
    ),
    (
        "id-key-twice",
        "ws",
        lambda ws: _batch(ws, _q(ws, '{"id": "a", "id": "b", "question": "loyer"}'), str(ws / "out.trec")),
        ['q.jsonl, row 1: key "id" appears twice', "expected each key once"],
    ),
    (
        "id-nul",
        "ws",
        lambda ws: _batch(ws, _q(ws, {"id": "a\u0000b", "question": "loyer"}), str(ws / "out.trec")),
        [
            "q.jsonl, row 1, column 'id'",
            "control",
            "'\\x00' at character 2",
            "expected a non-empty id without whitespace or control characters",
        ],
    ),
    (
        "id-escape-character",
        "ws",
        lambda ws: _batch(ws, _q(ws, {"id": "q\u001b[31m", "question": "loyer"}), str(ws / "out.trec")),
        ["q.jsonl, row 1, column 'id'", "'\\x1b' at character 2", "expected a non-empty id"],
    ),
    (
        "id-line-separator",
        "ws",
        lambda ws: _batch(ws, _q(ws, {"id": "q\u2028", "question": "loyer"}), str(ws / "out.trec")),
        ["q.jsonl, row 1, column 'id'", "whitespace", "expected a non-empty id"],
    ),
    (
        "id-zero-width",
        "ws",
        lambda ws: _batch(ws, _q(ws, {"id": "q\u200b1", "question": "loyer"}), str(ws / "out.trec")),
        ["q.jsonl, row 1, column 'id'", "'\\u200b' at character 2"],
    ),
    (
        "id-lone-surrogate",
        "ws",
        lambda ws: _batch(ws, _q(ws, '{"id": "a\\ud800", "question": "loyer"}'), str(ws / "out.trec")),
        ["q.jsonl, row 1, column 'id'", "lone surrogate"],
    ),
    (
        "question-lone-surrogate",
        "ws",
        lambda ws: _batch(ws, _q(ws, {"id": "b", "question": "loyer"}, SURROGATE_LINE), str(ws / "out.trec")),
        [
            "q.jsonl, row 2, column 'question'",
            "'\\udc80' at character 19",
            "lone surrogate",
            "expected valid Unicode text",
        ],
    ),
    (
        "question-lone-surrogate-json",
        "ws",
        lambda ws: ["search", "--questions", _q(ws, SURROGATE_LINE), "--json", "--workspace", str(ws)],
        ["q.jsonl, row 1, column 'question'", "lone surrogate"],
    ),
    (
        "question-argument-surrogate",
        "ws",
        lambda ws: ["search", "loyer \udcff", "--workspace", str(ws)],
        [
            "the question argument holds '\\udcff' at character 7",
            "lone surrogate",
            "expected a question in valid UTF-8 text",
        ],
    ),
    # 9. regress on bad files
    (
        "regress-missing-expected",
        "ws",
        lambda ws: _regress(ws),
        ["exp.yaml", "file not found", "expected a YAML file like regression/sample.yaml"],
    ),
    (
        "regress-malformed-yaml",
        "ws",
        lambda ws: _regress(ws, "systems:\n  bm25: {test: [\n"),
        ["exp.yaml", "not valid YAML", "line"],
    ),
    (
        "regress-no-systems",
        "ws",
        lambda ws: _regress(ws, "tolerance: 0.01\n"),
        ["exp.yaml", "expected a mapping with key 'systems'"],
    ),
    (
        "regress-expected-not-a-number",
        "ws",
        lambda ws: _regress(ws, "systems:\n  bm25:\n    test: {recall@100: 0.4, map: high}\n"),
        ["exp.yaml", "key 'systems.bm25.test.map'", '"high"', "expected a number in [0, 1]"],
    ),
    (
        "regress-bad-tolerance",
        "ws",
        lambda ws: _regress(ws, "tolerance: {map: {abs: x}}\nsystems:\n  bm25:\n    test: {map: 0.1}\n"),
        ["exp.yaml", "key 'tolerance.map.abs'", "expected a number >= 0"],
    ),
    (
        "regress-metric-not-a-number",
        "ws",
        lambda ws: _regress(ws, GOOD_YAML, {"test": {"recall@100": 0.4, "map": "n/a"}}),
        ["metrics/bm25.json", "key 'test.map'", '"n/a"', "expected a number"],
    ),
    (
        "regress-metrics-not-json",
        "ws",
        lambda ws: _regress(ws, GOOD_YAML, raw_metrics='{"test": {"map": 0.1'),
        ["metrics/bm25.json", "not valid JSON"],
    ),
]


def _dsr_search(ws: Path) -> list[str]:
    return _batch(ws, str(ws / "q.jsonl"), str(ws / "out.trec"), "--system", "dsr")


def _replace(path: Path, how: str) -> None:
    """Damage ``path`` (an entry of a model directory): ``loop``, ``directory``, ``missing``,
    ``dangling`` (a link to nothing), ``file`` (a file where a directory belongs)."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    if how == "loop":
        path.symlink_to(path.name)  # tokenizer.json -> tokenizer.json
    elif how == "directory":
        path.mkdir()
    elif how == "dangling":
        path.symlink_to("gone.json")
    elif how == "file":
        path.write_text("not a model\n", encoding="utf-8")


QUERY_ENCODER = "models/dsr/query_encoder"

SETUP = {  # extra damage done to the workspace before a case runs
    "query-encoder-tokenizer-loop": lambda ws: _replace(ws / QUERY_ENCODER / "tokenizer.json", "loop"),
    "query-encoder-config-is-a-directory": lambda ws: _replace(ws / QUERY_ENCODER / "config.json", "directory"),
    "query-encoder-config-missing": lambda ws: _replace(ws / QUERY_ENCODER / "config.json", "missing"),
    "query-encoder-config-broken-link": lambda ws: _replace(ws / QUERY_ENCODER / "config.json", "dangling"),
    "query-encoder-without-vocabulary": lambda ws: _replace(ws / QUERY_ENCODER / "tokenizer.json", "missing"),
    "query-encoder-without-weights": lambda ws: _replace(ws / QUERY_ENCODER / "model.safetensors", "missing"),
    "query-encoder-corrupt-settings": lambda ws: truncate(ws / QUERY_ENCODER / "query_encoder.json"),
    "query-encoder-is-a-file": lambda ws: _replace(ws / QUERY_ENCODER, "file"),
    "truncated-query-encoder": lambda ws: truncate(ws / "models/dsr/query_encoder/model.safetensors"),
    "truncated-embeddings": lambda ws: truncate(ws / "data/embed/articles.safetensors"),
    "truncated-bm25-index": lambda ws: truncate(ws / "models/bm25/index.npz"),
    "stale-bm25": _stale_bm25,
    "stale-dense": _stale_dense,
}


@pytest.mark.parametrize("case, fixture, argv, expected", CASES, ids=[c[0] for c in CASES])
def test_error_is_one_sentence_and_changes_nothing(case, fixture, argv, expected, request, capsys, monkeypatch):
    ws = request.getfixturevalue(fixture)
    monkeypatch.chdir(ws)
    if case in SETUP:
        SETUP[case](ws)
    args = argv(ws)
    if case.startswith(("run-", "k-", "top-", "question-", "id-", "empty-", "regress-update")):
        monkeypatch.setattr("lexgraph.systems.registry.load_retriever", no_retriever)  # checked before any loading
    before = snapshot(ws)
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if f"lexgraph {args[0]}: error: " in line]
    assert len(lines) == 1, err
    for part in expected:
        assert part in lines[0], f"{part!r} not in {lines[0]!r}"
    assert "Traceback" not in err
    assert snapshot(ws) == before  # inputs and the earlier run untouched, nothing new written


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_error_names_the_option(ws, capsys, monkeypatch):
    monkeypatch.setattr("lexgraph.systems.registry.load_retriever", no_retriever)
    before = snapshot(ws)
    assert main(_batch(ws, str(ws / "q.jsonl"), str(ws / "out.trec"), "--device", "cuda")) == 2
    err = capsys.readouterr().err
    assert "lexgraph search: error: --device = 'cuda' but no CUDA device is available" in err
    assert "params.yaml" not in err
    assert snapshot(ws) == before


def test_run_in_a_read_only_directory(ws, capsys, monkeypatch):  # mode bits hold for root too (issue 18)
    monkeypatch.setattr("lexgraph.systems.registry.load_retriever", no_retriever)
    (ws / "ro").mkdir()
    (ws / "ro").chmod(0o555)
    try:
        assert main(_batch(ws, str(ws / "q.jsonl"), str(ws / "ro" / "r.trec"))) == 2
    finally:
        (ws / "ro").chmod(0o755)
    err = capsys.readouterr().err
    assert "--run" in err and "is not writable" in err and not (ws / "ro" / "r.trec").exists()


def test_full_disk_while_writing_the_run(ws, capsys, monkeypatch):
    """ENOSPC half-way through writing --run (issue 18): one line naming the run and the
    reason, exit 2, the earlier run byte-identical and no temporary left."""
    import builtins
    import errno

    real_open = builtins.open

    class FullDisk:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def writelines(self, lines):
            self.fh.write("a Q0 3 1 0.5")  # part of the first line reaches the disk
            self.fh.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("lexgraph.evaluation.trec.open", lambda *a, **k: FullDisk(real_open(*a, **k)), raising=False)
    before = snapshot(ws)
    assert main(_batch(ws, str(ws / "q.jsonl"), str(ws / "out.trec"))) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "lexgraph search: error: " in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"{ws / 'out.trec'}: not written, no space left on device; free space and rerun" in lines[0]
    assert snapshot(ws) == before  # the earlier run as it was, no .out.trec.*.tmp left


# ---------------------------------------------------------------------------
# 3. a question nothing matches gets no results
# ---------------------------------------------------------------------------


def test_bm25_question_without_known_terms_gets_no_results(ws, capsys, caplog):
    import logging

    qfile = _q(ws, {"id": "a", "question": "Qui paie le loyer ?"}, {"id": "zz9", "question": "xyzzy plugh"})
    run = ws / "new.trec"
    with caplog.at_level(logging.WARNING):
        assert main(_batch(ws, qfile, str(run), "--k", "3")) == 0
    lines = run.read_text(encoding="utf-8").splitlines()
    assert lines and all(line.split()[0] == "a" for line in lines)  # nothing for zz9
    assert any("zz9" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    capsys.readouterr()
    assert main(["search", "xyzzy plugh", "--workspace", str(ws)]) == 0
    out = capsys.readouterr().out
    assert "no results" in out and "Art." not in out


def test_retrievers_return_padding_for_questions_without_a_match(ws):
    from lexgraph.methods.dense import DenseRetriever
    from lexgraph.search.bm25 import load_system

    ids, scores = load_system(ws).search(["xyzzy", "loyer"], 3)
    assert ids[0].tolist() == [-1, -1, -1] and scores[0].tolist() == [0, 0, 0]
    assert ids[1, 0] == 3 and scores[1, 0] > 0

    class Encoder:
        def encode(self, texts, batch_size=64, show_progress=False):
            assert all(t.strip() for t in texts)  # blank questions are never encoded
            return torch.ones(len(texts), 4)

    dense = DenseRetriever(Encoder(), [5, 6], torch.eye(2, 4))
    ids, scores = dense.search(["", "q", "  "], 2)
    assert ids.tolist() == [[-1, -1], [5, 6], [-1, -1]]
    assert scores[0].tolist() == [0, 0] and scores[1, 0] > 0


def test_dense_search_rejects_non_positive_k():
    from lexgraph.core.errors import LexgraphError
    from lexgraph.methods.dense import DenseRetriever

    dense = DenseRetriever(None, [5, 6], torch.eye(2, 4), name="dsr")
    with pytest.raises(LexgraphError, match="dsr.search: k = 0, expected a positive integer"):
        dense.search(["q"], 0)


def test_dense_system_runs_on_a_matching_corpus(dense_ws):
    run = dense_ws / "dense.trec"
    assert main(_batch(dense_ws, str(dense_ws / "q.jsonl"), str(run), "--system", "dsr", "--k", "2")) == 0
    assert [line.split()[0] for line in run.read_text(encoding="utf-8").splitlines()] == ["a", "a"]


def test_rerunning_over_an_earlier_run_is_allowed(ws):
    assert main(_batch(ws, str(ws / "q.jsonl"), str(ws / "out.trec"), "--k", "2")) == 0
    assert (ws / "out.trec").read_text(encoding="utf-8").startswith("a Q0 3 1 ")


# ---------------------------------------------------------------------------
# the same at process level: one line on stderr, exit status 2, no traceback
# ---------------------------------------------------------------------------


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "lexgraph.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_process_level_search_error(ws):
    before = snapshot(ws)
    proc = _cli("search", "--questions", "q.jsonl", "--run", "q.jsonl", cwd=ws)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "lexgraph search: error: --run q.jsonl is the --questions file; refusing to "
        "overwrite an input, expected a separate output path"
    )
    assert snapshot(ws) == before


def test_process_level_stale_models_error(ws):
    _stale_bm25(ws)
    proc = _cli("search", "loyer bail", cwd=ws)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "KeyError" not in proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "lexgraph search: error: models/bm25 was built on a different corpus than data/clean/articles.parquet"
        )
    )


def test_process_level_undecodable_question_argument(ws):
    """Bytes that are not UTF-8 on the command line become lone surrogates in ``sys.argv``."""
    before = snapshot(ws)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [sys.executable.encode(), b"-m", b"lexgraph.cli", b"search", b"le loyer \xff ?"],
        cwd=ws,
        capture_output=True,
        env=env,
        timeout=120,
    )
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        "lexgraph search: error: the question argument holds '\\udcff' at "
        "character 10, a lone surrogate that is not valid Unicode text (bytes "
        "that are not UTF-8?); expected a question in valid UTF-8 text"
    )
    assert snapshot(ws) == before


STDIN = {  # standard input holding a line that is not UTF-8, as a byte stream and as decoded text
    "bytes": lambda io: io.TextIOWrapper(io.BytesIO(b"loyer\nle bail \xff ?\n"), encoding="utf-8"),
    "surrogateescape": lambda io: io.TextIOWrapper(
        io.BytesIO(b"loyer\nle bail \xff ?\n"), encoding="utf-8", errors="surrogateescape"
    ),  # Python's UTF-8 mode (C locale)
    "text": lambda io: io.StringIO("loyer\nle bail \udcff ?\n"),  # already decoded with surrogateescape
}


@pytest.mark.parametrize("stdin", sorted(STDIN))
@pytest.mark.parametrize("flags", [[], ["--json"]], ids=["text", "json"])
def test_undecodable_interactive_question(ws, flags, stdin, capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", STDIN[stdin](io))
    before = snapshot(ws)
    assert main(["search", *flags, "--workspace", str(ws)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "lexgraph search: error: " in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("lexgraph search: error: standard input, line 2: "), lines[0]
    assert "expected one question per line in UTF-8 text" in lines[0]
    assert ("'\\udcff' at character 9, a lone surrogate" if stdin == "text" else "not valid UTF-8") in lines[0]
    assert snapshot(ws) == before


def test_line_separators_inside_a_question_are_text(ws, capsys):
    """U+2028, U+2029 and U+0085 are valid inside a JSON string: the file's lines end at \\n only."""
    questions = ["Qui paie\u2028le loyer ?", "le bail\u0085et le contrat", "le mur\u2029mitoyen"]
    qfile = ws / "q.jsonl"
    qfile.write_text(
        "".join(json.dumps({"id": f"q{i}", "question": q}, ensure_ascii=False) + "\n" for i, q in enumerate(questions)),
        encoding="utf-8",
    )
    assert main(_batch(ws, str(qfile), str(ws / "new.trec"), "--json", "--top", "1")) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.split("\n") if line]  # JSON lines: \n only
    assert [r["question"] for r in records] == questions
    assert [r["hits"][0]["id"] for r in records] == [3, 2, 1]
    assert {line.split()[0] for line in (ws / "new.trec").read_text(encoding="utf-8").splitlines()} == {
        "q0",
        "q1",
        "q2",
    }


def test_json_into_a_closed_pipe_stops_quietly(ws):
    """`lexgraph search --questions FILE --json | head -1`: the reader goes away after one line;
    the command stops with status 141 (128 + SIGPIPE), no message, no traceback."""
    write_questions(
        ws / "many.jsonl", [{"id": f"q{i}", "question": "Qui paie le loyer du mur mitoyen ?"} for i in range(3000)]
    )  # ~1.5 MB of JSON lines: far beyond a pipe's buffer
    before = snapshot(ws)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "lexgraph.cli", "search", "--questions", "many.jsonl", "--json", "--top", "3"],
        cwd=ws,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        first = proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read().decode("utf-8", "replace")
        assert proc.wait(timeout=120) == 141, err
    finally:
        proc.kill()
    assert json.loads(first)["id"] == "q0"
    assert "Traceback" not in err and "Error" not in err and "error" not in err and "Exception" not in err, err
    assert snapshot(ws) == before


@pytest.fixture(scope="module")
def outside_a_workspace(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """`lexgraph search x` run once from an empty directory that is no workspace: the two tests
    below check the same process (each run took ~5 s, most of it importing torch)."""
    elsewhere = tmp_path_factory.mktemp("outside") / "elsewhere"
    elsewhere.mkdir()
    return elsewhere, _cli("search", "x", cwd=elsewhere)


def test_process_level_search_outside_a_workspace(outside_a_workspace):
    """From a directory that is not a lexgraph workspace (no dvc.yaml, params.yaml or data/clean/),
    `lexgraph search` says so in one line, naming the directory and --workspace, instead of
    "no BM25 index; run `dvc repro bm25` first" (issue 25)."""
    elsewhere, proc = outside_a_workspace
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("lexgraph search: error: ") and "not a lexgraph workspace" in lines[0], lines[0]
    assert str(elsewhere.resolve()) in lines[0] and "--workspace" in lines[0] and "dvc repro bm25" not in lines[0], (
        lines[0]
    )
    assert proc.stdout == ""


HOSTILE = "\x1b[5mclignote\x1b[0m \x1b]8;;https://evil.example\x07lien\x1b]8;;\x07 \x00nul \x7fdel \x9bcsi"


@pytest.mark.parametrize("flags", [[], ["--json"]], ids=["text", "json"])
def test_process_level_control_characters_of_the_corpus_are_neutralised(tmp_path, flags):
    """Issue 28: ESC, OSC 8, BEL, NUL, DEL and C1 in an article and a heading reach stdout
    as visible escapes (text) or JSON escapes (``--json``), never as the bytes a terminal obeys."""
    (tmp_path / "data" / "clean").mkdir(parents=True)
    articles = {**ARTICLES, 3: f"{ARTICLES[3]} {HOSTILE}"}
    pl.DataFrame(
        {
            "id": list(articles),
            "article": list(articles.values()),
            "reference": [f"Art. {i} {HOSTILE}" for i in articles],
            "path": [["Code A", f"Titre {HOSTILE}"]] * len(articles),
        }
    ).write_parquet(tmp_path / "data" / "clean" / "articles.parquet")
    BM25().fit_texts(list(articles.values()), list(articles)).save(tmp_path / "models" / "bm25")
    before = snapshot(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "lexgraph.cli", "search", "qui paie le loyer ?", *flags],
        cwd=tmp_path,
        capture_output=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr
    out = proc.stdout
    for raw in (b"\x1b", b"\x07", b"\x00", b"\x7f", "\x9b".encode()):
        assert raw not in out, out
    assert (b"\\x1b[5mclignote" if not flags else b"\\u001b[5mclignote") in out
    if flags:
        assert json.loads(out)["hits"][0]["path"][1] == f"Titre {HOSTILE}"
    assert snapshot(tmp_path) == before


# issue 28, class 9: one rule for a directory given on the command line (a file, or nothing, there)

# (id, argv after the command with {ws} for the workspace, the one error line after "lexgraph <command>: error: ")
DIRECTORY_OPTIONS = [
    (
        "workspace-file",
        ["search", "x", "--workspace", "{ws}/q.jsonl"],
        "--workspace '{ws}/q.jsonl' is a file; expected a lexgraph workspace, the directory with dvc.yaml "
        "and params.yaml",
    ),
    (
        "workspace-spaces-quotes-newline",
        ["search", "x", "--workspace", "{ws}/my ws'\"\nx"],
        "--workspace '{ws}/my ws\\'\"\\nx' does not exist; expected a lexgraph workspace",
    ),
    (
        "metrics-dir-file",
        ["regress", "--expected", "{ws}/exp.yaml", "--metrics-dir", "{ws}/q.jsonl"],
        "--metrics-dir '{ws}/q.jsonl' is a file; expected the directory of <system>.json that `dvc repro` writes",
    ),
    (
        "metrics-dir-missing",
        ["regress", "--update", "--expected", "{ws}/exp.yaml", "--metrics-dir", "{ws}/metrics x"],
        "--metrics-dir '{ws}/metrics x' does not exist; expected the directory of <system>.json",
    ),
    (
        "plots-workspace-file",
        ["plots-offline", "--workspace", "{ws}/q.jsonl"],
        "--workspace '{ws}/q.jsonl' is a file; expected a DVC workspace, the directory with .dvc/ and dvc.yaml",
    ),
]


@pytest.mark.parametrize("argv, line", [c[1:] for c in DIRECTORY_OPTIONS], ids=[c[0] for c in DIRECTORY_OPTIONS])
def test_a_directory_option_given_a_file_or_nothing_is_one_line(ws, capsys, argv, line):
    """`--metrics-dir FILE` said "metrics directory not found"; a path with a newline split the
    error over two lines. Now: the option, the path with its escapes visible, what was expected."""
    (ws / "exp.yaml").write_text("systems:\n  bm25: {test: {map: 0.1}}\n", encoding="utf-8")
    before = snapshot(ws)
    argv = [a.replace("{ws}", str(ws)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"lexgraph {argv[0]}: error: {line.replace('{ws}', str(ws))}"), lines[0]
    assert snapshot(ws) == before


def test_process_level_search_outside_a_workspace_names_what_is_missing_and_dvc_repro(outside_a_workspace):
    elsewhere, proc = outside_a_workspace
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines() == [
        f"lexgraph search: error: --workspace '.' ({str(elsewhere.resolve())!r}) is not a lexgraph workspace: "
        "none of dvc.yaml, params.yaml, data/clean there; expected the project's directory, where `dvc repro` "
        "writes data/ and models/ (run lexgraph there, or pass --workspace DIR; in a fresh clone run "
        "`dvc repro` first)"
    ]
    assert list(elsewhere.iterdir()) == []


def test_a_query_encoder_whose_config_has_fewer_layers_than_its_weights_is_refused(dense_ws, capsys):
    """config.json saying 0 layers over weights of 1: transformers dropped encoder.layer.0.* and
    the search ran on an encoder without its layers (an unused-weights report at DEBUG only)."""
    config = dense_ws / "models" / "dsr" / "query_encoder" / "config.json"
    values = json.loads(config.read_text(encoding="utf-8"))
    config.write_text(json.dumps({**values, "num_hidden_layers": 0}), encoding="utf-8")
    before = snapshot(dense_ws)
    assert main(["search", "--system", "dsr", "loyer", "--workspace", str(dense_ws)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(
        f"lexgraph search: error: {config}: does not match the weights: the weights hold layer(s) 0 but config.json "
        "has num_hidden_layers = 0; expected the config.json saved with these weights (loading would silently drop "
    ), err
    assert "rerun `dvc repro train_dsr`" in err, err
    assert snapshot(dense_ws) == before


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("max_length", 2, "an integer >= 3 ([CLS], one token of text and [SEP])"),
        ("trainable_layers", 5, "null or an integer in [0, 1] (the backbone's layers)"),
    ],
)
def test_a_saved_query_encoder_setting_that_does_not_fit_its_model_names_the_file(
    dense_ws, capsys, key, value, expected
):
    settings = dense_ws / "models" / "dsr" / "query_encoder" / "query_encoder.json"
    values = json.loads(settings.read_text(encoding="utf-8"))
    settings.write_text(json.dumps({**values, key: value}), encoding="utf-8")
    before = snapshot(dense_ws)
    assert main(["search", "--system", "dsr", "loyer", "--workspace", str(dense_ws)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.splitlines() == [
        f"lexgraph search: error: {settings}: key '{key}' = {value}, expected {expected}; rerun `dvc repro train_dsr` "
        "(or `dvc checkout`) to restore it"
    ], err
    assert snapshot(dense_ws) == before

"""Bad values in params.yaml: every stage stops with one line naming params.yaml, the
dotted key and what was expected (exit 2, no traceback), before touching its outputs.

Each case writes a variant of the repository's params.yaml into tmp_path, runs the real
stage script as a subprocess with every output pointed at files pre-filled with
sentinel bytes, and checks the message and that the outputs are byte-for-byte intact.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import runpy
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from conftest import ROOT
from helpers_config import sample_config, sample_section
from lexgraph.core.config import SECTIONS, Base, read_params, resolve_device
from lexgraph.core.errors import ConfigError, DataError
from lexgraph.core.settings import read_section

PROFILES = [ROOT / "params.yaml", ROOT / "profiles" / "paper.yaml"]


SENTINEL = b"sentinel: must survive a failed stage\n"

# stage script -> (the stage name its error line starts with, argv with {in}/{out} placeholders; outputs under {out})
STAGES = {
    "fetch": ("fetch", ["--out", "{out}/raw"]),
    "clean": ("clean", ["--raw", "{in}/raw", "--out", "{out}/clean", "--metrics", "{out}/data.json"]),
    "bm25_tune": (
        "bm25_tune",
        [
            "--articles",
            "{in}/articles.parquet",
            "--questions",
            "{in}/questions.parquet",
            "--best",
            "{out}/bm25_tune.json",
            "--grid",
            "{out}/bm25_tune.csv",
        ],
    ),
    "bm25": ("bm25", ["--articles", "{in}/articles.parquet", "--tuned", "{in}/bm25_tune.json", "--out", "{out}/bm25"]),
    "mine_negatives": (
        "mine_negatives",
        [
            "--articles",
            "{in}/articles.parquet",
            "--questions",
            "{in}/questions.parquet",
            "--synthetic",
            "{in}/synthetic.parquet",
            "--hub-negatives",
            "{in}/raw_negatives.parquet",
            "--out",
            "{out}/negatives.parquet",
        ],
    ),
    "evaluate": (
        "evaluate",
        [
            "--questions",
            "{in}/questions.parquet",
            "--keys",
            "{in}/keys.parquet",
            "--runs",
            "{out}/runs",
            "--metrics-dir",
            "{out}/metrics",
            "--workspace",
            "{in}",
        ],
    ),
    "build_graph": (
        "build_graph",
        [
            "--articles",
            "{in}/articles.parquet",
            "--headings",
            "{in}/headings.parquet",
            "--questions",
            "{in}/questions.parquet",
            "--out",
            "{out}/graph",
            "--metrics",
            "{out}/graph.json",
        ],
    ),
    "generate_queries": (
        "generate_queries",
        [
            "--articles",
            "{in}/articles.parquet",
            "--questions",
            "{in}/questions.parquet",
            "--out",
            "{out}/synthetic.parquet",
        ],
    ),
    "pretrain": (
        "pretrain",
        [
            "--articles",
            "{in}/articles.parquet",
            "--out",
            "{out}/pretrain",
            "--metrics",
            "{out}/pretrain.json",
            "--plot",
            "{out}/pretrain_curve.csv",
        ],
    ),
    "zeroshot": (
        "zeroshot",
        [
            "--pretrained",
            "{in}/pretrain",
            "--articles",
            "{in}/articles.parquet",
            "--chunks",
            "{in}/chunks",
            "--out",
            "{out}/zeroshot",
        ],
    ),
    "train_dsr": (
        "train_dsr",
        [
            "--articles",
            "{in}/articles.parquet",
            "--questions",
            "{in}/questions.parquet",
            "--synthetic",
            "{in}/synthetic.parquet",
            "--negatives",
            "{in}/negatives.parquet",
            "--pretrained",
            "{in}/pretrain",
            "--chunks",
            "{in}/chunks",
            "--out",
            "{out}/dsr",
            "--metrics",
            "{out}/train_dsr.json",
            "--plot",
            "{out}/train_dsr_curve.csv",
        ],
    ),
    "train_dsr_qabisar": (
        "train_dsr_qabisar",
        [
            "--articles",
            "{in}/articles.parquet",
            "--questions",
            "{in}/questions.parquet",
            "--synthetic",
            "{in}/synthetic.parquet",
            "--negatives",
            "{in}/negatives.parquet",
            "--pretrained",
            "{in}/pretrain",
            "--chunks",
            "{in}/chunks",
            "--out",
            "{out}/dsr_qabisar",
            "--metrics",
            "{out}/train_dsr_qabisar.json",
            "--plot",
            "{out}/train_dsr_qabisar_curve.csv",
        ],
    ),
    "hybrid": (
        "hybrid",
        [
            "--questions",
            "{in}/questions.parquet",
            "--workspace",
            "{in}",
            "--out",
            "{out}/hybrid",
            "--metrics",
            "{out}/hybrid_tune.json",
        ],
    ),
    "train_gnn": (
        "train_gnn",
        [
            "--variant",
            "hgraph",
            "--graph",
            "{in}/graph",
            "--embed",
            "{in}/embed",
            "--questions",
            "{in}/questions.parquet",
            "--synthetic",
            "{in}/synthetic.parquet",
            "--negatives",
            "{in}/negatives.parquet",
            "--dsr",
            "{in}/dsr",
            "--fallback-dsr",
            "{in}/dsr",
            "--fallback-embed",
            "{in}/embed",
            "--hprior",
            "{in}/hprior",
            "--out",
            "{out}/gnn_hgraph",
            "--metrics",
            "{out}/train_gnn_hgraph.json",
            "--plot",
            "{out}/train_gnn_hgraph_curve.csv",
        ],
    ),
}

DELETE = object()

# (id, stage, {dotted key: new value (DELETE: remove it)}, fragments the error line must contain)
CASES = [
    ("base.seed-word", "clean", {"base.seed": "thirteen"}, ["'base.seed' = 'thirteen', expected an integer"]),
    ("base.seed-float", "clean", {"base.seed": 13.5}, ["'base.seed' = 13.5, expected an integer"]),
    ("base.device-int", "fetch", {"base.device": 0}, ["'base.device' = 0, expected auto, cpu, cuda or cuda:N"]),
    (
        "base.log_level",
        "zeroshot",
        {"base.log_level": "LOUD"},
        ["'base.log_level' = 'LOUD', expected one of DEBUG, INFO, WARNING, ERROR"],
    ),
    ("base.unknown", "clean", {"base.sed": 1}, ["unknown keys 'base.sed' (did you mean 'base.seed'?)"]),
    (
        "section-typo",
        "bm25_tune",
        {"bm25_tune": DELETE, "bm25_tunes": {"split": "dev"}},
        [
            "unknown section(s) 'bm25_tunes' (did you mean 'bm25_tune'?)",
            "expected only the sections base, fetch, clean",
        ],
    ),
    (
        "clean.min_words-word",
        "clean",
        {"clean.min_words": "three"},
        ["'clean.min_words' = 'three', expected an integer >= 0"],
    ),
    (
        "clean.min_words-negative",
        "clean",
        {"clean.min_words": -1},
        ["'clean.min_words' = -1, expected an integer >= 0"],
    ),
    (
        "clean.drop_repealed-int",
        "clean",
        {"clean.drop_repealed": 2},
        ["'clean.drop_repealed' = 2, expected true or false"],
    ),
    (
        "clean.unknown",
        "clean",
        {"clean.min_word": 3},
        [
            "unknown keys 'clean.min_word' (did you mean 'clean.min_words'?)",
            "expected keys of 'clean': allow_test_changes, drop_repealed, min_words",
        ],
    ),
    (
        "fetch.dev_fraction",
        "fetch",
        {"fetch.dev_fraction": "ten percent"},
        ["'fetch.dev_fraction' = 'ten percent', expected a number in (0, 1)"],
    ),
    # issue 28: a directory the user names, given a file or a path that is not there (shown escaped)
    (
        "fetch.local_dir-file",
        "fetch",
        {"fetch.source": "local", "fetch.local_dir": str(ROOT / "README.md")},
        [
            f"params.yaml: 'fetch.local_dir' = {str(ROOT / 'README.md')!r} is a file; expected a directory "
            "holding the hub's files (articles.csv, questions_train.csv, …)"
        ],
    ),
    (
        "fetch.local_dir-spaces-quotes-newline",
        "fetch",
        {"fetch.source": "local", "fetch.local_dir": "my data/l'\"x\ny"},
        ["params.yaml: 'fetch.local_dir' = 'my data/l\\'\"x\\ny' does not exist; expected a directory"],
    ),
    (
        "fetch.sample_dir-file",
        "fetch",
        {"fetch.sample_dir": "data/sample/articles.csv"},
        ["params.yaml: 'fetch.sample_dir' = 'data/sample/articles.csv' is a file; expected a directory"],
    ),
    (
        "bm25_tune.split-test",
        "bm25_tune",
        {"bm25_tune.split": "test"},
        ["'bm25_tune.split' = 'test', but the 'test' split is held out for evaluation; expected dev (or train)"],
    ),
    ("bm25.k1", "bm25", {"bm25.k1": "fast"}, ["'bm25.k1' = 'fast', expected a number >= 0 or 'tuned'"]),
    (
        "negatives.splits-test",
        "mine_negatives",
        {"negatives.splits": ["train", "test"]},
        ["'negatives.splits' = ['train', 'test'], but the 'test' split is held out for evaluation"],
    ),
    (
        "negatives.depth-float",
        "mine_negatives",
        {"negatives.depth": 1.5},
        ["'negatives.depth' = 1.5, expected a positive integer"],
    ),
    ("evaluate.k-shallow", "evaluate", {"evaluate.k": 100}, ["'evaluate.k' = 100, expected an integer >= 500"]),
    (
        "evaluate.systems",
        "evaluate",
        {"evaluate.systems": ["bm25", "bm26"]},
        ["'evaluate.systems' = ['bm25', 'bm26'], expected a non-empty list of distinct systems among bm25"],
    ),
    (
        "graph.questions",
        "build_graph",
        {"graph.questions": "yes"},
        ["'graph.questions' = 'yes', expected true or false"],
    ),
    (
        "queries.per_article",
        "generate_queries",
        {"queries.per_article": 2.5},
        ["'queries.per_article' = 2.5, expected a positive integer"],
    ),
    (
        "pretrain.learning_rate",
        "pretrain",
        {"pretrain.learning_rate": "fast"},
        ["'pretrain.learning_rate' = 'fast', expected a positive number"],
    ),
    (
        "zeroshot.batch_size",
        "zeroshot",
        {"zeroshot.batch_size": True},
        ["'zeroshot.batch_size' = True, expected a positive integer"],
    ),
    ("dsr.lr", "train_dsr", {"dsr.lr": "fast"}, ["'dsr.lr' = 'fast', expected a positive number"]),
    # QABISAR's first stage reads both sections: a bad value in either stops it, named as written
    (
        "dsr_qabisar.similarity",
        "train_dsr_qabisar",
        {"dsr_qabisar.similarity": "euclid"},
        ["'dsr_qabisar.similarity' = 'euclid', expected one of cosine, dot"],
    ),
    ("dsr_qabisar-dsr.lr", "train_dsr_qabisar", {"dsr.lr": "fast"}, ["'dsr.lr' = 'fast', expected a positive number"]),
    (
        "dsr_qabisar-no-dsr",
        "train_dsr_qabisar",
        {"dsr": DELETE},
        ["missing section 'dsr' (read by train_dsr, train_dsr_qabisar"],
    ),
    (
        "hybrid.split-test",
        "hybrid",
        {"hybrid.split": "test"},
        ["'hybrid.split' = 'test', expected dev (or train); the 'test' split is held out for evaluation"],
    ),
    # numbers that type-check but mean nothing (issue 18): refused by the config layer, naming the key
    (
        "dsr.temperature-inf",
        "train_dsr",
        {"dsr.temperature": float("inf")},
        ["'dsr.temperature' = inf, expected a positive number, finite (not nan or inf)"],
    ),
    ("dsr.lr-nan-string", "train_dsr", {"dsr.lr": "nan"}, ["'dsr.lr' = 'nan', expected a positive number, finite"]),
    (
        "pretrain.weight_decay-nan",
        "pretrain",
        {"pretrain.weight_decay": float("nan")},
        ["'pretrain.weight_decay' = nan, expected a number >= 0, finite (not nan or inf)"],
    ),
    (
        "pretrain.weight_decay-negative",
        "pretrain",
        {"pretrain.weight_decay": -0.5},
        ["'pretrain.weight_decay' = -0.5, expected a number >= 0"],
    ),
    (
        "bm25.k1-inf",
        "bm25",
        {"bm25.k1": float("inf")},
        ["'bm25.k1' = inf, expected a number >= 0 or 'tuned', finite (not nan or inf)"],
    ),
    (
        "bm25_tune.k1-inf",
        "bm25_tune",
        {"bm25_tune.k1": [1.2, float("inf")]},
        ["'bm25_tune.k1' = [1.2, inf], expected a non-empty list of numbers >= 0, finite (not nan or inf)"],
    ),
    (
        "negatives.k1-inf",
        "mine_negatives",
        {"negatives.k1": float("inf")},
        ["'negatives.k1' = inf, expected a number >= 0, finite (not nan or inf)"],
    ),
    (
        "gnn.temperature-inf",
        "train_gnn",
        {"gnn.hgraph.temperature": float("inf")},
        ["'gnn.hgraph.temperature' = inf, expected a positive number, finite (not nan or inf)"],
    ),
    (
        "gnn.weight_decay-nan",
        "train_gnn",
        {"gnn.weight_decay": float("nan")},
        ["'gnn.weight_decay' = nan, expected a number >= 0, finite (not nan or inf)"],
    ),
    (
        "gnn.layers-100",
        "train_gnn",
        {"gnn.layers": 100},
        [
            "'gnn.layers' = 100, expected an integer in [1, 8] (one hop per layer: an article's farthest heading is 8 "
            "hops up the hierarchy's 8 levels"
        ],
    ),
]


def _edit(params: dict, edits: dict) -> dict:
    for dotted, value in edits.items():
        *parents, key = dotted.split(".")
        node = params
        for part in parents:
            node = node[part]
        if value is DELETE:
            del node[key]
        else:
            node[key] = value
    return params


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()} | {
        str(p.relative_to(root)) + "/": b"" for p in root.rglob("*") if p.is_dir()
    }


def _prefill(out_dir: Path, argv: list[str]) -> None:
    """Every output path holds sentinel bytes (a file, or a directory with a file)."""
    for value in argv:
        path = Path(value)
        if out_dir in path.parents:
            if path.suffix:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(SENTINEL)
            else:
                path.mkdir(parents=True, exist_ok=True)
                (path / "sentinel").write_bytes(SENTINEL)


#: ``params`` for :func:`run_failing_stage`: params.yaml is a directory
PARAMS_DIRECTORY = object()


def run_failing_stage(tmp_path: Path, stage: str, params: dict | bytes, *, in_process: bool = False) -> str:
    """Run ``stages/<stage>.py`` (a subprocess, or in this process through ``runpy`` as
    ``__main__``) with ``params`` as params.yaml (a mapping, the file's bytes, or
    :data:`PARAMS_DIRECTORY`); assert exit 2, one error line, no traceback, intact inputs
    and outputs; return the error line."""
    label, template = STAGES[stage]
    params_path = tmp_path / "params.yaml"
    if params is PARAMS_DIRECTORY:
        params_path.mkdir()
    elif isinstance(params, bytes):
        params_path.write_bytes(params)
    else:
        params_path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    inputs, outputs = tmp_path / "in", tmp_path / "out"
    inputs.mkdir(exist_ok=True)
    argv = [a.replace("{in}", str(inputs)).replace("{out}", str(outputs)) for a in template]
    _prefill(outputs, argv)
    before, inputs_before = _snapshot(outputs), _snapshot(tmp_path / "in") | {"params": _snapshot(tmp_path)}
    script = ROOT / "stages" / f"{stage}.py"
    if in_process:  # an exception other than SystemExit would fail the test: no traceback either way
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as info:
            old_argv, sys.argv = sys.argv, [str(script), "--params", str(params_path), *argv]
            try:
                runpy.run_path(str(script), run_name="__main__")
            finally:
                sys.argv = old_argv
        returncode, err = info.value.code, stderr.getvalue()
    else:
        proc = subprocess.run(
            [sys.executable, str(script), "--params", str(params_path), *argv],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        returncode, err = proc.returncode, proc.stderr
    assert returncode == 2, (returncode, err[-2000:])
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(f"lexgraph {label}: error: ")]
    assert len(lines) == 1, err
    assert _snapshot(outputs) == before, "a failed stage changed its outputs"
    assert _snapshot(tmp_path / "in") | {"params": _snapshot(tmp_path)} == inputs_before, (
        "a failed stage changed its inputs"
    )
    return lines[0]


@pytest.fixture(scope="module")
def sample_params() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))


#: cases also run as a real subprocess (exit status and stderr of the process itself)
SUBPROCESS = {
    "base.seed-word",
    "section-typo",
    "clean.min_words-word",
    "bm25_tune.split-test",
    "negatives.splits-test",
    "gnn.layers-100",
    "fetch.local_dir-spaces-quotes-newline",
}


@pytest.mark.parametrize("stage, edits, fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_param_stops_the_stage_with_one_actionable_line(request, tmp_path, sample_params, stage, edits, fragments):
    import copy

    in_process = request.node.callspec.id not in SUBPROCESS
    line = run_failing_stage(tmp_path, stage, _edit(copy.deepcopy(sample_params), edits), in_process=in_process)
    assert "params.yaml" in line
    for fragment in fragments:
        assert fragment in line, line


# ---------------------------------------------------------------------------
# params.yaml itself: a key given twice, bytes that are not UTF-8, a directory (issue 18)
# ---------------------------------------------------------------------------

PARAMS_TEXT = (ROOT / "params.yaml").read_text(encoding="utf-8")


def _line(text: str, prefix: str, nth: int = 1) -> int:
    """The 1-based number of the ``nth`` line of ``text`` that starts with ``prefix``."""
    return [n for n, line in enumerate(text.splitlines(), 1) if line.startswith(prefix)][nth - 1]


def _after(text: str, prefix: str, new: str) -> str:
    """``text`` with the line ``new`` inserted after its first line starting with ``prefix``."""
    lines = text.splitlines(keepends=True)
    n = _line(text, prefix)
    return "".join(lines[:n] + [new + "\n"] + lines[n:])


# (id, stage run, params.yaml text, the repeated dotted key, prefix of its first line, of its second line)
DUPLICATES = [
    (
        "key",
        "clean",
        _after(PARAMS_TEXT, "  min_words: 3", "  min_words: 50"),
        "clean.min_words",
        "  min_words: 3",
        "  min_words: 50",
    ),
    (
        "section",
        "clean",
        PARAMS_TEXT + "\nclean:\n  min_words: 50\n  drop_repealed: true\n",
        "clean",
        "clean:",
        "clean:",
    ),
    (
        "another-stages-key",
        "bm25_tune",
        _after(PARAMS_TEXT, "    temperature: 0.01", "    temperature: .inf"),
        "gnn.gdsr.temperature",
        "    temperature: 0.01",
        "    temperature: .inf",
    ),
    (
        "nested-key",
        "clean",
        _after(PARAMS_TEXT, "      weight: 0.3", "      weight: 0.0"),
        "gnn.qabisar.kd.weight",
        "      weight: 0.3",
        "      weight: 0.0",
    ),
]


@pytest.mark.parametrize("stage, text, key, first, second", [c[1:] for c in DUPLICATES], ids=[c[0] for c in DUPLICATES])
def test_a_key_given_twice_stops_every_stage_naming_the_key_and_its_lines(
    request, tmp_path, stage, text, key, first, second
):
    """Outside DVC (torchrun, python stages/x.py) PyYAML kept the last value silently; DVC
    refuses such a file, and so does lexgraph's own loader, whichever stage runs."""
    first_line = _line(text, first)
    second_line = _line(text, second, 2 if first == second else 1)
    line = run_failing_stage(tmp_path, stage, text.encode("utf-8"), in_process=request.node.callspec.id != "section")
    assert line.endswith(
        f"params.yaml: key '{key}' appears twice, again on line {second_line} (first on line "
        f"{first_line}); expected each key once (a repeated key would silently replace the first)"
    ), line


def test_params_that_are_not_utf8_name_the_file_and_the_byte(tmp_path):
    raw = PARAMS_TEXT.encode("utf-8").replace(
        b"# articles with fewer", b"# articl\xe9s with fewer"
    )  # a Latin-1 e-acute
    offset = raw.index(b"\xe9")
    line = run_failing_stage(tmp_path, "clean", raw)
    assert line.endswith(
        f"params.yaml: not valid UTF-8 (invalid continuation byte at byte {offset}); expected a UTF-8 text file"
    ), line


def test_params_that_are_a_directory_say_so(tmp_path):
    line = run_failing_stage(tmp_path, "clean", PARAMS_DIRECTORY, in_process=True)
    assert line.endswith(
        "params.yaml: is a directory; expected the parameters file (YAML, like the repository's params.yaml)"
    ), line


def test_params_that_are_not_yaml_are_one_line(tmp_path):
    line = run_failing_stage(tmp_path, "clean", b"base: {seed: [1\n", in_process=True)
    assert line.endswith(
        "params.yaml: not valid YAML (expected ',' or ']', but got '<stream end>' at line 2, column 1)"
    ), line


@pytest.fixture
def search_ws(tmp_path):
    """A BM25 workspace for `lexgraph search`, which reads the workspace's params.yaml (evaluate.index)."""
    from helpers_cli import ARTICLES, write_articles
    from lexgraph.search.bm25 import BM25

    write_articles(tmp_path, ARTICLES)
    BM25().fit_texts(list(ARTICLES.values()), list(ARTICLES)).save(tmp_path / "models" / "bm25")
    return tmp_path


@pytest.mark.parametrize("case", ["not-utf8", "directory", "key-twice"])
def test_search_reads_params_with_the_same_rules(search_ws, case, capsys):
    from lexgraph.cli.main import main

    params = search_ws / "params.yaml"
    if case == "directory":
        params.mkdir()
        expected = f"{params}: is a directory; expected the parameters file"
    elif case == "not-utf8":
        params.write_bytes(b"evaluate:\n  k: 500 # r\xe9sultats\n")
        expected = f"{params}: not valid UTF-8 (invalid continuation byte at byte 22)"
    else:
        params.write_text(_after(PARAMS_TEXT, "    exact_below:", "    exact_below: 0"), encoding="utf-8")
        expected = f"{params}: key 'evaluate.index.exact_below' appears twice, again on line"
    before = _snapshot(search_ws)
    assert main(["search", "loyer", "--workspace", str(search_ws)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("lexgraph search: error: ")]
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in err, err
    assert _snapshot(search_ws) == before


# ---------------------------------------------------------------------------
# Numbers that type-check but mean nothing: every float key refuses nan and infinities
# ---------------------------------------------------------------------------


def _float_keys(values: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose params.yaml value is a float or a list of floats (nested mappings too)."""
    out = []
    for key, value in values.items():
        if isinstance(value, dict):
            out += _float_keys(value, f"{prefix}{key}.")
        elif isinstance(value, float) or (isinstance(value, list) and value and isinstance(value[0], float)):
            out.append(prefix + key)
    return out


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_number_must_be_finite(section):
    """nan, inf and -inf (YAML's .nan/.inf, or 'nan'/'inf' strings from `dvc exp run -S`) are
    refused for every float key of every section, naming it, before any stage work."""
    build = _builders()[section]
    values = read_params(PROFILES[0])[section]
    for dotted in _float_keys(values):
        for bad in (float("nan"), float("inf"), float("-inf"), "nan", "inf", "1e999", 10**400):
            edited = copy.deepcopy(values)
            *parents, key = dotted.split(".")
            node = edited
            for part in parents:
                node = node[part]
            node[key] = [bad] if isinstance(node[key], list) else bad
            with pytest.raises(ConfigError) as info:
                build(edited)
            message = str(info.value)
            assert f"'{section}.{dotted}'" in message and "finite" in message and "\n" not in message, (dotted, message)


def write_raw(tmp_path, texts: list[str], questions: list[tuple[int, str, str, str]]):
    """A ``data/raw`` directory with articles 1..n of ``texts`` and ``(id, question, article_ids, split)`` rows."""
    from lexgraph.data.schema import ARTICLE_COLUMNS

    raw = tmp_path / "in" / "raw"
    raw.mkdir(parents=True)
    pl.DataFrame(
        [{c: None for c in ARTICLE_COLUMNS} | {"id": i + 1, "article": t} for i, t in enumerate(texts)],
        schema={c: (pl.Int64 if c == "id" else pl.Utf8) for c in ARTICLE_COLUMNS},
    ).write_parquet(raw / "articles.parquet")
    pl.DataFrame(
        [dict(zip(("id", "question", "article_ids", "split"), q)) for q in questions],
        schema={"id": pl.Int64, "question": pl.Utf8, "article_ids": pl.Utf8, "split": pl.Utf8},
    ).write_parquet(raw / "questions.parquet")
    return raw


def test_clean_that_keeps_no_article_fails_naming_the_reasons_and_the_key(tmp_path, sample_params):
    """clean.min_words above every article's length: an error, not an empty corpus for build_graph."""
    raw = write_raw(
        tmp_path,
        ["Le preneur paie le loyer.", "Le bail est un contrat.", "(Abrogé)"],
        [(1, "Quand payer le loyer ?", "1", "train")],
    )
    params = {
        "base": sample_params["base"],
        "clean": {"min_words": 50, "drop_repealed": True, "allow_test_changes": False},
    }
    line = run_failing_stage(tmp_path, "clean", params)
    assert line.endswith(
        f"{raw / 'articles.parquet'}: cleaning dropped all 3 articles (2 shorter than 'clean.min_words' = 50 words, "
        "1 repeal notice(s)); lower 'clean.min_words' in params.yaml"
    ), line


def test_clean_that_leaves_a_split_without_questions_fails(tmp_path, sample_params):
    """Articles survive but every gold article of the test questions is dropped: an error
    naming the split, not a silently empty evaluation split."""
    raw = write_raw(
        tmp_path,
        ["Le preneur est tenu de payer le prix du bail aux termes convenus entre les parties.", "Court."],
        [(1, "Quand payer le loyer ?", "1", "train"), (2, "Quoi ?", "2", "test")],
    )
    params = {
        "base": sample_params["base"],
        "clean": {"min_words": 5, "drop_repealed": True, "allow_test_changes": False},
    }
    line = run_failing_stage(tmp_path, "clean", params)
    assert line.endswith(
        f"{raw / 'questions.parquet'}: cleaning dropped all 1 questions of split 'test' (every article they cite "
        "was dropped from the corpus, 1/2 articles kept); lower 'clean.min_words' (= 5) in params.yaml"
    ), line


def test_build_graph_refuses_an_empty_article_table():
    from lexgraph.graph.build import GraphConfig, build_graph

    empty = pl.DataFrame(schema={"id": pl.Int64, "article": pl.Utf8, "heading_id": pl.Int64})
    headings = pl.DataFrame(schema={"heading_id": pl.Int64, "parent_id": pl.Int64, "label": pl.Utf8, "text": pl.Utf8})
    questions = pl.DataFrame(
        schema={"id": pl.Int64, "question": pl.Utf8, "article_ids": pl.List(pl.Int64), "split": pl.Utf8}
    )
    with pytest.raises(DataError, match=r"^a\.parquet: no articles, so the graph would be empty.*'clean\.min_words'"):
        build_graph(
            empty,
            headings,
            questions,
            sample_config(GraphConfig, "graph"),
            paths=("a.parquet", "h.parquet", "q.parquet"),
        )


# ---------------------------------------------------------------------------
# The registry of sections and their typed configs
# ---------------------------------------------------------------------------


def _builders() -> dict:
    """Section -> the typed config its stage builds (every section has one)."""
    from lexgraph.data.clean import CleanConfig
    from lexgraph.data.fetch import FetchConfig
    from lexgraph.data.queries import QueriesConfig
    from lexgraph.encoding.embed import EmbedConfig
    from lexgraph.evaluation.evaluate import EvaluateConfig
    from lexgraph.graph.build import GraphConfig
    from lexgraph.methods.bm25.system import Bm25Config, Bm25TuneConfig
    from lexgraph.methods.dsr.config import DSRConfig, QabisarDSRConfig
    from lexgraph.methods.dsr.negatives import NegativesConfig
    from lexgraph.methods.gnn.config import VARIANTS, GNNSettings
    from lexgraph.methods.hprior.system import HpriorConfig
    from lexgraph.methods.hybrid.system import HybridConfig
    from lexgraph.methods.pretrain.model import PretrainConfig
    from lexgraph.methods.rerank.system import stage_settings
    from lexgraph.methods.zeroshot.system import ZeroshotConfig
    from lexgraph.serve.settings import ServeConfig

    return {
        "base": lambda p: read_section(Base, p, "base"),
        "fetch": FetchConfig.from_params,
        "clean": CleanConfig.from_params,
        "bm25_tune": Bm25TuneConfig.from_params,
        "bm25": Bm25Config.from_params,
        "evaluate": EvaluateConfig.from_params,
        "zeroshot": ZeroshotConfig.from_params,
        "graph": GraphConfig.from_params,
        "negatives": NegativesConfig.from_params,
        "gnn": lambda p: [GNNSettings.from_params(p, variant) for variant in VARIANTS],
        "pretrain": PretrainConfig.from_params,
        "queries": QueriesConfig.from_params,
        "dsr": DSRConfig.from_params,
        "dsr_qabisar": QabisarDSRConfig.from_params,
        "embed": EmbedConfig.from_params,
        "hprior": HpriorConfig.from_params,
        "hybrid": HybridConfig.from_params,
        "rerank": stage_settings,  # the rerank stage's: each first stage checked against the registry
        "serve": ServeConfig.from_params,
    }


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_registry_lists_exactly_the_sections_of_every_profile(profile):
    assert list(yaml.safe_load(profile.read_text(encoding="utf-8"))) == list(read_params(profile))
    assert set(read_params(profile)) == set(SECTIONS)
    assert set(_builders()) == set(SECTIONS)


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_section_has_a_typed_config_that_reads_both_profiles_and_refuses_unknown_keys(section):
    build = _builders()[section]
    for profile in PROFILES:
        build(read_params(profile)[section])
    raw = dict(read_params(PROFILES[0])[section] or {})
    with pytest.raises(ConfigError, match=rf"^params\.yaml: unknown keys '{section}\.typo_key'"):
        build({**raw, "typo_key": 1})


# The same checks, in process, for keys whose stage the suite above does not run.
CONFIG_CASES = [
    ("base", {"seed": True}, "'base.seed' = True, expected an integer"),
    ("base", {"seed": -1}, "'base.seed' = -1, expected an integer in [0, 4294967295]"),
    ("base", {"device": "gpu"}, "'base.device' = 'gpu', expected auto, cpu, cuda or cuda:N"),
    ("fetch", {"sourse": "hub"}, "unknown keys 'fetch.sourse' (did you mean 'fetch.source'?)"),
    ("fetch", {"source": "local", "local_dir": None}, "'fetch.local_dir' = None, expected a directory"),
    ("bm25_tune", {"k1": 1.2}, "'bm25_tune.k1' = 1.2, expected a non-empty list of numbers >= 0"),
    ("bm25_tune", {"b": [0.5, 1.5]}, "'bm25_tune.b' = [0.5, 1.5], expected a non-empty list of numbers in [0, 1]"),
    ("evaluate", {"split": "test"}, "unknown keys 'evaluate.split' (did you mean 'evaluate.splits'?)"),
    (
        "evaluate",
        {"significance_split": "train"},
        "'evaluate.significance_split' = 'train', expected one of the splits",
    ),
    (
        "negatives",
        {"splits": ["trian"]},
        "'negatives.splits' = ['trian'], expected a non-empty list of split names among train, dev, synthetic",
    ),
    ("dsr", {"epochs": DELETE}, "missing key 'dsr.epochs', expected a positive integer"),
    (
        "dsr",
        {"query_trainable_layers": "all"},
        "'dsr.query_trainable_layers' = 'all', expected null or an integer >= 0",
    ),
    ("gnn", {"layers": 1.5}, "'gnn.layers' = 1.5, expected an integer"),
    ("gnn", {"layers": 9}, "'gnn.layers' = 9, expected an integer in [1, 8]"),
    ("gnn", {"hgraph.layers": 2}, "unknown keys 'gnn.hgraph.layers' (a shared key: set it once under 'gnn')"),
    ("gnn", {"gdsr.lr": "inf"}, "'gnn.gdsr.lr' = 'inf', expected a positive number, finite (not nan or inf)"),
    ("gnn", {"gdsr.schedule": "cosine"}, "'gnn.gdsr.schedule' = 'cosine', expected one of constant, linear"),
    ("gnn", {"qabisar.selection": "best"}, "'gnn.qabisar.selection' = 'best', expected one of dev, fixed"),
    ("gnn", {"epochs_lge": 10}, "unknown keys 'gnn.epochs_lge'"),
    ("pretrain", {"max_grad_norm": -1.0}, "'pretrain.max_grad_norm' = -1.0, expected a number >= 0 (0: no clipping)"),
    ("pretrain", {"max_eval_blocks": -1}, "'pretrain.max_eval_blocks' = -1, expected a positive integer"),
    (
        "pretrain",
        {"learning_rate": float("inf")},
        "'pretrain.learning_rate' = inf, expected a positive number, finite (not nan or inf)",
    ),
    # a type and its range are checked once, where the section is read
    ("pretrain", {"max_length": 8.5}, "'pretrain.max_length' = 8.5, expected an integer"),
    ("pretrain", {"max_length": 600}, "'pretrain.max_length' = 600, expected an integer in [8, 512]"),
    ("pretrain", {"adam_epsilon": 0}, "'pretrain.adam_epsilon' = 0.0, expected a positive number"),
    ("pretrain", {"warmup_ratio": True}, "'pretrain.warmup_ratio' = True, expected a share of max_steps in [0, 1)"),
    ("queries", {"first_id": "0"}, "'queries.first_id' = '0', expected an integer"),
    ("queries", {"first_id": -1}, "'queries.first_id' = -1, expected an integer >= 0"),
    ("queries", {"top_p": 0}, "'queries.top_p' = 0.0, expected a number in (0, 1]"),
    ("zeroshot", {"max_length": "512"}, "'zeroshot.max_length' = '512', expected a positive integer"),
    ("zeroshot", {"batch_size": 0}, "'zeroshot.batch_size' = 0, expected a positive integer"),
    ("rerank", {"t1": float("nan")}, "'rerank.t1' = nan, expected a positive number, finite (not nan or inf)"),
    (
        "rerank",
        {"xrerank.weight_decay": "inf"},
        "'rerank.xrerank.weight_decay' = 'inf', expected a number >= 0, finite",
    ),
    ("rerank", {"lambda_ele": float("-inf")}, "'rerank.lambda_ele' = -inf, expected a number >= 0, finite"),
    ("gnn", {"hgraph_qa.kd.weight": "half"}, "'gnn.hgraph_qa.kd.weight' = 'half', expected a number"),
    ("gnn", {"hgraph.init": DELETE}, "missing key 'gnn.hgraph.init', expected one of random, identity, prior"),
    ("gnn", {"hgraph.init": "zeros"}, "'gnn.hgraph.init' = 'zeros', expected one of random, identity, prior"),
    ("gnn", {"qabisar.edge_dim": "16"}, "'gnn.qabisar.edge_dim' = '16', expected null or a positive integer"),
    ("embed", {"batch_size": 0}, "'embed.batch_size' = 0, expected a positive integer"),
    ("dsr", {"similarity": "l2"}, "'dsr.similarity' = 'l2', expected one of cosine, dot"),
    ("dsr_qabisar", {"enabled": "yes"}, "'dsr_qabisar.enabled' = 'yes', expected true or false"),
    ("dsr_qabisar", {"temperature": 0.1}, "unknown keys 'dsr_qabisar.temperature'"),
    (
        "evaluate",
        {"splits": ["synthetic"], "significance_split": "synthetic"},
        "'evaluate.splits' = ['synthetic'], expected a non-empty list of distinct split names among train, dev, "
        "test (synthetic questions are generated training data, not evaluated)",
    ),
    ("hprior", {"split": "test"}, "'hprior.split' = 'test', but the 'test' split is held out"),
    (
        "hybrid",
        {"dense": "bm25"},
        "'hybrid.dense' = 'bm25', expected one of zeroshot, dsr, hprior, gdsr, qabisar, hgraph, hgraph_qa or best",
    ),
    ("hybrid", {"depth": 100}, "'hybrid.depth' = 100, expected an integer >= 500"),
    (
        "rerank",
        {"first_stage": "mvcl"},
        "'rerank.first_stage' = 'mvcl', expected a retrieval system other than a re-ranker",
    ),
    (
        "rerank",
        {"split": "test"},
        "'rerank.split' = 'test', expected dev or train (the split that chooses the epoch, and alpha with fusion); "
        "the 'test' split is held out for evaluation",
    ),
    ("rerank", {"k": 1}, "'rerank.k' = 1, expected an integer >= 2"),
    ("rerank", {"hidden": 127}, "'rerank.hidden' = 127, expected an even positive integer"),
    (
        "rerank",
        {"xrerank.alignment": "dot"},
        "'rerank.xrerank.alignment' = 'dot', expected scaled_dot (h_a . h_b / sqrt(d)",
    ),
    (
        "rerank",
        {"xrerank.align_temperature": 0},
        "'rerank.xrerank.align_temperature' = 0.0, expected a positive number",
    ),
    ("rerank", {"mvcl.align_temperature": 0.05}, "'rerank.mvcl.align_temperature' is read only with alignment: cosine"),
    ("rerank", {"mvcl.plm": "thawed"}, "'rerank.mvcl.plm' = 'thawed', expected frozen (cached states) or finetune"),
    ("rerank", {"lambda_case": -0.1}, "'rerank.lambda_case' = -0.1, expected a number >= 0"),
    ("rerank", {"t1": 0}, "'rerank.t1' = 0.0, expected a positive number"),
    ("rerank", {"element_patterns": ["deontic"]}, "'rerank.element_patterns' = ['deontic'], expected a non-empty list"),
    (
        "rerank",
        {"xrerank.interpolation": [0.5, 1.5]},
        "'rerank.xrerank.interpolation' = [0.5, 1.5], expected a non-empty list of distinct numbers in [0, 1]",
    ),
    ("rerank", {"swap": "yes"}, "'rerank.swap' = 'yes', expected true or false"),
    ("rerank", {"lamda_ele": 0.0}, "unknown keys 'rerank.lamda_ele' (did you mean 'rerank.lambda_ele'?)"),
]


@pytest.mark.parametrize(
    "section, edits, fragment", CONFIG_CASES, ids=[f"{c[0]}-{next(iter(c[1]))}" for c in CONFIG_CASES]
)
def test_typed_config_errors(sample_params, section, edits, fragment):
    import copy

    raw = _edit(copy.deepcopy(sample_params), {f"{section}.{k}": v for k, v in edits.items()})[section]
    with pytest.raises(ConfigError) as info:
        _builders()[section](raw)
    message = str(info.value)
    assert message.startswith("params.yaml: ") and fragment in message, message


def test_type_checks_accept_yaml_strings_for_floats_and_refuse_bools_for_ints():
    from lexgraph.methods.dsr.negatives import NegativesConfig

    negatives = read_params(PROFILES[0])["negatives"]
    assert NegativesConfig.from_params({**negatives, "k1": "1.2e0", "b": 1}).k1 == 1.2
    config = NegativesConfig.from_params({**negatives, "b": 1})
    assert config.b == 1.0 and isinstance(config.b, float)
    with pytest.raises(ConfigError, match=r"^params\.yaml: 'negatives\.k' = True, expected a positive integer$"):
        NegativesConfig.from_params({**negatives, "k": True})
    with pytest.raises(ConfigError, match=r"'negatives\.splits' = \['train', 3\], expected a non-empty list"):
        NegativesConfig.from_params({**negatives, "splits": ["train", 3]})


def _keys(values: dict, prefix: str = "") -> list[str]:
    """Every dotted key of a section (nested mappings too: gnn's per-variant mappings included)."""
    out = []
    for key, value in values.items():
        out.append(prefix + key)
        if isinstance(value, dict) and value:
            out += _keys(value, f"{prefix}{key}.")
    return out


def _without(values: dict, dotted: str) -> dict:
    values = copy.deepcopy(values)
    *parents, key = dotted.split(".")
    node = values
    for part in parents:
        node = node[part]
    del node[key]
    return values


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_no_silent_defaults_every_key_deleted_is_an_error_naming_it(section):
    """Deleting any one key of params.yaml stops the section's config with one line naming
    that key (no code default stands in); e.g. deleting rerank.enabled no longer starts MVCL."""
    build = _builders()[section]
    values = read_params(PROFILES[0])[section]
    keys = _keys(values)
    assert keys, section
    for dotted in keys:
        with pytest.raises(ConfigError) as info:
            build(_without(values, dotted))
        message = str(info.value)
        assert f"'{section}.{dotted}'" in message and "missing" in message and "\n" not in message, (dotted, message)


def test_unknown_top_level_section_is_refused_when_loading_any_section(tmp_path):
    from lexgraph.core.config import load_params

    path = tmp_path / "params.yaml"
    path.write_text("base: {seed: 1}\nclean: {min_words: 3}\nbm25_tunes: {split: dev}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"unknown section\(s\) 'bm25_tunes' \(did you mean 'bm25_tune'\?\)"):
        load_params("clean", path)
    path.write_text("base: {seed: 1}\nclean: 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"section 'clean' = 3, expected a mapping of keys"):
        load_params("clean", path)


def test_resolve_device_names_the_setting_it_was_given():
    with pytest.raises(
        ConfigError, match=r"^params\.yaml: 'base\.device' = 'gpu', expected auto, cpu, cuda or cuda:N$"
    ):
        resolve_device("gpu")
    with pytest.raises(ConfigError, match=r"^--device = 'cuda0', expected auto, cpu, cuda or cuda:N$"):
        resolve_device("cuda0", where="--device")
    assert str(resolve_device("cpu", where="--device")) == "cpu"


def _config_classes() -> dict:
    """Section -> the dataclass whose fields are the section's keys (gnn: GNNSettings' own)."""
    from lexgraph.data.clean import CleanConfig
    from lexgraph.data.fetch import FetchConfig
    from lexgraph.data.queries import QueriesConfig
    from lexgraph.encoding.embed import EmbedConfig
    from lexgraph.evaluation.evaluate import EvaluateConfig
    from lexgraph.graph.build import GraphConfig
    from lexgraph.methods.bm25.system import Bm25Config, Bm25TuneConfig
    from lexgraph.methods.dsr.config import DSRConfig, QabisarDSRConfig
    from lexgraph.methods.dsr.negatives import NegativesConfig
    from lexgraph.methods.hprior.system import HpriorConfig
    from lexgraph.methods.hybrid.system import HybridConfig
    from lexgraph.methods.pretrain.model import PretrainConfig
    from lexgraph.methods.rerank.config import RerankSection
    from lexgraph.methods.zeroshot.system import ZeroshotConfig
    from lexgraph.search.index import IndexConfig

    return {
        "base": Base,
        "fetch": FetchConfig,
        "clean": CleanConfig,
        "bm25_tune": Bm25TuneConfig,
        "bm25": Bm25Config,
        "evaluate": EvaluateConfig,
        "evaluate.index": IndexConfig,
        "zeroshot": ZeroshotConfig,
        "graph": GraphConfig,
        "negatives": NegativesConfig,
        "pretrain": PretrainConfig,
        "queries": QueriesConfig,
        "dsr": DSRConfig,
        "dsr_qabisar": QabisarDSRConfig,
        "embed": EmbedConfig,
        "hprior": HpriorConfig,
        "hybrid": HybridConfig,
        "rerank": RerankSection,
    }


#: The one section config whose fields keep defaults: ``lexgraph search`` in a workspace
#: without params.yaml searches with ``IndexConfig()`` (lexgraph.serve.searcher.index_config).
KEEPS_DEFAULTS = {"evaluate.index"}


def _defaulted(cls) -> dict[str, object]:
    """The fields of dataclass ``cls`` (and of the dataclasses nested in it) that have a default."""
    import dataclasses
    import typing

    from pydantic import BaseModel

    out = {}
    if issubclass(cls, BaseModel):  # a pydantic section (lexgraph.core.settings)
        for name, f in cls.model_fields.items():
            if not f.is_required():
                out[name] = f.get_default(call_default_factory=True)
            sub = typing.get_args(f.annotation) or (f.annotation,)
            for model in (a for a in sub if isinstance(a, type) and issubclass(a, BaseModel)):
                out.update({f"{name}.{k}": v for k, v in _defaulted(model).items()})
        return out
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        sub = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(sub) and f"{cls.__name__}.{f.name}" not in {"EvaluateConfig.index"}:
            out.update({f"{f.name}.{k}": v for k, v in _defaulted(sub).items()})
    return out


@pytest.mark.parametrize("section", sorted(_config_classes()))
def test_no_setting_has_a_default_in_code(section):
    """A value lives in one place: params.yaml (and the profiles) set every key of a section, so
    a section config's field has no default (a default would be a second copy of the value,
    free to disagree). gnn's encoder (GraphEncoderConfig) is checked with it: what remains
    there is not a key of params.yaml."""
    from lexgraph.methods.gnn.config import KD_KEYS, SHARED_KEYS, GNNSettings

    classes = {**_config_classes(), "gnn": GNNSettings}
    cls = classes[section]
    defaulted = _defaulted(cls)
    if section in KEEPS_DEFAULTS:  # the CLI's defaults without params.yaml: params.yaml's values
        values = sample_section(section)
        assert defaulted == {k: values[k] for k in defaulted} and set(defaulted) == set(values)
        return
    if cls is GNNSettings:  # the encoder's architecture keeps what params.yaml does not set
        keys = {*SHARED_KEYS, *GNNSettings.keys("qabisar"), *KD_KEYS.values()}
        assert set(defaulted) == {"encoder.prior_weight", "encoder.edge_groups", "encoder.num_edge_types"}
        assert not {k.split(".")[-1] for k in defaulted} & keys
        return
    assert defaulted == {}, f"{cls.__name__} has defaults for {sorted(defaulted)}; params.yaml sets them"


# ---------------------------------------------------------------------------
# JSON one stage wrote and another reads: truncated, empty or wrong-shaped (issue 18)
# ---------------------------------------------------------------------------

TUNED = {"metric": "recall@100", "split": "dev", "k1": 1.0, "b": 0.1, "score": 0.5}

# (id, the bytes of metrics/bm25_tune.json, what the line says about it)
TUNED_CASES = [
    ("truncated", json.dumps(TUNED)[:30].encode(), "not valid JSON, truncated or corrupt (Unterminated string"),
    ("empty-object", b"{}", "key 'k1' is missing (a number >= 0)"),
    ("empty-file", b"", "is empty"),
    ("a-list", b"[1.0, 0.1]", "holds [1.0, 0.1], not a JSON object"),
    ("k1-word", json.dumps({**TUNED, "k1": "fast"}).encode(), "key 'k1' = \"fast\", not a number >= 0"),
    ("b-nan", json.dumps({**TUNED, "b": float("nan")}).encode(), "key 'b' = NaN, not a number in [0, 1]"),
    ("not-utf8", b'{"k1": 1.0, "b": 0.1, "note": "\xe9"}', "not valid UTF-8 (invalid continuation byte at byte 31)"),
    ("missing", None, "not found"),
]


@pytest.mark.parametrize("raw, problem", [c[1:] for c in TUNED_CASES], ids=[c[0] for c in TUNED_CASES])
def test_bm25_stops_on_a_damaged_bm25_tune_result(request, tmp_path, sample_params, raw, problem):
    """`bm25.k1: tuned` reads bm25_tune's best pair: a damaged file is one line naming it, what
    was expected and that bm25_tune must rerun (was a traceback: JSONDecodeError, KeyError)."""
    tuned = tmp_path / "in" / "bm25_tune.json"
    tuned.parent.mkdir(parents=True)
    if raw is not None:
        tuned.write_bytes(raw)
    line = run_failing_stage(tmp_path, "bm25", sample_params, in_process=request.node.callspec.id != "truncated")
    assert line.startswith(f"lexgraph bm25: error: {tuned}: {problem}"), line
    assert line.endswith(
        '; expected bm25_tune\'s best pair, an object with k1 and b (e.g. {"k1": 1.0, "b": 0.1, '
        "...}); rerun `dvc repro bm25_tune`"
    ), line


def test_bm25_with_both_numbers_given_does_not_read_bm25_tune(tmp_path, sample_params):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "bm25_tune.json").write_bytes(b"{")
    params = _edit(copy.deepcopy(sample_params), {"bm25.k1": 1.2, "bm25.b": 0.75})
    line = run_failing_stage(tmp_path, "bm25", params, in_process=True)
    assert "articles.parquet" in line and "bm25_tune.json" not in line, line


def _read_hprior(path):
    from lexgraph.graph.hierarchy import best_weight, read_hprior

    return best_weight(read_hprior(path.parent))


def _dsr(path):
    from lexgraph.models.dsr import DSR

    return DSR.load(path.parent)


def _gnn(path):
    from lexgraph.methods.gnn.io import load_graph_encoder

    return load_graph_encoder(path.parent)


def _cosine(path):
    from lexgraph.methods.gnn.system import _cosine

    return _cosine(path.parent)


def _first_stage(path):
    from lexgraph.methods.rerank.system import first_stage_of

    return first_stage_of(path.parents[2], "mvcl")  # <workspace>/models/mvcl/mvcl.json


def _mvcl(path):
    from lexgraph.methods.rerank.io import load_model

    return load_model(path.parent, "cpu")


def _base_info(path):
    from lexgraph.models.family import read_base_info

    return read_base_info(path.parent)


def _backbone_ref(path):
    from lexgraph.models.article_encoder import HierarchicalArticleEncoder

    return HierarchicalArticleEncoder.from_pretrained(path.parent)


def _query_encoder_ref(path):
    from lexgraph.models.encoders import QueryEncoder

    return QueryEncoder.from_pretrained(path.parent)


GRAPH_ENCODER = {
    "in_dim": 4,
    "model": "gatv2",
    "layers": 1,
    "hidden": None,
    "heads": 1,
    "concat_heads": True,
    "dropout": 0.0,
    "residual": True,
    "edge_dim": None,
    "init": "random",
}

# (id, reader(path), the file (under the workspace), its text, what the line says, the stage to rerun)
ARTEFACTS = [
    (
        "hprior-truncated",
        _read_hprior,
        "models/hprior/hprior.json",
        '{"format": "lexgraph-hprior/1", "grid": [',
        "not valid JSON, truncated or corrupt",
        "hprior",
    ),
    (
        "hprior-row",
        _read_hprior,
        "models/hprior/hprior.json",
        json.dumps({"format": "lexgraph-hprior/1", "metric": "recall@100", "grid": [{"scope": 0, "weight": 0.5}]}),
        "key 'grid.0' = {\"scope\": 0, \"weight\": 0.5}, not a row with an integer 'scope' >= 0, a number 'weight' "
        ">= 0 and a number 'recall@100'",
        "hprior",
    ),
    (  # issue 28: a weight outside hprior.weights' domain (the GNN's prior init would use it)
        "hprior-negative-weight",
        _read_hprior,
        "models/hprior/hprior.json",
        json.dumps(
            {"format": "lexgraph-hprior/1", "metric": "map", "grid": [{"scope": 0, "weight": -2.0, "map": 0.3}]}
        ),
        'key \'grid.0\' = {"scope": 0, "weight": -2.0, "map": 0.3}, not a row with an integer \'scope\' >= 0, a '
        "number 'weight' >= 0",
        "hprior",
    ),
    (
        "dsr-truncated",
        _dsr,
        "models/dsr/dsr.json",
        '{"temperature": 0.0',
        "not valid JSON, truncated or corrupt",
        "train_dsr",
    ),
    ("dsr-empty", _dsr, "models/dsr/dsr.json", "{}", "key 'temperature' is missing (a positive number)", "train_dsr"),
    (
        "gnn-truncated",
        _gnn,
        "models/gnn_hgraph/gnn.json",
        '{"graph_encoder": {',
        "not valid JSON, truncated or corrupt",
        "train_gnn@hgraph",
    ),
    (
        "gnn-bad-architecture",
        _gnn,
        "models/gnn_hgraph/gnn.json",
        json.dumps({"graph_encoder": {**GRAPH_ENCODER, "layers": 100}}),
        "key 'graph_encoder' does not build an encoder",
        "train_gnn@hgraph",
    ),
    (
        "gnn-similarity-truncated",
        _cosine,
        "models/gnn_hgraph/gnn.json",
        '{"similarity": "cos',
        "not valid JSON, truncated or corrupt",
        "train_gnn",
    ),
    ("mvcl-first-stage", _first_stage, "models/mvcl/mvcl.json", "[]", "holds [], not a JSON object", "rerank@mvcl"),
    (
        "mvcl-first-stage-unknown",
        _first_stage,
        "models/mvcl/mvcl.json",
        '{"first_stage": "bm26"}',
        "key 'first_stage' = \"bm26\", not a retrieval system other than a re-ranker",
        "rerank@mvcl",
    ),
    (
        "mvcl-settings",
        _mvcl,
        "models/mvcl/mvcl.json",
        '{"format": "lexgraph-mvcl"}',
        "key 'input_dim' is missing",
        "rerank@mvcl",
    ),
    (
        "base-info",
        _base_info,
        "models/pretrain/lexgraph_base.json",
        '{"query_prefix": ',
        "not valid JSON, truncated or corrupt",
        "pretrain",
    ),
    (
        "base-info-prefix",
        _base_info,
        "models/pretrain/lexgraph_base.json",
        '{"source": "local", "passage_prefix": ["passage: "]}',
        "key 'passage_prefix' = [\"passage: \"], not a string",
        "pretrain",
    ),
    (
        "backbone-reference",
        _backbone_ref,
        "models/dsr/article_encoder/backbone.json",
        '{"path": 3}',
        "key 'path' = 3, not a directory",
        "train_dsr",
    ),
    (
        "query-encoder-reference",
        _query_encoder_ref,
        "models/gnn_hgraph_qa/query_encoder/backbone.json",
        '{"path": ',
        "not valid JSON, truncated or corrupt",
        "train_gnn@hgraph_qa",
    ),
]


@pytest.mark.parametrize("read, name, text, problem, stage", [c[1:] for c in ARTEFACTS], ids=[c[0] for c in ARTEFACTS])
def test_a_damaged_artefact_json_is_one_line_naming_it(tmp_path, read, name, text, problem, stage):
    """Every JSON file a stage reads from another (hprior.json, dsr.json, gnn.json, mvcl.json,
    lexgraph_base.json, ...): truncated, empty or of the wrong shape is a DataError naming the
    file, what is wrong and the stage to rerun, never a JSONDecodeError/KeyError traceback
    (nor, for gnn.json, a message blaming params.yaml)."""
    path = tmp_path / name
    path.parent.mkdir(parents=True)
    path.write_text(text, encoding="utf-8")
    before = _snapshot(tmp_path)
    with pytest.raises(DataError) as info:
        read(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {problem}"), message
    assert "; expected " in message and "\n" not in message and "params.yaml" not in message, message
    assert f"rerun `dvc repro {stage}`" in message if stage else "rerun `dvc repro`" in message, message
    assert _snapshot(tmp_path) == before


# ---------------------------------------------------------------------------
# issue 28, class 9: settings whose validity depends on the model they configure
# ---------------------------------------------------------------------------


def _prefixed_model(tiny_model_dir, root: Path) -> Path:
    """conftest's tiny BERT with E5's prefixes (``lexgraph_base.json``), as models/pretrain."""
    import shutil

    model = root / "pretrain"
    shutil.copytree(tiny_model_dir, model)
    (model / "lexgraph_base.json").write_text(
        json.dumps({"query_prefix": "query: ", "passage_prefix": "passage: "}), encoding="utf-8"
    )
    return model


def test_zeroshot_max_length_below_what_the_tokenizer_needs_stops_the_stage(tmp_path, sample_params, tiny_model_dir):
    """`zeroshot.max_length: 4` said "max_chunk_length = 4 and max_document_length = 2048: expected
    max_chunk_length >= 11", naming no key of params.yaml."""
    from transformers import AutoTokenizer

    from lexgraph.models.packing import shortest_input

    model = _prefixed_model(tiny_model_dir, tmp_path / "in")
    pl.DataFrame({"id": [1, 2], "article": ["le bail", "la loi"]}).write_parquet(tmp_path / "in" / "articles.parquet")
    least, why = shortest_input(AutoTokenizer.from_pretrained(model), "passage: ")
    assert least > 4
    params = copy.deepcopy(sample_params)
    params["zeroshot"]["max_length"] = 4
    line = run_failing_stage(tmp_path, "zeroshot", params, in_process=True)
    assert (
        line
        == f"lexgraph zeroshot: error: params.yaml: 'zeroshot.max_length' = 4, expected an integer >= {least} ({why})"
    )
    assert why.startswith("[CLS], the prefix 'passage:' (") and why.endswith("one token of text and [SEP]")


# (id, dsr keys changed, the error after "params.yaml: ")
DSR_MODEL_CASES = [
    ("chunk_heads", {"chunk_heads": 7}, "'dsr.chunk_heads' = 7, expected a positive divisor of the encoder's width 16"),
    ("max_query_length", {"max_query_length": 2}, "'dsr.max_query_length' = 2, expected an integer >= 3 ([CLS], one"),
    ("max_chunk_length", {"max_chunk_length": 2}, "'dsr.max_chunk_length' = 2, expected an integer >= 3 ([CLS], one"),
    (
        "query_trainable_layers",
        {"query_trainable_layers": 12},
        "'dsr.query_trainable_layers' = 12, expected null or an integer in [0, 1] (the backbone's layers)",
    ),
    (
        "max_chunk_length-positions",
        {"max_chunk_length": 100, "max_document_length": 200},
        "'dsr.max_chunk_length' = 100, expected at most the backbone's 64 positions",
    ),
]


@pytest.mark.parametrize("changes, message", [c[1:] for c in DSR_MODEL_CASES], ids=[c[0] for c in DSR_MODEL_CASES])
def test_a_dsr_setting_that_does_not_fit_the_model_names_its_key(tiny_model_dir, changes, message):
    """Checked where the model is built (the width and the tokenizer are the model's): one line
    naming the params.yaml key, the value and what is expected."""
    from lexgraph.methods.dsr.config import DSRConfig, build_dsr

    values = {
        **sample_section("dsr"),
        "chunk_encoder": "finetune",
        "max_chunk_length": 16,
        "max_document_length": 32,
        "query_trainable_layers": None,
        "chunk_heads": 2,
    }
    config = DSRConfig.from_params({**values, **changes})
    with pytest.raises(ConfigError) as info:
        build_dsr(config, tiny_model_dir)
    assert str(info.value).startswith(f"params.yaml: {message}"), str(info.value)

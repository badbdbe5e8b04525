"""Bad values in params.yaml: every stage stops with one line naming params.yaml, the
dotted key and what was expected (exit 2, no traceback), before touching its outputs.

Each case writes a variant of the repository's params.yaml into tmp_path, runs the real
stage script as a subprocess with every output pointed at files pre-filled with
sentinel bytes, and checks the message and that the outputs are byte-for-byte intact.
"""

from __future__ import annotations

import copy

import contextlib
import io
import runpy
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from conftest import ROOT

from lexgraph.config import SECTIONS, Base, read_params, resolve_device, section_config
from lexgraph.errors import ConfigError, DataError

PROFILES = [ROOT / "params.yaml", ROOT / "profiles" / "paper.yaml"]
SENTINEL = b"sentinel: must survive a failed stage\n"

# stage script -> (the stage name its error line starts with, argv with {in}/{out} placeholders; outputs under {out})
STAGES = {
    "fetch": ("fetch", ["--out", "{out}/raw"]),
    "clean": ("clean", ["--raw", "{in}/raw", "--out", "{out}/clean", "--metrics", "{out}/data.json"]),
    "bm25_tune": ("bm25_tune", ["--articles", "{in}/articles.parquet", "--questions", "{in}/questions.parquet",
                                "--best", "{out}/bm25_tune.json", "--grid", "{out}/bm25_tune.csv"]),
    "bm25": ("bm25", ["--articles", "{in}/articles.parquet", "--tuned", "{in}/bm25_tune.json", "--out", "{out}/bm25"]),
    "mine_negatives": ("mine_negatives", ["--articles", "{in}/articles.parquet", "--questions", "{in}/questions.parquet",
                                     "--synthetic", "{in}/synthetic.parquet", "--out", "{out}/negatives.parquet"]),
    "evaluate": ("evaluate", ["--questions", "{in}/questions.parquet", "--runs", "{out}/runs",
                              "--metrics-dir", "{out}/metrics", "--workspace", "{in}"]),
    "build_graph": ("build_graph", ["--articles", "{in}/articles.parquet", "--headings", "{in}/headings.parquet",
                              "--questions", "{in}/questions.parquet", "--out", "{out}/graph",
                              "--metrics", "{out}/graph.json"]),
    "generate_queries": ("generate_queries", ["--articles", "{in}/articles.parquet", "--out", "{out}/synthetic.parquet"]),
    "pretrain": ("pretrain", ["--articles", "{in}/articles.parquet", "--out", "{out}/pretrain",
                              "--metrics", "{out}/pretrain.json"]),
    "zeroshot": ("zeroshot", ["--pretrained", "{in}/pretrain", "--articles", "{in}/articles.parquet",
                              "--chunks", "{in}/chunks", "--out", "{out}/zeroshot"]),
    "train_dsr": ("train_dsr", ["--articles", "{in}/articles.parquet", "--questions", "{in}/questions.parquet",
                          "--synthetic", "{in}/synthetic.parquet", "--negatives", "{in}/negatives.parquet", "--pretrained", "{in}/pretrain",
                          "--chunks", "{in}/chunks", "--out", "{out}/dsr", "--metrics", "{out}/train_dsr.json",
                          "--plot", "{out}/train_dsr_curve.csv"]),
    "hybrid": ("hybrid", ["--questions", "{in}/questions.parquet", "--workspace", "{in}", "--out", "{out}/hybrid",
                          "--metrics", "{out}/hybrid_tune.json"]),
}

DELETE = object()

# (id, stage, {dotted key: new value (DELETE: remove it)}, fragments the error line must contain)
CASES = [
    ("base.seed-word", "clean", {"base.seed": "thirteen"}, ["'base.seed' = 'thirteen', expected an integer"]),
    ("base.seed-float", "clean", {"base.seed": 13.5}, ["'base.seed' = 13.5, expected an integer"]),
    ("base.device-int", "fetch", {"base.device": 0}, ["'base.device' = 0, expected auto, cpu, cuda or cuda:N"]),
    ("base.log_level", "zeroshot", {"base.log_level": "LOUD"},
     ["'base.log_level' = 'LOUD', expected one of DEBUG, INFO, WARNING, ERROR"]),
    ("base.unknown", "clean", {"base.sed": 1}, ["unknown keys 'base.sed' (did you mean 'base.seed'?)"]),
    ("section-typo", "bm25_tune", {"bm25_tune": DELETE, "bm25_tunes": {"split": "dev"}},
     ["unknown section(s) 'bm25_tunes' (did you mean 'bm25_tune'?)", "expected only the sections base, fetch, clean"]),
    ("clean.min_words-word", "clean", {"clean.min_words": "three"},
     ["'clean.min_words' = 'three', expected an integer >= 0"]),
    ("clean.min_words-negative", "clean", {"clean.min_words": -1}, ["'clean.min_words' = -1, expected an integer >= 0"]),
    ("clean.drop_repealed-int", "clean", {"clean.drop_repealed": 1},
     ["'clean.drop_repealed' = 1, expected true or false"]),
    ("clean.unknown", "clean", {"clean.min_word": 3},
     ["unknown keys 'clean.min_word' (did you mean 'clean.min_words'?)", "expected keys of 'clean': allow_test_changes, drop_repealed, min_words"]),
    ("fetch.dev_fraction", "fetch", {"fetch.dev_fraction": "ten percent"},
     ["'fetch.dev_fraction' = 'ten percent', expected a number in (0, 1)"]),
    ("bm25_tune.split-test", "bm25_tune", {"bm25_tune.split": "test"},
     ["'bm25_tune.split' = 'test', but the 'test' split is held out for evaluation; expected dev (or train)"]),
    ("bm25.k1", "bm25", {"bm25.k1": "fast"}, ["'bm25.k1' = 'fast', expected a number >= 0 or 'tuned'"]),
    ("negatives.splits-test", "mine_negatives", {"negatives.splits": ["train", "test"]},
     ["'negatives.splits' = ['train', 'test'], but the 'test' split is held out for evaluation"]),
    ("negatives.depth-float", "mine_negatives", {"negatives.depth": 1.5},
     ["'negatives.depth' = 1.5, expected a positive integer"]),
    ("evaluate.k-shallow", "evaluate", {"evaluate.k": 100}, ["'evaluate.k' = 100, expected an integer >= 500"]),
    ("evaluate.systems", "evaluate", {"evaluate.systems": ["bm25", "bm26"]},
     ["'evaluate.systems' = ['bm25', 'bm26'], expected a non-empty list of distinct systems among bm25"]),
    ("graph.questions", "build_graph", {"graph.questions": "yes"}, ["'graph.questions' = 'yes', expected true or false"]),
    ("queries.per_article", "generate_queries", {"queries.per_article": 2.5},
     ["'queries.per_article' = 2.5, expected an integer"]),
    ("pretrain.learning_rate", "pretrain", {"pretrain.learning_rate": "fast"},
     ["'pretrain.learning_rate' = 'fast', expected a number"]),
    ("zeroshot.batch_size", "zeroshot", {"zeroshot.batch_size": True},
     ["'zeroshot.batch_size' = True, expected an integer"]),
    ("dsr.lr", "train_dsr", {"dsr.lr": "fast"}, ["'dsr.lr' = 'fast', expected a positive number"]),
    ("hybrid.split-test", "hybrid", {"hybrid.split": "test"},
     ["'hybrid.split' = 'test', but the 'test' split is held out for evaluation; expected dev (or train)"]),
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


def run_failing_stage(tmp_path: Path, stage: str, params: dict, *, in_process: bool = False) -> str:
    """Run ``stages/<stage>.py`` (a subprocess, or in this process through ``runpy`` as
    ``__main__``); assert exit 2, one error line, no traceback, intact outputs; return
    the error line."""
    label, template = STAGES[stage]
    params_path = tmp_path / "params.yaml"
    params_path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    inputs, outputs = tmp_path / "in", tmp_path / "out"
    inputs.mkdir(exist_ok=True)
    argv = [a.replace("{in}", str(inputs)).replace("{out}", str(outputs)) for a in template]
    _prefill(outputs, argv)
    before = _snapshot(outputs)
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
        proc = subprocess.run([sys.executable, str(script), "--params", str(params_path), *argv],
                              capture_output=True, text=True, cwd=ROOT, timeout=120)
        returncode, err = proc.returncode, proc.stderr
    assert returncode == 2, (returncode, err[-2000:])
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(f"lexgraph {label}: error: ")]
    assert len(lines) == 1, err
    assert _snapshot(outputs) == before, "a failed stage changed its outputs"
    return lines[0]


@pytest.fixture(scope="module")
def sample_params() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))


#: cases also run as a real subprocess (exit status and stderr of the process itself)
SUBPROCESS = {"base.seed-word", "section-typo", "clean.min_words-word", "bm25_tune.split-test", "negatives.splits-test"}


@pytest.mark.parametrize("stage, edits, fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_param_stops_the_stage_with_one_actionable_line(request, tmp_path, sample_params, stage, edits, fragments):
    import copy

    in_process = request.node.callspec.id not in SUBPROCESS
    line = run_failing_stage(tmp_path, stage, _edit(copy.deepcopy(sample_params), edits), in_process=in_process)
    assert "params.yaml" in line
    for fragment in fragments:
        assert fragment in line, line


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
    raw = write_raw(tmp_path, ["Le preneur paie le loyer.", "Le bail est un contrat.", "(Abrogé)"],
                    [(1, "Quand payer le loyer ?", "1", "train")])
    params = {"base": sample_params["base"], "clean": {"min_words": 50, "drop_repealed": True, "allow_test_changes": False}}
    line = run_failing_stage(tmp_path, "clean", params)
    assert line.endswith(
        f"{raw / 'articles.parquet'}: cleaning dropped all 3 articles (2 shorter than 'clean.min_words' = 50 words, "
        "1 repeal notice(s)); lower 'clean.min_words' in params.yaml"
    ), line


def test_clean_that_leaves_a_split_without_questions_fails(tmp_path, sample_params):
    """Articles survive but every gold article of the test questions is dropped: an error
    naming the split, not a silently empty evaluation split."""
    raw = write_raw(tmp_path, ["Le preneur est tenu de payer le prix du bail aux termes convenus entre les parties.",
                               "Court."],
                    [(1, "Quand payer le loyer ?", "1", "train"), (2, "Quoi ?", "2", "test")])
    params = {"base": sample_params["base"], "clean": {"min_words": 5, "drop_repealed": True, "allow_test_changes": False}}
    line = run_failing_stage(tmp_path, "clean", params)
    assert line.endswith(
        f"{raw / 'questions.parquet'}: cleaning dropped all 1 questions of split 'test' (every article they cite "
        "was dropped from the corpus, 1/2 articles kept); lower 'clean.min_words' (= 5) in params.yaml"
    ), line


def test_build_graph_refuses_an_empty_article_table():
    from lexgraph.graph import GraphConfig, build_graph

    empty = pl.DataFrame(schema={"id": pl.Int64, "article": pl.Utf8, "heading_id": pl.Int64})
    headings = pl.DataFrame(schema={"heading_id": pl.Int64, "parent_id": pl.Int64, "label": pl.Utf8, "text": pl.Utf8})
    questions = pl.DataFrame(schema={"id": pl.Int64, "question": pl.Utf8, "article_ids": pl.List(pl.Int64),
                                     "split": pl.Utf8})
    with pytest.raises(DataError, match=r"^a\.parquet: no articles, so the graph would be empty.*'clean\.min_words'"):
        build_graph(empty, headings, questions, GraphConfig(), paths=("a.parquet", "h.parquet", "q.parquet"))


# ---------------------------------------------------------------------------
# The registry of sections and their typed configs
# ---------------------------------------------------------------------------


def _builders() -> dict:
    """Section -> the typed config its stage builds (every section has one)."""
    from lexgraph.data.fetch import FetchConfig
    from lexgraph.embed import EmbedConfig
    from lexgraph.retrieval.bm25_pipeline import Bm25Config, Bm25TuneConfig
    from lexgraph.retrieval.hprior import HpriorConfig
    from lexgraph.retrieval.hybrid import HybridConfig
    from lexgraph.data.clean import CleanConfig
    from lexgraph.evaluation import EvaluateConfig
    from lexgraph.graph import GraphConfig
    from lexgraph.models.pretrain import PretrainConfig
    from lexgraph.negatives import NegativesConfig
    from lexgraph.queries import QueriesConfig
    from lexgraph.training.dsr_config import DSRConfig
    from lexgraph.training.gnn_config import VARIANTS, GNNSettings
    from lexgraph.models.mvcl_config import RerankConfig
    from lexgraph.zeroshot import ZeroshotConfig

    return {
        "base": lambda p: section_config(Base, p, "base"),
        "fetch": FetchConfig.from_params,
        "clean": CleanConfig.from_params,
        "bm25_tune": Bm25TuneConfig.from_params,
        "bm25": Bm25Config.from_params,
        "evaluate": EvaluateConfig.from_params,
        "zeroshot": lambda p: section_config(ZeroshotConfig, p, "zeroshot"),
        "graph": GraphConfig.from_params,
        "negatives": NegativesConfig.from_params,
        "gnn": lambda p: [GNNSettings.from_params(p, variant) for variant in VARIANTS],
        "pretrain": PretrainConfig.from_params,
        "queries": QueriesConfig.from_params,
        "dsr": DSRConfig.from_params,
        "embed": EmbedConfig.from_params,
        "hprior": HpriorConfig.from_params,
        "hybrid": HybridConfig.from_params,
        "rerank": RerankConfig.from_params,
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
    ("evaluate", {"significance_split": "train"}, "'evaluate.significance_split' = 'train', expected one of the splits"),
    ("negatives", {"splits": ["trian"]}, "'negatives.splits' = ['trian'], expected split names among train, dev, synthetic"),
    ("dsr", {"epochs": DELETE}, "missing key 'dsr.epochs', expected a positive integer"),
    ("dsr", {"query_trainable_layers": "all"}, "'dsr.query_trainable_layers' = 'all', expected null or an integer >= 0"),
    ("gnn", {"layers": 1.5}, "'gnn.layers' = 1.5, expected an integer"),
    ("gnn", {"kd": {"weight": "half", "mode": "score", "temperature": 0.05, "student_contrastive": False}},
     "'gnn.kd.weight' = 'half', expected a number"),
    ("gnn", {"init": DELETE}, "missing key(s) 'gnn.init'"),
    ("gnn", {"init": "zeros"}, "'gnn.init' = 'zeros', expected one of random, identity, prior"),
    ("gnn", {"qabisar": {"edge_dim": "16"}}, "'gnn.qabisar.edge_dim' = '16', expected null or an integer"),
    ("embed", {"batch_size": 0}, "'embed.batch_size' = 0, expected a positive integer"),
    ("hprior", {"split": "test"}, "'hprior.split' = 'test', but the 'test' split is held out"),
    ("hybrid", {"dense": "bm25"}, "'hybrid.dense' = 'bm25', expected one of zeroshot, dsr, hprior, gdsr, qabisar or best"),
    ("hybrid", {"depth": 100}, "'hybrid.depth' = 100, expected an integer >= 500"),
    ("rerank", {"first_stage": "mvcl"}, "'rerank.first_stage' = 'mvcl', expected a retrieval system other than mvcl"),
    ("rerank", {"split": "test"}, "'rerank.split' = 'test', but the 'test' split is held out"),
    ("rerank", {"k": 1}, "'rerank.k' = 1, expected an integer >= 2"),
    ("rerank", {"hidden": 127}, "'rerank.hidden' = 127, expected an even positive integer"),
    ("rerank", {"alignment": "dot"}, "'rerank.alignment' = 'dot', expected plm (word-level attention on the PLM's states)"),
    ("rerank", {"align_temperature": 0}, "'rerank.align_temperature' = 0.0, expected a number > 0"),
    ("rerank", {"lambda_case": -0.1}, "'rerank.lambda_case' = -0.1, expected a number >= 0"),
    ("rerank", {"t1": 0}, "'rerank.t1' = 0.0, expected a number > 0"),
    ("rerank", {"element_patterns": ["deontic"]}, "'rerank.element_patterns' = ['deontic'], expected a non-empty list"),
    ("rerank", {"interpolation": [0.5, 1.5]}, "'rerank.interpolation' = [0.5, 1.5], expected a non-empty list of distinct numbers in [0, 1]"),
    ("rerank", {"swap": "yes"}, "'rerank.swap' = 'yes', expected true or false"),
    ("rerank", {"lamda_ele": 0.0}, "unknown keys 'rerank.lamda_ele' (did you mean 'rerank.lambda_ele'?)"),
]


@pytest.mark.parametrize("section, edits, fragment", CONFIG_CASES, ids=[f"{c[0]}-{next(iter(c[1]))}" for c in CONFIG_CASES])
def test_typed_config_errors(sample_params, section, edits, fragment):
    import copy

    raw = _edit(copy.deepcopy(sample_params), {f"{section}.{k}": v for k, v in edits.items()})[section]
    with pytest.raises(ConfigError) as info:
        _builders()[section](raw)
    message = str(info.value)
    assert message.startswith("params.yaml: ") and fragment in message, message


def test_type_checks_accept_yaml_strings_for_floats_and_refuse_bools_for_ints():
    from lexgraph.negatives import NegativesConfig

    negatives = read_params(PROFILES[0])["negatives"]
    assert NegativesConfig.from_params({**negatives, "k1": "1.2e0", "b": 1}).k1 == 1.2
    config = NegativesConfig.from_params({**negatives, "b": 1})
    assert config.b == 1.0 and isinstance(config.b, float)
    with pytest.raises(ConfigError, match=r"^params\.yaml: 'negatives\.k' = True, expected a positive integer$"):
        NegativesConfig.from_params({**negatives, "k": True})
    with pytest.raises(ConfigError, match=r"'negatives\.splits' = \['train', 3\], expected a non-empty list"):
        NegativesConfig.from_params({**negatives, "splits": ["train", 3]})


def _keys(values: dict, prefix: str = "") -> list[str]:
    """Every dotted key of a section (nested mappings too, except gnn's per-variant overrides)."""
    out = []
    for key, value in values.items():
        out.append(prefix + key)
        if isinstance(value, dict) and value and key not in ("lge", "qabisar"):
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
    from lexgraph.config import load_params

    path = tmp_path / "params.yaml"
    path.write_text("base: {seed: 1}\nclean: {min_words: 3}\nbm25_tunes: {split: dev}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"unknown section\(s\) 'bm25_tunes' \(did you mean 'bm25_tune'\?\)"):
        load_params("clean", path)
    path.write_text("base: {seed: 1}\nclean: 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"section 'clean' = 3, expected a mapping of keys"):
        load_params("clean", path)


def test_resolve_device_names_the_setting_it_was_given():
    with pytest.raises(ConfigError, match=r"^params\.yaml: 'base\.device' = 'gpu', expected auto, cpu, cuda or cuda:N$"):
        resolve_device("gpu")
    with pytest.raises(ConfigError, match=r"^--device = 'cuda0', expected auto, cpu, cuda or cuda:N$"):
        resolve_device("cuda0", where="--device")
    assert str(resolve_device("cpu", where="--device")) == "cpu"


def _config_classes() -> dict:
    """Section -> the dataclass whose fields are the section's keys (gnn: GNNSettings' own)."""
    from lexgraph.data.clean import CleanConfig
    from lexgraph.data.fetch import FetchConfig
    from lexgraph.embed import EmbedConfig
    from lexgraph.evaluation import EvaluateConfig
    from lexgraph.graph import GraphConfig
    from lexgraph.models.mvcl_config import RerankConfig
    from lexgraph.models.pretrain import PretrainConfig
    from lexgraph.negatives import NegativesConfig
    from lexgraph.queries import QueriesConfig
    from lexgraph.retrieval.bm25_pipeline import Bm25Config, Bm25TuneConfig
    from lexgraph.retrieval.hprior import HpriorConfig
    from lexgraph.retrieval.hybrid import HybridConfig
    from lexgraph.retrieval.index import IndexConfig
    from lexgraph.training.dsr_config import DSRConfig
    from lexgraph.zeroshot import ZeroshotConfig

    return {"base": Base, "fetch": FetchConfig, "clean": CleanConfig, "bm25_tune": Bm25TuneConfig, "bm25": Bm25Config,
            "evaluate": EvaluateConfig, "evaluate.index": IndexConfig, "zeroshot": ZeroshotConfig,
            "graph": GraphConfig, "negatives": NegativesConfig, "pretrain": PretrainConfig, "queries": QueriesConfig,
            "dsr": DSRConfig, "embed": EmbedConfig, "hprior": HpriorConfig, "hybrid": HybridConfig,
            "rerank": RerankConfig}


@pytest.mark.parametrize("section", sorted(_config_classes()))
def test_code_defaults_equal_params_yaml(section):
    """A default in a config class can never disagree with params.yaml: every key is required
    when a stage reads its section, and any default the code keeps (for direct construction)
    is params.yaml's value."""
    import dataclasses

    cls = _config_classes()[section]
    values = read_params(PROFILES[0])
    for part in section.split("."):
        values = values[part]
    expected = dataclasses.asdict(cls.from_params(values) if hasattr(cls, "from_params")
                                  else section_config(cls, values, section))
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            continue
        default = dataclasses.asdict(default) if dataclasses.is_dataclass(default) else default
        assert default == expected[f.name], f"{cls.__name__}.{f.name} defaults to {default!r}, " \
                                            f"params.yaml says {expected[f.name]!r}"

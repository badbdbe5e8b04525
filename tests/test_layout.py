"""One home for paths: dvc.yaml writes every stage's paths on its command line, the stage
scripts have no path defaults, and :mod:`lexgraph.core.layout` (what the readers of a workspace
use) names exactly the outputs dvc.yaml declares."""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
from pathlib import Path

import pytest

from conftest import ROOT
from helpers_stages import driver, expanded_stages, outs_of
from lexgraph.core import layout
from lexgraph.core.stage import Stage, parser_of


@pytest.mark.parametrize("name", sorted(layout.ARTIFACTS))
def test_every_layout_artifact_is_an_output_of_its_stage(name):
    artifact = layout.ARTIFACTS[name]
    stages = expanded_stages()
    assert artifact.stage in stages, f"{name}: no stage {artifact.stage!r} in dvc.yaml"
    assert str(artifact.path) in outs_of(stages[artifact.stage]), (name, outs_of(stages[artifact.stage]))


def test_every_directory_output_of_dvc_yaml_is_in_the_layout():
    named = {str(a.path) for a in layout.ARTIFACTS.values()}
    for name, stage in expanded_stages().items():
        for path in outs_of(stage):
            if not path.startswith("metrics/"):
                assert path in named, f"{name} writes {path}, which lexgraph.core.layout does not name"


def stage_parser(script: Path) -> argparse.ArgumentParser:
    return parser_of(driver(script).STAGE)


@pytest.mark.parametrize("name", sorted(expanded_stages()))
def test_stage_paths_come_from_dvc_yaml_only(name):
    stage = expanded_stages()[name]
    argv = shlex.split(stage["cmd"].replace("${base.launcher}", "python"))
    script = ROOT / next(a for a in argv if a.startswith("stages/"))
    parser = stage_parser(script)
    options = [a for a in parser._actions if a.option_strings and a.dest not in ("help", "params")]
    for action in options:
        assert action.required and action.default is None, f"{script.name}: {action.option_strings[0]} has a default"
        assert action.option_strings[0] in argv, f"dvc.yaml's {name} does not pass {action.option_strings[0]}"


def test_no_artifact_path_literal_outside_the_layout_module():
    literal = re.compile(r"""["'](?:data|models|metrics)/""")
    offenders = [
        f"{path.relative_to(ROOT)}:{i}"
        for path in sorted((ROOT / "src").rglob("*.py"))
        if path.name != "layout.py"
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if literal.search(line)
    ]
    assert offenders == []


def test_only_the_config_layer_words_params_yaml_errors():
    """Messages that name params.yaml come from lexgraph.core.config and core.settings (params_error, bad_value)."""
    literal = re.compile(r"""(ConfigError|LexgraphError|DataError)\(\s*f?["']params\.yaml""")
    offenders = [
        f"{path.relative_to(ROOT)}:{i}"
        for path in sorted((ROOT / "src").rglob("*.py"))
        if path.name not in ("config.py", "settings.py") or path.parent.name != "core"
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if literal.search(line)
    ]
    assert offenders == []


def test_producer_names_the_stage_that_writes_a_path():
    assert layout.producer("/ws/models/dsr/query_encoder/config.json").stage == "train_dsr"
    assert layout.producer("models/gnn_qabisar/query_encoder").stage == "train_gnn@qabisar"
    assert layout.producer("ws/models/dsr_qabisar/dsr.json").stage == "train_dsr_qabisar"
    assert layout.producer("data/embed_qabisar/articles.safetensors").stage == "embed_qabisar"
    assert layout.producer("/srv/data/embed/models/pretrain/vocab.txt").stage == "pretrain"  # the rightmost
    assert layout.producer("data/queries/synthetic.parquet").stage == "generate_queries"
    assert layout.producer("/home/me/checkpoints/camembert") is None
    assert layout.restore_hint("ws/models/dsr/query_encoder") == (
        "rerun `dvc repro train_dsr` (or `dvc checkout`) to restore it"
    )
    assert layout.restore_hint("/elsewhere") == "rerun `dvc repro` (or `dvc checkout`) to restore it"


def test_every_stage_driver_has_one_shape():
    """A driver declares its stage, ``STAGE = Stage(<its name>, <its section>, <its paths dataclass>,
    <its settings>, <its entry>)``, and ends with ``run_stage(STAGE)``; the entry, the library's or a
    ``run`` wrapper the driver defines (its only function), takes ``(paths, config, context)``:
    every path of every stage comes from its paths dataclass."""
    import ast
    import inspect

    scripts = [s for s in sorted((ROOT / "stages").glob("*.py")) if s.name != "__init__.py"]
    assert len(scripts) == len(expanded_stages_by_script()), "a driver dvc.yaml does not run, or the reverse"
    for script in scripts:
        tree = ast.parse(script.read_text(encoding="utf-8"))
        funcs = [f.name for f in tree.body if isinstance(f, ast.FunctionDef)]
        assert funcs in ([], ["run"]), f"{script.name}: functions {funcs}"
        assert ast.unparse(tree.body[-1].body[-1]) == "sys.exit(run_stage(STAGE))", f"{script.name}: its last line"
        stage = driver(script).STAGE
        assert isinstance(stage, Stage) and stage.name == script.stem, f"{script.name}: STAGE {stage!r}"
        assert dataclasses.is_dataclass(stage.paths), f"{script.name}: its paths are not a dataclass"
        signature = inspect.signature(stage.run)
        assert list(signature.parameters) == ["paths", "config", "context"], f"{script.name}: entry {signature}"


def expanded_stages_by_script() -> set[str]:
    """The driver scripts dvc.yaml's stages run."""
    return {
        next(a for a in shlex.split(s["cmd"].replace("${base.launcher}", "python")) if a.startswith("stages/"))
        for s in expanded_stages().values()
    }


def test_every_section_is_read_by_read_section():
    """One reader of params: every config's ``from_params`` returns ``read_section(...)`` (its
    pydantic model, lexgraph.core.settings), as is or resolved for a variant, or is the one of
    ``Section`` it inherits (``class XConfig(Section, section=...)``): no section parses its keys
    by hand; nested and per-variant ones included."""
    import ast

    readers, sections = [], []
    for path in sorted((ROOT / "src").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b) == "Section" for b in node.bases):
                sections.append(node.name)
            if isinstance(node, ast.FunctionDef) and node.name == "from_params":
                body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
                returned = body[-1].value if body and isinstance(body[-1], ast.Return) else None
                while isinstance(returned, ast.Call) and isinstance(returned.func, ast.Attribute):
                    returned = returned.func.value  # read_section(...).resolve(variant)
                ok = isinstance(returned, ast.Call) and ast.unparse(returned.func) == "read_section"
                readers.append((f"{path.relative_to(ROOT)}:{node.lineno}", ok))
    assert [r for r, ok in readers if not ok] == []
    assert len(sections) + len(readers) >= 17  # + Base, read in load_params

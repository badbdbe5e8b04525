"""The stage table (``src/lexgraph/core/stages.toml``, read by lexgraph.core.layout.read_stage_table),
a stage's paths dataclass built from it (lexgraph.core.stage.stage_paths) and the marks its fields
carry (lexgraph.core.provenance.path_roles): each path's role and help written once."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Annotated

import pytest

from conftest import ROOT
from helpers_stages import driver, expanded_stages
from lexgraph.core import layout
from lexgraph.core.provenance import Input, Output, Workspace, path_roles, stage_inputs
from lexgraph.core.stage import add_paths, stage_paths

TABLE = """
[common]
articles = { in = "clean articles" }
metrics = { out = "metrics JSON" }

[stage.toy_stage]
common = ["articles", "metrics"]
tuned = { in = "the tuned pair" }
ws = { workspace = "w" }
runs = { out = "the runs", record = false }
"""
COMMON, STAGES = layout.read_stage_table(TABLE)
Toy = stage_paths("toy_stage", STAGES["toy_stage"])


def test_fields_roles_and_help_come_from_the_stage_table_common_first():
    assert [f.name for f in dataclasses.fields(Toy)] == ["articles", "metrics", "tuned", "ws", "runs"]
    assert path_roles(Toy) == {
        "articles": Input("clean articles"),
        "metrics": Output("metrics JSON"),
        "tuned": Input("the tuned pair"),
        "ws": Workspace("w"),
        "runs": Output("the runs", record=False),
    }
    assert path_roles(Toy)["articles"] is COMMON["articles"]
    assert Toy.__name__ == "ToyStagePaths" and Toy.__module__ == __name__
    parser = argparse.ArgumentParser()
    add_paths(parser, Toy)
    assert {a.dest: a.help for a in parser._actions if a.dest != "help"} == {
        "articles": "clean articles",
        "metrics": "metrics JSON",
        "tuned": "the tuned pair",
        "ws": "w",
        "runs": "the runs",
    }


def test_only_inputs_are_digested_and_fields_are_given_by_name():
    paths = Toy(articles=Path("a"), metrics=Path("m"), tuned=Path("t"), ws=Path("."), runs=Path("r"))
    assert stage_inputs(paths) == {"articles": Path("a"), "tuned": Path("t")}
    with pytest.raises(TypeError):
        Toy(Path("a"), Path("m"), Path("t"), Path("."), Path("r"))  # the order is --help's, not the caller's
    with pytest.raises(dataclasses.FrozenInstanceError):
        paths.articles = Path("b")


def test_an_unmarked_path_or_an_unknown_common_name_is_a_programming_error():
    @dataclasses.dataclass(frozen=True)
    class Bare:
        articles: Annotated[Path, Input("a")]
        out: Path

    with pytest.raises(TypeError, match=r"Bare\.out: expected Annotated\[Path, Input\|Output\|Workspace\(help\)\]"):
        path_roles(Bare)
    misspelt = TABLE.replace('common = ["articles"', 'common = ["artciles"')
    with pytest.raises(ValueError, match=r"stage 'toy_stage' names \['artciles'\], not paths of"):
        layout.read_stage_table(misspelt)


def test_every_stage_of_the_table_is_a_dvc_stage_driver_built_from_it():
    """Each table entry is one driver's paths, and each dvc.yaml stage's driver reads its entry."""
    built = {}
    for stage in expanded_stages().values():
        script = next(word for word in stage["cmd"].split() if word.startswith("stages/"))
        paths = driver(ROOT / script).STAGE.paths
        built[paths.__name__] = path_roles(paths)
    titles = {"".join(w.title() for w in name.split("_")) + "Paths": name for name in layout.STAGE_PATHS}
    assert set(built) == set(titles)
    for title, roles in built.items():
        assert roles == layout.STAGE_PATHS[titles[title]]

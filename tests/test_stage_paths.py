"""A stage's paths declaration (lexgraph.core.stage.stage_paths) and the marks its fields carry
(lexgraph.core.provenance.path_roles): the common paths' help written once in layout.PATHS."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Annotated

import pytest

from lexgraph.core import layout
from lexgraph.core.provenance import Input, Output, Workspace, path_roles, stage_inputs
from lexgraph.core.stage import add_paths, stage_paths

Toy = stage_paths("toy_stage", "articles", "metrics", tuned=Input("the tuned pair"), ws=Workspace("w"))


def test_fields_roles_and_help_come_from_the_declaration_and_the_common_table():
    assert [f.name for f in dataclasses.fields(Toy)] == ["articles", "metrics", "tuned", "ws"]
    assert path_roles(Toy) == {
        "articles": Input("clean articles (Parquet)"),
        "metrics": Output("metrics JSON"),
        "tuned": Input("the tuned pair"),
        "ws": Workspace("w"),
    }
    assert path_roles(Toy)["articles"] is layout.PATHS["articles"]
    assert Toy.__name__ == "ToyStagePaths" and Toy.__module__ == __name__
    parser = argparse.ArgumentParser()
    add_paths(parser, Toy)
    assert {a.dest: a.help for a in parser._actions if a.dest != "help"} == {
        "articles": "clean articles (Parquet)",
        "metrics": "metrics JSON",
        "tuned": "the tuned pair",
        "ws": "w",
    }


def test_only_inputs_are_digested_and_fields_are_given_by_name():
    paths = Toy(articles=Path("a"), metrics=Path("m"), tuned=Path("t"), ws=Path("."))
    assert stage_inputs(paths) == {"articles": Path("a"), "tuned": Path("t")}
    with pytest.raises(TypeError):
        Toy(Path("a"), Path("m"), Path("t"), Path("."))  # the order is --help's, not the caller's
    with pytest.raises(dataclasses.FrozenInstanceError):
        paths.articles = Path("b")


def test_an_unmarked_or_unknown_path_is_a_programming_error():
    @dataclasses.dataclass(frozen=True)
    class Bare:
        articles: Annotated[Path, Input("a")]
        out: Path

    with pytest.raises(TypeError, match=r"Bare\.out: expected Annotated\[Path, Input\|Output\|Workspace\(help\)\]"):
        path_roles(Bare)
    with pytest.raises(KeyError, match="artciles"):
        stage_paths("toy", "artciles")

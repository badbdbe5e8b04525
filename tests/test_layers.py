"""The layer contract names every folder of src/lexgraph, and no module lives outside one:
a new folder (or a module dropped at the top level) would otherwise escape `lint-imports`,
which only checks the layers it is told about. docs/architecture.md draws the same folders."""

from __future__ import annotations

import re
import tomllib

from conftest import ROOT

PACKAGE = ROOT / "src" / "lexgraph"


def _contract_layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    (contract,) = config["contracts"]
    return contract["layers"]


def _folders() -> set[str]:
    return {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}


def test_every_folder_is_a_layer_of_the_contract():
    named = {m.strip().removeprefix("lexgraph.") for layer in _contract_layers() for m in re.split(r"[|:]", layer)}
    named.discard("stages")
    assert named == _folders()


def test_no_module_sits_outside_a_folder():
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py"]


def test_the_architecture_page_draws_every_folder():
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    diagram = page.split("```")[1]
    drawn = set(re.findall(r"(?:^ *|\| )([a-z]+)/", diagram, re.M)) - {"stages"}
    assert drawn == _folders()

"""Each stage's paths are written once, in its ``dvc.yaml`` command, and everything else about them
is held to that command: the stage's paths dataclass (its driver's ``STAGE.paths``) says which
option is an input and which an output, so every input of the command must be one of the stage's
``deps``, every output one of its ``outs``/``metrics``/``plots`` (or the folder they lie in), and
no dep or out may name a path the command does not give, but for what a stage reading a whole
workspace loads there (the artefacts its systems declare they read, ``System.reads``: DVC must
rerun it when one changes) and the sources ``fetch`` reads. ``core/layout.py`` is held to the outs
by ``tests/test_layout.py``, the ``src/`` deps to the imports by ``tests/test_dvc_deps.py``."""

from __future__ import annotations

import shlex
from pathlib import PurePosixPath

import pytest

from conftest import ROOT
from helpers_stages import driver, expanded_stages, outs_of
from lexgraph.core import layout
from lexgraph.core.provenance import Output, Workspace, path_roles

#: deps a stage reads through an artefact its command gives, not on the command itself (why)
THROUGH = {
    "embed": {layout.PRETRAIN.path.as_posix(): "models/dsr's frozen chunk encoder is the base checkpoint it names"},
    "embed_qabisar": {layout.PRETRAIN.path.as_posix(): "the same, for models/dsr_qabisar"},
}


def command_paths(stage: dict) -> tuple[str, dict[str, str], dict[str, str], bool]:
    """``(script, inputs, outputs, reads a workspace)`` of a dvc.yaml stage: its command's path
    options, sorted by its paths dataclass into inputs and outputs (option -> path)."""
    argv = shlex.split(stage["cmd"].replace("${base.launcher}", "python"))
    script = next(a for a in argv if a.startswith("stages/"))
    given = {argv[i][2:].replace("-", "_"): argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    inputs, outputs, whole = {}, {}, False
    for name, role in path_roles(driver(ROOT / script).STAGE.paths).items():
        if isinstance(role, Workspace):
            whole = True
        elif isinstance(role, Output):
            outputs[name] = given[name]
        else:
            inputs[name] = given[name]
    return script, inputs, outputs, whole


def _inside(path: str, folders) -> bool:
    return any(
        PurePosixPath(path) == PurePosixPath(f) or PurePosixPath(f) in PurePosixPath(path).parents for f in folders
    )


def workspace_reads() -> set[str]:
    """What the systems declare they read: the artefacts a stage that loads systems depends on."""
    from lexgraph.methods.catalog import systems

    return {artifact.path.as_posix() for spec in systems().values() for artifact in spec.reads}


@pytest.mark.parametrize("name", sorted(expanded_stages()))
def test_every_path_of_a_stage_is_written_once_in_its_command(name):
    stage = expanded_stages()[name]
    script, inputs, outputs, whole = command_paths(stage)
    deps = [d for d in stage.get("deps", []) if not d.startswith("src/") and d != script]
    outs = outs_of(stage)
    for option, path in inputs.items():
        assert path in deps, f"{name}: --{option} {path} is read but not among its deps"
    for option, path in outputs.items():
        assert _inside(path, outs) or any(_inside(o, [path]) for o in outs), f"{name}: --{option} {path} not an out"
    for out in outs:
        assert _inside(out, outputs.values()), f"{name}: out {out} is no output of its command"
    extra = sorted(set(deps) - set(inputs.values()) - set(THROUGH.get(name, {})))
    if name == "fetch":
        assert extra == sorted({layout.SAMPLE.as_posix(), layout.CORPUS.as_posix()}), extra
    elif whole:
        artefacts = {a.path.as_posix() for a in layout.ARTIFACTS.values()}
        assert all(_inside(d, artefacts) for d in extra), f"{name}: deps {extra} are no workspace artefacts"
    else:
        assert not extra, f"{name}: deps {extra} are not given on its command"


@pytest.mark.parametrize("name", ["evaluate", "hybrid", "rerank@mvcl", "rerank@xrerank"])
def test_a_stage_loading_systems_depends_on_what_they_read(name):
    """``evaluate`` loads every system; ``hybrid`` and ``rerank`` may load any (``hybrid.dense:
    best``; ``rerank.first_stage``): each artefact a system declares it reads is among their deps,
    but their own outputs and those of the re-rankers, which they cannot load."""
    stage = expanded_stages()[name]
    _, _, outputs, whole = command_paths(stage)
    assert whole
    from lexgraph.methods.catalog import systems

    loadable = {
        artifact.path.as_posix()
        for spec in systems().values()
        if name == "evaluate" or spec.kind != "reranker"
        for artifact in spec.reads
    }
    missing = sorted(p for p in loadable if p not in stage["deps"] and not _inside(p, outputs.values()))
    assert not missing, f"{name} loads systems reading {missing}, which its deps lack"


def test_the_check_sees_a_path_written_twice(monkeypatch):
    """A command whose output is not declared, and a dep the command does not give, are caught."""
    import sys

    bm25 = expanded_stages()["bm25"]
    for edit, message in (
        ({"outs": []}, "not an out"),
        ({"deps": [*bm25["deps"], "data/clean/headings.parquet"]}, "not given on its command"),
    ):
        stage = {**bm25, **edit}
        monkeypatch.setattr(sys.modules[__name__], "expanded_stages", lambda stage=stage: {"bm25": stage})
        with pytest.raises(AssertionError, match=message):
            test_every_path_of_a_stage_is_written_once_in_its_command("bm25")

"""dvc.yaml lists, for every stage, its script and every library module that script
imports (transitively, function-level imports included), so that DVC reruns a stage
exactly when code it runs has changed.

Those lists are written by this module, not by hand: after changing an import, run
``python tests/test_dvc_deps.py --write`` (it rewrites each stage's ``src/`` lines of dvc.yaml to
the closure, and nothing else); the test fails until they agree.

Left out on purpose: package ``__init__`` files, and modules that only shape messages
and logs (``errors``, ``progress``), which never change an output.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

SRC = ROOT / "src"
EXEMPT = {"src/lexgraph/core/errors.py", "src/lexgraph/core/progress.py"}


def module_file(module: str) -> Path | None:
    base = SRC / Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(path: Path) -> set[str]:
    """``lexgraph.*`` modules imported anywhere in ``path`` (lazy imports and the
    included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("lexgraph")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lexgraph"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names if module_file(f"{node.module}.{a.name}")}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = re.fullmatch(r"(lexgraph(?:\.\w+)+):\w+", node.value)
            if match:
                found.add(match.group(1))
    return found


def closure(script: Path) -> set[str]:
    todo, seen = [script], set()
    files: set[str] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for module in imported_modules(path):
            target = module_file(module)
            if target is None:
                continue
            todo.append(target)
            if target.name != "__init__.py":
                files.add(str(target.relative_to(ROOT)))
    return files


def stages() -> dict[str, dict]:
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    out = {}
    for name, stage in spec.items():
        stage = stage.get("do", stage)
        out[name] = stage
    return out


def script_of(stage: dict) -> str:
    return re.search(r"(?:python|\$\{base\.launcher\}) (stages/\w+\.py)", stage["cmd"]).group(1)


def written(text: str) -> str:
    """``text`` (dvc.yaml) with each stage's run of ``- src/`` dep lines replaced by its script's closure."""
    specs, lines = stages(), text.splitlines(keepends=True)
    out, stage, i = [], None, 0
    while i < len(lines):
        heading = re.match(r"^  (\w+):\s*$", lines[i])
        stage = heading.group(1) if heading else stage
        if stage in specs and re.match(r"^\s+- src/", lines[i]):
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            while i < len(lines) and re.match(r"^\s+- src/", lines[i]):
                i += 1
            out += [f"{indent}- {dep}\n" for dep in sorted(closure(ROOT / script_of(specs[stage])) - EXEMPT)]
            continue
        out.append(lines[i])
        i += 1
    return "".join(out)


def test_writing_the_deps_changes_nothing_else():
    """The writer only replaces ``src/`` dep lines: the result parses to the same stages but for them."""
    text = (ROOT / "dvc.yaml").read_text(encoding="utf-8")
    before, after = yaml.safe_load(text)["stages"], yaml.safe_load(written(text))["stages"]
    strip = lambda spec: {  # noqa: E731
        name: {**s.get("do", s), "deps": [d for d in s.get("do", s).get("deps", []) if not d.startswith("src/")]}
        for name, s in spec.items()
    }
    assert strip(before) == strip(after)
    assert written(text) == text, (
        "dvc.yaml's src/ deps are not as written (sorted); run `python tests/test_dvc_deps.py --write`"
    )


@pytest.mark.parametrize("name", sorted(stages()))
def test_deps_list_every_imported_module(name):
    stage = stages()[name]
    script = script_of(stage)
    deps = set(stage.get("deps", []))
    assert script in deps, f"{name}: its script {script} is not in deps"
    needed = closure(ROOT / script) - EXEMPT
    missing = sorted(needed - deps)
    fix = "run `python tests/test_dvc_deps.py --write`"
    assert not missing, f"dvc.yaml stage '{name}' imports {missing} but does not list them in deps; {fix}"
    stale = sorted(d for d in deps if d.startswith("src/") and d not in needed)
    assert not stale, f"dvc.yaml stage '{name}' lists {stale} in deps but does not import them; {fix}"


def test_closure_follows_lazy_imports(tmp_path):
    assert "src/lexgraph/methods/gnn/system.py" in closure(
        ROOT / "stages" / "evaluate.py"
    )  # via the registry's imports
    assert "src/lexgraph/models/family.py" in closure(ROOT / "stages" / "train_dsr.py")  # via encoders


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--write"]:
        sys.exit(
            "usage: python tests/test_dvc_deps.py --write  (rewrites dvc.yaml's src/ deps to each stage's imports)"
        )
    path = ROOT / "dvc.yaml"
    path.write_text(written(path.read_text(encoding="utf-8")), encoding="utf-8")

"""The tests' own layout: shared fixtures live in conftest.py, shared helpers and constants
in conftest.py or a ``helpers_*`` module; no module under tests/ (test module, conftest or
helper) imports a test module (issue 25)."""

from __future__ import annotations

import ast

from conftest import ROOT


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, top-level module name) of every import in ``tree``, nested ones included."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            if node.module == "tests":  # from tests import test_x
                found += [(node.lineno, f"tests.{alias.name}") for alias in node.names]
    return found


def is_test_module(name: str) -> bool:
    parts = name.split(".")
    if parts[0] == "tests":
        parts = parts[1:]
    return bool(parts) and parts[0].startswith("test_")


def test_no_module_under_tests_imports_a_test_module():
    paths = sorted((ROOT / "tests").glob("*.py"))
    assert {"conftest.py", "test_gnn.py", "test_test_layout.py"} <= {p.name for p in paths}
    offenders = []
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        offenders += [f"{path.name}:{line}: {name}" for line, name in imported_modules(tree) if is_test_module(name)]
    assert offenders == [], "modules under tests/ importing a test module:\n" + "\n".join(offenders)


def test_the_check_sees_every_import_form():
    source = "import test_a\nfrom test_b import x\nfrom tests.test_c import y\nfrom tests import test_d\n"
    source += "def f():\n    from test_e import z\nimport conftest\nfrom helpers_graph import w\n"
    names = [name for _, name in imported_modules(ast.parse(source)) if is_test_module(name)]
    assert names == ["test_a", "test_b", "tests.test_c", "tests.test_d", "test_e"]

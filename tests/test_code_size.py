"""The project's size rule for the library (src/lexgraph): no function or method over 80
lines (from its ``def``, decorators included, to its last line: docstring and comments
count). A function that grows past it is split into named pieces with one job each. Files
are cut by meaning (a method's folder: its config, data, training, system and stage entry),
not by a line count: there is no file cap (issue 42)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

LIBRARY = ROOT / "src" / "lexgraph"
MAX_FUNCTION_LINES = 80


def _sources() -> list[Path]:
    files = sorted(LIBRARY.rglob("*.py"))
    assert files, f"no Python file under {LIBRARY}"
    return files


def function_lengths(source: str) -> list[tuple[str, int, int]]:
    """``(qualified name, first line, lines)`` of every function and method in ``source``."""
    out: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    out.append((name, first, child.end_lineno - first + 1))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def test_function_lengths_counts_decorators_docstrings_and_nested_functions():
    source = (
        "@wrap\ndef f():\n    '''doc'''\n    def g():\n        return 1\n    return g\n\n\n"
        "class C:\n    def m(self):\n        pass\n"
    )
    assert function_lengths(source) == [("f", 1, 6), ("f.g", 4, 2), ("C.m", 10, 2)]


def test_no_library_function_over_80_lines():
    long = [
        f"{path.relative_to(ROOT)}:{line} {name}: {n} lines"
        for path in _sources()
        for name, line, n in function_lengths(path.read_text(encoding="utf-8"))
        if n > MAX_FUNCTION_LINES
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them):\n" + "\n".join(long)

"""The house's figures (issue 42): how much of src/ refuses input, where each system's name is
written, how long the hand-kept files are, which functions run past 80 lines.

Read from the code's own syntax trees (``ast``), so anyone can rerun it and compare a later tree
with an earlier one::

    python benchmarks/house.py --json benchmarks/house_before.json

Definitions (issue 42, "Why"):

- *code lines*: lines of src/ that hold code, docstrings, comments and blank lines excluded;
- *guard lines*: the lines of every ``raise`` statement, and the ``if`` tests (their header
  lines) whose whole body is one ``raise``;
- *name files*: for each system of the registry, the files of src/ in which its name stands as a
  string literal (``"hgraph_qa"``);
- *functions over 80 lines*: ``def`` statements whose lines, decorators excluded, exceed 80;
- *method files*: for each folder of ``methods/`` (one per method), its modules (``__init__``
  aside) and their code lines.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import logging
import tokenize
from pathlib import Path

log = logging.getLogger("house")

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "lexgraph"
LONG = 80


def code_lines(source: str, tree: ast.Module) -> set[int]:
    """Lines holding a token of code: not comments, blank lines or docstrings."""
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    lines: set[int] = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines - docstrings


def guard_lines(tree: ast.Module) -> set[int]:
    """Lines of every raise, and the headers of ifs whose whole body is one raise."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise):
            lines.update(range(node.lineno, node.end_lineno + 1))
        elif isinstance(node, ast.If) and len(node.body) == 1 and isinstance(node.body[0], ast.Raise):
            lines.update(range(node.lineno, node.body[0].lineno))
    return lines


def long_functions(tree: ast.Module, path: str) -> list[dict]:
    return [
        {"function": f"{path}:{node.name}", "lines": node.end_lineno - node.lineno + 1}
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > LONG
    ]


def string_literals(tree: ast.Module) -> set[str]:
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def measure(src: Path, systems: list[str]) -> dict:
    code = guard = 0
    per_folder: dict[str, list[int]] = {}
    names = {s: [] for s in systems}
    long: list[dict] = []
    files = sorted(src.rglob("*.py"))
    for file in files:
        source = file.read_text(encoding="utf-8")
        tree = ast.parse(source)
        rel = file.relative_to(src).as_posix()
        c, g = code_lines(source, tree), guard_lines(tree)
        code, guard = code + len(c), guard + len(g & c)
        folder = per_folder.setdefault(rel.split("/")[0] if "/" in rel else ".", [0, 0])
        folder[0], folder[1] = folder[0] + len(c), folder[1] + len(g & c)
        literals = string_literals(tree)
        for system in systems:
            if system in literals:
                names[system].append(rel)
        long += long_functions(tree, rel)
    return {
        "files": len(files),
        "code_lines": code,
        "guard_lines": guard,
        "guard_share": round(guard / code, 4),
        "guard_share_by_folder": {k: round(v[1] / v[0], 4) for k, v in sorted(per_folder.items()) if v[0]},
        "name_files": {s: len(f) for s, f in names.items()},
        "name_files_where": names,
        "functions_over_80_lines": sorted(long, key=lambda f: -f["lines"]),
    }


#: the settings framework's own modules (conform.py before issue 42's part 4, settings.py after)
CONFIG_MODULES = ("core/config.py", "core/conform.py", "core/settings.py")
#: methods that check settings: the dataclasses' validate/__post_init__, pydantic's validators
CHECKS = {"validate", "__post_init__"}


def _settings_classes(trees: dict[str, ast.Module]) -> list[tuple[str, ast.ClassDef]]:
    """Every settings class: one with a ``from_params`` or ``validate`` (the dataclasses before), or a
    subclass of ``Settings`` or of another settings class (pydantic, after)."""
    classes = [(rel, node) for rel, tree in trees.items() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    found: set[str] = {"Settings"}
    while True:
        more = {n.name for _, n in classes if any(getattr(b, "id", None) in found for b in n.bases)} - found
        if not more:
            break
        found |= more
    own = {"from_params", "validate"}
    return [
        (rel, n)
        for rel, n in classes
        if n.name in found - {"Settings"} or any(isinstance(f, ast.FunctionDef) and f.name in own for f in n.body)
    ]


def config_figures(src: Path) -> dict:
    """Code lines of the settings framework and of every settings class, and of their checks
    (``validate``/``__post_init__`` methods, pydantic validators: functions decorated ``*_validator``)."""
    sources = {f.relative_to(src).as_posix(): f.read_text(encoding="utf-8") for f in sorted(src.rglob("*.py"))}
    trees = {rel: ast.parse(text) for rel, text in sources.items()}
    code = {rel: code_lines(sources[rel], trees[rel]) for rel in sources}
    framework = sum(len(code[rel]) for rel in CONFIG_MODULES if rel in code)
    classes = _settings_classes(trees)
    lines, checks = 0, 0
    for rel, node in classes:
        if rel in CONFIG_MODULES:
            continue  # counted with the framework
        lines += len(code[rel] & set(range(node.lineno, node.end_lineno + 1)))
        for f in (f for f in node.body if isinstance(f, ast.FunctionDef)):
            decorated = any("validator" in ast.unparse(d) for d in f.decorator_list)
            if f.name in CHECKS or decorated:
                start = min([f.lineno, *(d.lineno for d in f.decorator_list)])
                checks += len(code[rel] & set(range(start, f.end_lineno + 1)))
    return {
        "config_framework_lines": framework,
        "config_classes": len(classes),
        "config_class_lines": lines,
        "config_check_lines": checks,
        "config_lines": framework + lines,
    }


def method_files(src: Path) -> dict[str, dict]:
    """For each method's folder of ``src/methods``, its modules (``__init__`` aside) and code lines."""
    out = {}
    for folder in sorted(p for p in (src / "methods").iterdir() if (p / "__init__.py").is_file()):
        modules = sorted(f for f in folder.glob("*.py") if f.name != "__init__.py")
        lines = sum(len(code_lines(s, ast.parse(s))) for s in (f.read_text(encoding="utf-8") for f in modules))
        out[folder.name] = {"modules": [f.name for f in modules], "code_lines": lines}
    return out


def dvc_yaml_figures(path: Path) -> dict:
    lines = path.read_text(encoding="utf-8").splitlines()
    source_deps = sum(1 for line in lines if line.strip().startswith("- src/"))
    return {"dvc_yaml_lines": len(lines), "dvc_yaml_source_dep_lines": source_deps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the figures here as well")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from lexgraph.methods.catalog import names

    figures = measure(SRC, list(names())) | dvc_yaml_figures(ROOT / "dvc.yaml") | config_figures(SRC)
    if (SRC / "methods").is_dir():
        figures["methods"] = method_files(SRC)
    hidden = ("name_files_where", "functions_over_80_lines", "methods")
    summary = {k: v for k, v in figures.items() if k not in hidden}
    log.info(json.dumps(summary, indent=1))
    log.info("functions over %d lines: %d", LONG, len(figures["functions_over_80_lines"]))
    if args.json:
        from lexgraph.core.io import write_json

        write_json(figures, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

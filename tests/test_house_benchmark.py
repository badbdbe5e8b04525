"""benchmarks/house.py: guard lines, code lines and name files counted by hand on small sources."""

from __future__ import annotations

import ast

from conftest import load_benchmark

house = load_benchmark("house")

SOURCE = '''"""A module docstring,
two lines long."""


def check(x):
    """A docstring."""
    # a comment
    if x < 0:
        raise ValueError(
            "negative"
        )
    if x > 9:
        x = 9
        raise ValueError("big")
    return {"system": "dsr", "other": x}
'''


def test_code_lines_leave_out_docstrings_comments_and_blanks():
    tree = ast.parse(SOURCE)
    # lines 5 (def), 8-11 (if + raise over 3 lines), 12-14 (if, assignment, raise), 15 (return)
    assert house.code_lines(SOURCE, tree) == {5, 8, 9, 10, 11, 12, 13, 14, 15}


def test_guard_lines_are_raises_and_the_ifs_whose_whole_body_is_one_raise():
    tree = ast.parse(SOURCE)
    # the first if's header (8) and its raise (9-11); of the second if, only its raise (14)
    assert house.guard_lines(tree) == {8, 9, 10, 11, 14}


def test_name_files_count_string_literals_not_substrings(tmp_path):
    (tmp_path / "a.py").write_text(SOURCE, encoding="utf-8")
    (tmp_path / "b.py").write_text('X = "dsr_qabisar"  # dsr\n', encoding="utf-8")
    figures = house.measure(tmp_path, ["dsr", "zeroshot"])
    assert figures["name_files_where"] == {"dsr": ["a.py"], "zeroshot": []}
    assert figures["code_lines"] == 10 and figures["guard_lines"] == 5


def test_method_files_list_each_method_folders_modules(tmp_path):
    (tmp_path / "methods" / "gnn").mkdir(parents=True)
    (tmp_path / "methods" / "gnn" / "__init__.py").write_text('"""The GNN."""\n', encoding="utf-8")
    (tmp_path / "methods" / "gnn" / "model.py").write_text(SOURCE, encoding="utf-8")
    (tmp_path / "methods" / "gnn" / "train.py").write_text("x = 1\n", encoding="utf-8")
    (tmp_path / "methods" / "notes").mkdir()  # no package: not a method
    assert house.method_files(tmp_path) == {"gnn": {"modules": ["model.py", "train.py"], "code_lines": 10}}


def test_the_systems_page_gives_the_committed_name_counts():
    """docs/systems.md's before/after table is read from benchmarks/house_before.json and house_after.json."""
    import json
    import re

    from conftest import ROOT

    before = json.loads((ROOT / "benchmarks" / "house_before.json").read_text(encoding="utf-8"))["name_files"]
    after = json.loads((ROOT / "benchmarks" / "house_after.json").read_text(encoding="utf-8"))["name_files"]
    page = (ROOT / "docs" / "systems.md").read_text(encoding="utf-8")
    rows = {m[0]: (int(m[1]), int(m[2])) for m in re.findall(r"^\| `(\w+)` \| (\d+) \| (\d+) \|$", page, re.M)}
    assert rows == {name: (before[name], after[name]) for name in before}


def test_the_architecture_page_gives_the_committed_method_folders():
    """docs/architecture.md's table of each method's modules, before (benchmarks/method_moves.json:
    the folders its modules came from) and after (benchmarks/house_after.json: its folder now)."""
    import json
    import re

    from conftest import ROOT

    moves = json.loads((ROOT / "benchmarks" / "method_moves.json").read_text(encoding="utf-8"))
    after = json.loads((ROOT / "benchmarks" / "house_after.json").read_text(encoding="utf-8"))["methods"]
    came_from: dict[str, set[str]] = {}
    for old, new in [*moves["moves"].items(), *moves["split"].items()]:
        parts = new.split(".")
        if len(parts) == 4 and parts[1] == "methods":
            came_from.setdefault(parts[2], set()).add(old)
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\w+) \| (\d+) in (\d+) \(([a-z, ]+)\) \| (\d+) in 1 \(`methods/(\w+)/`\) \|$", page, re.M)
    assert {r[0] for r in rows} == set(after) == set(came_from)
    for method, n_before, n_folders, folders, n_after, folder in rows:
        old_folders = sorted({m.split(".")[1] for m in came_from[method]})
        assert (int(n_before), int(n_folders), folders.split(", ")) == (
            len(came_from[method]),
            len(old_folders),
            old_folders,
        )
        assert (int(n_after), folder) == (len(after[method]["modules"]), method)


def test_the_architecture_page_gives_the_committed_guard_and_settings_figures():
    """docs/architecture.md's before/after table of the guard share and the settings' code lines is
    read from benchmarks/house_before.json and house_after.json."""
    import json

    from conftest import ROOT

    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    before, after = (
        json.loads((ROOT / "benchmarks" / f"house_{when}.json").read_text(encoding="utf-8"))
        for when in ("before", "after")
    )

    def share(d):
        return f"{d['guard_lines']:,} of {d['code_lines']:,} ({100 * d['guard_lines'] / d['code_lines']:.2f} %)"

    assert f"| {share(before)} | {share(after)} |" in page
    for key in ("config_framework_lines", "config_classes", "config_class_lines", "config_check_lines"):
        assert f"| {before[key]:,} | {after[key]:,} |" in page, key


def test_config_figures_count_settings_classes_and_their_checks(tmp_path):
    """A settings class is one with from_params/validate or a Settings subclass (transitively); its
    checks are validate/__post_init__ and the functions decorated as validators."""
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "settings.py").write_text("class Settings:\n    pass\n", encoding="utf-8")
    (tmp_path / "a.py").write_text(
        "class Old:\n"
        "    x: int\n"
        "    def validate(self):\n"
        "        assert self.x\n"
        "class New(Settings):\n"
        "    y: int\n"
        "class Newer(New):\n"
        "    @model_validator(mode='after')\n"
        "    def _rule(self):\n"
        "        return self\n"
        "class Other:\n"
        "    z: int\n",
        encoding="utf-8",
    )
    figures = house.config_figures(tmp_path)
    assert figures == {
        "config_framework_lines": 2,
        "config_classes": 3,
        "config_class_lines": 10,
        "config_check_lines": 5,
        "config_lines": 12,
    }

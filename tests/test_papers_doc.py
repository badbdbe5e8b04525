"""docs/papers.md's settings tables against profiles/paper.yaml: every `key = value` of a
table's "profile" column names a full dotted key of the profile and its value there, so the
page cannot drift from the profile."""

from __future__ import annotations

import re

import pytest
import yaml

from conftest import ROOT

DOC = ROOT / "docs" / "papers.md"
PROFILE = ROOT / "profiles" / "paper.yaml"
HEADER = re.compile(r"^\|\s*setting\s*\|.*\|\s*profile\s*\|\s*$")
ASSIGNMENT = re.compile(r"^([A-Za-z_][\w@]*(?:\.[\w@]+)*)\s*=\s*(.+)$")
MISSING = object()


def profile_rows(text: str) -> list[tuple[int, str]]:
    """``(line number, profile cell)`` of every row of every settings table (header
    ``| setting | … | profile |``)."""
    rows: list[tuple[int, str]] = []
    column = None
    for n, line in enumerate(text.splitlines(), 1):
        if HEADER.match(line):
            column = len(line.strip().strip("|").split("|")) - 1
            continue
        if column is None:
            continue
        if not line.startswith("|"):
            column = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if set("".join(cells)) <= set(":- "):  # the alignment row
            continue
        assert len(cells) == column + 1, f"docs/papers.md:{n}: {len(cells)} cells, expected {column + 1}"
        rows.append((n, cells[column]))
    return rows


def assignments(cell: str) -> list[tuple[str, str]]:
    """The ``(key, raw value)`` of every code span of ``cell`` that reads ``key = value``."""
    found = []
    for span in re.findall(r"`([^`]+)`", cell):
        match = ASSIGNMENT.match(span.strip())
        if match:
            found.append((match.group(1), match.group(2).strip()))
    return found


def lookup(params: dict, key: str):
    node = params
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def test_parsing_by_hand():
    text = (
        "intro\n| setting | paper | source | checked | profile |\n|:---|:---|:---|:---|:---|\n"
        '| a | 1 | s | code | `gnn.layers = 3` (shared), `rerank.del_token = "<mask>"`, `x.y` |\n\nafter\n'
        "| not | a | settings | table |\n"
    )
    assert profile_rows(text) == [(4, '`gnn.layers = 3` (shared), `rerank.del_token = "<mask>"`, `x.y`')]
    assert assignments(profile_rows(text)[0][1]) == [("gnn.layers", "3"), ("rerank.del_token", '"<mask>"')]
    assert lookup({"gnn": {"qabisar": {"kd": {"mode": "score"}}}}, "gnn.qabisar.kd.mode") == "score"
    assert lookup({"gnn": {}}, "gnn.layers") is MISSING


@pytest.fixture(scope="module")
def named() -> list[tuple[int, str, str]]:
    rows = profile_rows(DOC.read_text(encoding="utf-8"))
    return [(n, key, raw) for n, cell in rows for key, raw in assignments(cell)]


def test_the_tables_name_keys(named):
    # the six settings tables (BSARD, DSR, pre-training, LGE, QABISAR, MVCL) name most rows' keys
    assert len(named) >= 100


def test_every_named_key_has_the_profile_value(named):
    profile = yaml.safe_load(PROFILE.read_text(encoding="utf-8"))
    wrong = []
    for n, key, raw in named:
        if "." not in key:
            wrong.append(f"docs/papers.md:{n}: `{key}` is not a full key (write its section too, e.g. gnn.gdsr.{key})")
            continue
        actual = lookup(profile, key)
        if actual is MISSING:
            wrong.append(f"docs/papers.md:{n}: `{key}` is not a key of profiles/paper.yaml")
            continue
        expected = yaml.safe_load(raw)
        if expected != actual or isinstance(expected, bool) != isinstance(actual, bool):
            wrong.append(f"docs/papers.md:{n}: `{key} = {raw}`, but profiles/paper.yaml has {actual!r}")
    assert not wrong, "\n".join(wrong)


def test_mvcl_is_credited_to_its_one_author():
    # MVCL (arXiv:2210.05188) has one author, Zhaowei Wang: no citation of it in the project
    # may add co-authors ("et al.", or the six-name list once copied into the loss docstrings)
    import subprocess

    tracked = subprocess.run(
        ["git", "ls-files", "*.py", "*.md", "*.yaml"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    wrong = []
    for name in tracked:
        text = (ROOT / name).read_text(encoding="utf-8")
        for match in re.finditer(r"IJCNN 2022", text):
            before = text[max(0, match.start() - 300) : match.start()]
            start = max(before.rfind("\n\n"), before.rfind("\n- "), before.rfind('"""'), 0)
            around = before[start:] + text[match.end() : match.end() + 50]  # the citation's paragraph or item
            if re.search(r"et al|Wang, Zhang|Zhang, Chen", around):
                wrong.append(f"{name}:{text.count(chr(10), 0, match.start()) + 1}")
    assert not wrong, f"MVCL credited to more than Zhaowei Wang at {wrong}"

"""The front page and the docs site (issue 25): the generated results page matches metrics/ and
regression/, the README's results table matches the same files, every relative link resolves,
and the README keeps the two commands that .ci/run and a fresh machine depend on."""

from __future__ import annotations

import re

import yaml

from conftest import ROOT, load_benchmark

gen_results = load_benchmark("gen_results", folder="docs")

SETUP = "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[dev]' && dvc repro"
TESTS = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' && .venv/bin/python -m pytest -q"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _table_rows(lines: list[str], start: int) -> list[list[str]]:
    """The cells of the Markdown table's data rows from line ``start`` (its header) on."""
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_results_page_is_generated_from_metrics(tmp_path):
    """docs/results.md is what docs/gen_results.py writes from metrics/ and regression/, byte for
    byte: after `dvc repro` changes a metric, rerun the script and commit the page."""
    built = gen_results.write(tmp_path)
    assert built.read_bytes() == (ROOT / "docs" / "results.md").read_bytes(), (
        "docs/results.md is stale: run `python docs/gen_results.py` and commit it"
    )


def test_results_page_reads_the_files_it_names(tmp_path):
    """A metric changed in a copy of the workspace changes the page (nothing is typed by hand)."""
    import shutil

    for name in ("params.yaml",):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "metrics", tmp_path / "metrics", ignore=shutil.ignore_patterns("per_query"))
    shutil.copytree(ROOT / "regression", tmp_path / "regression")
    page = gen_results.render(tmp_path)
    assert "| bm25 | 39.5 |" in page and "120 of 120 checks pass" in page
    bm25 = (tmp_path / "metrics" / "bm25.json").read_text(encoding="utf-8")
    (tmp_path / "metrics" / "bm25.json").write_text(
        bm25.replace('"recall@100": 0.3947', '"recall@100": 0.2947'), encoding="utf-8"
    )
    page = gen_results.render(tmp_path)
    assert "| bm25 | 29.5 |" in page and "119 of 120 checks pass" in page
    assert "bm25/test/recall@100: 0.2947, expected 0.3947" in page


def test_readme_table_matches_the_generated_one():
    """The README's test table (systems described in words) carries the generated table's
    numbers and superscripts, row for row and in the same order."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(readme) if line.startswith("| System | R@100"))
    page_start = page.index("## Test split")
    page_start = next(i for i in range(page_start, len(page)) if page[i].startswith("| System | R@100"))
    assert readme[start] == page[page_start]
    ours, generated = _table_rows(readme, start), _table_rows(page, page_start)
    assert len(ours) == len(generated)
    for row, want in zip(ours, generated):
        system = re.sub(r"[*`]", "", row[0]).split()[0].lower()
        assert system == want[0], (row[0], want[0])
        assert row[1:] == want[1:], system


def test_readme_is_a_front_page_with_the_two_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    assert f"```bash\n{SETUP}\n```" in readme
    assert f"```bash\n{TESTS}\n```" in readme
    assert TESTS in (ROOT / ".ci" / "run").read_text(encoding="utf-8")  # .ci/run runs the README's command


def test_every_relative_link_exists():
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                missing.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not missing


def test_every_docs_page_is_in_the_site_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(nav):
        for item in nav:
            for value in item.values():
                yield from pages(value) if isinstance(value, list) else [value]

    assert sorted(pages(config["nav"])) == sorted(p.name for p in (ROOT / "docs").glob("*.md"))

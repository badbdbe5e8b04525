"""The front page and the docs site (issue 25): the generated results page matches metrics/ and
regression/, the README's results table matches the same files, the sample outputs of
`lexgraph search` are what the command prints on the workspace, every relative link resolves,
and the README keeps the two commands that .ci/run and a fresh machine depend on."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from conftest import ROOT, load_benchmark
from helpers_cli import ARTICLES, write_articles

gen_results = load_benchmark("gen_results", folder="docs")
gen_samples = load_benchmark("gen_samples", folder="docs")

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


def test_search_samples_are_what_the_command_prints():
    """Every `$ lexgraph search` sample of the README and docs/ is the command's output on this
    workspace's BM25 index and articles (written by `dvc repro`, not in git: skipped without)."""
    absent = gen_samples.missing(ROOT)
    if absent:
        pytest.skip(f"needs {', '.join(absent)} in the workspace: run `dvc repro` (or `dvc pull`) first")
    stale = gen_samples.stale(ROOT, ROOT)
    assert not stale, (
        f"stale samples in {sorted(str(p.relative_to(ROOT)) for p in stale)}: run `python docs/gen_samples.py`"
    )
    assert sum(len(gen_samples.BLOCK.findall(p.read_text(encoding="utf-8"))) for p in gen_samples.pages()) >= 2


def test_samples_are_regenerated_from_a_real_run(tmp_path):
    """A stale sample's output is replaced by the command's, on the workspace given; the
    command line, the rest of the page and other code blocks stay as written."""
    write_articles(tmp_path, ARTICLES)
    from lexgraph.search.bm25 import BM25

    BM25(k1=1.2, b=0.75).fit_texts(list(ARTICLES.values()), list(ARTICLES)).save(tmp_path / "models" / "bm25")
    assert gen_samples.missing(tmp_path) == []
    text_cmd = '$ lexgraph search --system bm25 --top 2 "Qui paie la réparation du mur ?"'
    json_cmd = '$ lexgraph search --top 2 --json "Qui paie le loyer ?"'
    page = (
        f"Intro.\n\n```\n{text_cmd}\n  1. Art. 99 typed by hand\n```\n\n```bash\n{text_cmd}\nkept\n```\n\n"
        f"```\n{json_cmd}\n{{}}\n```\nEnd.\n"
    )
    fresh = gen_samples.render(page, tmp_path)
    assert fresh.startswith("Intro.\n\n```\n" + text_cmd + "\n\nQui paie la réparation du mur ?\n")
    assert "Art. 99" not in fresh and f"```bash\n{text_cmd}\nkept\n```" in fresh and fresh.endswith("```\nEnd.\n")
    text_block, json_block = (m.group(2) for m in gen_samples.BLOCK.finditer(fresh))
    assert "1. Art. 1 " in text_block and "**mur**" in text_block and "**réparation**" in text_block
    assert "Art. 2 " not in text_block  # only articles that match a term of the question
    record = json.loads(json_block)  # indented over lines, still one JSON object
    assert record["question"] == "Qui paie le loyer ?" and record["system"] == "bm25"
    assert [hit["id"] for hit in record["hits"]] == [3] and len(json_block.splitlines()) > 3
    assert gen_samples.render(fresh, tmp_path) == fresh
    with pytest.raises(ValueError, match="--system bm25"):
        gen_samples.render('```\n$ lexgraph search --system dsr "mur"\n```\n', tmp_path)

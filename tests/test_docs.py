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
TESTS = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' && .venv/bin/python -m pytest -q -n auto"
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
    # article 1 holds "paie" only, in 2 of the 3 articles: its idf is floored to ln(1 + 0.5 / 3.5) > 0 (issue 41)
    assert [hit["id"] for hit in record["hits"]] == [3, 1] and len(json_block.splitlines()) > 3
    assert gen_samples.render(fresh, tmp_path) == fresh
    with pytest.raises(ValueError, match="--system bm25"):
        gen_samples.render('```\n$ lexgraph search --system dsr "mur"\n```\n', tmp_path)


gen_walk = load_benchmark("gen_walk", folder="docs")


def test_walk_page_is_generated_from_its_files(tmp_path):
    """docs/walk.md is what docs/gen_walk.py writes from benchmarks/before_papers.json, metrics/
    and benchmarks/walk.json, byte for byte."""
    built = gen_walk.write(tmp_path)
    assert built.read_bytes() == (ROOT / "docs" / "walk.md").read_bytes(), (
        "docs/walk.md is stale: run `python docs/gen_walk.py` and commit it"
    )


def test_each_walk_runs_from_a_paper_to_the_default_runs_recipe():
    """benchmarks/walk.json: three walks of at least three steps, each ending at the default run's
    recipe with its metrics (the last row's means are metrics/<end>.json's), each change tested."""
    walks = json.loads((ROOT / "benchmarks" / "walk.json").read_text(encoding="utf-8"))["walks"]
    assert {(w["start"], w["end"]) for w in walks.values()} == {
        ("gdsr", "hgraph"),
        ("qabisar", "hgraph_qa"),
        ("mvcl", "xrerank"),
    }
    for walk in walks.values():
        rows = walk["rows"]
        assert len(rows) >= 4  # the start and at least three changes
        end = json.loads((ROOT / "metrics" / f"{walk['end']}.json").read_text(encoding="utf-8"))
        for split in ("dev", "test"):
            for metric in ("recall@100", "map", "ndcg@10"):
                assert rows[-1][split][metric] == pytest.approx(end[split][metric], abs=1e-4), (walk["end"], split)
        assert all(0 < p <= 1 for row in rows[1:] for p in row["p_holm"].values())
        assert all(row["p_holm"][m] >= row["p_raw"][m] for row in rows[1:] for m in row["p_raw"])


repro_time = load_benchmark("repro_time")
serve_reload = load_benchmark("serve_reload")
cpu_precision = load_benchmark("cpu_precision")


def _block_after(page: str, heading: str, first_row: str) -> str:
    """The Markdown table of ``page`` that starts with ``first_row`` after ``heading``."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    start = text.index(first_row, text.index(heading))
    lines = []
    for line in text[start:].splitlines():
        if not line.startswith("|"):
            break
        lines.append(line)
    return "\n".join(lines)


def test_the_runs_time_table_is_benchmarks_repro_time_json():
    """docs/scale.md's per-stage table of the default run is what benchmarks/repro_time.py prints
    from benchmarks/repro_time.json, and the README quotes the same total."""
    saved = json.loads((ROOT / "benchmarks" / "repro_time.json").read_text(encoding="utf-8"))
    table = repro_time.table(saved)
    assert _block_after("scale.md", "### Where the default run's time goes", table.splitlines()[0]) == table
    total = saved["total_s"]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"{total:.0f} s ({int(total // 60)} min {total % 60:.0f} s)" in readme
    assert total <= 12 * 60  # issue 39: the default run within 12 minutes on 2 cores


def test_repro_time_reads_a_dvc_log_by_hand():
    """Stage wall times run from one start line to the next (the last to the log's last stamp),
    across midnight, and the total is /usr/bin/time's elapsed clock."""
    log = "\n".join(
        [
            "23:59:50 INFO lexgraph: stage fetch (1 of 3)",
            "23:59:51 INFO lexgraph: stage fetch done in 0.5 s",
            "23:59:58 INFO lexgraph: stage train_dsr (2 of 3)",
            "00:01:58 INFO lexgraph: stage train_dsr done in 118.0 s",
            "00:02:00 INFO lexgraph: stage evaluate (3 of 3)",
            "00:02:30 INFO lexgraph: stage evaluate done in 29.0 s",
            "\tElapsed (wall clock) time (h:mm:ss or m:ss): 2:43.50",
        ]
    )
    got = repro_time.parse(log)
    assert [(s["stage"], s["wall_s"], s["own_s"]) for s in got["stages"]] == [
        ("fetch", 8, 0.5),
        ("train_dsr", 122, 118.0),
        ("evaluate", 30, 29.0),
    ]
    assert got["total_s"] == 163.5


def _stage_params() -> dict[str, list[str]]:
    """The params keys each stage of dvc.yaml lists (``foreach`` stages expanded: ``train_gnn@hgraph``)."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    found: dict[str, list[str]] = {}
    for name, body in stages.items():
        values = body.get("foreach")
        pairs = (
            [(None, None)] if values is None else values.items() if isinstance(values, dict) else zip(values, values)
        )
        for key, item in pairs:
            do = body if values is None else body["do"]
            keys = []
            for entry in do.get("params") or []:
                names = [k for ks in entry.values() for k in ks] if isinstance(entry, dict) else [entry]
                keys += [str(k).replace("${key}", str(key)).replace("${item}", str(item)) for k in names]
            found[name if values is None else f"{name}@{key}"] = keys
    return found


def _reruns(param: str) -> set[str]:
    """The stages a change of ``param`` reruns: those listing it (or its section), and every stage
    downstream of one of them (its deps overlap their outs), as DVC plans it."""
    from lexgraph.core.progress import _expanded

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    graph = {name: (deps, outs) for name, deps, outs in _expanded(stages)}
    todo = [
        name for name, keys in _stage_params().items() if any(param == k or param.startswith(k + ".") for k in keys)
    ]
    found = set(todo)

    def overlaps(a, b) -> bool:
        return a[: len(b)] == b or b[: len(a)] == a

    while todo:
        outs = graph[todo.pop()][1]
        for name, (deps, _) in graph.items():
            if name not in found and any(overlaps(d, o) for d in deps for o in outs):
                found.add(name)
                todo.append(name)
    return found


def test_the_readme_says_what_each_experiment_reruns_and_costs():
    """Issue 41, item 5f: the README's `dvc exp run -S gnn.layers=2` took 77 minutes on a loaded
    machine, a shared gnn key retraining every graph system and everything downstream. The README now
    gives a key of one graph system first, and for each key it names says which stages it reruns (as
    dvc.yaml's params and deps make DVC plan it) and what they took in the default run (the sum of
    their times in benchmarks/repro_time.json)."""
    saved = json.loads((ROOT / "benchmarks" / "repro_time.json").read_text(encoding="utf-8"))
    took = {row["stage"]: row["wall_s"] for row in saved["stages"]}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "-S gnn.hgraph.lr=" in readme and "-S gnn.layers=" in readme
    start = readme.index("**What an experiment costs**")
    paragraph = " ".join(readme[start : readme.index("\n\n", start)].split())
    assert f"({saved['total_s']:.0f} s on the 2-core AMD EPYC, per stage in `benchmarks/repro_time.json`)" in paragraph
    assert saved["machine"] == "2 cores, AMD EPYC"
    for param in ("gnn.hgraph.lr", "gnn.layers", "evaluate.baselines"):
        reruns = _reruns(param)
        assert reruns and reruns <= took.keys(), (param, reruns)
        span = paragraph[paragraph.index(f"`{param}`") :]
        cost = re.search(r"(?:took|:) (\d+) s\b", span)
        named = set(re.findall(r"`([^`]+)`", span[: cost.start()])) & took.keys()
        assert named == reruns, (param, named, reruns)
        assert int(cost.group(1)) == sum(took[stage] for stage in reruns), (param, cost.group(0))
    assert _reruns("gnn.hgraph.lr") < _reruns("gnn.layers")  # the first example is the cheaper one


def test_the_reload_memory_table_is_benchmarks_serve_reload_json():
    """docs/serve.md's RSS-over-reloads table is what benchmarks/serve_reload.py prints from its JSON,
    which holds ten reloads before and after issue 40's fix."""
    saved = json.loads((ROOT / "benchmarks" / "serve_reload.json").read_text(encoding="utf-8"))
    assert set(saved["runs"]) == {"before", "after"}
    assert all(len(run["rows"]) == 11 for run in saved["runs"].values())  # the start and ten reloads
    table = serve_reload.table(saved)
    assert _block_after("serve.md", "## Memory and start-up", table.splitlines()[0]) == table


def test_the_bm25_idf_section_quotes_benchmarks_bm25_idf_json():
    """docs/scale.md's idf section (issue 41): its table is what benchmarks/bm25_idf.py prints from
    benchmarks/bm25_idf.json, and every number its text quotes is that file's."""
    bm25_idf = load_benchmark("bm25_idf")
    saved = json.loads((ROOT / "benchmarks" / "bm25_idf.json").read_text(encoding="utf-8"))
    heading = "#### BM25's idf on every corpus (`benchmarks/bm25_idf.py`)"
    table = bm25_idf.table(saved)
    assert _block_after("scale.md", heading, table.splitlines()[0]) == table
    text = (ROOT / "docs" / "scale.md").read_text(encoding="utf-8")
    section = " ".join(text[text.index(heading) : text.index("\n## ", text.index(heading))].split())
    same, robertson, lucene = saved["unchanged"], saved["variants"]["robertson"], saved["variants"]["lucene"]
    versus = saved["lucene_vs_robertson"]
    quoted = [
        f"Of its {same['articles']:,} articles, the most common term is in {same['max_df']:,}",
        f"(N/2 is {same['articles'] // 2:,}; no term is in more than half)",
        f"the smallest Robertson idf is {same['min_robertson_idf']:.6f} and `ε({same['articles']})` is "
        f"{same['lucene_min']:.6f}",
        "at `mine_negatives`' pair (k1 {}, b {})".format(*same["negatives_k1_b"]),
        f"the mined negatives of the {same['negatives_questions']} train and dev questions are byte-identical",
        f"(recall@100 {robertson['tuned']:.4f})",
        f"(mAP {versus['map']['diff']:+.4f}, raw p {versus['map']['p_value']:.2g}, "
        f"{versus['map']['p_holm']:.2g} after Holm)",
        f"test is a paired randomisation test ({versus['resamples']:,} sign flips",
        f"at depth {saved['depth']}",
    ]
    for phrase in quoted:
        assert phrase in section, phrase
    # what the text says of them holds in the file
    top = [f"{split}_top{saved['depth']}" for split in ("dev", "test")]
    assert all(same[key] for key in ("idf", "weights_tuned", "weights_negatives", "negatives", *top))
    assert same["terms_df_over_half"] == 0 and same["max_df"] * 2 < same["articles"]
    assert same["min_robertson_idf"] > same["lucene_min"]
    assert robertson["tuned"] == lucene["tuned"] and not any(versus[m]["significant"] for m in bm25_idf.METRICS)
    assert lucene["dev"]["map"] > robertson["dev"]["map"] and lucene["dev"]["ndcg@10"] > robertson["dev"]["ndcg@10"]


def test_the_export_clients_table_is_the_benchmarks_own():
    """docs/cli.md's table of the export and MTEB clients is ``benchmarks/export_clients.py``'s
    rendering of its committed JSON, and each client's scores are within 0.001 of lexgraph's."""
    export_clients = load_benchmark("export_clients")
    result = json.loads((ROOT / "benchmarks" / "export_clients.json").read_text(encoding="utf-8"))
    assert export_clients.table(result) in (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for row in result["systems"].values():
        for client in ("sentence_transformers", "mteb"):
            assert row[client]["metrics"] == pytest.approx(row["lexgraph"], abs=1e-3)
        assert (
            row["exports_byte_identical"]
            and row["sentence_transformers"]["min_cosine_with_lexgraphs_vectors"] >= 0.9999
        )


def test_the_training_step_figures_are_the_benchmarks_own():
    """docs/scale.md's table of the engine's DSR step (issue 43) and its stable-shapes sentence
    quote ``benchmarks/throughput_cpu.json`` and ``benchmarks/throughput_cpu_stable.json``."""
    text = (ROOT / "docs" / "scale.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| `")}
    result = json.loads((ROOT / "benchmarks" / "throughput_cpu.json").read_text(encoding="utf-8"))
    for run in result["results"]:
        row = next(line for name, line in rows.items() if name.startswith(f"`{run['mode']}`"))
        cells = [c.strip() for c in row.split("|")[2:-1]]
        assert cells[0] == f"{run['pairs/s']:.2f}" and cells[2] == f"{run['ops']:,}", row
        assert cells[3] == str(run["syncs"]) and cells[4] == str(run["article_shapes"]), row
    stable = json.loads((ROOT / "benchmarks" / "throughput_cpu_stable.json").read_text(encoding="utf-8"))
    packed = next(r for r in stable["results"] if r["mode"] == "packed")
    assert stable["stable_queries"] == "on" and packed["article_shapes"] + packed["query_shapes"] <= 8
    assert (
        f"it saw {packed['query_shapes']}: both backbones together saw "
        f"{packed['article_shapes'] + packed['query_shapes']} distinct shapes in 20 steps (`packed`, "
        f"{packed['pairs/s']:.2f} pairs/s, {packed['syncs']} host sync per step)"
    ) in " ".join(text.split())


def test_the_cpu_precision_table_and_figures_are_the_benchmarks_own():
    """docs/scale.md's table of CPU encoding variants is what benchmarks/cpu_precision.py prints from
    its JSON, and the quality figures quoted beside it are that file's."""
    saved = json.loads((ROOT / "benchmarks" / "cpu_precision.json").read_text(encoding="utf-8"))
    table = cpu_precision.table(saved)
    assert _block_after("scale.md", "### Faster encoding on the CPU", table.splitlines()[0]) == table
    text = (ROOT / "docs" / "scale.md").read_text(encoding="utf-8")
    quality = saved["quality"]
    quoted = (
        f"{quality['fp32']['recall@100']:.2f} (fp32, the `zeroshot` metric) against {quality['bf16']['recall@100']:.2f}"
    )
    assert quoted in text and f"change of −{-quality['recall@100_change']:.2f}" in text
    assert saved["cpu_flags"]["amx_bf16"] and "`amx_bf16`" in text

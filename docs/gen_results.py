"""Generate the docs site's results page from what the pipeline wrote (pyserini 2CR style).

    .venv/bin/python docs/gen_results.py              # rewrite docs/results.md
    .venv/bin/python docs/gen_results.py --out DIR    # write DIR/results.md instead

Inputs, never numbers typed by hand:

- ``metrics/<system>.json`` (every system of ``params.yaml``'s ``evaluate.systems`` that was
  scored; a re-ranker switched off writes ``{"enabled": false}`` and is left out), the rows of
  the per-split tables, rendered by :func:`lexgraph.evaluation.evaluate.results_table`, the function
  ``evaluate`` writes ``metrics/results.md`` with;
- ``metrics/significance.json``, the superscripts (:func:`lexgraph.metrics.significance.significance_markers`,
  baselines in ``evaluate``'s order: ``evaluate.baselines``, then the re-rankers' first stage)
  and the table of paired differences;
- ``metrics/data.json``, the number of questions per split;
- ``regression/sample.yaml``, the expected scores and their tolerances, and how many of its
  checks ``metrics/`` passes (:func:`lexgraph.evaluation.regression.run_checks`, what ``lexgraph regress``
  runs).

``tests/test_docs.py`` rebuilds the page into a temporary directory and compares it byte for
byte with the committed ``docs/results.md``: after ``dvc repro`` changes a metric, rerun this
script and commit its output.
"""

from __future__ import annotations

import argparse
import json
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal
from pathlib import Path

from lexgraph.core.config import read_params
from lexgraph.evaluation.evaluate import results_table
from lexgraph.evaluation.regression import allowed, read_expected, run_checks, tolerance_for
from lexgraph.metrics.significance import marker_legend, significance_markers

ROOT = Path(__file__).resolve().parent.parent
PAGE = "results.md"
SPLITS = ("test", "dev")
MINUS = "\u2212"
#: the metrics of the expected-scores tables, in the results table's order
REGRESSION_COLUMNS = (
    ("R@10", "recall@10"),
    ("R@100", "recall@100"),
    ("R@200", "recall@200"),
    ("R@500", "recall@500"),
    ("mAP", "map"),
    ("nDCG@10", "ndcg@10"),
)
METRIC_NAMES = {"recall@100": "R@100", "map": "mAP", "ndcg@10": "nDCG@10"}


def _read_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def _points(fraction: float, signed: bool = False) -> str:
    """A fraction in percentage points, one decimal. Unsigned (a score): halves up, as
    ``metrics/results.md`` rounds. Signed (a difference already rounded to 4 decimals in
    significance.json): halves to even, so a stored 0.0425 is not rounded up twice (+4.2)."""
    rounding = ROUND_HALF_EVEN if signed else ROUND_HALF_UP
    value = (Decimal(repr(float(fraction))) * 100).quantize(Decimal("0.1"), rounding=rounding)
    if value == 0:
        return "0.0"
    if not signed:
        return str(value)
    return f"+{value}" if value > 0 else f"{MINUS}{-value}"


def _p(value: float) -> str:
    """A p-value with two significant digits (``0.040``, ``0.50``), ``1.0`` at the cap; below
    0.01 without a trailing zero (``0.0001``, ``0.009``: the stored value's own digits)."""
    if value >= 1:
        return "1.0"
    return f"{value:.2g}" if value < 0.01 else f"{value:#.2g}"


def _baselines(params: dict, tests: dict) -> list[str]:
    """The baselines in the order ``evaluate`` marks them: ``evaluate.baselines``, then the
    re-rankers' first stage; only those that significance.json compares with."""
    compared = {key.removeprefix("vs_") for versus in tests.values() for key in versus}
    order = [*params["evaluate"]["baselines"], params["rerank"]["first_stage"]]
    return [b for b in dict.fromkeys(order) if b in compared]


def _scored(params: dict, metrics_dir: Path) -> dict[str, dict]:
    """``{system: {split: metrics}}`` of every system of ``evaluate.systems`` that was scored."""
    scored = {}
    for system in params["evaluate"]["systems"]:
        path = metrics_dir / f"{system}.json"
        if path.is_file():
            by_split = _read_json(path)
            if any(split in by_split for split in SPLITS):
                scored[system] = by_split
    return scored


def _differences(tests: dict, baselines: list[str]) -> tuple[list[str], int]:
    """Every distinct paired test of significance.json as ``system − baseline`` rows, and how
    many tests they hold."""
    metrics = list(dict.fromkeys(m for versus in tests.values() for entries in versus.values() for m in entries))
    header = "| comparison | " + " | ".join(f"Δ{METRIC_NAMES.get(m, m)} | p (adj.)" for m in metrics) + " |"
    lines = [header, "|:---|" + "---:|---:|" * len(metrics)]
    seen: set[frozenset] = set()
    count = 0
    for system, versus in tests.items():
        for key, entries in versus.items():
            baseline = key.removeprefix("vs_")
            pair = frozenset((system, baseline))
            # each pair once, written against the baseline (system − baseline)
            if pair in seen or (system in baselines and baseline not in baselines):
                continue
            if system in baselines and baselines.index(system) < baselines.index(baseline):
                continue
            seen.add(pair)
            cells = []
            count += sum(m in entries for m in metrics)
            for m in metrics:
                entry = entries.get(m)
                cells += (
                    ["–", "–"]
                    if entry is None
                    else [_points(entry["diff"], signed=True), f"{_p(entry['p_value'])} ({_p(entry['p_holm'])})"]
                )
            lines.append(f"| {system} {MINUS} {baseline} | " + " | ".join(cells) + " |")
    return lines, count


def _expected(spec: dict, split: str) -> list[str]:
    """The expected scores of one split, in %, each with the tolerance ``lexgraph regress`` allows."""
    lines = [
        "| System | " + " | ".join(h for h, _ in REGRESSION_COLUMNS) + " |",
        "|:---|" + "---:|" * len(REGRESSION_COLUMNS),
    ]
    for system, by_split in spec["systems"].items():
        want = by_split.get(split)
        if not want:
            continue
        cells = []
        for _, metric in REGRESSION_COLUMNS:
            if metric not in want:
                cells.append("–")
                continue
            bound = allowed(want[metric], tolerance_for(spec, system, metric))
            cells.append(f"{_points(want[metric])} ± {_points(bound)}")
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    return lines


WALK_METRICS = (("recall@100", "R@100"), ("map", "mAP"), ("ndcg@10", "nDCG@10"))


def _papers(walks: dict) -> list[str]:
    """The papers' systems as published, from ``benchmarks/walk.json``: each walk's first row (the
    paper's method), its last (lexgraph's recipe), and every change whose Holm-adjusted p is below
    0.05 on some metric."""
    out = [
        "## The papers' systems as published",
        "",
        "`gdsr`, `qabisar` and `mvcl` follow their papers' texts on the sample's budget rule (every",
        "setting, its source in the paper and where the sample differs: [The papers, read](papers.md)).",
        "From `benchmarks/walk.json` ([the walk](walk.md)), test split, in %, R@100 / mAP / nDCG@10;",
        "the changes listed are those of the walk whose Holm-adjusted p (over the walk's tests) is",
        "below 0.05 on some metric.",
        "",
    ]
    for walk in walks.values():
        rows = walk["rows"]

        def triple(row: dict) -> str:
            return " / ".join(_points(row["test"][m]) for m, _ in WALK_METRICS)

        first = next(i for i, row in enumerate(rows) if row["change"].startswith(walk["start"]))
        out.append(
            f"- **`{walk['start']}`** as published: {triple(rows[first])} (row {first} of its walk: "
            f"{rows[first]['change']}); lexgraph's `{walk['end']}`: {triple(rows[-1])}."
        )
        for row, before in zip(rows[first + 1 :], rows[first:]):
            significant = [
                f"{name} {_points(row['test'][m] - before['test'][m], signed=True)} (p = {_p(row['p_holm'][m])})"
                for m, name in WALK_METRICS
                if row["p_holm"][m] < 0.05
            ]
            if significant:
                out.append(f"    - {row['change']}: " + ", ".join(significant) + ".")
    return [*out, ""]


def render(root: Path = ROOT) -> str:
    """The results page, from ``root``'s params.yaml, metrics/ and regression/sample.yaml."""
    metrics_dir, expected_file = root / "metrics", root / "regression" / "sample.yaml"
    params = read_params(root / "params.yaml")
    significance = _read_json(metrics_dir / "significance.json")
    tests, tested_split = significance["tests"], significance["split"]
    baselines = _baselines(params, tests)
    counts = {
        split: info["out"] for split, info in _read_json(metrics_dir / "data.json")["questions"]["by_split"].items()
    }
    scored = _scored(params, metrics_dir)
    tested_metrics = list(dict.fromkeys(m for versus in tests.values() for entries in versus.values() for m in entries))
    markers = {
        system: {m: significance_markers(tests, system, m, baselines) for m in tested_metrics} for system in scored
    }
    spec = read_expected(expected_file)
    outcome = run_checks(metrics_dir, expected_file)
    differences, n_tests = _differences(tests, baselines)

    out = [
        "<!-- Generated by docs/gen_results.py from metrics/, benchmarks/walk.json and regression/sample.yaml:",
        "     do not edit by hand.",
        "     After `dvc repro`, rerun `python docs/gen_results.py` (tests/test_docs.py compares this page). -->",
        "",
        "# Results on the embedded sample",
        "",
        "Every number on this page is read from the files `dvc repro` writes (`metrics/<system>.json`,",
        "`metrics/significance.json`, `metrics/data.json`) and from the expected scores that CI checks",
        "(`regression/sample.yaml`), by `docs/gen_results.py`. The systems are described on the",
        "[home page](index.md); the tests and what the tables show, in [Analysis](analysis.md);",
        "ablations and the re-ranker, in [Ablations](ablations.md).",
        "",
    ]
    for split in SPLITS:
        out += [f"## {split.capitalize()} split", ""]
        split_markers = markers if split == tested_split else None
        out += [results_table(scored, split, counts.get(split), split_markers).rstrip("\n"), ""]
        if split == tested_split and baselines:
            out += [marker_legend(baselines) + " Tested: " + ", ".join(tested_metrics) + ".", ""]
    walk_file = root / "benchmarks" / "walk.json"
    if walk_file.exists():
        out += _papers(_read_json(walk_file)["walks"])
    out += [
        f"## Paired differences ({tested_split} split)",
        "",
        "Every paired test of `metrics/significance.json`, system minus baseline, in points: the raw",
        "p of the two-sided paired randomisation test and, in brackets, the Holm-adjusted p over all",
        f"{n_tests} distinct tests of the {tested_split} table (one family).",
        "",
        *differences,
        "",
        "## Expected scores (`regression/sample.yaml`)",
        "",
        "What CI holds `dvc repro` to (`lexgraph regress`), in %, each value ± the tolerance it allows",
        "(|got − expected| ≤ max(abs, rel × expected); the YAML explains each width).",
        f"`metrics/` against it: {outcome.summary()}.",
        "",
    ]
    if outcome.failures:
        out += ["Failing:", "", *[f"- `{line}`" for line in outcome.failures], ""]
    for split in SPLITS:
        out += [f"### {split.capitalize()} split", "", *_expected(spec, split), ""]
    return "\n".join(out)


def write(out_dir: Path, root: Path = ROOT) -> Path:
    """Write the page into ``out_dir``; return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / PAGE
    path.write_text(render(root), encoding="utf-8", newline="\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="directory of the page (default: docs/)")
    args = parser.parse_args(argv)
    print(write(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

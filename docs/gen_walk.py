"""Generate docs/walk.md: the papers' systems before and after they followed their texts, and
the walk from each paper to lexgraph's recipe, one change at a time.

    .venv/bin/python docs/gen_walk.py              # rewrite docs/walk.md
    .venv/bin/python docs/gen_walk.py --out DIR    # write DIR/walk.md instead

Inputs, never numbers typed by hand:

- ``benchmarks/before_papers.json``: every system's ``metrics/<system>.json`` on the landed main
  before the papers were read (its commit named there);
- ``metrics/<system>.json`` and ``metrics/significance.json``: the default run now;
- ``benchmarks/walk.json``: ``python benchmarks/walk.py --json benchmarks/walk.json``.

``tests/test_docs.py`` rebuilds the page and compares it byte for byte with ``docs/walk.md``.
"""

from __future__ import annotations

import argparse
import json
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = "walk.md"
METRICS = (("recall@100", "R@100"), ("map", "mAP"), ("ndcg@10", "nDCG@10"))
SPLITS = ("test", "dev")
PAPERS = ("gdsr", "qabisar", "mvcl")
BASELINES = ("dsr", "hprior")
MINUS = "\u2212"


def _read(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def _pt(value: float | None) -> str:
    if value is None:
        return "–"
    return str(Decimal(str(value * 100)).quantize(Decimal("0.1"), ROUND_HALF_UP))


def _delta(after: float | None, before: float | None) -> str:
    if after is None or before is None:
        return ""
    d = Decimal(str(after * 100)).quantize(Decimal("0.1"), ROUND_HALF_UP) - Decimal(str(before * 100)).quantize(
        Decimal("0.1"), ROUND_HALF_UP
    )
    return f" ({'+' if d >= 0 else MINUS}{abs(d)})"


def _p(value: float) -> str:
    return f"{value:.4f}" if value < 0.001 else f"{value:.3f}".rstrip("0").rstrip(".") if value < 1 else "1"


def _scores(record: dict, split: str) -> dict:
    """A metrics record's split, or {} (a system switched off, or not evaluated)."""
    part = record.get(split)
    return part if isinstance(part, dict) else {}


def before_after(root: Path) -> list[str]:
    before = _read(root / "benchmarks" / "before_papers.json")
    out = [
        f"Every system of the default run, in %: before (`{before['commit']}`, the landed main) and after",
        "(`metrics/<system>.json`); in brackets, after minus before. A dash: not in that run (`mvcl`",
        "is off in the default run: its as-published figures are the walk's).",
        "",
    ]
    for split in SPLITS:
        head = " | ".join(f"{name} before | {name} after" for _, name in METRICS)
        out += [f"**{split.capitalize()} split**", "", f"| system | {head} |", "|:---" + "|---:" * 6 + "|"]
        for system, old in before["systems"].items():
            new = _read(root / "metrics" / f"{system}.json")
            a, b = _scores(new, split), _scores(old, split)
            cells = [f"{_pt(b.get(m))} | {_pt(a.get(m))}{_delta(a.get(m), b.get(m))}" for m, _ in METRICS]
            out.append(f"| {system} | " + " | ".join(cells) + " |")
        out.append("")
    return out


def _versus_row(system: str, baseline: str, entries: dict, source: str) -> str:
    cells = []
    for metric, _ in METRICS:
        e = entries[metric]
        d = Decimal(str(e["diff"] * 100)).quantize(Decimal("0.1"), ROUND_HALF_UP)
        cells.append(f"{'+' if d >= 0 else MINUS}{abs(d)} ({_p(e['p_holm'])})")
    return f"| {system} | {baseline} | " + " | ".join(cells) + f" | {source} |"


def against_baselines(root: Path) -> list[str]:
    significance = _read(root / "metrics" / "significance.json")
    tests = significance["tests"]
    walks = _read(root / "benchmarks" / "walk.json")["walks"]
    out = [
        f"Each paper's system against DSR and hprior on the {significance['split']} split: the difference in",
        "points and, in brackets, the Holm-adjusted p of the two-sided paired randomisation test",
        "(`metrics/significance.json`: Holm over every test of the results table; a system the default",
        "run leaves out, `mvcl`, is tested in `benchmarks/walk.json`: Holm over its six tests).",
        "",
        "| system | versus | " + " | ".join(name for _, name in METRICS) + " | tests |",
        "|:---|:---" + "|---:" * len(METRICS) + "|:---|",
    ]
    for system in PAPERS:
        for baseline in BASELINES:
            entries = tests.get(system, {}).get(f"vs_{baseline}")
            if entries:
                out.append(_versus_row(system, baseline, entries, "`metrics/significance.json`"))
                continue
            walked = walks.get(system, {}).get("versus", {}).get(baseline)
            if walked:
                out.append(_versus_row(system, baseline, walked, "`benchmarks/walk.json`"))
    return out + [""]


def walk_table(walk: dict) -> list[str]:
    head = " | ".join(f"{split} {name}" for split in SPLITS for _, name in METRICS)
    out = [
        f"| row | change | {head} | p (Holm), test: " + ", ".join(name for _, name in METRICS) + " |",
        "|---:|:---" + "|---:" * (len(SPLITS) * len(METRICS)) + "|:---|",
    ]
    for i, row in enumerate(walk["rows"]):
        cells = [_pt(row[split][m]) for split in SPLITS for m, _ in METRICS]
        p = ", ".join(_p(row["p_holm"][m]) for m, _ in METRICS) if "p_holm" in row else ""
        keys = ", ".join(f"`{k}: {json.dumps(v)}`" for k, v in row["keys"].items())
        change = row["change"] + (f" ({keys})" if keys and i < len(walk["rows"]) - 1 else "")
        out.append(f"| {i} | {change.replace('|', '/')} | " + " | ".join(cells) + f" | {p} |")
    reproduced = ", ".join(f"{system} {share:.0%}" for system, share in walk["reproduces"].items())
    return out + [
        "",
        f"Retrained here, the default run's systems give the same top 100 for: {reproduced} of the",
        f"questions. {walk['family']}.",
        "",
    ]


def render(root: Path = ROOT) -> str:
    walks = _read(root / "benchmarks" / "walk.json")
    out = [
        "<!-- Generated by docs/gen_walk.py from benchmarks/before_papers.json, metrics/ and",
        "     benchmarks/walk.json: do not edit by hand (tests/test_docs.py compares this page). -->",
        "",
        "# From the papers to lexgraph's recipes",
        "",
        "The systems named after papers (`gdsr`, `qabisar`, `mvcl`) follow their texts",
        "([The papers, read](papers.md)); lexgraph's recipes (`hgraph`, `hgraph_qa`, `xrerank`) depart",
        "from them. This page shows what following the texts changed, and which of lexgraph's",
        "departures matter, measured on the embedded sample with the sample's budget rule.",
        "",
        "## Before and after",
        "",
        *before_after(root),
        "## The papers' systems against DSR and hprior",
        "",
        *against_baselines(root),
        "## The walk from each paper to lexgraph's recipe",
        "",
        "`python benchmarks/walk.py --json benchmarks/walk.json` trains each row as its stage trains",
        "it and searches it as `evaluate` does; each row changes one group of settings (its keys in",
        "brackets; the last row takes the recipe's whole mapping) and is tested against the row",
        "before it (raw and Holm-adjusted p in `benchmarks/walk.json`). In %.",
        "",
    ]
    for walk in walks["walks"].values():
        out += [f"### {walk['start']} → {walk['end']}", "", *walk_table(walk)]
    return "\n".join(out)


def write(out_dir: Path, root: Path = ROOT) -> Path:
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

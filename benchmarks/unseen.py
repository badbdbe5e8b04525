"""Benchmark: score retrieval systems on the held-out unseen question set (data/unseen/).

    .venv/bin/python benchmarks/unseen.py --out OUT.json [--systems bm25 zeroshot dsr ...]
        [--baseline dsr] [--questions data/unseen/questions.jsonl] [--workspace .]
        [--runs-dir DIR] [--k 500] [--resamples 10000] [--seed 0] [--lexgraph PATH]
    .venv/bin/python benchmarks/unseen.py --table benchmarks/unseen.json   # docs/analysis.md's table of a saved result

For every system, runs ``lexgraph search --system S --questions Q --run RUNS/S.trec --k K
--workspace W`` in a subprocess, reads the TREC run back and scores it with lexgraph's own
metrics (:func:`lexgraph.metrics.ir.evaluate_run`, :func:`lexgraph.metrics.ir.per_query`). Every
system is compared with ``--baseline`` on recall@100 and map by
:func:`lexgraph.metrics.significance.compare_systems` (paired Fisher randomisation test, bootstrap
95 % CI of the mean difference, seeded; p-values Holm-adjusted over every test of the run,
``p_holm``). A system whose search fails (models missing, not built yet) is reported in one
line and skipped. Prints the Markdown table of docs/analysis.md (Δ with the adjusted p) and writes the
same numbers as JSON to ``--out``. The set is a final check only: never tune or select on it.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from lexgraph.core.arguments import OneLineParser, positive_int
from lexgraph.core.errors import DataError, LexgraphError
from lexgraph.evaluation.trec import read_trec
from lexgraph.metrics.ir import evaluate_run, per_query
from lexgraph.metrics.significance import compare_systems

ROOT = Path(__file__).resolve().parents[1]

log = logging.getLogger("unseen")

#: The artefact each system needs in the workspace (``dvc repro`` writes them); with no
#: ``--systems``, only the systems whose artefact exists are run.
MODEL_ARTEFACTS: dict[str, str] = {
    "bm25": "models/bm25",
    "zeroshot": "data/zeroshot/zeroshot.json",
    "dsr": "models/dsr",
    "hprior": "models/hprior",
    "gdsr": "models/gnn_gdsr",
    "qabisar": "models/gnn_qabisar",
    "hgraph": "models/gnn_hgraph",
    "hgraph_qa": "models/gnn_hgraph_qa",
    "hybrid": "models/hybrid",
    "xrerank": "models/xrerank",
}
COLUMNS = (
    ("R@10", "recall@10"),
    ("R@100", "recall@100"),
    ("R@500", "recall@500"),
    ("mAP", "map"),
    ("nDCG@10", "ndcg@10"),
)
COMPARED = ("recall@100", "map")

Run = Mapping[Any, Sequence[int]]
Qrels = Mapping[Any, Collection[int]]


def read_qrels(path: Path) -> dict[int, list[int]]:
    """``{question id: gold article ids}`` from a JSON-lines file of ``{id, article_ids, ...}``;
    a line that is not such a record is a :class:`DataError` naming the file and line."""
    qrels: dict[int, list[int]] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(path, f"cannot read the questions ({exc}); expected a JSON-lines file in UTF-8") from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            ids = rec["article_ids"] if isinstance(rec, dict) else None
            if not ids or not isinstance(ids, list):
                raise ValueError
            qrels[int(rec["id"])] = [int(a) for a in ids]
        except (ValueError, KeyError, TypeError):
            raise DataError(
                path,
                "expected a JSON object with an integer 'id' and a non-empty list of integer 'article_ids'",
                row=n,
            ) from None
    if not qrels:
        raise DataError(path, "no question; expected one JSON object per line")
    return qrels


def check_out(out: Path) -> None:
    """Refuse an ``--out`` that cannot be written, before any search: a directory, or a path under a file."""
    if out.is_dir():
        raise DataError(out, "is a directory; expected --out to name a JSON file")
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise DataError(out, f"{parent} is a file, not a directory; expected --out under a directory")
            return


def search(lexgraph: str, system: str, questions: Path, run: Path, k: int, workspace: Path) -> bool:
    """Run ``lexgraph search`` for ``system``; False (and one warning line) when it fails."""
    cmd = [
        lexgraph,
        "search",
        "--system",
        system,
        "--questions",
        str(questions),
        "--run",
        str(run),
        "--k",
        str(k),
        "--workspace",
        str(workspace),
    ]
    log.info("%s: searching (%s)", system, " ".join(cmd))
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as exc:
        log.warning("%s: skipped, cannot run %s (%s)", system, lexgraph, exc)
        return False
    if done.returncode != 0 or not run.is_file():
        lines = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        log.warning("%s: skipped (search exited %d: %s)", system, done.returncode, lines[-1] if lines else "no message")
        return False
    return True


def score(
    runs: Mapping[str, Run], qrels: Qrels, baseline: str, n_resamples: int = 10000, seed: int = 0
) -> dict[str, Any]:
    """Metrics of every run and its paired comparison with ``baseline`` (when it was run)."""
    comparisons = compare_systems(runs, qrels, [baseline], metrics=COMPARED, n_resamples=n_resamples, seed=seed)
    systems: dict[str, Any] = {}
    for name, run in runs.items():
        table = per_query(run, qrels)
        systems[name] = {
            "metrics": {m: round(v, 4) for m, v in evaluate_run(run, qrels).items()},
            "vs_baseline": comparisons[name].get(f"vs_{baseline}"),
            "per_query": {str(q): {m: round(v[m], 4) for m in COMPARED} for q, v in table.items()},
        }
    return {
        "n_queries": len(qrels),
        "baseline": baseline if baseline in runs else None,
        "compared": list(COMPARED),
        "n_resamples": n_resamples,
        "seed": seed,
        "systems": systems,
    }


def format_p(p: float) -> str:
    """A p-value as the docs write it: two significant digits, ``1.0`` at the cap."""
    return "1.0" if p >= 1.0 else f"{p:#.2g}"


def _delta(entry: Mapping[str, Any] | None, metric: str) -> str:
    if not entry:
        return ""
    e = entry[metric]
    p = e.get("p_holm", e["p_value"])
    return f"{100 * e['diff']:+.1f} ({format_p(p)})".replace("-", "\u2212")


def family_size(result: Mapping[str, Any]) -> int:
    """The number of tests Holm's adjustment ran over: every compared metric of every system
    compared with the baseline."""
    return sum(len(entry["vs_baseline"]) for entry in result["systems"].values() if entry["vs_baseline"])


def _entry_ok(entry: Any) -> bool:
    """A system's entry has what the table prints: its metrics and, beside the baseline's, the
    difference and p of each compared metric."""
    if not isinstance(entry, dict) or not isinstance(entry.get("metrics"), dict):
        return False
    if not all(isinstance(entry["metrics"].get(m), (int, float)) for _, m in COLUMNS):
        return False
    versus = entry.get("vs_baseline")
    return not versus or all(
        isinstance(versus.get(m), dict) and {"diff", "p_value"} <= versus[m].keys() for m in COMPARED
    )


def read_result(path: Path) -> dict[str, Any]:
    """An earlier ``--out`` file, checked for what :func:`markdown_table` reads (a damaged or
    foreign JSON is one line naming the file and the key)."""
    from lexgraph.core.inputs import read_json_object

    def is_int(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    return read_json_object(
        path,
        what="the JSON that benchmarks/unseen.py --out writes",
        fix="rerun benchmarks/unseen.py --out FILE",
        keys={
            "baseline": (lambda v: v is None or isinstance(v, str), "a system name or null"),
            "systems": (
                lambda v: isinstance(v, dict) and all(_entry_ok(e) for e in v.values()),
                "an object of systems, each with its metrics and its comparison with the baseline",
            ),
            "n_queries": (is_int, "an integer"),
            "n_resamples": (is_int, "an integer"),
            "seed": (is_int, "an integer"),
        },
    )


def markdown_table(result: Mapping[str, Any]) -> str:
    """The result of :func:`score` as docs/analysis.md's table (metrics in %, deltas in points
    against the baseline with their Holm-adjusted p in brackets), then one line saying what
    the p-values are."""
    base = result["baseline"] or "baseline"
    head = ["System", *(c for c, _ in COLUMNS), "ΔR@100 (p adj.)", "ΔmAP (p adj.)"]
    lines = ["| " + " | ".join(head) + " |", "|:---|" + "---:|" * (len(head) - 1)]
    for name, entry in result["systems"].items():
        cells = [
            name,
            *(f"{100 * entry['metrics'][m]:.1f}" for _, m in COLUMNS),
            _delta(entry["vs_baseline"], "recall@100"),
            _delta(entry["vs_baseline"], "map"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(
        f"\n{result['n_queries']} questions; Δ = system − {base} in points; two-sided paired "
        f"randomisation test ({result['n_resamples']} resamples, seed {result['seed']}, "
        f"p = (b + 1)/(m + 1)), p Holm-adjusted over the table's {family_size(result)} tests."
    )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = OneLineParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="JSON file to write the results to")
    parser.add_argument(
        "--table", type=Path, metavar="JSON", help="print the table of an earlier --out file and exit (no search)"
    )
    parser.add_argument("--systems", nargs="+", help="systems to run (default: those with models in the workspace)")
    parser.add_argument("--baseline", default="dsr", help="system every other is compared with (default dsr)")
    parser.add_argument("--questions", type=Path, default=ROOT / "data/unseen/questions.jsonl")
    parser.add_argument("--workspace", type=Path, default=ROOT, help="where `dvc repro` wrote models/ and data/")
    parser.add_argument("--runs-dir", type=Path, help="where to keep the TREC runs (default: a temporary directory)")
    parser.add_argument("--k", type=positive_int, default=500, help="ranking depth of the runs (default 500)")
    parser.add_argument("--resamples", type=positive_int, default=10000, help="randomisation and bootstrap resamples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--lexgraph",
        default=str(Path(sys.executable).with_name("lexgraph")),
        help="the lexgraph executable (default: next to this Python)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    try:
        return run(args)
    except LexgraphError as exc:
        log.error("benchmarks/unseen.py: error: %s", exc)
        return 2
    except OSError as exc:
        if exc.filename is None:
            raise
        log.error("benchmarks/unseen.py: error: %s: %s", exc.filename, exc.strerror or exc)
        return 2


def run(args: argparse.Namespace) -> int:
    if args.table:
        print(markdown_table(read_result(args.table)))
        return 0
    if not args.out:
        log.error("--out is required (or --table JSON)")
        return 2
    check_out(args.out)
    qrels = read_qrels(args.questions)
    systems = args.systems or [s for s, p in MODEL_ARTEFACTS.items() if (args.workspace / p).exists()]
    if not systems:
        log.error("no system has models under %s; run `dvc repro` first or name --systems", args.workspace)
        return 1
    with tempfile.TemporaryDirectory(prefix="unseen-runs-") as tmp:
        runs_dir = args.runs_dir or Path(tmp)
        runs_dir.mkdir(parents=True, exist_ok=True)
        runs = {}
        for system in systems:
            path = runs_dir / f"{system}.trec"
            if search(args.lexgraph, system, args.questions, path, args.k, args.workspace):
                runs[system] = read_trec(path)
    if not runs:
        log.error("no system could be run")
        return 1
    result = score(runs, qrels, args.baseline, args.resamples, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    log.info("wrote %s", args.out)
    print(markdown_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

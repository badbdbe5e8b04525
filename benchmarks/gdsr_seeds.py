"""Benchmark: how far the as-published ``gdsr`` moves with nothing but its random start.

    python benchmarks/gdsr_seeds.py [--workspace .] [--seeds 0 1 2 3 4 5] [--json benchmarks/gdsr_seeds.json]

Why: G-DSR's LGE starts from a random initialisation (G-DSR Table 5; maastrichtlawtech/gdsr
``src/models/gnn.py``) and trains about 70 updates on the sample, so its top ranks depend on the
start, and on anything that nudges the training early: another CPU's float rounding of DSR's
vectors (the last bits of ``data/embed``) moved its test recall@10 by 4 points between two
machines while DSR's own metrics stayed identical. ``regression/sample.yaml`` must allow that
spread and no more. This benchmark retrains ``train_gnn@gdsr`` exactly as the stage does (the
walk's scratch workspace, :mod:`walk`) with each ``--seeds`` value as the run's seed, searches
dev and test as ``evaluate`` does, and reports every seed's metrics, their mean, their standard
deviation and their range. The workspace is a reproduced one, read and never written.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
import sys
import tempfile
from pathlib import Path

from walk import SPLITS, Workspace

log = logging.getLogger("gdsr_seeds")

METRICS = ("recall@10", "recall@100", "recall@200", "recall@500", "map", "ndcg@10")


def measure(ws: Workspace, seeds: list[int]) -> dict:
    from lexgraph.metrics.ir import per_query

    mapping = ws.mapping("gnn", "gdsr")
    base = ws.base
    rows = {}
    for seed in seeds:
        ws.base = dataclasses.replace(base, seed=seed)
        ws.train_gnn("gdsr", mapping)
        runs = ws.runs("gdsr")
        rows[seed] = {}
        for split in SPLITS:
            table = per_query(runs[split], ws.qrels[split])
            rows[seed][split] = {
                m: round(sum(table[q][m] for q in ws.qrels[split]) / len(ws.qrels[split]), 4) for m in METRICS
            }
        log.info("seed %d: %s", seed, rows[seed])
    ws.base = base
    summary = {}
    for split in SPLITS:
        summary[split] = {}
        for m in METRICS:
            values = [rows[s][split][m] for s in seeds]
            summary[split][m] = {
                "mean": round(statistics.mean(values), 4),
                "sd": round(statistics.stdev(values), 4),
                "min": min(values),
                "max": max(values),
            }
    return {"seeds": {str(s): r for s, r in rows.items()}, "summary": summary}


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("."))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for noisy in ("lexgraph", "transformers"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="gdsr-seeds-") as scratch:
        result = measure(Workspace(args.workspace.resolve(), Path(scratch)), args.seeds)
    text = json.dumps(result, indent=1) + "\n"
    if args.json:
        args.json.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Regression check of a pipeline's metrics against expected scores (pyserini 2CR style).

``regression/sample.yaml`` holds, per system and split, the expected value of each
metric and a tolerance (absolute, in the metric's [0, 1] units; a per-system
``tolerance`` overrides the file's default). ``lexgraph regress`` compares
``metrics/<system>.json`` with it and fails if any metric is off by more.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import yaml

from lexgraph.errors import DataError

log = logging.getLogger(__name__)


def check(metrics_dir: str | Path, expected_file: str | Path) -> list[str]:
    """Return one line per metric outside its tolerance (empty list: all reproduce)."""
    expected_file = Path(expected_file)
    spec = yaml.safe_load(expected_file.read_text(encoding="utf-8")) or {}
    if "systems" not in spec:
        raise DataError(expected_file, "missing key 'systems'")
    default_tol = float(spec.get("tolerance", 0.01))
    failures = []
    for system, by_split in spec["systems"].items():
        tol = float(by_split.get("tolerance", default_tol))
        path = Path(metrics_dir) / f"{system}.json"
        if not path.is_file():
            failures.append(f"{system}: {path} missing")
            continue
        got = json.loads(path.read_text(encoding="utf-8"))
        for split, metrics in by_split.items():
            if split == "tolerance":
                continue
            for metric, want in metrics.items():
                have = got.get(split, {}).get(metric)
                if have is None:
                    failures.append(f"{system}/{split}/{metric}: missing")
                elif abs(have - want) > tol:
                    failures.append(f"{system}/{split}/{metric}: {have:.4f}, expected {want:.4f} ± {tol}")
                else:
                    log.info("%s/%s/%s: %.4f (expected %.4f ± %s) ok", system, split, metric, have, want, tol)
    return failures

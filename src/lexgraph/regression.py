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


REGRESSION_METRICS = ("recall@10", "recall@100", "recall@200", "recall@500", "map", "ndcg@10")


def expected_from_metrics(metrics_dir: str | Path, expected_file: str | Path) -> str:
    """The expected-scores YAML rebuilt from ``metrics/<system>.json``: every system and
    split already listed in ``expected_file`` (systems of ``metrics_dir`` it lacks are
    added), the header comments and tolerances kept, values replaced by today's."""
    expected_file = Path(expected_file)
    text = expected_file.read_text(encoding="utf-8") if expected_file.is_file() else ""
    spec = (yaml.safe_load(text) or {}) if text else {}
    header = [line for line in text.splitlines() if line.startswith("#")]
    systems = dict(spec.get("systems") or {})
    for path in sorted(Path(metrics_dir).glob("*.json")):
        got = json.loads(path.read_text(encoding="utf-8"))
        if path.stem in systems or (isinstance(got, dict) and {"dev", "test"} & set(got) and
                                    all(isinstance(v, dict) and "recall@100" in v for v in got.values())):
            systems.setdefault(path.stem, {})
    lines = header + [f"tolerance: {spec.get('tolerance', 0.005)}", "systems:"]
    for system, by_split in systems.items():
        path = Path(metrics_dir) / f"{system}.json"
        if not path.is_file():
            raise DataError(path, f"missing: cannot update the expected scores of '{system}'")
        got = json.loads(path.read_text(encoding="utf-8"))
        lines.append(f"  {system}:")
        if "tolerance" in by_split:
            lines.append(f"    tolerance: {by_split['tolerance']}")
        for split in [s for s in ("dev", "test") if s in got]:
            values = ", ".join(f"{m}: {got[split][m]}" for m in REGRESSION_METRICS if m in got[split])
            lines.append(f"    {split}: {{{values}}}")
    return "\n".join(lines) + "\n"

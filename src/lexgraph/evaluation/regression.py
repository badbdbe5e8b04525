"""Regression check of a pipeline's metrics against expected scores (pyserini 2CR style).

``regression/sample.yaml`` holds, per system and split, the expected value of each
metric, and tolerances. ``lexgraph regress`` compares ``metrics/<system>.json`` with it
and fails if any metric is off by more than its tolerance::

    tolerance:                          # the file's table, for every system
      default: {abs: 0.01, rel: 0.1}    # any metric not listed below
      recall@100: {abs: 0.01, rel: 0.04}
    systems:
      bm25:
        tolerance: 0.002                # a system's own table (or a number: abs for every metric)
        test: {recall@100: 0.3947, map: 0.1034}

A metric with expected value ``v`` reproduces when ``|got - v| <= max(abs, rel * v)``:
an absolute floor, and a part relative to the value, so a small metric gets a small
tolerance (zeroing it can never pass) while a large one absorbs a few ranking changes.
Look-up order for a system's metric: the system's table (the metric, then ``default``),
then the file's (the metric, then ``default``); a number ``x`` means ``{abs: x, rel: 0}``.
Values are fractions in [0, 1]. A tolerance sits at the file's or a system's level, never
inside a split (``test: {tolerance: ...}`` is refused, naming the key).

A check must be able to fail: a tolerance whose allowed deviation reaches the expected value
(a zeroed metric would pass) or 1 (the whole range of a [0, 1] metric) is refused, naming
the system, split and metric (docs/analysis.md, "Regression check").
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lexgraph.core.errors import DataError
from lexgraph.core.inputs import DuplicateKeyError, json_object, load_yaml, yaml_problem

log = logging.getLogger(__name__)

REGRESSION_METRICS = ("recall@10", "recall@100", "recall@200", "recall@500", "map", "ndcg@10")
DEFAULT_TOLERANCE = {"default": {"abs": 0.005, "rel": 0.0}}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)[:60]


# ---------------------------------------------------------------------------
# reading the expected file and the metrics
# ---------------------------------------------------------------------------


def read_expected(path: str | Path, *, checks: bool = True) -> dict[str, Any]:
    """The expected-scores YAML, checked: every value a number, every table well formed, no
    key given twice (the second would silently replace the first) and, with ``checks``,
    something to check: every system lists a split and every split a metric (an empty one
    would pass unseen; ``--update`` fills them, so it reads with ``checks=False``)."""
    path = Path(path)
    if path.is_dir():
        raise DataError(path, "is a directory; expected a YAML file like regression/sample.yaml")
    if not path.is_file():
        raise DataError(
            path,
            "expected-scores file not found; expected a YAML file like regression/sample.yaml "
            "(`lexgraph regress --update` writes one from metrics/)",
        )
    try:
        spec = load_yaml(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DataError(path, f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    except DuplicateKeyError as exc:
        raise DataError(
            path, f"{exc.located}; expected each key once (the second would silently replace the first)"
        ) from None
    except yaml.YAMLError as exc:
        raise DataError(path, f"not valid YAML ({yaml_problem(exc)})") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("systems"), dict) or not spec["systems"]:
        raise DataError(path, "expected a mapping with key 'systems' (system -> split -> {metric: value})")
    _tolerance_table(spec.get("tolerance", DEFAULT_TOLERANCE), path, "tolerance")
    for system, by_split in spec["systems"].items():
        if not isinstance(by_split, dict):
            raise DataError(path, f"key 'systems.{system}' = {_show(by_split)}, expected a mapping of splits")
        if checks and not set(by_split) - {"tolerance"}:
            raise DataError(
                path,
                f"key 'systems.{system}' = {_show(by_split)} checks no split; expected at least "
                "one split with metrics, e.g. test: {recall@100: 0.39}",
            )
        for split, metrics in by_split.items():
            key = f"systems.{system}.{split}"
            if split == "tolerance":
                _tolerance_table(metrics, path, key)
                continue
            if not isinstance(metrics, dict):
                raise DataError(path, f"key '{key}' = {_show(metrics)}, expected a mapping {{metric: value}}")
            if checks and not metrics:
                raise DataError(
                    path,
                    f"key '{key}' = {{}} checks no metric; expected at least one "
                    "{metric: value}, e.g. {recall@100: 0.39}",
                )
            for metric, want in metrics.items():
                if metric == "tolerance":
                    raise DataError(
                        path,
                        f"key '{key}.tolerance' = {_show(want)} is a tolerance inside a split; expected metrics "
                        f"only here (a tolerance goes under 'tolerance' or 'systems.{system}.tolerance')",
                    )
                if not _is_number(want) or not 0 <= want <= 1:
                    raise DataError(path, f"key '{key}.{metric}' = {_show(want)}, expected a number in [0, 1]")
                if checks:
                    _refuse_vacuous(spec, path, system, f"{key}.{metric}", metric, want)
    return spec


def _refuse_vacuous(spec: dict, path: Path, system: str, key: str, metric: str, want: float) -> None:
    """Refuse a check that cannot fail: its allowed deviation reaches the expected value (a
    metric of 0 would pass) or 1 (the whole range)."""
    tol = tolerance_for(spec, system, metric, path)
    bound = allowed(want, tol)
    if bound >= 1 or (want > 0 and bound >= want):
        raise DataError(
            path,
            f"key '{key}' = {want:g} with tolerance ± {bound:g} ({_describe(tol)}) passes "
            f"{'any value' if bound >= 1 else 'a zeroed metric'}; expected a tolerance below the expected "
            "value and below 1, so that the check can fail",
        )


def _tolerance_table(raw: Any, path: Path, key: str) -> dict[str, tuple[float, float]]:
    """``{metric | "default": (abs, rel)}`` from a tolerance entry (a number or a table)."""
    if _is_number(raw):
        raw = {"default": {"abs": raw, "rel": 0.0}}
    if not isinstance(raw, dict):
        raise DataError(
            path,
            f"key '{key}' = {_show(raw)}, expected a number or a table "
            "{default|metric: {abs: number, rel: number}}",
        )
    table = {}
    for metric, entry in raw.items():
        if _is_number(entry):
            entry = {"abs": entry, "rel": 0.0}
        if not isinstance(entry, dict) or set(entry) - {"abs", "rel"}:
            raise DataError(
                path, f"key '{key}.{metric}' = {_show(entry)}, expected a number or {{abs: number, rel: number}}"
            )
        pair = []
        for part in ("abs", "rel"):
            value = entry.get(part, 0.0)
            if not _is_number(value) or value < 0:
                raise DataError(path, f"key '{key}.{metric}.{part}' = {_show(value)}, expected a number >= 0")
            pair.append(float(value))
        table[str(metric)] = (pair[0], pair[1])
    return table


def read_metrics(path: str | Path) -> dict[str, dict[str, float]]:
    """``metrics/<system>.json`` as ``{split: {metric: value}}``, every value checked to be a number."""
    path = Path(path)
    try:
        got = json_object(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DataError(path, f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    except DuplicateKeyError as exc:
        raise DataError(path, f"{exc}; rerun `dvc repro evaluate`") from None
    except json.JSONDecodeError as exc:
        raise DataError(path, f"not valid JSON ({exc.msg} at line {exc.lineno}); rerun `dvc repro evaluate`") from None
    if not isinstance(got, dict):
        raise DataError(path, f"expected a JSON object {{split: {{metric: value}}}}, got {_show(got)}")
    return got


def not_scored(got: dict, system: str, splits: list[str]) -> str | None:
    """Why ``metrics/<system>.json`` (``got``) holds none of ``splits``, in words that follow
    its path: the placeholder ``evaluate`` writes for a system it did not score in its last run
    (not in ``evaluate.systems``, or a re-ranker switched off), or a file without those splits."""
    if set(splits) & set(got):
        return None
    if got.get("evaluated") is False:
        why = f"the last `dvc repro evaluate` did not score {system}: not in evaluate.systems"
    elif got.get("enabled") is False:
        why = f"the re-ranker is switched off: rerank.{system}.enabled: false"
    else:
        why = f"keys {_show(sorted(got))}"
    return (
        f"holds no {'/'.join(splits)} metrics of this run ({why}); expected {system}'s "
        f"metrics from `dvc repro evaluate` with {system} in evaluate.systems"
    )


def _metric(got: dict, path: Path, split: str, metric: str) -> float | None:
    by_metric = got.get(split)
    if by_metric is None:
        return None
    if not isinstance(by_metric, dict):
        raise DataError(path, f"key '{split}' = {_show(by_metric)}, expected an object {{metric: value}}")
    if metric not in by_metric:
        return None
    value = by_metric[metric]
    if not _is_number(value):
        raise DataError(path, f"key '{split}.{metric}' = {_show(value)}, expected a number")
    return float(value)


# ---------------------------------------------------------------------------
# the check
# ---------------------------------------------------------------------------


def tolerance_for(spec: dict, system: str, metric: str, path: Path) -> tuple[float, float]:
    """``(abs, rel)`` of ``system``'s ``metric`` (see the module docstring for the look-up order)."""
    own = spec["systems"][system].get("tolerance")
    tables = []
    if own is not None:
        tables.append(_tolerance_table(own, path, f"systems.{system}.tolerance"))
    tables.append(_tolerance_table(spec.get("tolerance", DEFAULT_TOLERANCE), path, "tolerance"))
    for table in tables:
        for key in (metric, "default"):
            if key in table:
                return table[key]
    return DEFAULT_TOLERANCE["default"]["abs"], DEFAULT_TOLERANCE["default"]["rel"]


def allowed(want: float, tol: tuple[float, float]) -> float:
    """``max(abs, rel * want)``."""
    return max(tol[0], tol[1] * abs(want))


def _describe(tol: tuple[float, float]) -> str:
    return f"max({tol[0]:g}, {tol[1]:g} x expected)" if tol[1] else f"{tol[0]:g}"


@dataclass(frozen=True)
class Outcome:
    """What :func:`run_checks` found: one line per metric outside its tolerance (or missing),
    and how many of the expected file's checks (one per system, split and metric) pass."""

    failures: list[str]
    passed: int
    total: int

    def summary(self) -> str:
        """``"N of M checks pass"``."""
        return f"{self.passed} of {self.total} checks pass"


def check(metrics_dir: str | Path, expected_file: str | Path) -> list[str]:
    """Return one line per metric outside its tolerance (empty list: all reproduce).

    A missing metrics file or metric is a failure line; a malformed expected file or
    metrics file raises :class:`DataError`.
    """
    return run_checks(metrics_dir, expected_file).failures


def run_checks(metrics_dir: str | Path, expected_file: str | Path) -> Outcome:
    """:func:`check`'s failure lines, with the count of checks that pass out of all of them
    (a missing ``metrics/<system>.json`` is one line, and fails each of that system's checks)."""
    expected_file, metrics_dir = Path(expected_file), Path(metrics_dir)
    spec = read_expected(expected_file)
    if not metrics_dir.is_dir():
        raise DataError(metrics_dir, "metrics directory not found; expected the metrics/ that `dvc repro` writes")
    failures, passed, total = [], 0, 0
    for system, by_split in spec["systems"].items():
        expected = [
            (split, metric, want)
            for split, metrics in by_split.items()
            if split != "tolerance"
            for metric, want in metrics.items()
        ]
        total += len(expected)
        path = metrics_dir / f"{system}.json"
        if not path.is_file():
            failures.append(f"{system}: {path} missing")
            continue
        got = read_metrics(path)
        unscored = not_scored(got, system, sorted({split for split, _, _ in expected}))
        if unscored:
            failures.append(f"{system}: {path} {unscored}")
            continue
        for split, metric, want in expected:
            if split not in got:  # one line for the split (evaluate.splits without it), not one per metric
                line = (
                    f"{system}/{split}: {path} holds no {split} metrics of this run; expected them from "
                    f"`dvc repro evaluate` with {split} in evaluate.splits"
                )
                failures += [line] if line not in failures else []
                continue
            have = _metric(got, path, split, metric)
            tol = tolerance_for(spec, system, metric, expected_file)
            bound = allowed(want, tol)
            if have is None:
                failures.append(f"{system}/{split}/{metric}: missing from {path}")
            elif abs(have - want) > bound + 1e-9:
                failures.append(
                    f"{system}/{split}/{metric}: {have:.4f}, expected {want:.4f} ± {bound:.4f} ({_describe(tol)})"
                )
            else:
                passed += 1
                log.info("%s/%s/%s: %.4f (expected %.4f ± %.4f) ok", system, split, metric, have, want, bound)
    return Outcome(failures, passed, total)


# ---------------------------------------------------------------------------
# --update
# ---------------------------------------------------------------------------


def _format_tolerance(raw: Any, indent: str) -> list[str]:
    """``tolerance:`` lines (a number on one line, a table one metric per line)."""
    if _is_number(raw):
        return [f"{indent}tolerance: {raw}"]
    lines = [f"{indent}tolerance:"]
    for metric, entry in raw.items():
        if _is_number(entry):
            lines.append(f"{indent}  {metric}: {entry}")
        else:
            lines.append(f"{indent}  {metric}: {{{', '.join(f'{k}: {v}' for k, v in entry.items())}}}")
    return lines


def _is_system_metrics(got: Any) -> bool:
    return (
        isinstance(got, dict)
        and bool({"dev", "test"} & set(got))
        and all(isinstance(v, dict) and "recall@100" in v for v in got.values())
    )


def expected_from_metrics(metrics_dir: str | Path, expected_file: str | Path) -> str:
    """The expected-scores YAML rebuilt from ``metrics/<system>.json``: every system and
    split already listed in ``expected_file`` (systems of ``metrics_dir`` it lacks are
    added), the header comments and tolerances kept, values replaced by today's."""
    expected_file, metrics_dir = Path(expected_file), Path(metrics_dir)
    if not metrics_dir.is_dir():
        raise DataError(metrics_dir, "metrics directory not found; expected the metrics/ that `dvc repro` writes")
    if expected_file.is_file():
        spec = read_expected(expected_file, checks=False)
        text = expected_file.read_text(encoding="utf-8")
    else:
        text, spec = "", {}
    header = [line for line in text.splitlines() if line.startswith("#")]
    systems = dict(spec.get("systems") or {})
    for path in sorted(metrics_dir.glob("*.json")):
        if path.stem in systems:
            continue
        try:
            got = json_object(path.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue  # not a system's metrics file
        except DuplicateKeyError as exc:
            raise DataError(path, f"{exc}; rerun `dvc repro evaluate`") from None
        if _is_system_metrics(got):
            systems[path.stem] = {}
    if not systems:
        raise DataError(metrics_dir, "no metrics/<system>.json with dev/test metrics; run `dvc repro evaluate` first")
    lines = header + _format_tolerance(spec.get("tolerance", 0.005), "") + ["systems:"]
    for system, by_split in systems.items():
        path = metrics_dir / f"{system}.json"
        if not path.is_file():
            raise DataError(path, f"missing: cannot update the expected scores of '{system}'")
        got = read_metrics(path)
        unscored = not_scored(got, system, ["dev", "test"])
        if unscored:
            raise DataError(path, f"{unscored} (cannot update the expected scores of '{system}')")
        lines.append(f"  {system}:")
        if "tolerance" in by_split:
            lines += _format_tolerance(by_split["tolerance"], "    ")
        for split in [s for s in ("dev", "test") if s in got]:
            values = []
            for metric in REGRESSION_METRICS:
                value = _metric(got, path, split, metric)
                if value is not None:
                    values.append(f"{metric}: {got[split][metric]}")
            lines.append(f"    {split}: {{{', '.join(values)}}}")
    return "\n".join(lines) + "\n"

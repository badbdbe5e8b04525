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

Both files are read once, through a schema (:class:`ExpectedScores`, :data:`_METRICS`): a value
out of shape is one :class:`DataError` naming the file, the dotted key, the value and what it
expects (:func:`_refusal`); past that, the code trusts what it reads.

A check must be able to fail: a tolerance whose allowed deviation reaches the expected value
(a zeroed metric would pass) or 1 (the whole range of a [0, 1] metric) is refused, naming
the system, split and metric (docs/analysis.md, "Regression check").
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, TypeAdapter, ValidationError

from lexgraph.core.errors import DataError
from lexgraph.core.inputs import DuplicateKeyError, json_object, load_yaml, yaml_problem
from lexgraph.core.io import check_file

log = logging.getLogger(__name__)

REGRESSION_METRICS = ("recall@10", "recall@100", "recall@200", "recall@500", "map", "ndcg@10")
DEFAULT_TOLERANCE = {"default": {"abs": 0.005, "rel": 0.0}}
EVALUATE = "rerun `dvc repro evaluate`"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)[:60]


# ---------------------------------------------------------------------------
# the schemas of the expected file and the metrics
# ---------------------------------------------------------------------------

#: a finite number (an integer too; true/false refused)
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]


class Deviation(BaseModel):
    """One metric's tolerance: ``max(abs, rel * expected)``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    abs: Annotated[Number, Field(ge=0)] = 0.0
    rel: Annotated[Number, Field(ge=0)] = 0.0


def _long_form(raw: Any) -> Any:
    """A tolerance's short forms spelled out: a number ``x`` for ``{default: {abs: x}}``, a
    table entry ``x`` for ``{abs: x}``."""
    raw = {"default": raw} if _is_number(raw) else raw
    return {k: {"abs": v} if _is_number(v) else v for k, v in raw.items()} if isinstance(raw, dict) else raw


#: a metric's name (YAML reads ``1`` as a number)
Name = Annotated[str, BeforeValidator(str)]
#: ``{default|metric: Deviation}``, from a number or a table
Tolerance = Annotated[dict[Name, Deviation], BeforeValidator(_long_form)]
_TOLERANCE: TypeAdapter[dict[str, Deviation]] = TypeAdapter(Tolerance)
#: a split's expected metrics: a fraction in [0, 1] each, and no tolerance among them
Split = dict[Annotated[Name, Field(pattern=r"^(?!tolerance$)")], Annotated[Number, Field(ge=0, le=1)]]


class SystemScores(BaseModel):
    """A system's expected scores: its splits (any other key) and its own tolerance."""

    model_config = ConfigDict(extra="allow", regex_engine="python-re")
    __pydantic_extra__: dict[str, Split]
    tolerance: Tolerance | None = None


class ExpectedScores(BaseModel):
    """The expected-scores file (the module docstring shows one)."""

    tolerance: Tolerance = DEFAULT_TOLERANCE
    systems: Annotated[dict[str, SystemScores], Field(min_length=1)]


#: what a value of the expected file expects, by its depth below the top, and below a tolerance
_SCORES_WORDS = (
    "a mapping with key 'systems' (system -> split -> {metric: value}) and optionally 'tolerance'",
    "at least one system: a mapping system -> split -> {metric: value}",
    "a mapping of splits {split name: {metric: value}}",
    "a mapping {metric: value}",
    "a number in [0, 1]",
)
_TOLERANCE_WORDS = (
    "a number or a table {default|metric: {abs: number, rel: number}}, every number >= 0",
    "a number or {abs: number, rel: number}, every number >= 0",
    "a number >= 0",
)


def _scores_words(loc: list) -> str:
    """What the value at ``loc`` (its keys from the top of the expected file) expects."""
    table = 0 if loc[:1] == ["tolerance"] else 2 if loc[2:3] == ["tolerance"] else None
    if table is not None:
        return _TOLERANCE_WORDS[len(loc) - table - 1]
    if loc[3:] == ["tolerance"]:
        return (
            "metrics only in a split, not a tolerance (a tolerance goes under 'tolerance' or "
            f"'systems.{loc[1]}.tolerance')"
        )
    return _SCORES_WORDS[len(loc)]


#: ``metrics/<system>.json``'s splits that a check reads: ``{split: {metric: number}}``
_METRICS: TypeAdapter[dict[str, dict[str, float]]] = TypeAdapter(dict[str, dict[str, Number]])
_METRICS_WORDS = ("a JSON object {split: {metric: value}}", "an object {metric: value}", "a number")


def _refusal(path: Path, exc: ValidationError, raw: Any, words: Callable[[list], str]) -> DataError:
    """The first error of ``exc`` (``raw`` read through a schema) as one sentence naming ``path``,
    the dotted key, its value as written and ``words(keys)``, what it expects. An unknown or
    missing key, a key that is not a string, or a value of a short form, is the error of the
    mapping that holds it."""
    error = exc.errors()[0]
    loc = [part for part in error["loc"] if part != "[key]"]
    loc = loc[:-1] if error["type"] in ("extra_forbidden", "missing", "invalid_key") else loc
    value = raw
    for depth, part in enumerate(loc):
        if not isinstance(value, dict) or part not in value:  # a short form's key: its mapping's error
            loc = loc[:depth]
            break
        value = value[part]
    head = f"key '{'.'.join(map(str, loc))}' = " if loc else "holds "
    return DataError(path, f"{head}{_show(value)}, expected {words(loc)}")


# ---------------------------------------------------------------------------
# reading the expected file and the metrics
# ---------------------------------------------------------------------------


def _parse(path: Path, parse: Callable[[str], Any], fix: str = "") -> Any:
    """``parse`` of the UTF-8 text of ``path``; bytes that are not UTF-8, a key given twice (the
    second would silently replace the first) or text that does not parse is one DataError, then ``fix``."""
    try:
        return parse(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        problem = f"not valid UTF-8 ({exc.reason} at byte {exc.start})"
    except DuplicateKeyError as exc:
        problem = f"{exc.located}; expected each key once (the second would silently replace the first)"
    except json.JSONDecodeError as exc:
        problem = f"not valid JSON ({exc.msg} at line {exc.lineno})"
    except yaml.YAMLError as exc:
        problem = f"not valid YAML ({yaml_problem(exc)})"
    raise DataError(path, problem + fix)


def read_expected(path: str | Path, *, checks: bool = True) -> dict[str, Any]:
    """The expected-scores YAML as written, read through :class:`ExpectedScores` (every value a
    number, every table well formed, no key given twice) and, with ``checks``, every check able
    to fail (:func:`_cannot_fail`; ``--update`` fills empty splits, so it reads with ``checks=False``)."""
    path = Path(path)
    check_file(
        path,
        "expected-scores file",
        "expected a YAML file like regression/sample.yaml (`lexgraph regress --update` writes one from metrics/)",
    )
    spec = _parse(path, load_yaml)
    try:
        ExpectedScores.model_validate(spec)
    except ValidationError as exc:
        raise _refusal(path, exc, spec, _scores_words) from None
    problem = _cannot_fail(spec) if checks else None
    if problem:
        raise DataError(path, problem)
    return spec


def _cannot_fail(spec: dict) -> str | None:
    """Why a check of ``spec`` (read through its schema) cannot fail, or None: a system that
    lists no split or a split that lists no metric (either would pass unseen), a tolerance whose
    allowed deviation reaches the expected value (a metric of 0 would pass) or 1 (any value)."""
    for system, by_split in spec["systems"].items():
        splits = {split: metrics for split, metrics in by_split.items() if split != "tolerance"}
        if not splits:
            return (
                f"key 'systems.{system}' = {_show(by_split)} checks no split; expected at least "
                "one split with metrics, e.g. test: {recall@100: 0.39}"
            )
        for split, metrics in splits.items():
            key = f"systems.{system}.{split}"
            if not metrics:
                return (
                    f"key '{key}' = {{}} checks no metric; expected at least one "
                    "{metric: value}, e.g. {recall@100: 0.39}"
                )
            for metric, want in metrics.items():
                tol = tolerance_for(spec, system, metric)
                bound = allowed(want, tol)
                if bound >= 1 or 0 < want <= bound:
                    return (
                        f"key '{key}.{metric}' = {want:g} with tolerance ± {bound:g} ({_describe(tol)}) passes "
                        f"{'any value' if bound >= 1 else 'a zeroed metric'}; expected a tolerance below the "
                        "expected value and below 1, so that the check can fail"
                    )
    return None


def read_metrics(path: str | Path, splits: list[str]) -> dict[str, Any]:
    """``metrics/<system>.json`` as ``{split: {metric: value}}``, every value of ``splits`` checked
    to be a number (other keys are the placeholder ``evaluate`` writes, :func:`not_scored`)."""
    path = Path(path)
    check_file(path, "metrics file", EVALUATE)
    got = _parse(path, json_object, f"; {EVALUATE}")
    read = {split: got[split] for split in splits if split in got} if isinstance(got, dict) else got
    try:
        _METRICS.validate_python(read)
    except ValidationError as exc:
        raise _refusal(path, exc, read, lambda loc: _METRICS_WORDS[len(loc)]) from None
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


# ---------------------------------------------------------------------------
# the check
# ---------------------------------------------------------------------------


def tolerance_for(spec: dict, system: str, metric: str) -> tuple[float, float]:
    """``(abs, rel)`` of ``system``'s ``metric`` in ``spec``, an expected file :func:`read_expected`
    read (see the module docstring for the look-up order)."""
    tables = [spec["systems"][system].get("tolerance"), spec.get("tolerance", DEFAULT_TOLERANCE)]
    for table in (_TOLERANCE.validate_python(raw) for raw in tables if raw is not None):
        for key in (metric, "default"):
            if key in table:
                return table[key].abs, table[key].rel
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
    (a missing ``metrics/<system>.json`` is one line, and fails each of that system's checks).
    ``metrics_dir`` is a directory (``lexgraph regress`` checks its ``--metrics-dir``)."""
    spec = read_expected(expected_file)
    failures, passed, total = [], 0, 0
    for system, by_split in spec["systems"].items():
        expected = [
            (split, metric, want)
            for split, metrics in by_split.items()
            if split != "tolerance"
            for metric, want in metrics.items()
        ]
        total += len(expected)
        path = Path(metrics_dir) / f"{system}.json"
        if not path.is_file():
            failures.append(f"{system}: {path} missing")
            continue
        splits = sorted({split for split, _, _ in expected})
        got = read_metrics(path, splits)
        unscored = not_scored(got, system, splits)
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
            have = got[split].get(metric)
            tol = tolerance_for(spec, system, metric)
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


def _is_system_metrics(path: Path) -> bool:
    """Whether ``path`` holds a system's metrics (dev or test, each with recall@100), not another
    stage's report (``train_dsr.json``); :func:`read_metrics` then reads it."""
    try:
        got = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return (
        isinstance(got, dict)
        and bool({"dev", "test"} & set(got))
        and all(isinstance(v, dict) and "recall@100" in v for v in got.values())
    )


def expected_from_metrics(metrics_dir: str | Path, expected_file: str | Path) -> str:
    """The expected-scores YAML rebuilt from ``metrics/<system>.json``: every system and
    split already listed in ``expected_file`` (systems of ``metrics_dir`` it lacks are
    added), the header comments and tolerances kept, values replaced by today's.
    ``metrics_dir`` is a directory (``lexgraph regress`` checks its ``--metrics-dir``)."""
    expected_file, metrics_dir = Path(expected_file), Path(metrics_dir)
    if expected_file.is_file():
        spec = read_expected(expected_file, checks=False)
        text = expected_file.read_text(encoding="utf-8")
    else:
        text, spec = "", {}
    header = [line for line in text.splitlines() if line.startswith("#")]
    systems = dict(spec.get("systems") or {})
    systems |= {
        p.stem: {} for p in sorted(metrics_dir.glob("*.json")) if p.stem not in systems and _is_system_metrics(p)
    }
    if not systems:
        raise DataError(metrics_dir, "no metrics/<system>.json with dev/test metrics; run `dvc repro evaluate` first")
    lines = header + _format_tolerance(spec.get("tolerance", 0.005), "") + ["systems:"]
    for system, by_split in systems.items():
        path = metrics_dir / f"{system}.json"
        got = read_metrics(path, ["dev", "test"])
        unscored = not_scored(got, system, ["dev", "test"])
        if unscored:
            raise DataError(path, f"{unscored} (cannot update the expected scores of '{system}')")
        lines.append(f"  {system}:")
        if "tolerance" in by_split:
            lines += _format_tolerance(by_split["tolerance"], "    ")
        for split in [s for s in ("dev", "test") if s in got]:
            values = [f"{metric}: {got[split][metric]}" for metric in REGRESSION_METRICS if metric in got[split]]
            lines.append(f"    {split}: {{{', '.join(values)}}}")
    return "\n".join(lines) + "\n"

"""Training curves for ``dvc plots``: a trainer's per-epoch (or per-step) history as CSV.

Every trained stage writes one (``metrics/<stage>_curve.csv``, declared under ``plots:`` in
``dvc.yaml``): ``train_dsr`` through :func:`lexgraph.methods.dsr.train.curve_csv`, ``pretrain``,
``train_gnn@<variant>`` and ``rerank@<variant>`` through :func:`write_curve`. The file is
written from the history the engine already keeps (:class:`lexgraph.training.engine.FitResult`),
after training: it reads no random number and changes no other output."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

from lexgraph.core.io import write_text


def _cell(value) -> str:
    """One CSV value: a count as an integer, a float to 6 decimals, ``nan`` when missing or not
    finite (as in train_dsr's curve: Vega drops NaN points, where an empty cell would be drawn at 0)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "nan"
    if isinstance(value, int):
        return str(value)
    return f"{float(value):.6f}"


def curve_csv(records: Sequence[Mapping[str, float]], columns: Sequence[str]) -> str:
    """``columns`` as the header, then one line per record (a key a record lacks: ``nan``)."""
    lines = [",".join(columns)]
    lines += [",".join(_cell(record.get(column)) for column in columns) for record in records]
    return "\n".join(lines) + "\n"


def write_curve(records: Sequence[Mapping[str, float]], columns: Sequence[str], path: str | os.PathLike) -> None:
    """Write :func:`curve_csv` to ``path`` atomically (a header alone when nothing was trained)."""
    write_text(curve_csv(records, columns), path)


def step_records(step_losses: Sequence[float], initial: float | None, final: float | None) -> list[dict]:
    """Per-step records for a one-epoch trainer (MLM pre-training): ``step`` 0 holds the
    evaluation loss before training, then each optimizer step its loss, the last one also the
    evaluation loss after training."""
    records: list[dict] = [{"step": 0, "eval_loss": initial}]
    records += [{"step": i + 1, "loss": loss} for i, loss in enumerate(step_losses)]
    if step_losses:
        records[-1]["eval_loss"] = final
    return records

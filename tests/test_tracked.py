"""lexgraph.core.tracked: which paths DVC owns (its cache, the outputs its files track), so that
`lexgraph search --run` and `lexgraph regress --update` never write there (issue 18)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import ROOT
from lexgraph.core import layout
from lexgraph.core.tracked import MANAGED, dvc_owner


def _stages(tmp_path: Path, text: str, name: str = "dvc.yaml") -> Path:
    (tmp_path / name).write_text(text, encoding="utf-8")
    return tmp_path


def test_the_repository_outputs_are_owned_and_a_new_file_beside_them_is_not():
    """Against the real dvc.yaml: every layout artefact, every metrics/plots output (the foreach
    ones too) is DVC's; a new run file at the top of the workspace is not."""
    for art in layout.ARTIFACTS.values():
        assert dvc_owner(art.under(ROOT, "x.trec"), ROOT), art
    for path in (
        "metrics/bm25.json",
        "metrics/train_gnn_hgraph.json",
        "metrics/per_query/test.csv",
        "metrics/recall_curve_test.csv",
        "metrics/bm25_tune.csv",
        "dvc.lock",
        ".dvc/cache/files/md5/00/1",
    ):
        assert dvc_owner(ROOT / path, ROOT), path
    assert dvc_owner(ROOT / "my_run.trec", ROOT) is None
    assert dvc_owner(ROOT / "metrics" / "my_run.trec", ROOT) is None  # metrics/ itself is git's, not an output


def test_wdir_matrix_lock_and_top_level_plots(tmp_path):
    ws = _stages(
        tmp_path,
        "stages:\n  a:\n    wdir: sub\n    cmd: x\n    outs: [out]\n"
        "  b:\n    matrix:\n      sys: [bm25, dsr]\n      split: [dev, test]\n    cmd: x\n"
        "    outs:\n      - runs/${item.sys}/${item.split}.trec\n"
        "plots:\n  - curves/recall.csv:\n      x: k\n",
    )
    _stages(
        ws,
        "schema: '2.0'\nstages:\n  c:\n    cmd: x\n    outs:\n    - path: locked/file.trec\n      md5: 0\n",
        "dvc.lock",
    )
    assert dvc_owner(ws / "sub" / "out" / "r.trec", ws) == f"is inside out, an output of stage 'a' in {ws / 'dvc.yaml'}"
    assert dvc_owner(ws / "out" / "r.trec", ws) is None  # out is relative to wdir
    assert dvc_owner(ws / "runs" / "hprior" / "dev.trec", ws).startswith("matches runs/${item.sys}/${item.split}.trec")
    assert dvc_owner(ws / "runs" / "dev.trec", ws) is None
    assert dvc_owner(ws / "curves" / "recall.csv", ws).startswith("is curves/recall.csv, a top-level plots entry")
    assert dvc_owner(ws / "locked" / "file.trec", ws).endswith("an output of stage 'c' in " + str(ws / "dvc.lock"))
    assert dvc_owner(ws / "locked" / "file.trec2", ws) is None  # a name that only starts like an output


def test_nested_dvc_yaml_and_dvc_files_below_the_workspace(tmp_path):
    (tmp_path / "exp" / "deep").mkdir(parents=True)
    _stages(tmp_path / "exp", "stages:\n  s:\n    cmd: x\n    outs: [deep/result.trec]\n")
    (tmp_path / "exp" / "deep" / "raw.dvc").write_text("outs:\n- path: raw\n  md5: 0\n", encoding="utf-8")
    assert dvc_owner(tmp_path / "exp" / "deep" / "result.trec", tmp_path).startswith("is deep/result.trec")
    assert dvc_owner(tmp_path / "exp" / "deep" / "raw" / "r.trec", tmp_path).startswith("is inside raw, tracked by")


def test_cache_dir_from_the_global_config(tmp_path, monkeypatch):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "config").write_text("[cache]\n    dir = '../shared cache'  # quoted\n", encoding="utf-8")
    monkeypatch.setenv("DVC_GLOBAL_CONFIG_DIR", str(tmp_path / "home"))
    assert dvc_owner(tmp_path / "shared cache" / "files" / "md5" / "ab" / "cd", tmp_path / "ws") == (
        f"is inside DVC's cache {tmp_path / 'shared cache'} (cache.dir of {tmp_path / 'home' / 'config'})"
    )


def test_a_dvc_file_that_cannot_be_read_is_a_reason(tmp_path):
    _stages(tmp_path, "stages:\n  a: [unclosed\n")
    reason = dvc_owner(tmp_path / "r.trec", tmp_path)
    assert reason.startswith(f"is in {tmp_path}, where {tmp_path / 'dvc.yaml'} cannot be read")


@pytest.mark.parametrize("path", [".git/objects/ab/cd", ".dvc/tmp/x", ".dvc"])
def test_tool_directories(tmp_path, path):
    assert "a directory only" in dvc_owner(tmp_path / path, tmp_path)


def test_data_and_models_are_owned_whole(tmp_path):
    """One rule for the workspace's data/ and models/ (every layout artefact lies there): a file no
    stage writes is owned too, and so is a symbolic link there to a file elsewhere (a write
    would replace the link)."""
    (tmp_path / "models").mkdir()
    (tmp_path / "elsewhere.trec").write_text("", encoding="utf-8")
    (tmp_path / "models" / "link.trec").symlink_to(tmp_path / "elsewhere.trec")
    for path in ("data/notes/run.trec", "data/sample/run.trec", "models/link.trec"):
        reason = dvc_owner(tmp_path / path, tmp_path)
        assert reason == f"is inside {tmp_path / path.split('/')[0]}, {MANAGED}", path
    assert dvc_owner(tmp_path / "elsewhere.trec", tmp_path) is None
    assert dvc_owner(tmp_path / "database" / "run.trec", tmp_path) is None  # a name that only starts like data

"""`dvc plots show` offline (`lexgraph plots-offline`) and the training curves every trained stage
writes (lexgraph.training.curves; issue 25, item 6)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT
from helpers_graph import NEGATIVES, QUESTIONS, embeddings, graph, settings
from lexgraph.cli.main import main
from lexgraph.core.stage import StageContext
from lexgraph.training.curves import curve_csv, step_records

CURVE = "epoch,loss\n0,nan\n1,2.5\n2,1.25\n"
DVC_YAML = """plots:
  - curve.csv:
      x: epoch
      y: loss
      title: tiny curve
"""


def _dvc(args: list[str], cwd) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _script_sources(html: str) -> list[str]:
    return re.findall(r"<script\b[^>]*\bsrc\s*=\s*[\"']?([^\"' >]+)", html, flags=re.IGNORECASE)


def test_dvc_plots_show_needs_no_network(tmp_path, capsys):
    (tmp_path / "dvc.yaml").write_text(DVC_YAML, encoding="utf-8")
    (tmp_path / "curve.csv").write_text(CURVE, encoding="utf-8")
    _dvc(["init", "--no-scm", "-q"], tmp_path)
    # DVC's own page loads Vega from a CDN: nothing renders offline
    _dvc(["plots", "show", "-o", "before"], tmp_path)
    before = (tmp_path / "before" / "index.html").read_text(encoding="utf-8")
    assert any(src.startswith("http") for src in _script_sources(before))

    assert main(["plots-offline", "--workspace", str(tmp_path)]) == 0
    assert "dvc plots show" in capsys.readouterr().out
    assert "html_template = plots/offline.html" in (tmp_path / ".dvc" / "config.local").read_text()
    _dvc(["plots", "show"], tmp_path)  # the config key, no option
    page = (tmp_path / "dvc_plots" / "index.html").read_text(encoding="utf-8")
    assert _script_sources(page) == [] and "cdn.jsdelivr" not in page
    # the inlined libraries, then DVC's plot calling them with the curve's data
    assert "window.vegaEmbed=" in page and "window.vega=" in page and "window.vegaLite=" in page
    assert page.index("window.vegaEmbed=") < page.index("vegaEmbed('#")
    assert '"loss": "1.25"' in page and "tiny curve" in page
    assert "{plot_divs}" not in page and "{scripts}" not in page


def test_plots_offline_outside_a_dvc_workspace_is_one_line(tmp_path, capsys):
    assert main(["plots-offline", "--workspace", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no .dvc directory" in err[0] and str(tmp_path) in err[0]


def test_plots_offline_into_an_unwritable_place_is_one_line(tmp_path, capsys):
    """.dvc/plots exists as a file: the page cannot be written there; one line names it."""
    (tmp_path / ".dvc").mkdir()
    (tmp_path / ".dvc" / "plots").write_text("not a folder")
    assert main(["plots-offline", "--workspace", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write the offline page" in err[0], err


def test_an_unknown_vega_lite_version_is_one_line(monkeypatch, capsys, tmp_path):
    from lexgraph.cli import plots

    (tmp_path / ".dvc").mkdir()
    monkeypatch.setattr(plots, "VEGA_LITE", "v0_1")
    assert main(["plots-offline", "--workspace", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no Vega-Lite v0_1 bundle" in err[0], err


TRAINED = {"pretrain": None, "train_dsr": None, "train_dsr_qabisar": None, "train_gnn": "foreach", "rerank": "foreach"}


@pytest.mark.parametrize("name", sorted(TRAINED))
def test_every_trained_stage_declares_its_curve(name):
    """Each trained stage writes a CSV curve (``--plot``) that dvc.yaml declares as a plot with x and y."""
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"][name]
    stage = stage["do"] if TRAINED[name] else stage
    (plot,) = stage["plots"]
    ((path, props),) = plot.items()
    assert path.endswith("_curve.csv") and f"--plot {path}" in " ".join(stage["cmd"].split())
    assert props["persist"] and props["cache"] is False and props["x"] in ("epoch", "step")
    assert props["y"] in ("loss", "dev_recall@200")


def test_curve_csv_columns_and_missing_values():
    records = [{"epoch": 0, "loss": float("nan"), "dev_map": 0.5}, {"epoch": 1, "loss": 0.25, "extra": 9.0}]
    assert curve_csv(records, ("epoch", "loss", "dev_map")) == "epoch,loss,dev_map\n0,nan,0.500000\n1,0.250000,nan\n"
    assert curve_csv([], ("epoch", "loss")) == "epoch,loss\n"


def test_step_records_put_the_eval_loss_before_and_after():
    assert step_records([3.0, 2.0], 4.0, 1.5) == [
        {"step": 0, "eval_loss": 4.0},
        {"step": 1, "loss": 3.0},
        {"step": 2, "loss": 2.0, "eval_loss": 1.5},
    ]


@pytest.mark.parametrize("select", [True, False])
def test_gnn_curve_has_a_row_per_epoch_with_loss_and_dev(select, one_thread):
    """train_gnn's curve columns (lexgraph.methods.gnn.io.CURVE) over a tiny run's history: with dev
    selection epoch 0 (untrained: no loss) and a dev recall per epoch; without, the loss alone."""
    import torch

    from lexgraph.methods.gnn.data import prepare_training_set
    from lexgraph.methods.gnn.io import CURVE
    from lexgraph.methods.gnn.train import train_graph_encoder

    s = settings("hgraph")
    ts = prepare_training_set(graph(), QUESTIONS, NEGATIVES, embeddings(), s)
    torch.manual_seed(7)
    result = train_graph_encoder(ts, s, "cpu", seed=7, show_progress=False, select=select)
    rows = [line.split(",") for line in curve_csv(result.history, CURVE).splitlines()]
    assert rows[0] == ["epoch", "loss", "dev_recall@200"]
    epochs = [0, 1, 2] if select else [1, 2]
    assert [int(r[0]) for r in rows[1:]] == epochs
    assert [r[1] != "nan" for r in rows[1:]] == [e > 0 for e in epochs]
    assert all((r[2] != "nan") == select for r in rows[1:])


def test_a_switched_off_reranker_writes_the_curve_header_alone(tmp_path):
    """rerank@mvcl is off in params.yaml: its declared curve is still written (the header alone)."""

    from lexgraph.methods.rerank.config import RerankConfig
    from lexgraph.methods.rerank.stage import RerankPaths, run_rerank

    config = RerankConfig.from_params(yaml.safe_load((ROOT / "params.yaml").read_text())["rerank"], "mvcl")
    assert not config.enabled
    names = {"questions": "q", "articles": "a", "features": "f", "pretrain": "p", "workspace": "w"}
    paths = RerankPaths(
        **{k: tmp_path / v for k, v in names.items()},
        out=tmp_path / "mvcl",
        metrics=tmp_path / "m.json",
        plot=tmp_path / "curve.csv",
    )
    run_rerank(paths, config, StageContext(seed=1, device="cpu"), None)
    from lexgraph.methods.rerank.report import curve_columns

    assert paths.plot.read_text() == ",".join(curve_columns(config)) + "\n" and config.metric == "accuracy"

"""Logs fit for CI (issue 10, item 6): a tqdm bar only on a terminal, periodic log lines
elsewhere, and no third-party bar (Hugging Face) off a terminal; stages and the CLI run with
their output piped write no carriage return."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import warnings

import polars as pl

from conftest import ROOT, write_params
from lexgraph.core import progress as progress_module
from lexgraph.core.progress import HF_PROGRESS_ENV, progress, progress_bar, quiet_third_party_bars


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bar_on_a_terminal(monkeypatch, caplog):
    err = FakeTty()
    monkeypatch.setattr(sys, "stderr", err)
    with caplog.at_level(logging.INFO, logger="lexgraph.core.progress"):
        assert list(progress(range(7), "walk", unit="step")) == list(range(7))
        with progress_bar(3, "count", unit="q") as bar:
            bar.update(2)
            bar.set_postfix(loss="0.125")
            bar.update(1)
    out = err.getvalue()
    assert "\r" in out and "walk" in out and "7/7" in out and "count" in out and "loss=0.125" in out
    assert not caplog.records  # a bar, not log lines


def test_log_lines_elsewhere(monkeypatch, caplog):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    clock = iter(range(0, 1000, 20))  # every call to time.monotonic() is 20 s later
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: next(clock))
    with caplog.at_level(logging.INFO, logger="lexgraph.core.progress"):
        bar = progress(range(4), "walk", unit="step", every=30)
        for _ in bar:
            bar.set_postfix(loss="0.5")
    assert err.getvalue() == ""
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all(line.startswith("walk: ") for line in lines)
    assert any("/4 step after" in line for line in lines)
    assert lines[-1].startswith("walk: 4/4 step done in") and lines[-1].endswith("(loss=0.5)")
    assert len(lines) < 5  # at most one line per 30 s, not one per step


def test_a_long_run_says_its_rate_and_end_within_two_seconds(monkeypatch, caplog):
    """``first=2`` and ``rate``: the first line comes at 2 s with the units per second and the time
    left (from the count so far), then one per ``every`` (15 s); a fractional count (a share of tokens) adds up."""
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    now = [0.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    with caplog.at_level(logging.INFO, logger="lexgraph.core.progress"):
        with progress_bar(1000, "index: encode articles", unit="article", every=15, first=2.0, rate=True) as bar:
            for _ in range(60):  # 2.5 articles every 0.5 s: 5 articles/s
                now[0] += 0.5
                bar.update(2.5)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "index: encode articles: 10/1000 article after 2 s, 5.0 article/s, about 3 min 18 s left"
    assert lines[1].startswith("index: encode articles: 85/1000 article after 17 s, 5.0 article/s, about 3 min 03 s")
    assert len(lines) == 3 and lines[-1] == "index: encode articles: 150/1000 article done in 30 s, 5.0 article/s"
    assert progress_module.duration(7325) == "2 h 02 min" and progress_module.duration(59.4) == "59 s"


def test_quick_or_disabled_loops_say_nothing(monkeypatch, caplog):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with caplog.at_level(logging.INFO, logger="lexgraph.core.progress"):
        assert sum(progress(range(100), "quick")) == 4950  # well under `every`
        with progress_bar(10, "off", disable=True, every=0) as bar:
            bar.update(10)
        assert bar.count == 10
    assert not caplog.records and sys.stderr.getvalue() == ""
    monkeypatch.setattr(sys, "stderr", FakeTty())
    list(progress(range(3), "off", disable=True))
    assert sys.stderr.getvalue() == ""


def test_third_party_bars_are_silenced_off_a_terminal(monkeypatch):
    from transformers.utils import logging as hf_logging

    for name in HF_PROGRESS_ENV:
        monkeypatch.delenv(name, raising=False)
    with warnings.catch_warnings():  # an earlier in-process CLI run may have switched them off already
        warnings.simplefilter("ignore")
        hf_logging.enable_progress_bar()
    try:
        monkeypatch.setattr(sys, "stderr", FakeTty())
        quiet_third_party_bars()
        assert hf_logging.is_progress_bar_enabled() and not any(n in os.environ for n in HF_PROGRESS_ENV)
        monkeypatch.setattr(sys, "stderr", io.StringIO())
        quiet_third_party_bars()
        assert not hf_logging.is_progress_bar_enabled()
        assert all(os.environ[n] == "1" for n in HF_PROGRESS_ENV)
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hf_logging.enable_progress_bar()


def test_a_user_who_asks_for_bars_keeps_them(monkeypatch):
    from transformers.utils import logging as hf_logging

    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    quiet_third_party_bars()
    assert hf_logging.is_progress_bar_enabled() and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"


def _run(args: list[str], cwd, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in HF_PROGRESS_ENV}
    env["PYTHONPATH"] = str(ROOT / "src")
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout
    )


def test_a_stage_with_piped_output_writes_no_carriage_return(tmp_path):
    """bm25_tune (a k1 x b grid loop, a tqdm bar before issue 10) as `dvc repro` in CI runs it."""
    articles = {
        1: "Le mur mitoyen est réparé à frais communs.",
        2: "Le bail est un contrat de louage.",
        3: "Le locataire paie le loyer au bailleur.",
        4: "Le voisin peut exiger le bornage.",
    }
    pl.DataFrame({"id": list(articles), "article": list(articles.values())}).write_parquet(
        tmp_path / "articles.parquet"
    )
    pl.DataFrame(
        {
            "id": [1, 2, 3],
            "question": ["Qui répare le mur ?", "Quand payer le loyer ?", "bornage"],
            "article_ids": [[1], [3], [4]],
            "split": ["dev", "dev", "test"],
        },
        schema_overrides={"article_ids": pl.List(pl.Int64)},
    ).write_parquet(tmp_path / "questions.parquet")
    write_params(
        tmp_path / "params.yaml",
        base={"seed": 13, "device": "cpu", "log_level": "INFO"},
        bm25_tune={"split": "dev", "metric": "recall@100", "k1": [0.5, 1.0, 1.5, 2.0], "b": [0.25, 0.5, 0.75]},
    )
    proc = _run(
        [
            str(ROOT / "stages" / "bm25_tune.py"),
            "--params",
            "params.yaml",
            "--articles",
            "articles.parquet",
            "--questions",
            "questions.parquet",
            "--best",
            "best.json",
            "--grid",
            "grid.csv",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"stage bm25_tune done" in proc.stderr
    assert b"\r" not in proc.stdout and b"\r" not in proc.stderr
    assert (tmp_path / "grid.csv").read_text(encoding="utf-8").count("\n") == 1 + 12


def test_cli_loading_a_transformers_model_writes_no_carriage_return(tmp_path, tiny_model_dir):
    """`lexgraph search --system dsr` loads a checkpoint (transformers' "Loading weights" bar)."""
    import torch

    from lexgraph.encoding.embed import save_embeddings
    from lexgraph.models.encoders import QueryEncoder

    (tmp_path / "data" / "clean").mkdir(parents=True)
    pl.DataFrame(
        {
            "id": [1, 2, 3],
            "article": ["Le bail.", "Le loyer.", "Le mur."],
            "reference": ["Art. 1", "Art. 2", "Art. 3"],
            "path": [["Code A"]] * 3,
        }
    ).write_parquet(tmp_path / "data" / "clean" / "articles.parquet")
    QueryEncoder.from_pretrained(tiny_model_dir, max_length=32, token_pooling="mean").save_pretrained(
        tmp_path / "models" / "dsr" / "query_encoder"
    )
    (tmp_path / "data" / "embed").mkdir(parents=True)
    save_embeddings(tmp_path / "data" / "embed" / "articles.safetensors", [1, 2, 3], torch.randn(3, 16))
    proc = _run(
        ["-m", "lexgraph.cli", "search", "--system", "dsr", "--device", "cpu", "--top", "2", "le bail"], tmp_path
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"  1. Art. " in proc.stdout
    assert b"\r" not in proc.stdout and b"\r" not in proc.stderr, proc.stderr.decode()


FOREIGN_LOGS = """
import logging
from lexgraph.core.stage import setup_logging

setup_logging({level!r})
logging.getLogger("torch._subclasses.fake_tensor").info("FakeTensor cache stats:")
logging.getLogger("torch._dynamo.utils").info("foreign info")
logging.getLogger("uvicorn.error").info("Started server process")
logging.getLogger("lexgraph.methods.gnn.train").info("lexgraph info")
logging.getLogger("lexgraph").debug("lexgraph debug")
logging.getLogger("torch._dynamo.utils").warning("foreign warning")
"""


def _foreign_logs(level: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", FOREIGN_LOGS.format(level=level)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_stage_logging_keeps_other_libraries_at_warning():
    """Issue 41, item 5e: torch's ``FakeTensor cache stats`` reached the stage logs at INFO at exit
    (a foreign logger propagating to the root, which lexgraph set to INFO). After the stages' and the
    CLI's logging setup, in a fresh interpreter (the torch loggers named here are plain loggers
    without torch imported, propagating to the root as the report's did): lexgraph's INFO lines are
    written, a foreign library's INFO is not, its WARNING is."""
    err = _foreign_logs("INFO")
    assert "lexgraph info" in err and "foreign warning" in err, err
    assert "FakeTensor" not in err and "foreign info" not in err and "Started server" not in err, err
    assert "lexgraph debug" not in err, err
    debug = _foreign_logs("DEBUG")  # base.log_level: DEBUG lowers lexgraph's level only
    assert "lexgraph debug" in debug and "foreign info" not in debug and "foreign warning" in debug, debug

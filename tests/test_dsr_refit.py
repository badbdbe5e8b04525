"""DSR refit on train + dev once the epoch is chosen on dev (G-DSR appendix B):
``lexgraph.methods.dsr.train.train_and_refit`` and the ``train_dsr`` stage's metrics.

The dev selection is forced by replacing ``evaluate_dsr`` with fixed scores per epoch;
every optimizer run is recorded by wrapping the engine's ``fit``. Tiny local BERT, CPU.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from types import SimpleNamespace

import polars as pl
import pytest
import torch

import lexgraph.methods.dsr.train as dsr
from helpers_config import sample_section
from helpers_dsr import CORPUS, _fresh_dsr  # the same six toy articles, the same fresh DSR
from helpers_dsr import _config as helpers_config  # the same toy settings
from lexgraph.core.errors import ConfigError, DataError
from lexgraph.core.io import write_parquet
from lexgraph.core.stage import StageContext
from lexgraph.methods.dsr.config import DSRConfig
from lexgraph.methods.dsr.data import TrainingData, load_training_data, split_pairs
from lexgraph.methods.dsr.train import train_and_refit, train_dsr
from lexgraph.models.dsr import DSR
from lexgraph.training.runtime import Runtime

QUESTIONS = pl.DataFrame(
    {
        "id": [1, 2, 3, 4, 10, 11],
        "question": ["bail contrat ?", "mariage enfant ?", "divorce loi ?", "contrat loi ?", "bail ?", "enfant ?"],
        "article_ids": [[1, 4], [2], [3, 5], [4], [1], [2, 5]],
        "split": ["train"] * 4 + ["dev"] * 2,
    }
)
NEGATIVES = pl.DataFrame(
    {  # dev question 10 has BM25 negatives; 11 was mined, but BM25 found none
        "question_id": [1, 2, 3, 10, 11],
        "split": ["train", "train", "train", "dev", "dev"],
        "negative_ids": [[2, 3], [6, 1, 2], [1], [3, 6], []],
    }
)
BATCH = 4


def _data() -> TrainingData:
    dev = QUESTIONS.filter(pl.col("split") == "dev")
    return TrainingData(
        pairs=split_pairs(QUESTIONS, NEGATIVES, set(CORPUS), ["train"]),
        article_ids=list(CORPUS),
        article_texts=list(CORPUS.values()),
        dev_questions=dev["question"].to_list(),
        dev_qrels={int(q): set(g) for q, g in zip(dev["id"].to_list(), dev["article_ids"].to_list())},
        dev_ids=dev["id"].to_list(),
        dev_pairs=split_pairs(QUESTIONS, NEGATIVES, set(CORPUS), ["dev"]),
    )


def _config(**kw) -> DSRConfig:
    """helpers_dsr's toy DSR settings, with this module's epochs, batch and no synthetic queries."""
    return helpers_config(**{"epochs": 3, "batch_size": BATCH, "synthetic": False, **kw})


def _state(model: DSR) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def runs(monkeypatch):
    """Every ``fit`` call: its FitConfig, training pairs, optimizer steps and final learning rates."""
    calls = []
    real_fit = dsr.fit

    def recording_fit(task, optimizer, scheduler, config, runtime, checkpoint=None):
        result = real_fit(task, optimizer, scheduler, config, runtime, checkpoint)
        calls.append(
            SimpleNamespace(
                config=config,
                pairs=list(task.data.pairs),
                steps=len(result.step_losses),
                last_lr=scheduler.get_last_lr(),
            )
        )
        return result

    monkeypatch.setattr(dsr, "fit", recording_fit)
    return calls


def _force_dev(monkeypatch, scores: list[float]) -> None:
    """Dev recall@200 of epoch 0, 1, ... is ``scores[i]`` (more calls: an error)."""
    calls = iter(scores)
    monkeypatch.setattr(dsr, "evaluate_dsr", lambda model, data, batch_size: {"recall@200": next(calls)})


def test_refit_off_is_the_plain_training_run(tiny_model_dir, runs, monkeypatch):
    assert sample_section("dsr")["refit"] is False
    config = _config(epochs=2)
    _force_dev(monkeypatch, [0.1, 0.3, 0.2] * 2)  # epoch 1 wins, twice
    plain = _fresh_dsr(tiny_model_dir, config)
    start = _state(plain)
    expected = train_dsr(plain, replace(_data(), dev_pairs=[]), config, torch.device("cpu"), seed=7)  # no option
    model = _fresh_dsr(tiny_model_dir, config)
    result, refit = train_and_refit(model, _data(), _config(epochs=2, refit=False), Runtime("cpu"), seed=7)
    assert refit is None and len(runs) == 2  # one run each
    assert result.best_epoch == expected.best_epoch == 1 and repr(result.history) == repr(expected.history)
    assert _same(_state(model), _state(plain)) and not _same(start, _state(plain))


def test_refit_trains_the_chosen_epochs_on_train_and_dev(tiny_model_dir, runs, monkeypatch):
    data, config = _data(), _config(refit=True)
    assert [p.key for p in data.dev_pairs] == [("dev", 10), ("dev", 11), ("dev", 11)]
    assert [p.negatives for p in data.dev_pairs] == [(3, 6), (), ()]  # mined negatives, else random at draw time
    _force_dev(monkeypatch, [0.1, 0.2, 0.9, 0.3])  # best epoch E = 2 of 3
    model = _fresh_dsr(tiny_model_dir, config)
    selection, refit = train_and_refit(model, data, config, Runtime("cpu"), seed=7)
    assert selection.best_epoch == 2 and [h["epoch"] for h in selection.history] == [0, 1, 2, 3]
    assert refit is not None and refit.model is model and len(runs) == 2
    first, second = runs
    n = len(data.pairs) + len(data.dev_pairs)
    assert n == 9 and refit.n_pairs == n
    assert first.steps == 3 * math.ceil(len(data.pairs) / BATCH)
    assert second.config.epochs == 2 and second.steps == 2 * math.ceil(n / BATCH)  # E epochs of train + dev
    assert second.config.selection_metric is None and not second.config.select_epoch_zero  # no selection
    assert refit.best_epoch == 2 and [h["epoch"] for h in refit.history] == [1, 2]  # the last epoch kept
    assert all(lr == 0.0 for lr in second.last_lr)  # the schedule ends with the refit's last step
    assert {p.key for p in second.pairs} == {p.key for p in data.pairs} | {("dev", 10), ("dev", 11)}
    # the same as a fresh model, same start and seed, trained E epochs on train + dev
    reference = _fresh_dsr(tiny_model_dir, config)
    both = replace(data, pairs=data.pairs + data.dev_pairs, dev_pairs=[], dev_questions=[], dev_qrels={}, dev_ids=[])
    train_dsr(reference, both, config.model_copy(update={"epochs": 2}), torch.device("cpu"), seed=7, select=False)
    assert _same(_state(model), _state(reference))


def test_refit_keeps_the_untrained_model_when_epoch_zero_wins(tiny_model_dir, runs, monkeypatch):
    config = _config(epochs=2, refit=True)
    _force_dev(monkeypatch, [0.9, 0.1, 0.2])
    model = _fresh_dsr(tiny_model_dir, config)
    start = _state(model)
    selection, refit = train_and_refit(model, _data(), config, Runtime("cpu"), seed=7)
    assert selection.best_epoch == 0 and refit is None and len(runs) == 1
    assert _same(_state(model), start)


def test_fixed_selection_refits_the_full_schedule_even_when_epoch_zero_wins_on_dev(
    tiny_model_dir, runs, monkeypatch, caplog
):
    """``dsr.selection: fixed`` (G-DSR Table 5 / appendix B): the selection run keeps its last
    epoch whatever dev says, and the refit trains all ``epochs`` on train + dev."""
    caplog.set_level("INFO", logger="lexgraph.methods.dsr.train")
    data, config = _data(), _config(epochs=2, refit=True, selection="fixed")
    _force_dev(monkeypatch, [0.1, 0.05])  # dev would prefer epoch 1 (and scores no epoch 0): fixed keeps epoch 2
    model = _fresh_dsr(tiny_model_dir, config)
    selection, refit = train_and_refit(model, data, config, Runtime("cpu"), seed=7)
    first, second = runs
    assert first.config.selection_metric is None and not first.config.select_epoch_zero
    assert selection.best_epoch == 2 and [h["epoch"] for h in selection.history] == [1, 2]
    n = len(data.pairs) + len(data.dev_pairs)
    assert second.config.epochs == 2 and second.steps == 2 * math.ceil(n / BATCH) and refit.best_epoch == 2
    assert "for 2 epochs ('dsr.selection' is fixed: the full schedule)" in caplog.text
    with pytest.raises(ConfigError, match=r"^params\.yaml: 'dsr\.selection' = 'best', expected one of dev, fixed$"):
        DSRConfig.from_params({**sample_section("dsr"), "selection": "best"})


def test_refit_logs_every_run_and_every_skip_with_its_reason(tiny_model_dir, runs, monkeypatch, caplog):
    caplog.set_level("INFO", logger="lexgraph.methods.dsr.train")
    for refit, scores, expected in (
        (False, [0.1, 0.3, 0.2], "refit: skipped, 'dsr.refit' is false"),
        (True, [0.9, 0.1, 0.2], "refit: skipped, the untrained model won on dev"),
        (
            True,
            [0.1, 0.9, 0.2],
            "refit: on train + dev, 9 pairs (6 train, 3 dev, 1 of them "
            "with BM25 negatives) for 1 epochs (chosen on dev)",
        ),
    ):
        caplog.clear()
        _force_dev(monkeypatch, scores)
        config = _config(epochs=2, refit=refit)
        train_and_refit(_fresh_dsr(tiny_model_dir, config), _data(), config, Runtime("cpu"), seed=7)
        assert expected in caplog.text


def _write_inputs(tmp_path, negatives: pl.DataFrame) -> dict:
    write_parquet(pl.DataFrame({"id": list(CORPUS), "article": list(CORPUS.values())}), tmp_path / "a.parquet")
    write_parquet(QUESTIONS, tmp_path / "q.parquet")
    write_parquet(negatives, tmp_path / "n.parquet")
    return dict(
        articles_path=tmp_path / "a.parquet",
        questions_path=tmp_path / "q.parquet",
        synthetic_path=tmp_path / "none",
        negatives_path=tmp_path / "n.parquet",
        use_synthetic=False,
    )


def test_refit_gets_the_mined_dev_negatives_and_refuses_unmined_dev_questions(tmp_path):
    """The refit's dev pairs draw from BM25 negatives mined for dev (split 'dev'); a dev question
    with no mined row (negatives.splits without dev) is an error, never silent random negatives."""
    data = load_training_data(**_write_inputs(tmp_path, NEGATIVES), refit=True)
    assert [(p.key, p.negatives) for p in data.dev_pairs] == [
        (("dev", 10), (3, 6)),
        (("dev", 11), ()),
        (("dev", 11), ()),
    ]
    unmined = NEGATIVES.filter(pl.col("split") != "dev")
    assert load_training_data(**_write_inputs(tmp_path, unmined), refit=False).dev_pairs == []  # no refit: fine
    with pytest.raises(DataError) as info:
        load_training_data(**_write_inputs(tmp_path, unmined), refit=True)
    message = str(info.value)
    assert "\n" not in message and "2 of 2 dev questions (first: 10) have no mined BM25 negatives" in message
    assert "'dsr.refit'" in message and "add dev to 'negatives.splits'" in message


def test_profiles_that_refit_mine_dev_negatives():
    import yaml

    from conftest import ROOT

    for profile in (ROOT / "params.yaml", ROOT / "profiles" / "paper.yaml"):
        params = yaml.safe_load(profile.read_text(encoding="utf-8"))
        assert "dev" in params["negatives"]["splits"], profile  # dsr.refit / gnn.refit may train on dev


def test_refit_without_dev_questions_is_an_error(tiny_model_dir):
    config = _config(refit=True)
    with pytest.raises(DataError, match="refit"):
        train_and_refit(_fresh_dsr(tiny_model_dir, config), replace(_data(), dev_pairs=[]), config, Runtime("cpu"), 7)


def test_stage_metrics_say_what_the_dev_numbers_are(tiny_model_dir, tmp_path, monkeypatch):
    write_parquet(pl.DataFrame({"id": list(CORPUS), "article": list(CORPUS.values())}), tmp_path / "a.parquet")
    write_parquet(QUESTIONS, tmp_path / "q.parquet")
    write_parquet(NEGATIVES, tmp_path / "n.parquet")
    summaries = {}
    for name, refit, scores in (
        ("off", False, [0.1, 0.9, 0.3]),
        ("on", True, [0.1, 0.9, 0.3]),
        ("zero", True, [0.9, 0.1, 0.3]),
    ):
        _force_dev(monkeypatch, scores)
        out = tmp_path / name
        paths = dsr.TrainDsrPaths(
            articles=tmp_path / "a.parquet",
            questions=tmp_path / "q.parquet",
            synthetic=tmp_path / "none",
            negatives=tmp_path / "n.parquet",
            pretrained=tiny_model_dir,
            chunks=tmp_path / "none",
            out=out / "dsr",
            metrics=out / "m.json",
            plot=out / "c.csv",
        )
        dsr.run_train_dsr(paths, _config(epochs=2, refit=refit), StageContext(seed=3, device="cpu"))
        summaries[name] = json.loads((out / "m.json").read_text())
        assert (out / "c.csv").read_text().count("\n") == 4  # the selection run's curve: epochs 0, 1, 2
    assert not {"refit", "dev_metrics_of", "dev_held_out"} & set(summaries["off"])
    on = summaries["on"]
    assert on["best_epoch"] == 1 and on["refit"] == {"epochs": 1, "pairs": 9}
    assert on["dev_metrics_of"] == "selection run" and on["dev_held_out"] is False
    zero = summaries["zero"]
    assert zero["best_epoch"] == 0 and zero["refit"] is None and zero["dev_held_out"] is True
    saved = DSR.load(tmp_path / "on" / "dsr")
    assert not torch.equal(
        saved.encode_queries(["bail ?"]), DSR.load(tmp_path / "off" / "dsr").encode_queries(["bail ?"])
    )  # the refit model, not the selection run's

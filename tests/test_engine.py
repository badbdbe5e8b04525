"""The shared training engine (lexgraph.training.engine) against hand computations:
the AdamW no-decay rule, the warm-up/decay schedule, batch sharding, best-epoch
selection, the NaN guard; and the ``base.deterministic`` switch."""

from __future__ import annotations

import math
import os

import pytest
import torch
from torch import nn

from conftest import write_params
from lexgraph.core.errors import LexgraphError
from lexgraph.training.engine import (
    BestState,
    FitConfig,
    ParamGroup,
    Runtime,
    build_optimizer,
    build_scheduler,
    fit,
    linear_warmup_decay,
    no_decay_parameters,
    shard,
)


def test_no_decay_rule_is_biases_and_layernorm_weights_of_a_bert():
    from transformers import BertConfig, BertForMaskedLM

    model = BertForMaskedLM(
        BertConfig(
            vocab_size=50,
            hidden_size=8,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=16,
            max_position_embeddings=16,
        )
    )
    exempt = no_decay_parameters(model)
    # the usual BERT rule, by name: biases and LayerNorm weights (and nothing with 2 dims)
    expected = {id(p) for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n}
    assert exempt == expected
    assert all(p.ndim == 1 for p in model.parameters() if id(p) in exempt)
    optimizer = build_optimizer([ParamGroup(list(model.parameters()), 1e-3, 0.01)], [model])
    decayed, free = optimizer.param_groups
    assert (decayed["weight_decay"], free["weight_decay"]) == (0.01, 0.0)
    assert {id(p) for p in free["params"]} == expected
    # a decay_exempt=False group decays everything (the GNN's AdamW)
    (group,) = build_optimizer(
        [ParamGroup(list(model.parameters()), 1e-3, 0.1, decay_exempt=False)], [model]
    ).param_groups
    assert group["weight_decay"] == 0.1 and len(group["params"]) == len(list(model.parameters()))


def test_frozen_parameters_are_left_out_and_groups_keep_their_lr():
    a, b = nn.Linear(3, 3), nn.Linear(3, 3)
    a.weight.requires_grad_(False)
    optimizer = build_optimizer(
        [ParamGroup(list(a.parameters()), 0.1, 0.5), ParamGroup(list(b.parameters()), 0.2, 0.5)], [a, b], eps=1e-7
    )
    assert [(g["lr"], g["weight_decay"], len(g["params"])) for g in optimizer.param_groups] == [
        (0.1, 0.0, 1),
        (0.2, 0.5, 1),
        (0.2, 0.0, 1),
    ]
    assert optimizer.defaults["eps"] == 1e-7


def test_linear_schedule_by_hand():
    factor = linear_warmup_decay(2, 10)
    assert [factor(s) for s in range(4)] == [1 / 3, 2 / 3, 1.0, 7 / 8]
    assert factor(10) == 0.0 and factor(12) == 0.0
    param = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.3)
    scheduler = build_scheduler(opt, "constant")
    for _ in range(3):
        opt.step()
        scheduler.step()
    assert opt.param_groups[0]["lr"] == 0.3


def test_shard_cuts_contiguous_near_equal_parts():
    batch = list(range(7))
    parts = [shard(batch, i, 3) for i in range(3)]
    assert parts == [[0, 1, 2], [3, 4], [5, 6]]
    assert [shard([1, 2], i, 4) for i in range(4)] == [[1], [2], [], []]
    tensor = torch.arange(10).view(5, 2)
    assert torch.equal(torch.cat([shard(tensor, i, 2) for i in range(2)]), tensor)


def test_best_state_keeps_the_first_best_epoch_and_restores_it():
    model = nn.Linear(2, 1)
    best = BestState([model], "recall")
    snapshots = {}
    for epoch, score in enumerate([0.5, 0.7, 0.7, 0.6]):
        with torch.no_grad():
            model.weight.fill_(float(epoch))
        snapshots[epoch] = model.weight.clone()
        best.offer(epoch, {"recall": score})
    best.restore()
    assert best.epoch == 1 and best.metrics == {"recall": 0.7}  # the tie at epoch 2 keeps epoch 1
    assert torch.equal(model.weight, snapshots[1])
    last = BestState([model], "recall")
    for epoch in range(3):
        last.offer(epoch, {})  # no dev data: the last epoch, no copy
    assert last.epoch == 2 and last._states is None


class _Task:
    """y = w x with a fixed data set; ``poison``: the loss becomes NaN at that step."""

    def __init__(self, poison: int | None = None) -> None:
        self.model = nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            self.model.weight.fill_(0.0)
        self.poison, self.calls = poison, 0

    def modules(self):
        return [self.model]

    def train(self):
        self.model.train()

    def batches(self, epoch):
        yield from ([1.0, 2.0], [3.0, 4.0])

    def step(self, batch):
        self.calls += 1
        x = torch.tensor(batch).view(-1, 1)  # (b, 1)
        loss = ((self.model(x) - 2 * x) ** 2).mean()
        return loss * float("nan") if self.calls == self.poison else loss

    def evaluate(self):
        return {"neg_w_error": -abs(float(self.model.weight.detach()) - 2.0)}

    def nan_error(self, value, epoch, step):
        return LexgraphError(f"nan at epoch {epoch}, step {step}")


def _fit(task, epochs=3, **kw):
    optimizer = torch.optim.SGD(task.model.parameters(), lr=0.02)
    config = FitConfig(name="t", epochs=epochs, steps_per_epoch=2, show_progress=False, **kw)
    return fit(task, optimizer, build_scheduler(optimizer, "constant"), config, Runtime("cpu"))


def test_fit_by_hand_two_sgd_steps():
    task = _Task()
    result = _fit(task, epochs=1, max_grad_norm=0)
    # step 1: x = 1, 2; loss = mean((w x - 2x)^2) = 10 at w = 0; grad = mean(2 (w-2) x^2) = -10
    w = 0.0 - 0.02 * -10.0
    # step 2: x = 3, 4; grad = mean(2 (w - 2) x^2) = (w - 2) * 25
    loss2 = (w - 2) ** 2 * 12.5
    w2 = w - 0.02 * (w - 2) * 25
    assert result.step_losses == pytest.approx([10.0, loss2], rel=1e-6)
    assert float(task.model.weight) == pytest.approx(w2, rel=1e-6)
    assert result.history == [{"epoch": 1, "loss": pytest.approx((10.0 + loss2) / 2, rel=1e-6)}]


def test_fit_restores_epoch_zero_when_no_epoch_beats_it():
    task = _Task()
    task.evaluate = lambda: {"score": -float(task.calls)}  # every epoch scores below the untrained model
    result = _fit(task, selection_metric="score", select_epoch_zero=True)
    assert result.best_epoch == 0 and result.dev_metrics == {"score": 0.0}
    assert float(task.model.weight.detach()) == 0.0  # trained to ~2, then the untrained weights restored
    assert [h["epoch"] for h in result.history] == [0, 1, 2, 3] and math.isnan(result.history[0]["loss"])
    assert [h["dev_score"] for h in result.history] == [0.0, -2.0, -4.0, -6.0]


def test_nan_guard_names_the_step_and_does_not_update():
    task = _Task(poison=2)
    with pytest.raises(LexgraphError, match="epoch 1, step 2"):
        _fit(task, max_grad_norm=0)
    assert float(task.model.weight) == pytest.approx(0.2)  # only step 1 (gradient -10, lr 0.02) was applied


@pytest.fixture()
def restore_determinism():
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]
    if before[4] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = before[4]


def test_deterministic_switch(restore_determinism, monkeypatch):
    from lexgraph.core.config import set_deterministic

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    set_deterministic(True)
    assert torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    set_deterministic(False)
    assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.deterministic


@pytest.mark.parametrize("deterministic", [True, False])
def test_a_training_stage_runs_on_cpu_under_either_setting(tmp_path, restore_determinism, deterministic):
    import importlib.util
    import json
    from pathlib import Path

    import polars as pl

    from lexgraph.core.stage import run_stage

    texts = [f"Article {i}: le bail du locataire et le contrat du propriétaire, alinéa {i}." for i in range(40)]
    articles = tmp_path / "articles.parquet"
    pl.DataFrame({"id": list(range(40)), "article": texts}).write_parquet(articles)
    section = dict(
        mode="scratch",
        vocab_size=200,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        max_length=16,
        max_steps=3,
        batch_size=4,
        warmup_ratio=0.34,
        log_every=1,
        accumulation_steps=2,
    )
    params = tmp_path / "params.yaml"
    write_params(params, base={"seed": 1, "device": "cpu", "deterministic": deterministic}, pretrain=section)
    driver_path = Path(__file__).resolve().parents[1] / "stages" / "pretrain.py"
    spec = importlib.util.spec_from_file_location("stage_pretrain_det", driver_path)
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    metrics = tmp_path / "pretrain.json"
    argv = [
        "--params",
        str(params),
        "--articles",
        str(articles),
        "--out",
        str(tmp_path / "out"),
        "--metrics",
        str(metrics),
        "--plot",
        str(tmp_path / "pretrain_curve.csv"),
    ]
    assert run_stage(driver.STAGE, argv) == 0
    assert torch.are_deterministic_algorithms_enabled() == deterministic
    assert math.isfinite(json.loads(metrics.read_text())["eval_loss"])

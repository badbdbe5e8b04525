"""Resumable training (lexgraph.training.resume): a fit killed after an epoch and rerun
resumes from that epoch and ends bit-identical to an uninterrupted fit; other settings or
inputs start afresh; the checkpoints go when the block completes."""

from __future__ import annotations

import logging

import pytest
import torch

from helpers_resume import EPOCHS, Killed, Task, run, state
from lexgraph.training.resume import checkpoint_dir, resumable


@pytest.fixture
def reference():
    task = Task()
    result = run(task)
    return state(task), result


def test_a_fit_killed_after_an_epoch_resumes_there_and_ends_bit_identical(tmp_path, reference, caplog):
    expected, expected_result = reference
    out, settings, inputs = tmp_path / "model", {"lr": 0.05}, {"data": tmp_path / "data.txt"}
    (tmp_path / "data.txt").write_text("v1")
    with pytest.raises(Killed), resumable(out, settings, inputs) as resume:
        run(Task(kill_at=3), resume.next_fit())
    folder = checkpoint_dir(out)
    assert folder == tmp_path / ".model.resume" and (folder / "fit-1.pt").is_file()
    assert [p.name for p in folder.glob("fit-1.rank-*")] == ["fit-1.rank-0.epoch-2.pt"]  # the older epoch's is gone
    torch.manual_seed(123)  # the rerun's global RNG differs: the checkpoint's must win
    caplog.set_level(logging.INFO, logger="lexgraph")
    with resumable(out, settings, inputs) as resume:
        task = Task()
        result = run(task, resume.next_fit())
    assert "toy: resumed after epoch 2 of 4" in caplog.text
    assert task.evaluated == 2  # epochs 3 and 4 only: no epoch 0, 1 or 2 again
    got = state(task)
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)
    assert result.best_epoch == expected_result.best_epoch == 2
    assert repr(result.history) == repr(expected_result.history)  # (epoch 0's loss is NaN)
    assert result.step_losses == expected_result.step_losses
    assert result.initial_metrics == expected_result.initial_metrics
    assert not folder.exists()  # removed when the block completed


@pytest.mark.parametrize("change", ["settings", "inputs"])
def test_other_settings_or_inputs_start_afresh_and_say_so(tmp_path, reference, caplog, change):
    expected, _ = reference
    out, data = tmp_path / "model", tmp_path / "data.txt"
    data.write_text("v1")
    with pytest.raises(Killed), resumable(out, {"lr": 0.05}, {"data": data}) as resume:
        run(Task(kill_at=3), resume.next_fit())
    settings = {"lr": 0.05}
    if change == "settings":
        settings = {"lr": 0.01}
    else:
        data.write_text("v2")
    caplog.set_level(logging.INFO, logger="lexgraph")
    with resumable(out, settings, {"data": data}) as resume:
        task = Task()
        run(task, resume.next_fit())
    assert "of a run with other settings or inputs; starting afresh" in caplog.text
    assert "resumed" not in caplog.text and task.evaluated == EPOCHS + 1
    got = state(task)
    assert all(torch.equal(got[k], expected[k]) for k in got)  # a full fresh run: the reference


def test_a_second_fit_of_the_stage_has_its_own_checkpoint(tmp_path, caplog):
    """train_dsr's refit is the stage's second fit: a kill during it resumes the first one
    at its end (nothing left to train) and the second where it stopped."""
    out = tmp_path / "model"
    first = Task(seed=0)
    run(first)
    second = Task(seed=1)
    run(second)
    with pytest.raises(Killed), resumable(out, {}, {}) as resume:
        run(Task(seed=0), resume.next_fit())
        run(Task(seed=1, kill_at=2), resume.next_fit())
    caplog.set_level(logging.INFO, logger="lexgraph")
    with resumable(out, {}, {}) as resume:
        a, b = Task(seed=0), Task(seed=1)
        run(a, resume.next_fit())
        run(b, resume.next_fit())
    assert "resumed after epoch 4 of 4" in caplog.text and "resumed after epoch 1 of 4" in caplog.text
    assert a.evaluated == 0 and b.evaluated == 3
    for done, ref in ((a, first), (b, second)):
        assert all(torch.equal(done.model.state_dict()[k], v) for k, v in ref.model.state_dict().items())


def test_a_checkpoint_without_its_process_state_is_not_half_used(tmp_path, caplog):
    """A kill between the two writes of an epoch: the common state of epoch 2 and no own state
    of epoch 2 (it was removed): the fit starts afresh rather than mix epochs."""
    out = tmp_path / "model"
    with pytest.raises(Killed), resumable(out, {}, {}) as resume:
        run(Task(kill_at=3), resume.next_fit())
    for own in checkpoint_dir(out).glob("fit-1.rank-0.*"):
        own.unlink()
    caplog.set_level(logging.INFO, logger="lexgraph")
    with resumable(out, {}, {}) as resume:
        task = Task()
        run(task, resume.next_fit())
    assert "lacks fit-1.rank-0.epoch-2.pt; this training starts afresh" in caplog.text
    assert task.evaluated == EPOCHS + 1

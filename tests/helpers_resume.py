"""A tiny resumable training task shared by the resume tests (tests/test_resume.py,
tests/test_resume_hostile.py): a one-weight model fitted for :data:`EPOCHS` epochs that can be
killed after an epoch."""

from __future__ import annotations

import torch
from torch import nn

from lexgraph.training.engine import FitConfig, ParamGroup, Runtime, build_optimizer, build_scheduler, fit

EPOCHS = 4


class Killed(Exception):
    """Stands for SIGKILL: raised before an epoch's first batch."""


class Task:
    """A tiny regression with dropout (the global torch RNG), a task generator that runs on
    across epochs (its state is the task's to save) and a dev metric that picks an epoch."""

    def __init__(self, seed: int = 0, kill_at: int | None = None) -> None:
        torch.manual_seed(seed)
        self.model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.3), nn.Linear(8, 1))
        self.generator = torch.Generator().manual_seed(seed + 1)
        self.x = torch.randn(32, 4, generator=torch.Generator().manual_seed(5))
        self.y = self.x.sum(1, keepdim=True)
        self.kill_at = kill_at
        self.evaluated, self.epoch = 0, 0

    def modules(self):
        return [self.model]

    def train(self):
        self.model.train()

    def batches(self, epoch: int):
        if epoch == self.kill_at:
            raise Killed(epoch)
        self.epoch = epoch
        order = torch.randperm(32, generator=self.generator)  # runs on from epoch to epoch
        for step in range(4):
            yield order[step * 8 : (step + 1) * 8]

    def step(self, batch):
        return nn.functional.mse_loss(self.model(self.x[batch]), self.y[batch])

    def evaluate(self):
        self.evaluated += 1
        self.model.eval()
        with torch.no_grad():
            loss = float(nn.functional.mse_loss(self.model(self.x), self.y))
        return {"neg_loss": -loss + (9.0 if self.epoch == 2 else 0.0)}  # epoch 2 wins: its weights are restored

    def state_dict(self):
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state):
        self.generator.set_state(state["generator"])

    def nan_error(self, value, epoch, step):
        raise AssertionError(value)


def run(task: Task, checkpoint=None):
    optimizer = build_optimizer([ParamGroup(list(task.model.parameters()), 0.05, 0.01)], [task.model])
    scheduler = build_scheduler(optimizer, "linear", 2, 4 * EPOCHS)
    config = FitConfig(
        name="toy", epochs=EPOCHS, steps_per_epoch=4, selection_metric="neg_loss", select_epoch_zero=True
    )
    return fit(task, optimizer, scheduler, config, Runtime("cpu"), checkpoint)


def state(task: Task) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in task.model.state_dict().items()}

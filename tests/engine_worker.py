"""A tiny regression model trained with lexgraph.training.engine.fit, for the
multi-process tests (tests/test_engine_distributed.py). Run directly (one process) or
under ``torchrun --nproc_per_node N``; the main process writes the per-step losses and
the final weights as JSON.

    python tests/engine_worker.py OUT.json --runs 8:1 8:2   # BATCH:ACCUMULATION per run

With ``--resume DIR`` the run is resumable (checkpoints in DIR's ``.model.resume``), and
``--die-at E`` ends every process abruptly (``os._exit``, as SIGKILL) at the start of epoch E.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os

import torch
from torch import nn

from lexgraph.core.errors import LexgraphError
from lexgraph.training.engine import FitConfig, ParamGroup, Runtime, build_optimizer, build_scheduler, fit
from lexgraph.training.resume import resumable

N_EXAMPLES = 40  # 5 global batches of 8 per epoch


class Regression:
    """MSE of a small MLP (with LayerNorm, biases and one weight it never uses) on a fixed random data set."""

    def __init__(self, runtime: Runtime, batch: int, seed: int = 0, die_at: int | None = None) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(N_EXAMPLES, 6, generator=g)  # (n, 6)
        self.y = torch.randn(N_EXAMPLES, 1, generator=g)  # (n, 1)
        torch.manual_seed(seed)
        self.model = nn.Sequential(nn.Linear(6, 16), nn.LayerNorm(16), nn.Tanh(), nn.Linear(16, 1))
        # a trained weight the loss never reaches (an unused pooler, say): no process gives it a
        # gradient, so AdamW must leave it on 2 processes as on 1 (weight decay included)
        self.model.register_parameter("unused", nn.Parameter(torch.ones(3, 2)))
        self.batch, self.seed, self.runtime, self.die_at = batch, seed, runtime, die_at
        self.noise = torch.Generator().manual_seed(seed + 1 + 7919 * runtime.rank)  # per process, runs on

    def modules(self):
        return [self.model]

    def train(self) -> None:
        self.model.train()

    def batches(self, epoch: int):
        if epoch == self.die_at:
            os._exit(9)
        order = torch.randperm(N_EXAMPLES, generator=torch.Generator().manual_seed(self.seed * 100 + epoch))
        for start in range(0, N_EXAMPLES, self.batch):
            yield order[start : start + self.batch].tolist()

    def step(self, batch):
        rows = torch.tensor(batch)
        x = self.x[rows]  # (b, 6)
        if self.die_at is not None:  # the resume test: input noise from a per-process generator
            x = x + 0.01 * torch.randn(len(batch), 6, generator=self.noise)
        pred = self.model(x)  # (b, 1)
        return ((pred - self.y[rows]) ** 2).mean()

    def evaluate(self):
        with torch.no_grad():
            return {"neg_mse": -float(((self.model(self.x) - self.y) ** 2).mean())}

    def state_dict(self):
        return {"noise": self.noise.get_state()}

    def load_state_dict(self, state):
        self.noise.set_state(state["noise"])

    def nan_error(self, value, epoch, step):
        return LexgraphError(f"loss {value} at epoch {epoch}, step {step}")


def train(
    runtime: Runtime, batch: int, accumulation: int = 1, epochs: int = 2, resume=None, die_at: int | None = None
) -> dict:
    """Train the regression task; per-step global losses, final weights, best epoch."""
    task = Regression(runtime, batch, die_at=die_at)
    steps = -(-N_EXAMPLES // batch)
    optimizer = build_optimizer([ParamGroup(list(task.model.parameters()), 0.05, 0.1)], [task.model])
    scheduler = build_scheduler(optimizer, "linear", 2, steps * epochs)
    config = FitConfig(
        name="regression",
        epochs=epochs,
        steps_per_epoch=steps,
        max_grad_norm=0.5,
        accumulation_steps=accumulation,
        selection_metric="neg_mse",
        select_epoch_zero=True,
        show_progress=False,
    )
    result = fit(task, optimizer, scheduler, config, runtime, resume.next_fit() if resume else None)
    weights = torch.cat([p.detach().reshape(-1) for p in task.model.parameters()]).tolist()
    return {
        "world_size": runtime.world_size,
        "batch": batch,
        "accumulation": accumulation,
        "step_losses": result.step_losses,
        "weights": weights,
        "best_epoch": result.best_epoch,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--runs", nargs="+", default=["8:1"], help="BATCH:ACCUMULATION of each training run")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--resume", help="a folder: the runs are resumable, checkpointed there")
    parser.add_argument("--die-at", type=int, help="every process exits abruptly at the start of this epoch")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)  # the resume line
    runtime = Runtime("cpu")
    results = []
    with contextlib.ExitStack() as stack:
        resume = None
        if args.resume:
            resume = stack.enter_context(resumable(os.path.join(args.resume, "model"), {}, {}, runtime))
        for run in args.runs:
            batch, accumulation = (int(v) for v in run.split(":"))
            results.append(train(runtime, batch, accumulation, args.epochs, resume, args.die_at))
    if runtime.is_main:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(results, fh)
    runtime.wait()


if __name__ == "__main__":
    main()

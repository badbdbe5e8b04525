"""Resumable training on a GPU with mixed precision: a device check, run by hand where a GPU is
(the CI machines have none; tests/test_resume.py checks the same on CPU).

For each precision (fp32, bf16, fp16 with its gradient scaler) a small MLP with dropout trains
4 epochs uninterrupted, then again killed at the start of epoch 3 and resumed from epoch 2's
checkpoint; prints, per precision, whether the resumed weights equal the uninterrupted ones
bit for bit (deterministic algorithms on) and the largest difference.

    for p in no bf16 fp16; do PYTHONPATH=src python tests/device_resume.py --precision $p; done
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import torch
from torch import nn

from lexgraph.training.engine import FitConfig, ParamGroup, Runtime, build_optimizer, build_scheduler, fit
from lexgraph.training.resume import resumable


class Killed(Exception):
    pass


class Task:
    def __init__(self, runtime: Runtime, die_at: int | None = None) -> None:
        torch.manual_seed(0)
        self.device = runtime.device
        self.model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Dropout(0.2), nn.Linear(256, 1)).to(self.device)
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(512, 64, generator=g).to(self.device)
        self.y = self.x[:, :8].sum(1, keepdim=True)
        self.order = torch.Generator().manual_seed(2)
        self.runtime, self.die_at = runtime, die_at

    def modules(self):
        return [self.model]

    def train(self):
        self.model.train()

    def batches(self, epoch):
        if epoch == self.die_at:
            raise Killed(epoch)
        order = torch.randperm(512, generator=self.order)
        for s in range(8):
            yield order[s * 64 : (s + 1) * 64]

    def step(self, batch):
        with self.runtime.autocast():
            pred = self.model(self.x[batch.to(self.device)])
        return nn.functional.mse_loss(pred.float(), self.y[batch.to(self.device)])

    def evaluate(self):
        self.model.eval()
        with torch.no_grad():
            return {"neg": -float(nn.functional.mse_loss(self.model(self.x), self.y))}

    def state_dict(self):
        return {"order": self.order.get_state()}

    def load_state_dict(self, state):
        self.order.set_state(state["order"])

    def nan_error(self, value, epoch, step):
        return RuntimeError(f"loss {value}")


def run(device: str, precision: str, checkpoint=None, die_at=None) -> dict[str, torch.Tensor]:
    runtime = Runtime(device, precision)
    task = Task(runtime, die_at)
    opt = build_optimizer([ParamGroup(list(task.model.parameters()), 1e-3, 0.01)], [task.model])
    sched = build_scheduler(opt, "linear", 4, 32)
    config = FitConfig("toy", 4, 8, selection_metric="neg", select_epoch_zero=True, show_progress=False)
    fit(task, opt, sched, config, runtime, checkpoint)
    return {k: v.detach().float().cpu() for k, v in task.model.state_dict().items()}


def check(device: str, precision: str) -> dict:
    whole = run(device, precision)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "model")
        try:
            with resumable(out, {"p": precision}, {}) as resume:
                run(device, precision, resume.next_fit(), die_at=3)
        except Killed:
            pass
        with resumable(out, {"p": precision}, {}) as resume:
            resumed = run(device, precision, resume.next_fit())
    diff = max(float((whole[k] - resumed[k]).abs().max()) for k in whole)
    return {
        "precision": precision,
        "identical": all(torch.equal(whole[k], resumed[k]) for k in whole),
        "max_diff": diff,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precision", default="bf16", help="no | bf16 | fp16 (one per process: Accelerate's state)")
    args = parser.parse_args()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    rows = [check(args.device, args.precision)]
    print(json.dumps({"device": name, "torch": torch.__version__, "checks": rows}, indent=1))


if __name__ == "__main__":
    main()

"""train_dsr's engine step on the sample (params.yaml's dsr: frozen chunk encoder, batch 32): pairs/s
of the lexgraph under argv[1]/src (a worktree of the old commit, or this one), argv[2] timed steps after
2 warm-up steps; prints one JSON line. CPU and the sample workspace only (lexgraph's readers use polars).
Issue 43's old/new ratio: run it for both sources in turns (benchmarks/train_dsr_sample_ab.json)."""

import json
import sys
import time

sys.path.insert(0, sys.argv[1] + "/src")
import torch

from lexgraph.core.config import read_params, seed_everything
from lexgraph.encoding.chunks import load_chunk_table
from lexgraph.methods.dsr.config import DSRConfig, build_dsr
from lexgraph.methods.dsr.data import load_training_data
from lexgraph.methods.dsr.train import DSRTask
from lexgraph.training.engine import FitConfig, ParamGroup, Runtime, _FitLoop, build_optimizer, build_scheduler

W = str(__import__("pathlib").Path(__file__).resolve().parents[1]) + "/"
n = int(sys.argv[2])
config = DSRConfig.from_params(read_params(W + "params.yaml")["dsr"])
data = load_training_data(
    W + "data/clean/articles.parquet",
    W + "data/clean/questions.parquet",
    W + "data/queries/synthetic.parquet",
    W + "data/negatives/negatives.parquet",
    config.synthetic,
)
seed_everything(0)
model = build_dsr(config, W + "models/pretrain")
data.chunks = load_chunk_table(W + "data/chunks/articles.safetensors")
runtime = Runtime("cpu")
model.to("cpu")
torch.manual_seed(0)
task = DSRTask(model, data, config, runtime, 0)
chunk_level = {id(p) for nm, p in model.article_encoder.named_parameters() if not nm.startswith("backbone.")}
params = list(model.parameters())
opt = build_optimizer(
    [
        ParamGroup([p for p in params if id(p) not in chunk_level], config.lr, config.weight_decay),
        ParamGroup([p for p in params if id(p) in chunk_level], config.chunk_lr or config.lr, config.weight_decay),
    ],
    [model],
    eps=1e-7,
)
loop = _FitLoop(
    task, opt, build_scheduler(opt, "linear", 1, 100), FitConfig("train_dsr", 1, task.steps_per_epoch), runtime
)
task.train()
batches = list(task.batches(1))
losses = []


def step(b):
    losses.append(loop.batch_losses(b)["loss"])
    loop.optimizer_step()


for b in batches[:2]:
    step(b)
t = time.perf_counter()
for b in batches[2 : 2 + n]:
    step(b)
s = time.perf_counter() - t
print(
    json.dumps(
        {"src": sys.argv[1], "pairs_per_s": n * config.batch_size / s, "s_per_step": s / n, "losses": losses[:4]}
    )
)

"""DSR's training step asks nothing back from the device (issue 43).

:class:`~lexgraph.core.step_probe.StepProbe` counts, on a CPU, the operators a step dispatches
and the reads that would make a GPU's host wait; the step of ``train_dsr`` (the engine's own:
its optimizer, clipping and loss read-back) may read back one value per optimizer step, the
loss. Every layout's loss and gradients equal a reference computed through the padded
``(batch, chunks, len)`` path, which shares no code with the host plans."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers_dsr import CORPUS, _config, _fresh_dsr
from lexgraph.core.step_probe import StepProbe, optimizer_host_scalars
from lexgraph.methods.dsr.data import Pair, TrainingData
from lexgraph.methods.dsr.train import DSRTask, dsr_optimization
from lexgraph.models import packing
from lexgraph.models.packing import LAYOUTS, collate_chunks
from lexgraph.training.engine import Runtime, training_loop

QUESTIONS = ["le bail du contrat", "mariage enfant", "la loi du divorce et du bail", "les articles"]


def test_the_probe_counts_every_kind_of_read_back_once():
    x = torch.arange(6.0)
    with StepProbe() as probe:
        y = (x * 2 + 1).sum()  # no read-back
    assert probe.syncs == 0 and probe.ops >= 3
    for read in (
        lambda: y.item(),
        lambda: float(y),
        lambda: bool(y > 0),
        lambda: x.tolist(),
        lambda: torch.nonzero(x),
        lambda: x[x > 2],
        lambda: x.numpy(),
    ):
        with StepProbe() as probe:
            read()
        assert probe.syncs == 1, probe.sync_causes
    host = torch.tensor(3)
    with StepProbe(host_scalars=[host]) as probe:
        int(host)  # a host-side scalar by design (an optimizer's step counter) is no read-back
    assert probe.syncs == 0


def _task(path, layout: str, **config):
    config = _config(max_chunk_length=24, max_document_length=96, max_query_length=24, batch_size=4, **config)
    model = _fresh_dsr(path, config)
    ids = sorted(CORPUS)
    pairs = [
        Pair(q, ("train", i), frozenset({ids[i]}), ids[i], (ids[(i + 3) % len(ids)],)) for i, q in enumerate(QUESTIONS)
    ]
    data = TrainingData(pairs, ids, [CORPUS[i] for i in ids])
    task = DSRTask(model, data, config, Runtime("cpu"), seed=0)
    task.layout = layout
    task.rng = np.random.default_rng(0)
    return task, pairs


def test_the_engine_step_reads_back_one_value_the_loss(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(packing, "MIN_BUCKET", 1)  # several width groups even in this tiny batch
    monkeypatch.setattr(packing, "WIDTH_MULTIPLE", 8)
    for layout in LAYOUTS:
        task, pairs = _task(tiny_model_dir, layout)
        optimizer, scheduler, fit_config = dsr_optimization(task, select=False)
        loop = training_loop(task, optimizer, scheduler, fit_config, task.runtime)
        task.train()
        loop.step(pairs)  # the optimizer's state exists from here on
        with StepProbe(host_scalars=optimizer_host_scalars(optimizer)) as probe:
            loop.step(pairs)
        assert probe.syncs == 1, probe.sync_causes  # the loss the engine logs, nothing else
        assert probe.by_op["addmm"] + probe.by_op["mm"] > 0  # the probe saw the step's work


def _grads(task, pairs, step) -> tuple[float, dict[str, torch.Tensor]]:
    task.model.zero_grad(set_to_none=True)
    task.rng = np.random.default_rng(0)  # the same negatives
    loss = step(pairs)
    loss.backward()
    return float(loss), {n: p.grad.clone() for n, p in task.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_gives_the_padded_reference_loss_and_gradients(tiny_model_dir, monkeypatch, layout):
    monkeypatch.setattr(packing, "MIN_BUCKET", 1)
    monkeypatch.setattr(packing, "WIDTH_MULTIPLE", 8)
    task, pairs = _task(tiny_model_dir, layout)
    model = task.model
    for module in model.modules():  # no dropout: the paths must agree to float rounding
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(module, torch.nn.MultiheadAttention):
            module.dropout = 0.0
    widths = {s[1] for s in packing.plan_chunks(list(task.chunks.values()), task.pad_id, 24, 4, layout).shapes}
    assert layout != "packed" or len(widths) > 1  # the test exercises several backbone calls

    def reference(batch):  # the padded (batch, chunks, len) path: real chunks selected by the mask
        from lexgraph.methods.dsr.data import sample_negatives

        columns = [p.positive for p in batch] + sample_negatives(batch, task.data.article_ids, task.rng)
        q = model.encode_query(**model.query_encoder.tokenize([p.query for p in batch]))
        a = model.article_encoder(**collate_chunks([task.chunks[c] for c in columns], task.pad_id))
        mask = model.criterion.shared_positive_mask([p.gold for p in batch], columns)
        return model.criterion(q, a[: len(batch)], a[len(batch) :], other_positives=mask)

    task.train()
    loss, grads = _grads(task, pairs, task.step)  # the training step, in training mode
    model.eval()  # the reference: Hugging Face's own masks, torch's inference path of the chunk Transformer
    expected_loss, expected = _grads(task, pairs, reference)
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    assert grads.keys() == expected.keys() and any(n.startswith("article_encoder.backbone") for n in grads)
    for name in grads:
        torch.testing.assert_close(grads[name], expected[name], atol=1e-5, rtol=1e-4)

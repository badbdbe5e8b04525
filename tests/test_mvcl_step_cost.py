"""What a fine-tuning step of MVCL as published (``rerank.mvcl``, the PLM trained inside the
step) costs, without changing what it computes: the PLM runs on chunks of similar lengths
(a random batch is not padded to its longest text), the element view reads the gold
articles' states of the same step (they are not encoded a second time), and the report
reuses the kept epoch's dev scores (every dev candidate is not encoded once more)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch
import yaml

from lexgraph.methods.rerank.config import RerankConfig
from lexgraph.methods.rerank.features import TokenStore
from lexgraph.methods.rerank.plm import PLMTokens, length_chunks

ROOT = Path(__file__).resolve().parents[1]


def _tiny_xlmr():
    from transformers import XLMRobertaConfig, XLMRobertaModel

    torch.manual_seed(0)
    config = XLMRobertaConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=80,
        pad_token_id=1,
    )
    return XLMRobertaModel(config, add_pooling_layer=False)


class Recording(torch.nn.Module):
    """The PLM, recording the shape of every call's input ids."""

    def __init__(self, plm) -> None:
        super().__init__()
        self.plm, self.calls = plm, []
        self.config = plm.config

    def forward(self, input_ids, attention_mask):
        self.calls.append(tuple(input_ids.shape))
        return self.plm(input_ids=input_ids, attention_mask=attention_mask)


def _config(own: dict) -> RerankConfig:
    section = copy.deepcopy(yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))["rerank"])
    section.update({"k": 6, "hidden": 8, "batch_size": 8, "eval_batch_size": 8})
    section["mvcl"].update(own)
    return RerankConfig.from_params(section, "mvcl")


def test_length_chunks_cut_where_padding_costs_more_than_a_call():
    assert length_chunks([300, 3], overhead=64) == [[1], [0]]  # 3 + 300 + 2 * 64 < 2 * 300 + 64
    assert length_chunks([52, 50], overhead=64) == [[1, 0]]  # 2 * 52 + 64 < 50 + 52 + 2 * 64
    assert length_chunks([9, 9, 9], overhead=0) == [[0, 1, 2]]  # no saving, no cut (first minimum kept)
    lengths = [int(x) for x in np.random.default_rng(0).integers(5, 512, 48)]
    chunks = length_chunks(lengths)
    assert sorted(i for c in chunks for i in c) == list(range(48))
    padded = sum(len(c) * max(lengths[i] for i in c) for c in chunks)
    assert padded + 64 * len(chunks) <= 48 * max(lengths) + 64  # never worse than one padded batch
    assert padded < 0.75 * 48 * max(lengths)


def test_a_batch_is_encoded_in_length_chunks_with_the_states_of_each_text_alone(one_thread):
    """Each text's states are those it gets encoded alone (padding changes nothing), and the
    PLM never sees the short question padded to the long article's length."""
    plm = Recording(_tiny_xlmr()).eval()
    rows = [[0] + [5 + i % 30 for i in range(70)] + [2], [0, 7, 8, 2], [0] + [9] * 66 + [2]]
    store = PLMTokens([10, 11, 12], rows, plm, pad_id=1)
    with torch.no_grad():
        states, mask = store.batch([10, 11, 12], torch.device("cpu"))
        alone = [plm.plm(input_ids=torch.tensor([r])).last_hidden_state[0] for r in rows]
    assert states.shape == (3, 72, 16) and mask.sum(1).tolist() == [72, 4, 68]
    for i, r in enumerate(rows):
        torch.testing.assert_close(states[i, : len(r)], alone[i], rtol=1e-5, atol=1e-5)
    assert sorted(plm.calls[:2]) == [(1, 4), (2, 72)]  # one padded (3, 72) call before


def test_rows_of_a_batch_equal_a_store_batch_of_those_keys():
    """The element view's texts are B's rows: for a cached store (xrerank) exactly, bit for bit,
    what a second ``store.batch`` gave."""
    from lexgraph.methods.rerank.train import rows_of

    g = torch.Generator().manual_seed(0)
    lengths = {3: 5, 7: 9, 8: 2, 9: 4}
    store = TokenStore.from_list(list(lengths), [torch.randn(n, 6, generator=g).half() for n in lengths.values()], 6)
    golds = [7, 3, 7, 9, 3]
    b, b_mask = store.batch(golds, torch.device("cpu"))
    for wanted in ([7, 3, 9], [3, 9], [9]):
        t, t_mask = rows_of(b, b_mask, golds, wanted)
        ref, ref_mask = store.batch(wanted, torch.device("cpu"))
        assert torch.equal(t, ref) and torch.equal(t_mask, ref_mask)


def _lists(qids):
    from lexgraph.methods.rerank.train import Lists

    ids = np.array([[(q - 100 + j) % 12 for j in range(6)] for q in qids])
    return Lists(list(qids), {q: [(q - 100) % 12] for q in qids}, ids, np.tile(np.linspace(1, 0, 6), (len(qids), 1)))


def test_a_step_encodes_each_gold_article_once_and_the_report_scores_dev_once_per_epoch(one_thread, monkeypatch):
    from lexgraph.methods.rerank import train as rerank

    plm = _tiny_xlmr()
    g = np.random.default_rng(0)
    arts = [[0] + [4 + (i % 6) * 5 + int(t) for t in g.integers(0, 5, 8)] + [2] for i in range(12)]
    qs = [[0] + [4 + (q % 6) * 5 + int(t) for t in g.integers(0, 5, 4)] + [2] for q in range(16)]
    articles = PLMTokens(range(12), arts, plm, pad_id=1)
    asked: list[list[int]] = []
    batch = articles.batch

    def recording(keys, device):
        if plm.training:  # the training step's calls (dev scoring encodes in eval mode)
            asked.append(list(keys))
        return batch(keys, device)

    monkeypatch.setattr(articles, "batch", recording)
    scorings = []
    dev_pass = rerank.RerankTrainer.dev_pass
    monkeypatch.setattr(rerank.RerankTrainer, "dev_pass", lambda self: (scorings.append(1), dev_pass(self))[1])
    queries = PLMTokens(range(100, 116), qs, plm, pad_id=1)
    views = PLMTokens(range(12), [a[:5] + [3] * 4 + a[-1:] for a in arts], plm, pad_id=1)
    config = _config({"epochs": 2, "plm_layers": None})  # the whole PLM in the step (the stores above)
    assert config.lambda_ele > 0
    _, report = rerank.train(
        config,
        articles,
        queries,
        views,
        _lists(range(100, 112)),
        _lists(range(112, 116)),
        torch.device("cpu"),
        seed=13,
        plm=plm,
    )
    assert report["steps"] == 4 and len(asked) == 2 * 4  # B+ and C- per step: the element view reads B+'s rows
    assert len(scorings) == 2  # one per epoch; the report reuses the kept epoch's
    kept = next(h for h in report["history"] if h["epoch"] == report["epoch"])
    assert report["dev"]["map"] == round(kept["dev_map"], 4)

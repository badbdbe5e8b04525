"""The trainers learn, and the graph encoder is the PyG stack it claims to be.

* DSR: on a toy corpus whose questions name their article's key word, dev MRR rises from the
  untrained model's (0.46) to 1 (the training loop, loss and both encoders work together).
* GraphEncoder: a hand-built stack of PyG ``GATv2Conv`` layers (residual, ELU between
  layers, no self-loops) with the same weights gives the same node embeddings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch_geometric.nn import GATv2Conv

from helpers_dsr import _config, _fresh_dsr
from lexgraph.methods.dsr.data import Pair, TrainingData
from lexgraph.methods.dsr.train import evaluate_dsr, train_dsr
from lexgraph.methods.gnn.model import GraphEncoder, GraphEncoderConfig

WORDS = ["bail", "mariage", "enfant", "divorce", "contrat", "loi"]  # whole words of the tiny vocabulary


def toy_data() -> TrainingData:
    """Article i is about WORDS[i]; train questions ask about it one way, dev questions another."""
    texts = [f"article de la {w} et du {w}" for w in WORDS]
    ids = list(range(1, len(WORDS) + 1))
    pairs = [
        Pair(query=f"le {w} ?", key=("train", i), gold=frozenset({i}), positive=i, negatives=())
        for i, w in zip(ids, WORDS)
    ]
    return TrainingData(
        pairs=pairs,
        article_ids=ids,
        article_texts=texts,
        synthetic_pairs=[],
        dev_questions=[f"la {w} de la les" for w in WORDS],
        dev_qrels={100 + i: {i} for i in ids},
        dev_ids=[100 + i for i in ids],
    )


def test_dsr_training_raises_dev_mrr(tiny_model_dir):
    data = toy_data()
    config = _config(epochs=40, batch_size=4, lr=5e-3, temperature=0.05, token_pooling="mean", pooling="mean")
    model = _fresh_dsr(tiny_model_dir, config, seed=2)
    before = evaluate_dsr(model, data, batch_size=8)["mrr@10"]
    train_dsr(model, data, config, torch.device("cpu"), seed=3, select=False)
    after = evaluate_dsr(model, data, batch_size=8)["mrr@10"]
    assert after >= before + 0.3 and after >= 0.8, (before, after)


def test_graph_encoder_equals_a_hand_built_pyg_stack():
    torch.manual_seed(0)
    n, dim, heads = 9, 8, 2
    x = torch.randn(n, dim)  # (nodes, dim)
    edge_index = torch.tensor([[0, 0, 1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8, 0, 3]])  # (2, E)
    config = GraphEncoderConfig(
        in_dim=dim,
        model="gatv2",
        layers=3,
        hidden=None,
        heads=heads,
        concat_heads=True,
        dropout=0.0,
        residual=True,
        edge_dim=None,
        init="random",
        attention_dropout=None,
        self_loops=None,
        projections="linear",
        activation="elu",
    )
    encoder = GraphEncoder(config).eval()
    reference = [GATv2Conv(dim, dim // heads, heads=heads, concat=True, add_self_loops=False) for _ in range(3)]
    for ours, ref in zip(encoder.convs, reference):
        ref.load_state_dict(ours[0].state_dict())
    h = x
    for i, conv in enumerate(reference):
        out = conv(h, edge_index)
        h = h + (F.elu(out) if i < len(reference) - 1 else out)
    with torch.no_grad():
        assert torch.allclose(encoder(x, edge_index), h, atol=1e-6)

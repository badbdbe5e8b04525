"""Graph encoder over the legislative graph (G-DSR's LGE, QABISAR's graph network).

G-DSR (Louis, van Dijck & Spanakis, EACL 2023) passes the DSR article embeddings
through a GNN over the statute hierarchy; QABISAR (Santosh, Sarwat & Grabmair, 2024)
adds train questions and question-article edges, with edge-type embeddings and
residual multi-head attention. :class:`GraphEncoder` covers both:

    h_0     = W_in x                     (identity when hidden == input dim)
    h_l     = h_{l-1} + drop(elu(conv_l(h_{l-1}, edges)))   (residual; plain conv_L on the last layer)
    output  = W_out h_L                  (identity when hidden == input dim)

so its output lives in the input (query) space and can be scored against query
embeddings directly. With ``identity_init`` (residual, hidden = input size) every
convolution starts with zero message weights, so the untrained encoder is the identity
and training starts from the DSR embeddings instead of a random perturbation of them.
ELU (as in GAT) rather than ReLU between layers: its slope at 0 is 1, so a zero-initialised
branch is not stuck at ReLU's zero gradient. Edge features: with ``edge_dim`` set, each edge type gets a
learnable ``nn.Embedding(num_edge_types, edge_dim)`` vector fed to the convolutions as
``edge_attr``. Only the attention convolutions (``gatv2``, ``gat``) use edge features;
asking for them with ``gcn``, ``sage`` or ``graphconv`` raises a ConfigError rather than
silently ignoring them. ``heads`` only applies to ``gatv2``/``gat`` (heads are
concatenated: ``hidden`` must be divisible by ``heads``); the other models ignore it.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GATConv, GATv2Conv, GCNConv, GraphConv, SAGEConv

from lexgraph.errors import ConfigError
from lexgraph.graph import NUM_EDGE_TYPES

log = logging.getLogger(__name__)

MODELS = ("gatv2", "gat", "gcn", "sage", "graphconv")
ATTENTION_MODELS = ("gatv2", "gat")


@dataclass(frozen=True)
class GraphEncoderConfig:
    """Architecture of a :class:`GraphEncoder` (saved as JSON next to its weights)."""

    in_dim: int
    model: str = "gatv2"
    layers: int = 1
    hidden: int | None = None  # None: the input dimension
    heads: int = 1
    dropout: float = 0.1
    residual: bool = True
    edge_dim: int | None = None  # None: no edge-type features
    identity_init: bool = False  # residual branches start at zero: the encoder starts as the identity
    num_edge_types: int = NUM_EDGE_TYPES

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ConfigError(f"params.yaml: 'gnn.model' = {self.model!r}, expected one of {', '.join(MODELS)}")
        if not isinstance(self.layers, int) or self.layers < 1:
            raise ConfigError(f"params.yaml: 'gnn.layers' = {self.layers!r}, expected an integer >= 1")
        if self.hidden is not None and (not isinstance(self.hidden, int) or self.hidden < 1):
            raise ConfigError(f"params.yaml: 'gnn.hidden' = {self.hidden!r}, expected a positive integer or null")
        if not isinstance(self.heads, int) or self.heads < 1:
            raise ConfigError(f"params.yaml: 'gnn.heads' = {self.heads!r}, expected an integer >= 1")
        if self.model in ATTENTION_MODELS and self.hidden_dim % self.heads:
            raise ConfigError(
                f"params.yaml: 'gnn.hidden' = {self.hidden_dim} is not divisible by 'gnn.heads' = {self.heads}"
                " (attention heads are concatenated)"
            )
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ConfigError(f"params.yaml: 'gnn.dropout' = {self.dropout!r}, expected a number in [0, 1)")
        if self.edge_dim is not None:
            if not isinstance(self.edge_dim, int) or self.edge_dim < 1:
                raise ConfigError(
                    f"params.yaml: 'gnn.edge_dim' = {self.edge_dim!r}, expected a positive integer or null"
                )
            if self.model not in ATTENTION_MODELS:
                raise ConfigError(
                    f"params.yaml: 'gnn.edge_dim' = {self.edge_dim} needs an attention model (gatv2 or gat); "
                    f"'{self.model}' cannot use edge features: set gnn.edge_dim to null"
                )

        if self.identity_init and not (self.residual and self.hidden_dim == self.in_dim):
            raise ConfigError(
                "params.yaml: 'gnn.identity_init' needs 'gnn.residual: true' and 'gnn.hidden' equal to the "
                f"embedding size ({self.in_dim}) or null"
            )

    @property
    def hidden_dim(self) -> int:
        return self.hidden if self.hidden is not None else self.in_dim

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "GraphEncoderConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_conv(model: str, dim: int, heads: int, dropout: float, edge_dim: int | None) -> nn.Module:
    """One ``dim -> dim`` convolution of the given kind."""
    if model == "gatv2":
        return GATv2Conv(dim, dim // heads, heads=heads, dropout=dropout, edge_dim=edge_dim)
    if model == "gat":
        return GATConv(dim, dim // heads, heads=heads, dropout=dropout, edge_dim=edge_dim)
    if model == "gcn":
        return GCNConv(dim, dim)
    if model == "sage":
        return SAGEConv(dim, dim)
    if model == "graphconv":
        return GraphConv(dim, dim)
    raise ConfigError(f"params.yaml: 'gnn.model' = {model!r}, expected one of {', '.join(MODELS)}")


def zero_output(conv: nn.Module) -> None:
    """Zero the node-feature linear maps and biases of ``conv`` so that it outputs 0.

    Attention vectors and edge-feature projections keep their random init. The output is
    linear in the zeroed message weights with non-zero inputs, so they still receive
    gradients: with residual connections the encoder starts as the identity map and
    learns a correction (the zero-initialised residual branch of Goyal et al., 2017).
    """
    for name, module in conv.named_modules():
        if "edge" in name or not hasattr(module, "weight") or name == "":
            continue
        nn.init.zeros_(module.weight)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    if getattr(conv, "bias", None) is not None:
        nn.init.zeros_(conv.bias)


class GraphEncoder(nn.Module):
    """A stack of graph convolutions mapping node features to node embeddings of the same size."""

    def __init__(self, config: GraphEncoderConfig) -> None:
        super().__init__()
        self.config = config
        dim = config.hidden_dim
        self.lin_in = nn.Linear(config.in_dim, dim) if dim != config.in_dim else nn.Identity()
        self.lin_out = nn.Linear(dim, config.in_dim) if dim != config.in_dim else nn.Identity()
        self.edge_embedding = (
            nn.Embedding(config.num_edge_types, config.edge_dim) if config.edge_dim is not None else None
        )
        self.convs = nn.ModuleList(
            make_conv(config.model, dim, config.heads, config.dropout, config.edge_dim) for _ in range(config.layers)
        )
        if config.identity_init:
            for conv in self.convs:
                zero_output(conv)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_type: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` (nodes, in_dim), ``edge_index`` (2, edges), ``edge_type`` (edges,) -> (nodes, in_dim)."""
        kwargs = {}
        if self.edge_embedding is not None:
            if edge_type is None:
                raise ValueError("this GraphEncoder uses edge-type features: pass edge_type")
            kwargs["edge_attr"] = self.edge_embedding(edge_type)  # (edges, edge_dim)
        h = self.lin_in(x)  # (nodes, hidden)
        for i, conv in enumerate(self.convs):
            out = conv(h, edge_index, **kwargs)  # (nodes, hidden)
            if i < len(self.convs) - 1:  # ELU + dropout between layers, none after the last
                out = F.dropout(F.elu(out), p=self.config.dropout, training=self.training)
            h = h + out if self.config.residual else out  # (nodes, hidden)
        return self.lin_out(h)  # (nodes, in_dim)

"""QABISAR's graph attention layer, as §2.2 of the paper writes it.

Santosh, Sarwat & Grabmair, "QABISAR: Query-Article Bipartite Interactions for Statutory
Article Retrieval" (COLING 2025), §2.2, for K heads:

    x'_i     = ||_{k=1..K} σ( α^k_ii W^k_s x_i + Σ_{j ∈ N(i)} α^k_ij W^k_t x_j )
    α^k_ij   = Softmax( (a^k)^T LeakyReLU( [W^k_s x_i || W^k_t x_j || W^k_e e_ij] ) )

"where || indicates concatenation, σ indicates non-linearity, W_s, W_t indicates learnable
weight matrices", and e_ij is the edge between i and j, "which in our case indicate the
node types" (an edge-type embedding of the node features' width, App. A).

:class:`QabisarConv` computes the bracket for every head and returns the heads
concatenated; σ is the graph encoder's (:class:`lexgraph.methods.gnn.model.GraphEncoder`, which
applies it after every QABISAR layer). How the text is read where it leaves room:

* **The self term has its own weights.** The message of node i to itself is ``W_s x_i``
  and its neighbours' are ``W_t x_j`` — unlike PyG's ``GATv2Conv``, whose added self-loops
  send ``W_t x_i``. The self term's attention logit is the same function with ``j = i``,
  and its "edge" is an edge type of its own (``self_type``, one more row of the edge-type
  embedding), so it shares one softmax with the neighbours: over ``N(i) ∪ {i}``.
* **The attention sums its three parts, as GATv2 does** (Brody et al., the layer the
  paper cites): ``a^T LeakyReLU(W_s x_i + W_t x_j + W_e e_ij)``. Read literally, a
  concatenation inside the LeakyReLU splits into ``a_s^T LReLU(W_s x_i) + a_t^T
  LReLU(W_t x_j) + a_e^T LReLU(W_e e_ij)``, whose first part is the same for every j of
  node i and cancels in the softmax: x_i would then have no say in its own attention, and
  the layer would be GAT's static attention, not the GATv2 the paper cites. The
  equation's ``W_s``/``W_t``/``W_e`` names are those of PyG's GATv2Conv documentation,
  which sums them.
* **No bias and no attention dropout**: the equations have neither. LeakyReLU's negative
  slope is GATv2's 0.2 (not stated).
* The width of a head is ``dim / K``, so the concatenation has the node features' width
  and the output can be scored against query vectors by the dot product (§2.1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.utils import scatter, softmax

NEGATIVE_SLOPE = 0.2  # GATv2's (the paper does not state it)


class QabisarConv(nn.Module):
    """One QABISAR attention layer: ``(nodes, dim) -> (nodes, dim)``, heads concatenated, before σ."""

    def __init__(self, dim: int, heads: int, edge_dim: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"the width {dim} is not divisible by {heads} heads (QABISAR concatenates them)")
        self.heads, self.head_dim = heads, dim // heads
        self.lin_s = nn.Linear(dim, dim, bias=False)  # W_s: the node itself (target side)
        self.lin_t = nn.Linear(dim, dim, bias=False)  # W_t: its neighbours (source side)
        self.lin_e = nn.Linear(edge_dim, dim, bias=False)  # W_e: the edge-type embedding
        self.att = nn.Parameter(torch.empty(1, heads, self.head_dim))  # a^k
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot-uniform weights, as PyG's attention layers start."""
        for lin in (self.lin_s, self.lin_t, self.lin_e):
            nn.init.xavier_uniform_(lin.weight)
        nn.init.xavier_uniform_(self.att)

    def forward(
        self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor, self_attr: torch.Tensor
    ) -> torch.Tensor:
        """``x`` (nodes, dim); ``edge_index`` (2, edges), source -> target, no self-loops;
        ``edge_attr`` (edges, edge_dim) each edge's type vector; ``self_attr`` (edge_dim,) the
        self term's. Returns the heads' weighted sums, concatenated: (nodes, dim)."""
        nodes, heads, width = x.size(0), self.heads, self.head_dim
        source, target = edge_index  # (edges,), (edges,)
        loops = torch.arange(nodes, device=x.device)  # (nodes,)
        xs = self.lin_s(x).view(nodes, heads, width)  # W_s x: (nodes, heads, width)
        xt = self.lin_t(x).view(nodes, heads, width)  # W_t x: (nodes, heads, width)
        edge = self.lin_e(torch.cat([edge_attr, self_attr.expand(nodes, -1)])).view(-1, heads, width)  # (e + n, ...)
        receiver = torch.cat([target, loops])  # (edges + nodes,): i of each term
        sender_t = torch.cat([xt[source], xt])  # W_t x_j, and W_t x_i for the self term's logit
        logits = (F.leaky_relu(xs[receiver] + sender_t + edge, NEGATIVE_SLOPE) * self.att).sum(-1)  # (e + n, heads)
        alpha = softmax(logits, receiver, num_nodes=nodes)  # over N(i) ∪ {i}: (edges + nodes, heads)
        messages = torch.cat([xt[source], xs])  # W_t x_j from the neighbours, W_s x_i from itself
        out = scatter(alpha.unsqueeze(-1) * messages, receiver, dim=0, dim_size=nodes, reduce="sum")  # (n, h, w)
        return out.reshape(nodes, heads * width)  # (nodes, dim)

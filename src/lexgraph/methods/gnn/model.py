"""Graph encoder over the legislative graph (G-DSR's LGE, QABISAR's graph network).

G-DSR (Louis, van Dijck & Spanakis, EACL 2023) passes the DSR article embeddings
through a GNN over the statute hierarchy; QABISAR (Santosh, Sarwat & Grabmair, 2024)
adds train questions and question-article edges, with edge-type embeddings and
residual multi-head attention. :class:`GraphEncoder` covers both:

    h_0     = W_in x                     (identity when hidden == input dim)
    h_l     = h_{l-1} + drop(elu(sum_g conv_{l,g}(h_{l-1}, edges of group g)))   (residual;
              no ELU/dropout after the last layer)
    output  = W_out h_L                  (identity when hidden == input dim)

so its output lives in the input (query) space and can be scored against query
embeddings directly. **Edge groups**: each layer has one convolution per group of edge
types (``edge_groups``), summed, as a relational GNN does: QABISAR's statute edges and
its question-article edges get their own attention and weights, so each can start, and
be ablated, on its own. One group (G-DSR) is a plain stack of convolutions.

**Initialisation** (``init``):

* ``random``: PyG's initialisation (the papers');
* ``identity``: every convolution outputs 0 (zero message weights, Goyal et al. 2017's
  zero-initialised residual branch), so the untrained encoder is the identity map and
  training starts from the DSR embeddings;
* ``prior``: as ``identity``, except the **last** layer's first group (the statute
  edges), whose messages start as ``prior_weight * x_j`` with uniform attention. With
  residual connections and no self-loops, an article whose only in-neighbour is its
  deepest heading then outputs ``x_a + prior_weight * x_heading``: with heading features
  that average the heading's articles (:mod:`lexgraph.graph.hierarchy`), the untrained
  encoder *is* the hierarchy prior. The last layer carries it because it has no ELU.

**Self-loops** (``self_loops``; unset: residual encoders add none, the residual being the
self term, and plain stacks add PyG's). With edge features, self-loops are edges of their
own type (index ``num_edge_types``) with their own embedding, so each node attends to itself
with its neighbours in one softmax (QABISAR's alpha_ii); without, PyG adds them.
**Activation** between layers (``activation``): ELU (lexgraph's: its slope at 0 is 1, so a
zero-initialised branch is not stuck at ReLU's zero gradient) or ReLU (G-DSR's public code,
maastrichtlawtech/gdsr ``src/models/gnn.py``, ReLU then dropout between GATv2 layers).
**Widths** (``projections``): ``linear`` maps the input to ``hidden`` and back around the
stack; ``convolutions`` lets the first convolution widen and the last narrow (the public
code's ``c_in -> c_hidden -> ... -> c_out`` stack, no extra maps). ``attention_dropout``
is the convolutions' own dropout on attention coefficients (unset: ``dropout``). Heads are concatenated
(``concat_heads``; ``hidden`` must be divisible by ``heads``) or averaged (each head of
full width: G-DSR's LGE size). Edge features: with ``edge_dim`` set, each edge type gets
a learnable ``nn.Embedding(num_edge_types, edge_dim)`` vector fed to the attention as
``edge_attr``. Only the attention convolutions (``gatv2``, ``gat``) use edge features
or ``prior`` initialisation; asking for them with ``gcn``, ``sage`` or ``graphconv`` is a
ConfigError rather than silently ignored.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GATConv, GATv2Conv, GCNConv, GraphConv, SAGEConv

from lexgraph.data.schema import HIERARCHY_LEVELS
from lexgraph.graph.build import NUM_EDGE_TYPES
from lexgraph.methods.gnn.qabisar_conv import QabisarConv

log = logging.getLogger(__name__)

MODELS = ("gatv2", "gat", "gcn", "sage", "graphconv")
ATTENTION_MODELS = ("gatv2", "gat")


INITS = ("random", "identity", "prior")
#: ``stack``: G-DSR's stack of ``model`` convolutions, the activation between layers (and
#: lexgraph's options: residual, projections, edge groups, prior start); ``qabisar``: QABISAR's
#: §2.2 layer (:class:`~lexgraph.methods.gnn.qabisar_conv.QabisarConv`), σ after every layer
LAYERS = ("stack", "qabisar")
PROJECTIONS = ("linear", "convolutions")
ACTIVATIONS = {"elu": F.elu, "relu": F.relu}

#: The deepest useful stack: each layer is one hop, and an article's farthest heading is
#: ``len(HIERARCHY_LEVELS)`` = 8 hops up its chain (law type, code, book, part, act,
#: chapter, section, subsection), so after 8 layers every heading above it has been heard;
#: more layers add parameters and over-smoothing, not information (the papers use 1-3).
MAX_LAYERS = len(HIERARCHY_LEVELS)


@dataclass(frozen=True)
class GraphEncoderConfig:
    """Architecture of a :class:`GraphEncoder` (saved as JSON next to its weights)."""

    in_dim: int | None  # None: not known yet (the embeddings give it: :meth:`with_input`)
    model: str
    layers: int
    hidden: int | None  # None: the input dimension
    heads: int
    concat_heads: bool  # heads concatenated (hidden / heads each) or averaged (hidden each)
    dropout: float
    residual: bool
    edge_dim: int | None  # None: no edge-type features
    init: str  # random | identity | prior
    attention_dropout: float | None  # on the attention coefficients (None: ``dropout``, lexgraph's)
    self_loops: bool | None  # None: without a residual only (lexgraph's); with edge_dim, own edge type
    projections: str  # linear: W_in/W_out around the stack | convolutions: the first and last convs
    activation: str  # between layers: elu | relu (G-DSR's public code)
    layer: str = "stack"  # stack (G-DSR) | qabisar (QABISAR §2.2)
    prior_weight: float = 0.0  # init=prior: the statute messages' starting weight
    edge_groups: tuple[tuple[int, ...], ...] = (tuple(range(NUM_EDGE_TYPES)),)  # a convolution per group
    num_edge_types: int = NUM_EDGE_TYPES

    def __post_init__(self) -> None:
        object.__setattr__(self, "edge_groups", tuple(tuple(int(t) for t in g) for g in self.edge_groups))

    @property
    def adds_self_loops(self) -> bool:
        return (not self.residual) if self.self_loops is None else self.self_loops

    @property
    def typed_self_loops(self) -> bool:
        """Self-loops added as edges of their own type (``num_edge_types``) with their own
        edge embedding, so the self term alpha_ii is attended with the neighbours (QABISAR)."""
        return self.adds_self_loops and self.edge_dim is not None

    @property
    def hidden_dim(self) -> int:
        if self.hidden is None and self.in_dim is None:
            raise ValueError("the width of a GraphEncoderConfig without in_dim is not known yet")
        return self.hidden if self.hidden is not None else self.in_dim

    def with_input(self, in_dim: int, prior_weight: float = 0.0) -> GraphEncoderConfig:
        """This architecture for ``in_dim``-dimensional node features; ``prior_weight``
        applies to ``init: prior`` only (0 otherwise)."""
        return replace(self, in_dim=in_dim, prior_weight=prior_weight if self.init == "prior" else 0.0)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GraphEncoderConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def parameter_count(self) -> int:
        """Trainable parameters of the encoder this config builds."""
        return sum(p.numel() for p in GraphEncoder(self).parameters())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: what QABISAR's layer (§2.2) fixes: one GATv2-style attention over every edge type with its own
#: self term and edge-type vectors, heads concatenated to the node width, σ after every layer, no
#: residual; the keys that would add what the equation does not have are refused
_QABISAR_LAYER = {
    "model": ("gatv2", "gatv2 (QABISAR's attention is GATv2's, cited in §2.2)"),
    "residual": (False, "false (the layer's self term is alpha_ii W_s x_i, not a skip)"),
    "init": ("random", "random"),
    "hidden": (None, "null (the heads are concatenated back to the node width)"),
    "projections": ("linear", "linear (no maps around the stack)"),
    "concat_heads": (True, "true (the heads are concatenated: ||_k)"),
    "self_loops": (True, "true (the self term alpha_ii is part of the layer)"),
}


def architecture_problem(config: GraphEncoderConfig) -> tuple[str, Any, str] | None:
    """The first rule of the keys together that ``config`` breaks, as ``(key, value, expected)``
    (the settings word it for params.yaml), or None. The width is checked where it is known
    (``hidden``, or the input's once :meth:`GraphEncoderConfig.with_input` gives it)."""
    attention = config.model in ATTENTION_MODELS
    if config.layer == "qabisar":
        for key, (value, expected) in _QABISAR_LAYER.items():
            if getattr(config, key) != value:
                return key, getattr(config, key), f"{expected} with layer: qabisar"
        if config.edge_dim is None:
            return "edge_dim", None, "the edge types' width with layer: qabisar"
        if config.attention_dropout:
            return "attention_dropout", config.attention_dropout, "0 with layer: qabisar (its equation has none)"
        if len(config.edge_groups) != 1:
            return "edge_attention", "per_group", "joint with layer: qabisar (it attends every edge type jointly)"
    widths = [w for w in (config.hidden, config.in_dim) if w is not None]
    widths = widths[:1] if config.projections == "linear" or config.in_dim is None else widths
    if attention and config.concat_heads and any(w % config.heads for w in widths):
        width = " and ".join(map(str, sorted(set(widths))))
        return "heads", config.heads, f"a divisor of {width} (heads are concatenated: concat_heads is true)"
    if config.edge_dim is not None and not attention:
        return "edge_dim", config.edge_dim, f"null with model: {config.model} (only gatv2 and gat use edge features)"
    if config.init != "random" and not config.residual:
        return "init", config.init, "random without residual: true (the identity start needs the skip)"
    if config.init != "random" and config.in_dim is not None and config.hidden not in (None, config.in_dim):
        return "hidden", config.hidden, f"null or the embedding size ({config.in_dim}) with init: {config.init}"
    if config.init == "prior" and not attention:
        return "init", "prior", f"random or identity with model: {config.model} (prior needs an attention model)"
    if config.projections == "convolutions" and config.residual and config.hidden is not None:
        return "projections", "convolutions", "linear with residual: true (a residual cannot add across widths)"
    return None


def make_conv(config: GraphEncoderConfig, in_dim: int | None = None, out_dim: int | None = None) -> nn.Module:
    """One ``in_dim -> out_dim`` convolution of ``config``'s kind (both default to the hidden width)."""
    dim, heads = config.hidden_dim, config.heads
    in_dim, out_dim = in_dim or dim, out_dim or dim
    if config.layer == "qabisar":
        return QabisarConv(dim, heads, config.edge_dim)
    self_loops = config.adds_self_loops and not config.typed_self_loops  # typed ones are edges of their own
    if config.model in ATTENTION_MODELS:
        conv = GATv2Conv if config.model == "gatv2" else GATConv
        out = out_dim // heads if config.concat_heads else out_dim
        dropout = config.dropout if config.attention_dropout is None else config.attention_dropout
        return conv(
            in_dim,
            out,
            heads=heads,
            concat=config.concat_heads,
            dropout=dropout,
            edge_dim=config.edge_dim,
            add_self_loops=self_loops,
        )
    if config.model == "gcn":
        return GCNConv(in_dim, out_dim, add_self_loops=self_loops)
    if config.model == "sage":
        return SAGEConv(in_dim, out_dim)
    return GraphConv(in_dim, out_dim)


def layer_widths(config: GraphEncoderConfig) -> list[tuple[int, int]]:
    """``(in, out)`` of each layer: the hidden width throughout (``projections: linear``), or,
    with ``projections: convolutions`` (G-DSR's public code, ``src/models/gnn.py``), the
    first layer from the input width and the last back to it."""
    dim, in_dim = config.hidden_dim, config.in_dim
    if config.projections == "linear":
        return [(dim, dim)] * config.layers
    return [(in_dim if i == 0 else dim, in_dim if i == config.layers - 1 else dim) for i in range(config.layers)]


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


def scaled_identity_messages(conv: nn.Module, weight: float) -> None:
    """Make attention convolution ``conv`` send ``weight * x_j`` with uniform attention.

    The source map (GATv2's ``lin_l``, GAT's ``lin``) becomes ``weight * I`` for every head
    (a concatenated head gets its slice of the identity, an averaged head all of it), the
    attention vectors become 0 (uniform softmax over the in-neighbours) and the biases 0.
    The target map and the edge projection keep their init: with zero attention they do
    not change the output, and they receive gradients once attention moves.
    """
    zero_output(conv)
    source = conv.lin_l if isinstance(conv, GATv2Conv) else conv.lin
    out_dim, in_dim = source.weight.shape
    eye = torch.eye(in_dim)
    with torch.no_grad():
        source.weight.copy_(weight * (eye if out_dim == in_dim else eye.repeat(out_dim // in_dim, 1)))
        for name in ("att", "att_src", "att_dst", "att_edge"):
            if getattr(conv, name, None) is not None:
                getattr(conv, name).zero_()


class GraphEncoder(nn.Module):
    """A stack of graph convolutions (one per edge group and layer) mapping node features
    to node embeddings of the same size."""

    def __init__(self, config: GraphEncoderConfig) -> None:
        super().__init__()
        if config.in_dim is None:
            raise ValueError("a GraphEncoder needs the input dimension: build it from config.with_input(in_dim)")
        self.config = config
        dim = config.hidden_dim
        project = config.projections == "linear" and dim != config.in_dim
        self.lin_in = nn.Linear(config.in_dim, dim) if project else nn.Identity()
        self.lin_out = nn.Linear(dim, config.in_dim) if project else nn.Identity()
        types = config.num_edge_types + int(config.typed_self_loops)  # the self-loops' own type last
        self.edge_embedding = nn.Embedding(types, config.edge_dim) if config.edge_dim is not None else None
        self.convs = nn.ModuleList(
            nn.ModuleList(make_conv(config, i, o) for _ in config.edge_groups) for i, o in layer_widths(config)
        )
        for layer in self.convs if config.init != "random" else ():
            for conv in layer:
                zero_output(conv)
        if config.init == "prior" and config.prior_weight:
            scaled_identity_messages(self.convs[-1][0], config.prior_weight)
        for g, group in enumerate(config.edge_groups):
            self.register_buffer(f"group_{g}", torch.tensor(group, dtype=torch.long), persistent=False)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_type: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` (nodes, in_dim), ``edge_index`` (2, edges), ``edge_type`` (edges,) -> (nodes, in_dim)."""
        if self.config.layer == "qabisar":
            return self._qabisar(x, edge_index, edge_type)
        if edge_type is None:
            if self.edge_embedding is not None or len(self.config.edge_groups) > 1:
                raise ValueError("this GraphEncoder uses edge types (features or groups): pass edge_type")
            masks = [None]
        else:
            masks = [torch.isin(edge_type, getattr(self, f"group_{g}")) for g in range(len(self.config.edge_groups))]
        if self.config.typed_self_loops:  # (2, edges + nodes): every group's convolution gets the self term
            edge_index, edge_type, masks = self._with_self_loops(x.size(0), edge_index, edge_type, masks)
        edge_attr = self.edge_embedding(edge_type) if self.edge_embedding is not None else None  # (edges, edge_dim)
        activation = ACTIVATIONS[self.config.activation]
        h = self.lin_in(x)  # (nodes, hidden)
        for i, layer in enumerate(self.convs):
            out = sum(self._conv(conv, h, edge_index, edge_attr, mask) for conv, mask in zip(layer, masks))
            if i < len(self.convs) - 1:  # activation + dropout between layers, none after the last
                out = F.dropout(activation(out), p=self.config.dropout, training=self.training)
            h = h + out if self.config.residual else out  # (nodes, hidden)
        return self.lin_out(h)  # (nodes, in_dim)

    def _qabisar(self, x: torch.Tensor, edge_index: torch.Tensor, edge_type: torch.Tensor | None) -> torch.Tensor:
        """QABISAR §2.2: every layer ``σ(QabisarConv(h))``, dropout between layers; the edge-type
        embedding is shared by the layers, the self term's type is the last row."""
        if edge_type is None:
            raise ValueError("QABISAR's layer attends over edge types: pass edge_type")
        activation = ACTIVATIONS[self.config.activation]
        edge_attr = self.edge_embedding(edge_type)  # (edges, edge_dim)
        self_attr = self.edge_embedding.weight[self.config.num_edge_types]  # (edge_dim,)
        h = x  # (nodes, dim)
        for i, (conv,) in enumerate(self.convs):
            h = activation(conv(h, edge_index, edge_attr, self_attr))  # σ on every layer, the last included
            if i < len(self.convs) - 1:
                h = F.dropout(h, p=self.config.dropout, training=self.training)
        return h  # (nodes, dim)

    def _with_self_loops(self, nodes: int, edge_index: torch.Tensor, edge_type: torch.Tensor, masks: list):
        loops = torch.arange(nodes, device=edge_index.device)  # (nodes,)
        edge_index = torch.cat([edge_index, torch.stack([loops, loops])], dim=1)  # (2, edges + nodes)
        edge_type = torch.cat([edge_type, torch.full_like(loops, self.config.num_edge_types)])  # (edges + nodes,)
        keep = torch.ones(nodes, dtype=torch.bool, device=edge_index.device)  # (nodes,)
        return edge_index, edge_type, [torch.cat([m, keep]) for m in masks]

    @staticmethod
    def _conv(conv, h, edge_index, edge_attr, mask) -> torch.Tensor:
        if mask is not None:
            edge_index = edge_index[:, mask]  # (2, group edges)
            edge_attr = edge_attr[mask] if edge_attr is not None else None
        return conv(h, edge_index, edge_attr=edge_attr) if edge_attr is not None else conv(h, edge_index)

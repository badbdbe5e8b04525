"""The article side of a lexgraph export as sentence-transformers modules, standalone.

``lexgraph export`` copies this file into the exported folder as ``lexgraph_st.py``; the folder's
``router_config.json`` names its classes, so ``SentenceTransformer(OUT, trust_remote_code=True)``
(sentence-transformers >= 6) loads them from there and ``encode_document`` runs them, with only
torch, transformers, safetensors and sentence-transformers installed: no lexgraph. It therefore
imports nothing from lexgraph; ``tests/test_export.py`` holds it to lexgraph's own article vectors.

* :class:`ArticleEncoder`: G-DSR's hierarchical article encoder (Louis et al., EACL 2023, §3.1:
  "we split the article into passages … encode them … and aggregate"), in inference: each article's
  tokens cut into chunks of ``max_chunk_length`` (``[CLS] prefix … [SEP]`` each, at most
  ``max_document_length // max_chunk_length`` chunks); one vector per chunk from the backbone
  (``cls`` or masked ``mean`` of its tokens); the chunk-position embeddings added; the chunk-level
  ``nn.TransformerEncoder`` (none when ``num_layers`` is 0) over the real chunks; then ``max``,
  ``mean`` or ``token_mean`` (weighted by each chunk's token count: E5's windowed mean) pooling.
  lexgraph's ``zeroshot`` is this encoder with no chunk layers and ``token_mean`` pooling.
* :class:`GraphArticleSide`: the article side of a system whose article vectors come from a pass
  over the whole statute graph (``hprior``, the graph encoders): no text encoder can give them, so
  ``encode_document`` refuses in one line; the export's ``article_vectors.safetensors`` holds them
  and ``lexgraph index`` makes them for a corpus of one's own.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file, save_file
from sentence_transformers.base.modules import InputModule
from torch import nn
from transformers import AutoModel, AutoTokenizer

#: the chunk-level weights (``chunk_positions.weight``, ``chunk_transformer.layers.*``)
WEIGHTS = "chunk_module.safetensors"


class ArticleEncoder(InputModule):
    """Texts -> ``sentence_embedding`` ``(batch, dim)``, as lexgraph's ``HierarchicalArticleEncoder``."""

    config_file_name = "lexgraph_article.json"
    config_keys = [
        "max_chunk_length",
        "max_document_length",
        "pooling",
        "num_layers",
        "num_heads",
        "norm_first",
        "layer_norm_eps",
        "token_pooling",
        "prefix",
        "model_kwargs",
    ]
    save_in_root = False

    def __init__(self, model_name_or_path: str, **config) -> None:
        super().__init__()
        for key in self.config_keys:
            setattr(self, key, config[key])
        self.tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
        self.backbone = AutoModel.from_pretrained(model_name_or_path, **self.model_kwargs)
        dim = self.backbone.config.hidden_size
        self.max_chunks = self.max_document_length // self.max_chunk_length
        self.chunk_positions = nn.Embedding(self.max_chunks, dim)
        self.chunk_transformer = None
        if self.num_layers:
            layer = nn.TransformerEncoderLayer(
                d_model=dim,
                nhead=self.num_heads,
                dim_feedforward=4 * dim,
                activation="gelu",
                layer_norm_eps=self.layer_norm_eps,
                batch_first=True,
                norm_first=self.norm_first,
            )
            self.chunk_transformer = nn.TransformerEncoder(layer, self.num_layers, enable_nested_tensor=False)
        weights = os.path.join(model_name_or_path, WEIGHTS)
        if os.path.isfile(weights):
            self.load_state_dict(load_file(weights), strict=False)  # the backbone's weights are loaded above

    def get_embedding_dimension(self) -> int:
        return int(self.backbone.config.hidden_size)

    def _chunks(self, texts: list[str]) -> list[list[list[int]]]:
        """Token ids per chunk of each text: ``[CLS] prefix piece [SEP]``, pieces of ``body`` tokens."""
        tok = self.tokenizer
        prefix = tok(self.prefix.strip(), add_special_tokens=False)["input_ids"] if self.prefix.strip() else []
        body = self.max_chunk_length - 2 - len(prefix)
        ids = tok(texts, add_special_tokens=False, truncation=True, max_length=self.max_chunks * body)["input_ids"]
        pieces = [[row[i : i + body] for i in range(0, len(row), body)] or [[]] for row in ids]
        return [[[tok.cls_token_id, *prefix, *piece, tok.sep_token_id] for piece in doc] for doc in pieces]

    def preprocess(self, inputs, prompt: str | None = None, **kwargs) -> dict[str, torch.Tensor]:
        """Padded chunk ids and mask ``(batch, chunks, length)``; an empty chunk slot is all padding."""
        texts = [(prompt or "") + text for text in inputs]
        chunks = self._chunks(texts)
        shape = (len(chunks), max(len(doc) for doc in chunks), max(len(c) for doc in chunks for c in doc))
        input_ids = torch.full(shape, self.tokenizer.pad_token_id, dtype=torch.long)  # (batch, chunks, length)
        attention_mask = torch.zeros(shape, dtype=torch.long)  # (batch, chunks, length)
        for b, doc in enumerate(chunks):
            for c, chunk in enumerate(doc):
                input_ids[b, c, : len(chunk)] = torch.tensor(chunk)
                attention_mask[b, c, : len(chunk)] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    def forward(self, features: dict, **kwargs) -> dict:
        input_ids, attention_mask = features["input_ids"], features["attention_mask"]
        tokens = attention_mask.sum(dim=-1)  # (batch, chunks)
        real = tokens > 0  # (batch, chunks)
        mask = attention_mask[real]  # (real chunks, length)
        hidden = self.backbone(input_ids=input_ids[real], attention_mask=mask).last_hidden_state  # (m, length, dim)
        if self.token_pooling == "cls":
            vectors = hidden[:, 0]  # (m, dim)
        else:
            weights = mask.unsqueeze(-1).to(hidden.dtype)  # (m, length, 1)
            vectors = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)  # (m, dim)
        chunks = vectors.new_zeros(*real.shape, vectors.size(-1))  # (batch, chunks, dim)
        chunks[real] = vectors
        positions = self.chunk_positions(torch.arange(chunks.size(1), device=chunks.device))  # (chunks, dim)
        chunks = chunks + positions.unsqueeze(0).to(chunks.dtype)
        if self.chunk_transformer is not None:
            chunks = self.chunk_transformer(chunks, src_key_padding_mask=~real)  # (batch, chunks, dim)
        keep = real.unsqueeze(-1)  # (batch, chunks, 1)
        if self.pooling == "max":
            pooled = chunks.masked_fill(~keep, float("-inf")).max(dim=1).values
        else:
            weight = (tokens.to(chunks.dtype) if self.pooling == "token_mean" else real.to(chunks.dtype)) * real
            weight = weight.unsqueeze(-1)  # (batch, chunks, 1)
            pooled = (chunks.masked_fill(~keep, 0.0) * weight).sum(dim=1) / weight.sum(dim=1)  # (batch, dim)
        features["sentence_embedding"] = pooled  # (batch, dim)
        return features

    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        self.backbone.save_pretrained(output_path)
        self.tokenizer.save_pretrained(output_path)
        state = {
            k: v.detach().cpu().contiguous() for k, v in self.state_dict().items() if not k.startswith("backbone.")
        }
        save_file(dict(sorted(state.items())), os.path.join(output_path, WEIGHTS))
        self.save_config(output_path)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", **kwargs) -> ArticleEncoder:
        hub = {k: kwargs[k] for k in ("token", "cache_folder", "revision", "local_files_only") if k in kwargs}
        directory = cls.load_dir_path(model_name_or_path, subfolder=subfolder, **hub)
        with open(os.path.join(directory, cls.config_file_name), encoding="utf-8") as f:
            return cls(directory, **json.load(f))


class GraphArticleSide(InputModule):
    """The article side of a graph system: ``encode_document`` refuses in one line (module docstring)."""

    config_file_name = "lexgraph_article.json"
    config_keys = ["system", "dim"]
    save_in_root = False

    def __init__(self, system: str, dim: int) -> None:
        super().__init__()
        self.system, self.dim = system, int(dim)

    def get_embedding_dimension(self) -> int:
        return self.dim

    def preprocess(self, inputs, prompt: str | None = None, **kwargs) -> dict:
        raise ValueError(
            f"lexgraph's {self.system} gets its article vectors from a pass over the whole statute graph, not "
            "from article texts: use this export's article_vectors.safetensors, or `lexgraph index` for your own corpus"
        )

    def forward(self, features: dict, **kwargs) -> dict:  # pragma: no cover - preprocess refuses first
        raise NotImplementedError

    def save(self, output_path: str, *args, **kwargs) -> None:
        self.save_config(output_path)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", **kwargs) -> GraphArticleSide:
        return cls(**cls.load_config(model_name_or_path, subfolder=subfolder))

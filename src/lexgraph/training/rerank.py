"""MVCL re-ranker: frozen token states, triples, training with the multi-view losses.

The ``mvcl`` system re-ranks the top-``k`` articles of a first-stage system
(``rerank.first_stage``) with MVCL's interaction network (:mod:`lexgraph.models.mvcl`;
Wang et al., "Legal Element-oriented Modeling with Multi-view Contrastive Learning for
Legal Case Retrieval", IJCNN 2022, arXiv:2210.05188). Two stages:

* ``encode_rerank`` (:func:`build_features`): the base encoder (``models/pretrain``,
  multilingual-e5-small on the sample) stays **frozen**; its last-layer token states are
  cached once, in float16: every article's first ``max_article_length`` tokens
  (``passage: `` prefix), the train and dev questions' first ``max_query_length`` tokens
  (``query: ``), and the element view T+ (:func:`lexgraph.elements.element_view`) of the
  gold articles of the train questions. The test questions are never read here.
* ``rerank`` (:func:`train`): triples (A, B+, C-) pair each (train question, gold
  article) with ``negatives`` non-gold articles drawn, fresh every epoch, from the first
  stage's top-``k`` for that question. The loss is
  ``L + lambda_case * L_case + lambda_ele * L_ele`` (:mod:`lexgraph.losses`); AdamW
  with linear warm-up and decay. After every epoch the dev questions' top-``k`` are
  re-ranked and the best epoch by ``metric`` is kept. Finally the re-ranker's score is
  interpolated with the first stage's (both z-normalised over the question's top-``k``):
  ``alpha * z(mvcl) + (1 - alpha) * z(first)``, alpha chosen on dev among
  ``interpolation`` (ties: the first listed); alpha = 0 is the first stage itself.

A re-ranked list is the top-``k`` in fused order followed by the rest of the first
stage's list in its own order, scored below the top-``k``.

:class:`RerankTrainer` is a task of the shared training loop
(:func:`lexgraph.training.engine.fit`): ``batches(epoch)`` (a seeded iterator),
``step(batch) -> (loss, parts)`` and ``evaluate() -> dev metrics`` (best epoch by ``metric``).
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from lexgraph.config import autocast, bad_value, expectation, refuse_held_out, section_config
from lexgraph.data.schema import split_questions
from lexgraph.elements import PATTERNS, element_sentences, element_view, token_sentence_flags
from lexgraph.errors import DataError, LexgraphError
from lexgraph.metrics import METRICS, evaluate_run

log = logging.getLogger(__name__)

SECTION = "rerank"
SYSTEM = "mvcl"
MODEL_DIR = Path("models/mvcl")
FEATURES_DIR = Path("data/rerank")
WEIGHTS = "mvcl.safetensors"
SETTINGS = "mvcl.json"
#: Depth of the lists scored on dev (what evaluate's deepest metric reads).
SCORE_DEPTH = max(int(m.split("@")[1]) for m in METRICS if "@" in m)


# ---------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------


def _first_stages() -> tuple[str, ...]:
    from lexgraph.retrieval import SYSTEMS

    return tuple(s for s in SYSTEMS if s != SYSTEM)


@dataclass(frozen=True)
class RerankConfig:
    """The ``rerank`` section of params.yaml."""

    enabled: bool = True  # false: encode_rerank and rerank write placeholders in seconds and evaluate skips mvcl
    first_stage: str = field(default="dsr", metadata={"expected": "a retrieval system other than mvcl (bm25, zeroshot, dsr, gdsr, qabisar, hybrid)"})
    k: int = field(default=100, metadata={"expected": "an integer >= 2 (articles re-ranked per question)"})
    max_query_length: int = field(default=64, metadata={"expected": "an integer >= 8"})
    max_article_length: int = field(default=128, metadata={"expected": "an integer >= 8"})
    encode_batch_size: int = field(default=32, metadata={"expected": "a positive integer"})
    hidden: int = field(default=128, metadata={"expected": "an even positive integer"})
    dropout: float = field(default=0.1, metadata={"expected": "a number in [0, 1)"})
    alignment: str = field(default="plm", metadata={"expected": "plm (word-level attention on the PLM's states) or projected (on the learned projection)"})
    align_temperature: float = field(default=0.05, metadata={"expected": "a number > 0 (cosine / temperature of the plm alignment)"})
    match_features: bool = True  # H_{a,b} ends with the PLM's alignment scores (MaxSim both ways, mean cosine)
    warm_start: bool = True  # untrained network = MaxSim ranking (needs match_features); epoch 0 can be kept
    negatives: int = field(default=2, metadata={"expected": "a positive integer (C- per question and gold article per epoch)"})
    swap: bool = True
    lambda_case: float = field(default=0.01, metadata={"expected": "a number >= 0"})
    lambda_ele: float = field(default=0.01, metadata={"expected": "a number >= 0"})
    t1: float = field(default=0.1, metadata={"expected": "a number > 0 (case-view temperature)"})
    t2: float = field(default=0.1, metadata={"expected": "a number > 0 (element-view temperature)"})
    element_patterns: list[str] = field(default_factory=lambda: list(PATTERNS),
                                        metadata={"expected": f"a non-empty list of distinct pattern families among {', '.join(PATTERNS)}"})
    element_budget: int = field(default=128, metadata={"expected": "an integer >= 8 (L1: tokens of the element view)"})
    del_token: str = field(default="<mask>", metadata={"expected": "a token of the base encoder's vocabulary"})
    epochs: int = field(default=3, metadata={"expected": "a positive integer"})
    batch_size: int = field(default=16, metadata={"expected": "a positive integer (triples per step)"})
    lr: float = field(default=1.0e-3, metadata={"expected": "a number > 0"})
    warmup_ratio: float = field(default=0.1, metadata={"expected": "a number in [0, 1)"})
    weight_decay: float = field(default=0.01, metadata={"expected": "a number >= 0"})
    max_grad_norm: float = field(default=1.0, metadata={"expected": "a number > 0"})
    split: str = field(default="dev", metadata={"expected": "dev (the split that chooses the epoch and alpha)"})
    metric: str = field(default="map", metadata={"expected": f"one of {', '.join(METRICS)}"})
    interpolation: list[float] = field(default_factory=lambda: [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
                                       metadata={"expected": "a non-empty list of distinct numbers in [0, 1] (the re-ranker's weight)"})
    eval_batch_size: int = field(default=128, metadata={"expected": "a positive integer"})

    @classmethod
    def from_params(cls, params: dict[str, Any] | None) -> "RerankConfig":
        return section_config(cls, params, SECTION)

    def validate(self) -> None:
        def bad(key: str) -> Exception:
            return bad_value(SECTION, key, getattr(self, key), expectation(RerankConfig, key))

        refuse_held_out(SECTION, "split", self.split, expectation(RerankConfig, "split"))
        if self.first_stage not in _first_stages():
            raise bad("first_stage")
        if self.k < 2:
            raise bad("k")
        for key in ("max_query_length", "max_article_length", "element_budget"):
            if getattr(self, key) < 8:
                raise bad(key)
        for key in ("encode_batch_size", "negatives", "epochs", "batch_size", "eval_batch_size"):
            if getattr(self, key) < 1:
                raise bad(key)
        if self.hidden < 2 or self.hidden % 2:
            raise bad("hidden")
        if not 0.0 <= self.dropout < 1.0:
            raise bad("dropout")
        for key in ("lambda_case", "lambda_ele", "weight_decay"):
            if getattr(self, key) < 0:
                raise bad(key)
        from lexgraph.models.mvcl import ALIGNMENTS

        if self.alignment not in ALIGNMENTS:
            raise bad("alignment")
        for key in ("t1", "t2", "lr", "max_grad_norm", "align_temperature"):
            if getattr(self, key) <= 0:
                raise bad(key)
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise bad("warmup_ratio")
        pats = self.element_patterns
        if not pats or any(p not in PATTERNS for p in pats) or len(set(pats)) < len(pats):
            raise bad("element_patterns")
        if not self.del_token.strip():
            raise bad("del_token")
        if self.split not in ("dev", "train"):
            raise bad("split")
        if self.metric not in METRICS:
            raise bad("metric")
        a = self.interpolation
        if not a or any(not 0.0 <= x <= 1.0 for x in a) or len(set(a)) < len(a):
            raise bad("interpolation")


# ---------------------------------------------------------------------------
# Token states: a ragged store
# ---------------------------------------------------------------------------


class TokenStore:
    """Token states of many texts in one ragged tensor: ``states`` ``(total, dim)``,
    ``offsets`` ``(n + 1,)``, ``ids`` ``(n,)``; :meth:`batch` pads a selection."""

    def __init__(self, ids: np.ndarray, offsets: torch.Tensor, states: torch.Tensor) -> None:
        self.ids = np.asarray(ids, dtype=np.int64)
        self.offsets = offsets.long()
        self.states = states
        self.row = {int(i): r for r, i in enumerate(self.ids.tolist())}

    @classmethod
    def from_list(cls, ids: Sequence[int], states: Sequence[torch.Tensor], dim: int) -> "TokenStore":
        lengths = torch.tensor([s.shape[0] for s in states], dtype=torch.long)
        offsets = torch.zeros(len(states) + 1, dtype=torch.long)
        offsets[1:] = torch.cumsum(lengths, 0)
        flat = torch.cat(list(states), 0) if states else torch.zeros(0, dim, dtype=torch.float16)
        return cls(np.asarray(ids, dtype=np.int64), offsets, flat)

    @property
    def dim(self) -> int:
        return int(self.states.shape[1])

    def __contains__(self, key: int) -> bool:
        return int(key) in self.row

    def get(self, key: int) -> torch.Tensor:
        r = self.row[int(key)]
        return self.states[self.offsets[r]:self.offsets[r + 1]]

    def batch(self, keys: Sequence[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded float32 states ``(n, L, dim)`` and bool mask ``(n, L)`` of ``keys``."""
        parts = [self.get(k) for k in keys]
        length = max((p.shape[0] for p in parts), default=1)
        out = torch.zeros(len(parts), length, self.dim, dtype=torch.float32)  # (n, L, dim)
        mask = torch.zeros(len(parts), length, dtype=torch.bool)  # (n, L)
        for i, p in enumerate(parts):
            out[i, : p.shape[0]] = p.float()
            mask[i, : p.shape[0]] = True
        return out.to(device), mask.to(device)

    def save(self, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
        from lexgraph.io import save_tensors

        tensors = {"ids": torch.as_tensor(self.ids), "offsets": self.offsets.contiguous(), "states": self.states.contiguous()}
        save_tensors(tensors, path, metadata)  # reproducible header, written atomically

    @classmethod
    def load(cls, path: str | os.PathLike) -> "TokenStore":
        from lexgraph.io import load_tensors

        path = Path(path)
        t = load_tensors(path, "token-state file", "run `dvc repro encode_rerank`")
        if set(t) != {"ids", "offsets", "states"}:
            raise DataError(path, f"expected tensors 'ids', 'offsets' and 'states', found {sorted(t)}")
        return cls(t["ids"].numpy(), t["offsets"], t["states"])


class FrozenTokenEncoder:
    """The base encoder, frozen: texts -> last-layer token states (float16, no padding)."""

    def __init__(self, directory: str | os.PathLike, device: torch.device) -> None:
        from lexgraph.models.encoders import load_backbone
        from lexgraph.models.family import read_base_info

        self.model, self.tokenizer = load_backbone(directory)
        self.model.eval().requires_grad_(False).to(device)
        self.device = device
        info = read_base_info(directory)
        self.query_prefix, self.passage_prefix = info["query_prefix"], info["passage_prefix"]
        self.dim = int(self.model.config.hidden_size)

    def tokenize(self, texts: Sequence[str], prefix: str, max_length: int) -> list[dict[str, list]]:
        enc = self.tokenizer([prefix + t for t in texts], truncation=True, max_length=max_length,
                             return_offsets_mapping=True)
        return [{"input_ids": ids, "offsets": off} for ids, off in zip(enc["input_ids"], enc["offset_mapping"])]

    @torch.no_grad()
    def encode_ids(self, sequences: Sequence[Sequence[int]], batch_size: int, desc: str = "encode") -> list[torch.Tensor]:
        from lexgraph.progress import progress

        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))  # similar lengths batch together
        out: list[torch.Tensor | None] = [None] * len(sequences)
        pad = self.tokenizer.pad_token_id
        starts = range(0, len(order), batch_size)
        for start in progress(starts, desc, total=len(starts), unit="batch", disable=len(order) <= batch_size):
            rows = order[start:start + batch_size]
            length = max(len(sequences[i]) for i in rows)
            ids = torch.full((len(rows), length), pad, dtype=torch.long)  # (b, L)
            mask = torch.zeros(len(rows), length, dtype=torch.long)  # (b, L)
            for j, i in enumerate(rows):
                ids[j, : len(sequences[i])] = torch.tensor(sequences[i])
                mask[j, : len(sequences[i])] = 1
            with autocast(self.device):
                states = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).last_hidden_state
            states = states.float().cpu().half()  # (b, L, dim)
            for j, i in enumerate(rows):
                out[i] = states[j, : len(sequences[i])].clone()
        return out  # type: ignore[return-value]

    def encode_queries(self, texts: Sequence[str], max_length: int, batch_size: int) -> list[torch.Tensor]:
        toks = self.tokenize(texts, self.query_prefix, max_length)
        return self.encode_ids([t["input_ids"] for t in toks], batch_size, "encode questions")

    def del_id(self, token: str) -> int:
        tid = self.tokenizer.convert_tokens_to_ids(token)
        if tid is None or tid == self.tokenizer.unk_token_id:
            raise LexgraphError(f"params.yaml: 'rerank.del_token' = {token!r} is not a token of the base encoder's vocabulary")
        return int(tid)


# ---------------------------------------------------------------------------
# encode_rerank: the cached features
# ---------------------------------------------------------------------------


def _filter_patterns(text: str, families: Sequence[str]) -> list[tuple[int, int, bool]]:
    from lexgraph.elements import element_families

    if set(families) == set(PATTERNS):
        return element_sentences(text)
    from lexgraph.elements import split_sentences

    return [(s, e, bool(set(element_families(text[s:e])) & set(families))) for s, e in split_sentences(text)]


DISABLED = {"enabled": False}


def write_disabled(out_dir: str | os.PathLike) -> None:
    """The placeholder output of a stage when ``rerank.enabled`` is false."""
    from lexgraph.io import atomic_path

    with atomic_path(out_dir, directory=True) as tmp:
        (Path(tmp) / "disabled.json").write_text(json.dumps(DISABLED) + "\n", encoding="utf-8")
    log.info("rerank.enabled is false: %s holds a placeholder (dvc exp run -S rerank.enabled=true builds mvcl)", out_dir)


def is_disabled(directory: str | os.PathLike) -> bool:
    return (Path(directory) / "disabled.json").is_file()


def build_features(articles, questions, config: RerankConfig, pretrain_dir: str | os.PathLike,
                   out_dir: str | os.PathLike, device: torch.device) -> dict[str, Any]:
    """Encode and write ``articles``, ``questions`` (train + dev) and ``element_views``
    token stores under ``out_dir``; returns the element indicator's statistics."""
    import polars as pl

    from lexgraph.io import atomic_path

    if not config.enabled:
        write_disabled(out_dir)
        return dict(DISABLED)

    encoder = FrozenTokenEncoder(pretrain_dir, device)
    del_id = encoder.del_id(config.del_token)
    ids = articles["id"].to_list()
    texts = articles["article"].to_list()
    toks = encoder.tokenize(texts, encoder.passage_prefix, config.max_article_length)
    art_states = encoder.encode_ids([t["input_ids"] for t in toks], config.encode_batch_size, "encode articles")

    # element views of the train questions' gold articles (the B+ of the triples)
    train = questions.filter(pl.col("split") == "train")
    gold = sorted({int(a) for row in train["article_ids"].to_list() for a in row})
    index = {int(i): r for r, i in enumerate(ids)}
    view_ids, view_seqs = [], []
    n_sent = n_elem = n_tok = n_del = with_element = 0
    for aid in gold:
        if aid not in index:
            continue
        r = index[aid]
        sentences = _filter_patterns(texts[r], config.element_patterns)
        flags = token_sentence_flags(toks[r]["offsets"], sentences, text_start=len(encoder.passage_prefix))
        view = element_view(toks[r]["input_ids"], flags, del_id, config.element_budget)
        view_ids.append(aid)
        view_seqs.append(view)
        n_tok += len(view)
        n_del += sum(t == del_id for t in view)
    for text in texts:  # the indicator over the whole corpus
        sentences = _filter_patterns(text, config.element_patterns)
        n_sent += len(sentences)
        marked = sum(s[2] for s in sentences)
        n_elem += marked
        with_element += marked > 0
    view_states = encoder.encode_ids(view_seqs, config.encode_batch_size, "encode element views")

    splits = ("train", "dev") if config.split == "dev" else ("train",)
    q = questions.filter(pl.col("split").is_in(list(splits))).sort("id")
    q_states = encoder.encode_queries(q["question"].to_list(), config.max_query_length, config.encode_batch_size)

    meta = {"model": str(pretrain_dir), "max_article_length": str(config.max_article_length),
            "max_query_length": str(config.max_query_length), "element_budget": str(config.element_budget),
            "del_token": config.del_token, "element_patterns": ",".join(config.element_patterns)}
    with atomic_path(out_dir, directory=True) as tmp:
        TokenStore.from_list(ids, art_states, encoder.dim).save(Path(tmp) / "articles.safetensors", meta)
        TokenStore.from_list(q["id"].to_list(), q_states, encoder.dim).save(Path(tmp) / "questions.safetensors", meta)
        TokenStore.from_list(view_ids, view_states, encoder.dim).save(Path(tmp) / "element_views.safetensors", meta)
    stats = {
        "articles": len(ids),
        "article_tokens": int(sum(s.shape[0] for s in art_states)),
        "articles_truncated": int(sum(len(t["input_ids"]) >= config.max_article_length for t in toks)),
        "questions": q.height,
        "sentences": n_sent,
        "element_sentences": n_elem,
        "element_sentence_fraction": round(n_elem / max(n_sent, 1), 4),
        "articles_with_element": with_element,
        "element_views": len(view_ids),
        "element_view_tokens": n_tok,
        "element_view_deleted_fraction": round(n_del / max(n_tok, 1), 4),
    }
    log.info("element indicator: %s", stats)
    return stats


# ---------------------------------------------------------------------------
# Scoring a list
# ---------------------------------------------------------------------------


@torch.no_grad()
def rerank_scores(model, q_states: torch.Tensor, candidates: Sequence[int], articles: TokenStore,
                  device: torch.device, batch_size: int = 128) -> np.ndarray:
    """MVCL tournament scores ``(n,)`` of ``candidates`` for one question ``(Lq, dim)``."""
    model.eval()
    if len(candidates) == 0:
        return np.zeros(0, dtype=np.float32)
    q = q_states.float().to(device).unsqueeze(0)  # (1, Lq, dim)
    h = []
    for start in range(0, len(candidates), batch_size):
        keys = list(candidates[start:start + batch_size])
        d, d_mask = articles.batch(keys, device)  # (b, Ld, dim), (b, Ld)
        qb = q.expand(len(keys), -1, -1)  # (b, Lq, dim)
        q_mask = torch.ones(qb.shape[:2], dtype=torch.bool, device=device)  # (b, Lq)
        h.append(model.match(qb, q_mask, d, d_mask).float())
    return model.tournament_scores(torch.cat(h, 0)).cpu().numpy().astype(np.float32)


def zscore(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return x
    return (x - x.mean()) / max(float(x.std()), 1e-9)


def fuse_list(ids: np.ndarray, first: np.ndarray, mvcl: np.ndarray, alpha: float, k: int) -> tuple[np.ndarray, np.ndarray]:
    """One question's re-ranked list: the first stage's ``ids``/``first`` scores (best first,
    ``-1`` padding) with the re-ranker's scores ``mvcl`` of its top-``k`` valid entries.
    Returns ``(ids, scores)`` of the same length: the top-``k`` by
    ``alpha * z(mvcl) + (1 - alpha) * z(first)`` (ties: the first stage's order), then the
    rest in the first stage's order, scored below."""
    ids = np.asarray(ids, dtype=np.int64)
    valid = np.flatnonzero(ids >= 0)
    head, tail = valid[:k], valid[k:]
    if head.size == 0:
        return ids.copy(), np.zeros(ids.shape, dtype=np.float32)
    fused = alpha * zscore(mvcl[: head.size]) + (1.0 - alpha) * zscore(first[head])  # (h,)
    order = np.lexsort((np.arange(head.size), -fused))  # by fused desc, then first-stage rank
    out_ids = np.full(ids.shape, -1, dtype=np.int64)
    out_scores = np.zeros(ids.shape, dtype=np.float32)
    out_ids[: head.size] = ids[head[order]]
    out_scores[: head.size] = fused[order]
    if tail.size:
        floor = float(fused.min()) - 1.0
        t = np.asarray(first[tail], dtype=np.float64)
        out_ids[head.size: head.size + tail.size] = ids[tail]
        out_scores[head.size: head.size + tail.size] = floor - (t[0] - t)  # keeps the tail's order, below the head
    return out_ids, out_scores


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------


@dataclass
class Lists:
    """First-stage lists of one split: question ids, golds, ids/scores ``(n, depth)``."""

    qids: list[int]
    qrels: dict[int, list[int]]
    ids: np.ndarray
    scores: np.ndarray


def first_stage_lists(retriever, questions, split: str, depth: int) -> Lists:
    qids, texts, qrels = split_questions(questions, split)
    if not qids:
        raise LexgraphError(f"no '{split}' questions in the questions table; the re-ranker needs them")
    ids, scores = retriever.search(texts, depth)
    return Lists(qids, qrels, np.asarray(ids), np.asarray(scores))


class RerankTrainer:
    """MVCL's training task in an engine's shape: ``batches``, ``step``, ``evaluate``."""

    def __init__(self, model, config: RerankConfig, articles: TokenStore, queries: TokenStore,
                 views: TokenStore, train: Lists, dev: Lists, device: torch.device, seed: int) -> None:
        from lexgraph.losses.CaseViewLoss import CaseViewLoss
        from lexgraph.losses.ElementViewLoss import ElementViewLoss
        from lexgraph.losses.PairwiseTripleLoss import PairwiseTripleLoss

        self.model, self.config, self.device, self.seed = model, config, device, seed
        self.articles, self.queries, self.views = articles, queries, views
        self.train_lists, self.dev_lists = train, dev
        self.triple_loss = PairwiseTripleLoss(swap=config.swap)
        self.case_loss = CaseViewLoss(config.t1)
        self.element_loss = ElementViewLoss(config.t2)
        self.pairs: list[tuple[int, int, np.ndarray]] = []  # (qid, gold, negative pool)
        for qid, row in zip(train.qids, train.ids):
            gold = set(train.qrels[qid])
            pool = np.array([a for a in row[: config.k].tolist() if a >= 0 and a not in gold and a in articles],
                            dtype=np.int64)
            if pool.size == 0 or qid not in queries:
                continue
            for g in sorted(gold):
                if g in articles:
                    self.pairs.append((qid, g, pool))
        if not self.pairs:
            raise LexgraphError("no training triple: no train question has a gold article and a non-gold candidate")

    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.pairs) * self.config.negatives / self.config.batch_size)

    def batches(self, epoch: int) -> Iterator[list[tuple[int, int, int]]]:
        """Triples ``(qid, B+, C-)`` of one epoch in batches, from a generator seeded by
        ``(seed, epoch)``."""
        rng = np.random.default_rng([self.seed, epoch])
        triples = []
        for qid, gold, pool in self.pairs:
            negs = rng.choice(pool, size=self.config.negatives, replace=pool.size < self.config.negatives)
            triples += [(qid, gold, int(c)) for c in negs]
        order = rng.permutation(len(triples))
        size = self.config.batch_size
        for start in range(0, len(order), size):
            yield [triples[i] for i in order[start:start + size]]

    def modules(self) -> list[torch.nn.Module]:
        return [self.model]

    def train(self) -> None:
        self.model.train()

    def step(self, batch: Sequence[tuple[int, int, int]]) -> tuple[torch.Tensor, dict[str, float]]:
        """The engine's step: the total loss, and its parts for the history."""
        out = self.losses(batch)
        return out["loss"], {f"train_{k}": float(v.detach()) for k, v in out.items() if k != "loss"}

    def nan_error(self, value: float, epoch: int, step: int) -> LexgraphError:
        return LexgraphError(f"mvcl: the loss is {value} at epoch {epoch}, step {step}; lower rerank.lr "
                             "or rerank.max_grad_norm")

    def losses(self, batch: Sequence[tuple[int, int, int]]) -> dict[str, torch.Tensor]:
        """The losses of one batch of triples (``loss`` is the total to back-propagate)."""
        m, cfg, dev = self.model, self.config, self.device
        qids, golds, negs = zip(*batch)
        q, q_mask = self.queries.batch(qids, dev)  # (b, Lq, dim)
        b, b_mask = self.articles.batch(golds, dev)  # (b, Lb, dim)
        c, c_mask = self.articles.batch(negs, dev)  # (b, Lc, dim)
        h_ab = m.match(q, q_mask, b, b_mask)  # (b, 4 * hidden)
        h_ac = m.match(q, q_mask, c, c_mask)  # (b, 4 * hidden)
        out = {"triple": self.triple_loss(h_ab, h_ac, m.classifier)}
        total = out["triple"]
        if cfg.lambda_case > 0:
            out["case"] = self.case_loss(m.pool(q, q_mask), m.pool(b, b_mask), m.pool(c, c_mask))
            total = total + cfg.lambda_case * out["case"]
        unique = [g for g in dict.fromkeys(golds) if g in self.views]
        if cfg.lambda_ele > 0 and len(unique) >= 2:
            t, t_mask = self.articles.batch(unique, dev)  # (u, Lt, dim)
            v, v_mask = self.views.batch(unique, dev)  # (u, Lv, dim)
            out["element"] = self.element_loss(m.pool(t, t_mask), m.pool(v, v_mask))
            total = total + cfg.lambda_ele * out["element"]
        out["loss"] = total
        return out

    def dev_scores(self) -> list[np.ndarray]:
        """The re-ranker's scores of every dev question's top-``k``."""
        from lexgraph.progress import progress

        out = []
        for qid, row in progress(list(zip(self.dev_lists.qids, self.dev_lists.ids)), "re-rank dev", unit="question"):
            cands = [int(a) for a in row[: self.config.k] if a >= 0]
            out.append(rerank_scores(self.model, self.queries.get(qid), cands, self.articles, self.device,
                                     self.config.eval_batch_size))
        return out

    def metrics_at(self, scores: Sequence[np.ndarray], alpha: float) -> dict[str, float]:
        d = self.dev_lists
        run = {}
        for qid, ids, first, s in zip(d.qids, d.ids, d.scores, scores):
            fused, _ = fuse_list(ids, first, s, alpha, self.config.k)
            run[qid] = [int(a) for a in fused if a >= 0]
        return evaluate_run(run, d.qrels)

    def evaluate(self) -> dict[str, float]:
        """Dev metrics of the re-ranker alone (alpha = 1): what selects the epoch."""
        return self.metrics_at(self.dev_scores(), 1.0)


def _round(d: dict[str, float]) -> dict[str, float]:
    return {k: round(float(v), 4) for k, v in d.items()}


def build_model(input_dim: int, config: RerankConfig):
    """The interaction network that ``config`` describes, over PLM states of ``input_dim``."""
    from lexgraph.models.mvcl import InteractionModel

    return InteractionModel(input_dim, config.hidden, config.dropout, alignment=config.alignment,
                            temperature=config.align_temperature, features=config.match_features,
                            warm_start=config.warm_start)


def train(config: RerankConfig, articles: TokenStore, queries: TokenStore, views: TokenStore,
          train_lists: Lists, dev_lists: Lists, device: torch.device, seed: int, runtime=None):
    """Train the interaction network; returns ``(model, report)`` with the kept epoch's
    weights, alpha and the dev metrics."""
    from lexgraph.training.engine import FitConfig, ParamGroup, Runtime, build_optimizer, build_scheduler, fit

    torch.manual_seed(seed)  # the initial weights and dropout follow the seed
    model = build_model(articles.dim, config).to(device)
    trainer = RerankTrainer(model, config, articles, queries, views, train_lists, dev_lists, device, seed)
    steps = trainer.steps_per_epoch()
    # AdamW with weight decay on every parameter, linear warm-up then decay (lexgraph.training.engine)
    optimizer = build_optimizer([ParamGroup(list(model.parameters()), config.lr, config.weight_decay,
                                            decay_exempt=False)], [model])
    scheduler = build_scheduler(optimizer, "linear", int(config.warmup_ratio * steps * config.epochs),
                                steps * config.epochs)
    log.info("mvcl: %d (question, gold) pairs, %d negatives each, %d steps per epoch",
             len(trainer.pairs), config.negatives, steps)
    result = fit(trainer, optimizer, scheduler,
                 FitConfig(name="mvcl", epochs=config.epochs, steps_per_epoch=steps,
                           max_grad_norm=config.max_grad_norm, selection_metric=config.metric,
                           select_epoch_zero=model.warm_started),
                 runtime or Runtime(device))
    best_epoch, history = result.best_epoch, result.history
    scores = trainer.dev_scores()  # of the kept epoch's weights (fit restored them)
    by_alpha = {}
    for alpha in config.interpolation:
        by_alpha[alpha] = trainer.metrics_at(scores, alpha)
    alpha = max(config.interpolation, key=lambda a: (by_alpha[a][config.metric], -config.interpolation.index(a)))
    report = {
        "first_stage": config.first_stage,
        "k": config.k,
        "epoch": best_epoch,
        "alpha": alpha,
        "split": config.split,
        "metric": config.metric,
        "dev": _round(by_alpha[alpha]),
        "dev_mvcl_only": _round(trainer.metrics_at(scores, 1.0)),
        "dev_first_stage": _round(trainer.metrics_at(scores, 0.0)),
        "dev_by_alpha": {str(a): round(float(m[config.metric]), 4) for a, m in by_alpha.items()},
        "history": history,
        "pairs": len(trainer.pairs),
    }
    log.info("mvcl: kept epoch %d, alpha %.2f: dev %s %.4f (first stage %.4f, re-ranker alone %.4f)", best_epoch, alpha,
             config.metric, report["dev"][config.metric], report["dev_first_stage"][config.metric],
             report["dev_mvcl_only"][config.metric])
    return model, report


def save_model(model, config: RerankConfig, report: dict[str, Any], out_dir: str | os.PathLike) -> None:
    from safetensors.torch import save_file

    from lexgraph.io import atomic_path

    settings = {"format": "lexgraph-mvcl", "version": 1, "config": asdict(config), "input_dim": model.input_dim,
                "first_stage": config.first_stage, "k": config.k, "alpha": report["alpha"], "epoch": report["epoch"]}
    with atomic_path(out_dir, directory=True) as tmp:
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        save_file(dict(sorted(state.items())), str(Path(tmp) / WEIGHTS))
        (Path(tmp) / SETTINGS).write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def load_model(directory: str | os.PathLike, device: torch.device):
    """``(model, settings)`` from a ``models/mvcl`` directory."""
    from safetensors.torch import load_file

    directory = Path(directory)
    path = directory / SETTINGS
    if is_disabled(directory):
        raise LexgraphError(f"{directory}: the MVCL re-ranker is switched off (rerank.enabled: false); "
                            "run `dvc exp run -S rerank.enabled=true` (or set it in params.yaml and `dvc repro`)")
    if not path.is_file():
        raise LexgraphError(f"{path}: the MVCL re-ranker not found; run `dvc repro rerank` first")
    settings = json.loads(path.read_text(encoding="utf-8"))
    if settings.get("format") != "lexgraph-mvcl":
        raise DataError(path, "not an MVCL settings file (expected format 'lexgraph-mvcl')")
    model = build_model(int(settings["input_dim"]), RerankConfig(**settings["config"]))
    try:
        model.load_state_dict(load_file(str(directory / WEIGHTS)))
    except RuntimeError as exc:  # weights of another network shape (e.g. trained before match_features)
        raise DataError(directory / WEIGHTS, "weights that do not fit the network mvcl.json describes "
                        f"({str(exc).splitlines()[0]}); run `dvc repro rerank` to rebuild it") from None
    return model.to(device).eval(), settings

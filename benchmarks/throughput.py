"""Benchmark: throughput of the GPU-heavy stages, with a FLOP-based utilisation estimate.

    python benchmarks/throughput.py                       # paper shapes, paper batch sizes, auto device
    python benchmarks/throughput.py --small --steps 2     # e5-small / mT5-small shapes, for a CPU
    python benchmarks/throughput.py --stages train_dsr,embed --json out.json

Stages (random-weight stand-ins of the paper's models; nothing is downloaded):

* ``pretrain``: MLM training steps (``BertForMaskedLM``, AdamW), ``pretrain.batch_size`` x
  ``pretrain.max_length`` tokens: sequences/s.
* ``doc2query``: sampled generation (``MT5ForConditionalGeneration.generate``, top-k/top-p,
  ``queries.per_article`` returns, full ``queries.max_length``-token outputs forced with
  ``min_length``), ``queries.batch_size`` articles per call: queries/s.
* ``train_dsr``: ``train_dsr``'s own training step (``lexgraph.methods.dsr.train.DSRTask`` and
  ``dsr_optimization``, driven by the engine's loop, ``lexgraph.training.engine.training_loop``:
  its AdamW, schedule, clipping, precision, accumulation and loss read-back) on synthetic pairs
  of ``dsr.batch_size`` questions with one negative each (2 x batch articles), a fresh batch
  every step: pairs/s, and per step the dispatched operators and host synchronisations
  (``lexgraph.core.step_probe.StepProbe``, one probed step per mode; on CUDA also the count of
  ``torch.cuda.set_sync_debug_mode``), the article backbone's calls and the distinct input
  shapes both backbones saw over the timed steps.
* ``embed``: article encoding without gradients, ``embed.batch_size``: articles/s.

``train_dsr`` and ``embed`` run in three article-side modes, on articles whose chunk
counts and chunk lengths are drawn from the real distribution (``--articles``, chunked at
``dsr.max_chunk_length`` tokens with ``--tokenizer``):

* ``slots``: every article padded to ``max_document_length / max_chunk_length`` chunk slots
  of ``max_chunk_length`` tokens, every slot through the backbone (a fixed padded layout);
* ``real``: only the real chunks, padded to the longest chunk (``train_dsr``'s ``padded``
  layout: a GPU's default);
* ``packed``: the real chunks in width groups, multiples of 32 tokens
  (:func:`lexgraph.models.packing.width_buckets`; a CPU's default). ``train_dsr``'s layouts are
  planned on the host (:func:`lexgraph.models.packing.plan_chunks`); ``embed``'s ``real`` and
  ``slots`` are this script's own, its ``packed`` the real ``encode()``.

Defaults: camembert-base-sized encoders (hidden 768, 12 layers, 12 heads, 3072, 514
positions, 32,005 tokens) and mT5-base-sized doc2query (d_model 768, 12+12 layers, d_ff
2048, 250,112 tokens); ``--small``: multilingual-e5-small-sized encoders (384, 12 layers,
1536, 250,037 tokens) and mT5-small (512, 8+8 layers, d_ff 1024). Batch sizes come from
``--profile`` (``profiles/paper.yaml``) unless given; ``--small`` takes smaller ones that fit a
24 GB machine (``SMALL_BATCHES``: ``train_dsr`` 4 pairs). ``--sdpa`` picks the attention
backends of ``train_dsr`` (as ``LEXGRAPH_SDPA`` does for the stages).

FLOPs: a matmul weight of ``N`` parameters costs ``2 N`` per token forward and ``6 N``
per token for a training step (forward + backward); ``N`` counts every ``nn.Linear`` and
attention projection (the MLM/LM head included, embedding look-ups excluded). Attention
scores add ``4 S d`` per token and layer forward (``QK^T`` and ``AV`` over ``S``
positions), x3 for training. *Useful* FLOPs count real tokens only (no padding, no empty
slots), so a mode that computes less padding shows a higher utilisation for the same work.
Utilisation = useful FLOP/s / the device's dense bf16 peak (H100 SXM 989, H100 PCIe 756,
H200 989, A100 312 TFLOP/s); on a CPU there is no reliable peak, so achieved GFLOP/s only.

Timing: ``--warmup`` steps, then ``--steps`` timed steps (CUDA synchronised), mean time;
the modes of ``train_dsr`` and ``embed`` take turns step by step (``embed``: ``steps // 2``
passes), so that a load change on a shared machine hits them alike.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]

log = logging.getLogger("throughput")

ENCODERS = {
    "base": dict(hidden=768, layers=12, heads=12, intermediate=3072, positions=514, vocab=32005),
    "small": dict(hidden=384, layers=12, heads=12, intermediate=1536, positions=514, vocab=250037),
}
DOC2QUERY = {
    "base": dict(d_model=768, layers=12, heads=12, d_ff=2048, d_kv=64, vocab=250112),
    "small": dict(d_model=512, layers=8, heads=6, d_ff=1024, d_kv=64, vocab=250112),
}
PEAK_TFLOPS = [("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("A100", 312.0)]  # dense bf16
STAGES = ("pretrain", "doc2query", "train_dsr", "embed")
MODES = ("slots", "real", "packed")
LAYOUT_OF_MODE = {"slots": "slots", "real": "padded", "packed": "packed"}  # lexgraph.models.packing.LAYOUTS
SMALL_BATCHES = {"dsr_batch": 4, "pretrain_batch": 8, "d2q_batch": 8, "embed_batch": 32}  # --small: fits 24 GB
GPU_COMMAND = "python benchmarks/throughput.py --device cuda --steps 20 --json throughput-gpu.json"


# ---------------------------------------------------------------------------
# FLOP accounting
# ---------------------------------------------------------------------------


def matmul_params(module: nn.Module) -> int:
    """Weights used as matmuls: every ``nn.Linear`` (tied heads included) and the packed
    input projection of ``nn.MultiheadAttention``."""
    total = 0
    for m in module.modules():
        if isinstance(m, nn.Linear):
            total += m.weight.numel()
        elif isinstance(m, nn.MultiheadAttention) and m.in_proj_weight is not None:
            total += m.in_proj_weight.numel()
    return total


def attention_flops(lengths, layers: int, dim: int) -> float:
    """Forward attention-score FLOPs of sequences of ``lengths`` tokens: ``4 S^2 d`` per layer."""
    return float(sum(4.0 * int(s) ** 2 * dim * layers for s in lengths))


def peak_flops(device: torch.device) -> tuple[str, float | None]:
    if device.type != "cuda":
        import platform

        return platform.processor() or "cpu", None
    name = torch.cuda.get_device_name(device)
    for key, tflops in PEAK_TFLOPS:
        if key in name:
            return name, tflops * 1e12
    return name, None


def timed(step, device: torch.device, warmup: int, steps: int) -> float:
    """Mean seconds of ``step()`` over ``steps`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / steps


def timed_interleaved(steps_by_mode: dict, device: torch.device, warmup: int, steps: int) -> dict[str, float]:
    """Mean seconds per call of each mode's ``step()``, the modes taking turns (one call each
    per round) so that a load change on a shared machine hits them alike."""
    for step in steps_by_mode.values():
        for _ in range(warmup):
            step()
    total = dict.fromkeys(steps_by_mode, 0.0)
    for _ in range(steps):
        for mode, step in steps_by_mode.items():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            total[mode] += time.perf_counter() - start
    return {mode: seconds / steps for mode, seconds in total.items()}


def autocast(device: torch.device):
    from lexgraph.core.config import autocast as lexgraph_autocast

    return lexgraph_autocast(device)


# ---------------------------------------------------------------------------
# The real length distribution
# ---------------------------------------------------------------------------


def tiny_tokenizer(directory: Path):
    """A 5-piece WordPiece tokenizer: the encoders need CLS/SEP/PAD ids, not a vocabulary."""
    from transformers import BertTokenizer

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n", encoding="utf-8")
    return BertTokenizer(str(directory / "vocab.txt"))


def csv_column(path: Path, column: str) -> list[str]:
    """One column of a CSV file, empty cells as "" (the csv module: the GPU image has no polars)."""
    import csv

    with open(path, encoding="utf-8", newline="") as f:
        return [row.get(column) or "" for row in csv.DictReader(f)]


def length_distribution(articles: Path, tokenizer_dir: Path | None, chunk_length: int, document_length: int):
    """Per article: its chunks' token counts at ``chunk_length`` (specials included), its
    token count (for doc2query inputs); per question: its token count."""
    from lexgraph.models.packing import chunk_token_ids

    texts = csv_column(articles, "article")
    questions = []
    for path in sorted(articles.parent.glob("questions_*.csv")):
        questions += csv_column(path, "question")
    if tokenizer_dir is not None and (tokenizer_dir / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        source = f"{tokenizer_dir.name} tokenizer"
        chunks = [[len(c) for c in doc] for doc in chunk_token_ids(tok, texts, chunk_length, document_length)]
        article_tokens = [len(ids) for ids in tok(texts, add_special_tokens=True, verbose=False)["input_ids"]]
        question_tokens = [len(ids) for ids in tok(questions, add_special_tokens=True)["input_ids"]]
    else:  # no tokenizer: ~1.5 sentencepiece tokens per French word
        source = "1.5 tokens/word estimate"
        body, cap = chunk_length - 2, document_length // chunk_length
        article_tokens = [int(1.5 * len(t.split())) + 2 for t in texts]
        chunks = []
        for n in article_tokens:
            n = min(n - 2, body * cap)
            full, rest = divmod(n, body)
            chunks.append([chunk_length] * full + ([rest + 2] if rest or not full else []))
        question_tokens = [int(1.5 * len(q.split())) + 2 for q in questions]
    return {
        "chunks": chunks,
        "article_tokens": article_tokens,
        "question_tokens": question_tokens or [32],
        "source": source,
        "articles": str(articles),
    }


def padding_table(chunks, batch_articles: int, max_chunks: int, chunk_length: int, rng) -> dict[str, float]:
    """Backbone tokens computed per mode, over 200 random batches of ``batch_articles`` articles,
    relative to the useful (real) tokens: the device-independent ceiling of packing's gain. Each
    mode counts the calls ``train_dsr``'s layout plans (:func:`lexgraph.models.packing.plan_chunks`:
    widths in multiples of 32, stable row counts, dummy rows included)."""
    from lexgraph.models.packing import plan_chunks

    totals = dict.fromkeys(("useful", *MODES), 0.0)
    for _ in range(200):
        batch = [chunks[i] for i in rng.integers(0, len(chunks), batch_articles)]
        docs = [[[0] * n for n in doc] for doc in batch]
        totals["useful"] += sum(n for doc in batch for n in doc)
        for mode in MODES:
            plan = plan_chunks(docs, 0, chunk_length, max_chunks, LAYOUT_OF_MODE[mode])
            totals[mode] += sum(rows * width for rows, width in plan.shapes)
    return {mode: totals[mode] / totals["useful"] for mode in MODES}


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------


def bert_config(shape: dict):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=shape["vocab"],
        hidden_size=shape["hidden"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        intermediate_size=shape["intermediate"],
        max_position_embeddings=shape["positions"],
        attn_implementation="sdpa",
    )


def random_ids(n: int, vocab: int, rng) -> list[int]:
    return rng.integers(5, vocab, n).tolist()


def bench_pretrain(args, shape, device, peak) -> list[dict]:
    from transformers import BertForMaskedLM

    torch.manual_seed(0)
    model = BertForMaskedLM(bert_config(shape)).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    batch, length = args.pretrain_batch, min(args.pretrain_length, shape["positions"] - 2)
    ids = torch.randint(5, shape["vocab"], (batch, length), device=device)
    labels = ids.masked_fill(torch.rand(batch, length, device=device) > 0.15, -100)

    def step():
        with autocast(device):
            loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    seconds = timed(step, device, args.warmup, args.steps)
    flops = 6.0 * matmul_params(model) * batch * length + 3 * attention_flops(
        [length] * batch, shape["layers"], shape["hidden"]
    )
    return [
        row(
            "pretrain",
            "mlm",
            seconds,
            {"sequences/s": batch / seconds, "tokens/s": batch * length / seconds},
            flops,
            peak,
            f"batch {batch} x {length} tokens",
        )
    ]


def bench_doc2query(args, shape, device, peak, dist) -> list[dict]:
    from transformers import MT5Config, MT5ForConditionalGeneration

    torch.manual_seed(0)
    config = MT5Config(
        vocab_size=shape["vocab"],
        d_model=shape["d_model"],
        d_kv=shape["d_kv"],
        d_ff=shape["d_ff"],
        num_layers=shape["layers"],
        num_decoder_layers=shape["layers"],
        num_heads=shape["heads"],
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    model = MT5ForConditionalGeneration(config).to(device).eval()
    rng = np.random.default_rng(0)
    batch = args.d2q_batch
    lengths = sorted((min(n, args.d2q_input) for n in rng.choice(dist["article_tokens"], batch)), reverse=True)
    width = lengths[0]
    ids = torch.zeros(batch, width, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, :n] = torch.tensor(random_ids(n, shape["vocab"], rng))
        mask[b, :n] = 1
    ids, mask = ids.to(device), mask.to(device)
    returns, out_length = args.d2q_returns, args.d2q_length
    use_amp = device.type == "cuda" and torch.cuda.is_bf16_supported()

    def step():
        with torch.no_grad(), autocast(device) if use_amp else torch.autocast("cpu", enabled=False):
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                top_k=50,
                top_p=0.95,
                max_length=out_length,
                min_length=out_length,
                num_return_sequences=returns,
            )

    seconds = timed(step, device, args.warmup, args.steps)
    n_enc = matmul_params(model.encoder)
    n_dec = matmul_params(model.decoder) + model.lm_head.weight.numel()
    sequences = batch * returns
    flops = (
        2.0 * n_enc * sum(lengths)
        + attention_flops(lengths, shape["layers"], shape["heads"] * shape["d_kv"])
        + 2.0 * n_dec * sequences * out_length
    )
    return [
        row(
            "doc2query",
            "generate",
            seconds,
            {"queries/s": sequences / seconds, "tokens/s": sequences * out_length / seconds},
            flops,
            peak,
            f"{batch} articles x {returns} queries x {out_length} tokens",
        )
    ]


def build_dsr(shape, tokenizer, device, chunk_length: int, document_length: int):
    from transformers import BertModel

    from lexgraph.models.article_encoder import HierarchicalArticleEncoder
    from lexgraph.models.dsr import DSR
    from lexgraph.models.encoders import QueryEncoder

    torch.manual_seed(0)
    config = bert_config(shape)
    query = QueryEncoder(BertModel(config, add_pooling_layer=False), tokenizer, max_length=shape["positions"] - 2)
    article = HierarchicalArticleEncoder(
        BertModel(config, add_pooling_layer=False),
        tokenizer,
        max_chunk_length=chunk_length,
        max_document_length=document_length,
        pooling="max",
        num_layers=2,
        num_heads=12,
    )
    return DSR(query, article, temperature=0.01).to(device)


def synthetic_docs(chunk_lengths, vocab: int, rng, cls_id: int, sep_id: int):
    """Random token ids with exactly the given chunk lengths."""
    return [[[cls_id, *random_ids(n - 2, vocab, rng), sep_id] for n in doc] for doc in chunk_lengths]


def article_embeddings(enc, docs, mode: str, device, pad_id: int, grad: bool):
    """Article vectors ``(batch, dim)`` of ``docs`` (token-id chunks) in ``mode``."""
    from lexgraph.models.packing import collate_chunks, pack_chunks, scatter_chunks

    if mode == "packed":
        packed = {k: v.to(device) for k, v in pack_chunks(docs, pad_id).items()}
        return enc(**packed)
    if mode == "real":
        packed = {k: v.to(device) for k, v in pack_chunks(docs, pad_id).items()}
        vectors = enc.encode_flat(packed["input_ids"], packed["attention_mask"], bucket=False)  # (m, dim)
        chunks, mask = scatter_chunks(vectors, packed["chunk_counts"])
        tokens, _ = scatter_chunks(packed["attention_mask"].sum(-1), packed["chunk_counts"])
        return enc.aggregate(chunks, mask, tokens)
    # slots: every slot of the fixed layout through the backbone (an empty slot attends to its first position)
    padded = collate_chunks([doc + [[pad_id]] * (enc.max_chunks - len(doc)) for doc in docs], pad_id)
    ids, attention = padded["input_ids"].to(device), padded["attention_mask"].to(device)  # (b, slots, len)
    real = torch.tensor([[i < len(doc) for i in range(enc.max_chunks)] for doc in docs], device=device)
    full = torch.full((*ids.shape[:2], enc.max_chunk_length), pad_id, device=device, dtype=ids.dtype)
    full_mask = torch.zeros_like(full)
    full[..., : ids.size(2)], full_mask[..., : ids.size(2)] = ids, attention
    vectors = enc._pool(full.flatten(0, 1), full_mask.flatten(0, 1)).view(*ids.shape[:2], -1)  # (b, slots, dim)
    return enc.aggregate(vectors * real.unsqueeze(-1), real, (full_mask.sum(-1) * real))


def dsr_pairs(args, shape, dist, n_batches: int):
    """``n_batches`` batches of ``args.dsr_batch`` synthetic pairs with the real length
    distribution: the pairs, and the chunks (token ids) of every article id."""
    from lexgraph.methods.dsr.data import Pair

    rng = np.random.default_rng(1)
    batch, chunks, batches = args.dsr_batch, {}, []
    for k in range(n_batches):
        draw = [dist["chunks"][i] for i in rng.integers(0, len(dist["chunks"]), 2 * batch)]
        lengths = [min(int(n), args.query_length) for n in rng.choice(dist["question_tokens"], batch)]
        for j, doc in enumerate(synthetic_docs(draw, shape["vocab"], rng, 2, 3)):
            chunks[2 * batch * k + j] = doc
        batches.append(
            [
                Pair(
                    " ".join(["x"] * (n - 2)),
                    ("train", k),
                    frozenset({2 * batch * k + i}),
                    2 * batch * k + i,
                    (2 * batch * k + batch + i,),
                )
                for i, n in enumerate(lengths)
            ]
        )
    return batches, chunks


def dsr_loop(args, shape, device, tokenizer, batches, chunks):
    """``train_dsr``'s own task, optimizer, schedule and engine loop (``lexgraph.training``)
    around the stand-in model, on the synthetic pairs."""
    from dataclasses import replace

    from lexgraph.core.config import read_params
    from lexgraph.methods.dsr.config import DSRConfig
    from lexgraph.methods.dsr.data import TrainingData
    from lexgraph.methods.dsr.train import DSRTask, dsr_optimization
    from lexgraph.training.engine import Runtime, training_loop

    profile = read_params(args.profile)["dsr"]
    config = replace(DSRConfig.from_params(profile), batch_size=args.dsr_batch, chunk_encoder="finetune")
    model = build_dsr(shape, tokenizer, device, args.chunk_length, args.document_length)
    ids = sorted(chunks)
    data = TrainingData([p for b in batches for p in b], ids, [""] * len(ids))
    task = DSRTask(model, data, config, Runtime(device), seed=0)
    task.chunks = chunks  # the synthetic chunks, not the empty texts'
    if args.stable_queries != "auto":  # the other device's setting, measured here
        task.stable_queries = args.stable_queries == "on"
    task.rng = np.random.default_rng(0)
    optimizer, scheduler, fit_config = dsr_optimization(task, select=False)
    return task, training_loop(task, optimizer, scheduler, fit_config, task.runtime)


def count_step(step, loop, device) -> dict:
    """Operators and synchronisations of one ``step()`` (:class:`~lexgraph.core.step_probe.StepProbe`;
    on CUDA also ``torch.cuda.set_sync_debug_mode``, which sees pageable copies too)."""
    import warnings

    from lexgraph.core.step_probe import StepProbe, optimizer_host_scalars

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        try:
            with StepProbe(optimizer_host_scalars(loop.optimizer), device) as probe:
                step()
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")
    cuda_syncs = sum("synchroniz" in str(w.message) for w in caught) if device.type == "cuda" else None
    return {"ops": probe.ops, "syncs": probe.syncs, "sync_causes": dict(probe.sync_causes), "cuda_syncs": cuda_syncs}


def bench_train_dsr(args, shape, device, peak, dist, tokenizer) -> list[dict]:
    batches, chunks = dsr_pairs(args, shape, dist, args.warmup + args.steps + 1)
    task, loop = dsr_loop(args, shape, device, tokenizer, batches, chunks)
    model, batch = task.model, args.dsr_batch
    shapes = {mode: {"article": [], "query": []} for mode in args.modes}
    current = {"mode": args.modes[0]}
    for side, encoder in (("article", model.article_encoder), ("query", model.query_encoder)):
        encoder.backbone.register_forward_pre_hook(
            lambda _m, _a, kw, side=side: shapes[current["mode"]][side].append(tuple(kw["input_ids"].shape)),
            with_kwargs=True,
        )
    n_q, n_a = matmul_params(model.query_encoder.backbone), matmul_params(model.article_encoder.backbone)
    n_chunk = matmul_params(model.article_encoder) - n_a
    useful = []
    for pairs in batches:
        lens = [len(p.query.split()) + 2 for p in pairs]
        chunk_lengths = [len(c) for p in pairs for a in (p.positive, p.negatives[0]) for c in chunks[a]]
        useful.append(
            6.0 * (n_q * sum(lens) + n_a * sum(chunk_lengths) + n_chunk * len(chunk_lengths))
            + 3 * attention_flops(lens + chunk_lengths, shape["layers"], shape["hidden"])
        )
    flops = float(np.mean(useful))

    def make_step(mode: str):
        turn = iter(range(10**9))

        def step():
            current["mode"] = mode
            task.layout = LAYOUT_OF_MODE[mode]
            with sdpa_context(args.sdpa):
                loop.step(batches[next(turn) % len(batches)])

        return step

    steps = {mode: make_step(mode) for mode in args.modes}
    for _ in range(max(1, args.warmup)):  # AdamW's state exists after a step: its step counters are host scalars
        for step in steps.values():
            step()
    counts = {mode: count_step(steps[mode], loop, device) for mode in args.modes}
    for mode in args.modes:
        shapes[mode] = {"article": [], "query": []}
    seconds = timed_interleaved(steps, device, 0, args.steps)
    chunks_per_step = np.mean([sum(len(chunks[a]) for p in b for a in (p.positive, p.negatives[0])) for b in batches])
    return [
        row(
            "train_dsr",
            mode,
            seconds[mode],
            {"pairs/s": batch / seconds[mode], "chunks/s": chunks_per_step / seconds[mode]},
            flops,
            peak,
            f"batch {batch} pairs, {2 * batch} articles, {chunks_per_step:.0f} real chunks; the engine's step",
            {
                **counts[mode],
                "article_shapes": len(set(shapes[mode]["article"])),  # distinct, over the timed steps
                "query_shapes": len(set(shapes[mode]["query"])),
                "article_calls_per_step": len(shapes[mode]["article"]) / args.steps,
            },
        )
        for mode in args.modes
    ]


def sdpa_context(value: str):
    """``--sdpa``: the attention backends of the timed steps (``default``: torch's choice)."""
    import contextlib

    from lexgraph.training.engine import sdpa_backends

    backends = sdpa_backends(value)
    if backends is None:
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel(backends)


def bench_embed(args, shape, device, peak, dist, tokenizer) -> list[dict]:
    model = build_dsr(shape, tokenizer, device, args.chunk_length, args.document_length).eval()
    enc = model.article_encoder
    rng = np.random.default_rng(2)
    n_articles = args.embed_articles
    draw = [dist["chunks"][i] for i in rng.integers(0, len(dist["chunks"]), n_articles)]
    docs = synthetic_docs(draw, shape["vocab"], rng, tokenizer.cls_token_id, tokenizer.sep_token_id)
    chunk_lengths = [n for doc in draw for n in doc]
    n_a = matmul_params(enc.backbone)
    flops = 2.0 * (n_a * sum(chunk_lengths) + (matmul_params(enc) - n_a) * len(chunk_lengths)) + attention_flops(
        chunk_lengths, shape["layers"], shape["hidden"]
    )
    batch = args.embed_batch
    enc.chunk = lambda texts: [docs[int(t)] for t in texts]  # the chunks are given

    def make_run(mode: str):
        if mode == "packed":  # the real inference path: encode() over the whole input
            return lambda: enc.encode([str(i) for i in range(n_articles)], batch_size=batch, show_progress=False)

        def run():
            with torch.no_grad(), autocast(device):
                for start in range(0, n_articles, batch):
                    article_embeddings(
                        enc, docs[start : start + batch], mode, device, tokenizer.pad_token_id, grad=False
                    )

        return run

    seconds = timed_interleaved(
        {mode: make_run(mode) for mode in args.modes}, device, min(args.warmup, 1), max(1, args.steps // 2)
    )
    return [
        row(
            "embed",
            mode,
            seconds[mode],
            {"articles/s": n_articles / seconds[mode], "chunks/s": len(chunk_lengths) / seconds[mode]},
            flops,
            peak,
            f"{n_articles} articles, {len(chunk_lengths)} chunks, batch {batch}",
        )
        for mode in args.modes
    ]


def row(stage, mode, seconds, rates, flops, peak, note, extra=None) -> dict:
    achieved = flops / seconds
    return {
        **(extra or {}),
        "stage": stage,
        "mode": mode,
        "seconds_per_step": seconds,
        **rates,
        "useful_tflop_per_step": flops / 1e12,
        "achieved_tflops": achieved / 1e12,
        "utilisation": achieved / peak if peak else None,
        "note": note,
    }


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


def parse_args(argv=None):
    from lexgraph.core.arguments import OneLineParser, non_negative_int, positive_int
    from lexgraph.core.config import read_params
    from lexgraph.core.errors import LexgraphError

    parser = OneLineParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    parser.add_argument("--modes", default=",".join(MODES), help="article-side modes for train_dsr and embed")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--small", action="store_true", help="e5-small / mT5-small shapes (for a CPU)")
    parser.add_argument("--steps", type=positive_int, default=5, help="timed steps per measurement")
    parser.add_argument("--warmup", type=non_negative_int, default=1)
    parser.add_argument("--profile", type=Path, default=ROOT / "profiles/paper.yaml", help="batch sizes from here")
    parser.add_argument(
        "--articles",
        type=Path,
        default=ROOT / "data/sample/articles.csv",
        help="articles (and questions_*.csv beside them) for the length distribution",
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=ROOT / "models/pretrain",
        help="tokenizer directory for the length distribution (else a words estimate)",
    )
    for key in ("hidden", "layers", "heads", "intermediate", "positions", "vocab"):
        parser.add_argument(f"--{key}", type=positive_int, help=f"encoder {key} (overrides the preset)")
    for key in (
        "pretrain-batch",
        "pretrain-length",
        "d2q-batch",
        "d2q-returns",
        "d2q-length",
        "d2q-input",
        "dsr-batch",
        "query-length",
        "embed-batch",
        "embed-articles",
    ):
        parser.add_argument(f"--{key}", type=positive_int, help="overrides the profile's value")
    parser.add_argument(
        "--sdpa", default="default", help="attention backends of train_dsr: default | flash,efficient,cudnn,math"
    )
    parser.add_argument(
        "--stable-queries",
        choices=("auto", "on", "off"),
        default="auto",
        help="pad train_dsr's questions to multiples of 32 tokens: auto (as train_dsr: on CUDA only), on, off",
    )
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args(argv)
    try:  # lexgraph's own reader: a repeated key, bad bytes or an unknown section is one line
        profile = read_params(args.profile)
    except LexgraphError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    defaults = {
        "pretrain_batch": profile["pretrain"]["batch_size"],
        "pretrain_length": profile["pretrain"]["max_length"],
        "d2q_batch": profile["queries"]["batch_size"],
        "d2q_returns": profile["queries"]["per_article"],
        "d2q_length": profile["queries"]["max_length"],
        "d2q_input": profile["queries"]["max_input_length"],
        "dsr_batch": profile["dsr"]["batch_size"],
        "query_length": profile["dsr"]["max_query_length"],
        "embed_batch": profile["embed"]["batch_size"],
        "embed_articles": 4 * profile["embed"]["batch_size"],
    }
    if args.small:
        defaults.update(SMALL_BATCHES)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.chunk_length = profile["dsr"]["max_chunk_length"]
    args.document_length = profile["dsr"]["max_document_length"]
    args.stages = [s for s in args.stages.split(",") if s]
    args.modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(args.stages) - set(STAGES)) + sorted(set(args.modes) - set(MODES))
    if unknown:
        parser.error(f"unknown stage/mode {unknown}")
    return args


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    args = parse_args(argv)
    from lexgraph.core.config import resolve_device
    from lexgraph.core.machine import describe

    device = resolve_device(args.device)
    size = "small" if args.small else "base"
    shape = dict(ENCODERS[size], **{k: getattr(args, k) for k in ENCODERS[size] if getattr(args, k) is not None})
    name, peak = peak_flops(device)
    print(
        f"device: {device} ({name}); peak bf16: {f'{peak / 1e12:.0f} TFLOP/s' if peak else 'unknown (CPU)'}; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(f"encoders: {shape}; doc2query: {DOC2QUERY[size]}; {args.warmup} warm-up + {args.steps} timed steps")
    dist = length_distribution(args.articles, args.tokenizer, args.chunk_length, args.document_length)
    counts = np.bincount([len(doc) for doc in dist["chunks"]])
    print(
        f"length distribution: {len(dist['chunks'])} articles of {dist['articles']} ({dist['source']}), "
        f"chunks per article at {args.chunk_length} tokens: "
        + ", ".join(f"{n}: {c / len(dist['chunks']):.1%}" for n, c in enumerate(counts) if c)
    )
    ratios = padding_table(
        dist["chunks"],
        2 * args.dsr_batch,
        args.document_length // args.chunk_length,
        args.chunk_length,
        np.random.default_rng(0),
    )
    print(
        f"backbone tokens computed per useful token, batches of {2 * args.dsr_batch} articles: "
        + ", ".join(f"{m} {r:.2f}" for m, r in ratios.items())
        + f" (packing computes {ratios['real'] / ratios['packed']:.2f}x fewer than real, "
        f"{ratios['slots'] / ratios['packed']:.2f}x fewer than slots)"
    )
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = tiny_tokenizer(Path(tmp))
        for stage in args.stages:
            log.info("running %s ...", stage)
            if stage == "pretrain":
                rows += bench_pretrain(args, shape, device, peak)
            elif stage == "doc2query":
                rows += bench_doc2query(args, DOC2QUERY[size], device, peak, dist)
            elif stage == "train_dsr":
                rows += bench_train_dsr(args, shape, device, peak, dist, tokenizer)
            else:
                rows += bench_embed(args, shape, device, peak, dist, tokenizer)
            for r in rows[-len(args.modes) if stage in ("train_dsr", "embed") else -1 :]:
                rates = ", ".join(f"{k} {v:.2f}" for k, v in r.items() if k.endswith("/s"))
                util = f"{r['utilisation']:.1%} of peak" if r["utilisation"] is not None else "no peak known"
                counted = (
                    f"; per step {r['ops']} operators, {r['syncs']} host syncs {r['sync_causes'] or ''}"
                    + (f" ({r['cuda_syncs']} by CUDA's sync debug mode)" if r["cuda_syncs"] is not None else "")
                    + f", {r['article_calls_per_step']:.1f} article backbone calls; distinct shapes over "
                    f"{args.steps} steps: article {r['article_shapes']}, query {r['query_shapes']}"
                    if "ops" in r
                    else ""
                )
                print(
                    f"{r['stage']:<10} {r['mode']:<8} {r['seconds_per_step']:8.3f} s/step  {rates}; "
                    f"{r['achieved_tflops'] * 1e3:.1f} useful GFLOP/s ({util}); {r['note']}{counted}"
                )
    for stage in ("train_dsr", "embed"):
        by_mode = {r["mode"]: r["seconds_per_step"] for r in rows if r["stage"] == stage}
        if "packed" in by_mode and len(by_mode) > 1:
            print(
                f"{stage}: packed is "
                + ", ".join(f"{by_mode[m] / by_mode['packed']:.2f}x {m}" for m in by_mode if m != "packed")
            )
    if device.type != "cuda":
        print(f"no GPU here: the paper-scale target (>= 2 x 108 pairs/s on an H100) needs `{GPU_COMMAND}` on one")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "device": str(device),
                    "device_name": name,
                    "encoder": shape,
                    "doc2query": DOC2QUERY[size],
                    "padding": ratios,
                    "results": rows,
                    "stable_queries": args.stable_queries,
                    "command": "python benchmarks/throughput.py " + " ".join(sys.argv[1:] if argv is None else argv),
                    "machine": describe(torch.get_num_threads()),
                },
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

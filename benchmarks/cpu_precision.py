"""Benchmark: the chunk encoder's number format on the CPU (issue 44, item 3).

    .venv/bin/python benchmarks/cpu_precision.py [--workspace .] [--n 300] [--batch-size 32]
        [--repeat 3] [--threads 2] [--out benchmarks/cpu_precision.json]
    .venv/bin/python benchmarks/cpu_precision.py --table benchmarks/cpu_precision.json   # the docs table

(run in a workspace after ``dvc repro zeroshot``: the sample's clean articles and questions and its
e5-small checkpoint, ``models/pretrain``)

**Speed.** ``--n`` articles spread evenly over the workspace's clean articles, cut into the windows
of its ``zeroshot`` section (those ``lexgraph index`` encodes: the ``encode_chunks`` cache holds these
very windows), encoded by each variant in turns, ``--repeat`` rounds (the order rotated each round),
after one untimed warm-up each; a variant's figure is its median articles/s, ``ratio`` that over
``torch_fp32``'s.

* ``torch_fp32``: today's ``lexgraph index`` (:func:`lexgraph.encoding.chunks.encode_chunk_table`,
  shape-stable batches), float32; ``torch_fp32_longest_first``: the same without shape-stable batches
  (the ``zeroshot`` stage's and ``benchmarks/french_law.py``'s path);
* ``torch_autocast_bf16``: ``torch_fp32`` under ``torch.autocast("cpu", torch.bfloat16)``;
* ``torch_bf16``: the backbone's weights in bfloat16 (:mod:`lexgraph.models.precision`, ``lexgraph index
  --precision bf16``), shape-stable batches;
* ``st_torch_fp32``: sentence-transformers' torch backend (``SentenceTransformer(models/pretrain)``,
  its own batching, ``max_seq_length`` = the window) over the same windows decoded back to text;
* ``openvino`` / ``openvino_fp32``: OpenVINO's CPU plugin on the backbone converted from torch
  (``openvino.convert_model``), its default inference precision (bf16 on a CPU with AMX) and f32,
  over the same windows, longest first, mean-pooled as the encoder pools (only when ``openvino`` is
  installed; it is not a dependency of lexgraph).

``cosine``: each variant's smallest cosine to ``torch_fp32``'s window vectors.

**Quality.** Every clean article encoded in ``torch_fp32`` and ``torch_bf16`` (shape-stable batches, as
``lexgraph index``), aggregated as the ``zeroshot`` system aggregates (token-count-weighted mean of
the windows), the test questions encoded by the zeroshot query encoder in float32 (as ``lexgraph
search`` does), exact cosine top-100: recall@100 and ndcg@10 of each, and the paired randomisation
test of bf16 against fp32 on recall@100 (10,000 resamples; one comparison, so no Holm adjustment).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lexgraph.core.arguments import OneLineParser, positive_int
from lexgraph.core.config import workspace_params
from lexgraph.core.io import read_parquet, write_json
from lexgraph.core.machine import describe
from lexgraph.core.timing import interleaved, rate_rows
from lexgraph.encoding.chunks import embed_from_chunks, encode_chunk_table
from lexgraph.methods.zeroshot.system import SECTION, ZeroshotConfig, article_encoder, load_system
from lexgraph.models.precision import cast_backbone, cpu_flags

#: the CPU flags that decide what reduced precision can run fast, reported with the figures
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def spread(texts: list[str], n: int) -> list[str]:
    rows = np.linspace(0, len(texts) - 1, min(n, len(texts))).round().astype(int)
    return [texts[int(r)] for r in rows]


def torch_variant(encoder, texts: list[str], batch_size: int, stable: bool, autocast: bool = False) -> Callable:
    def run() -> torch.Tensor:
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        with ctx:
            return encode_chunk_table(encoder, list(range(len(texts))), texts, batch_size, stable=stable).vectors

    return run


def windows(encoder, texts: list[str]) -> list[list[int]]:
    """The token ids of every window of ``texts``, in order."""
    return [list(chunk) for doc in encoder.chunk(texts) for chunk in doc]


def st_variant(pretrained: Path, encoder, texts: list[str], batch_size: int) -> Callable:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(pretrained), device="cpu")
    model.max_seq_length = encoder.max_chunk_length
    decoded = encoder.tokenizer.batch_decode(windows(encoder, texts), skip_special_tokens=True)

    def run() -> torch.Tensor:
        out = model.encode(decoded, batch_size=batch_size, convert_to_tensor=True, normalize_embeddings=False)
        return out.float().cpu()  # (m, dim)

    return run


def openvino_variant(encoder, texts: list[str], batch_size: int, precision: str | None) -> Callable | None:
    """OpenVINO's CPU plugin on ``encoder``'s backbone (``precision``: its inference precision hint,
    None for the plugin's default), or None when openvino is not installed."""
    try:
        import openvino as ov
    except ImportError:
        return None
    ids = windows(encoder, texts)
    example = {"input_ids": torch.ones(2, 8, dtype=torch.long), "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    converted = ov.convert_model(encoder.backbone.float().eval(), example_input=example)
    config = {"INFERENCE_NUM_THREADS": torch.get_num_threads()}
    if precision is not None:
        config["INFERENCE_PRECISION_HINT"] = precision
    compiled = ov.Core().compile_model(converted, "CPU", config)
    pad = encoder.tokenizer.pad_token_id
    order = sorted(range(len(ids)), key=lambda i: (-len(ids[i]), i))

    def run() -> torch.Tensor:
        out = torch.empty(len(ids), encoder.dim)  # (m, dim)
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            length = len(ids[rows[0]])
            input_ids = np.full((len(rows), length), pad, dtype=np.int64)  # (batch, len)
            mask = np.zeros((len(rows), length), dtype=np.int64)  # (batch, len)
            for r, i in enumerate(rows):
                input_ids[r, : len(ids[i])], mask[r, : len(ids[i])] = ids[i], 1
            hidden = torch.from_numpy(np.asarray(compiled({"input_ids": input_ids, "attention_mask": mask})[0]))
            out[torch.tensor(rows)] = encoder.pool_states(hidden, torch.from_numpy(mask))
        return out

    return run


def timed(variants: dict[str, Callable], repeat: int) -> tuple[dict[str, list[float]], dict[str, torch.Tensor]]:
    """:func:`~lexgraph.core.timing.interleaved` rounds after one untimed warm-up of each variant."""
    for run in variants.values():
        run()
    return interleaved(variants, repeat)


def speed(args, workspace: Path) -> dict[str, Any]:
    config = workspace_params(SECTION, workspace, ZeroshotConfig)
    pretrained = workspace / "models" / "pretrain"
    df = read_parquet(workspace / "data" / "clean" / "articles.parquet", ["id", "article"])
    texts = spread([str(t) for t in df["article"].to_list()], args.n)
    fp32 = article_encoder(pretrained, config).eval()
    bf16 = article_encoder(pretrained, config).eval()
    cast_backbone(bf16.backbone, "bf16")
    variants = {
        "torch_fp32": torch_variant(fp32, texts, args.batch_size, stable=True),
        "torch_fp32_longest_first": torch_variant(fp32, texts, args.batch_size, stable=False),
        "torch_autocast_bf16": torch_variant(fp32, texts, args.batch_size, stable=True, autocast=True),
        "torch_bf16": torch_variant(bf16, texts, args.batch_size, stable=True),
        "st_torch_fp32": st_variant(pretrained, fp32, texts, args.batch_size),
    }
    for name, hint in (("openvino", None), ("openvino_fp32", "f32")):
        run = openvino_variant(fp32, texts, args.batch_size, hint)
        if run is not None:
            variants[name] = run
    seconds, out = timed(variants, args.repeat)
    rows = rate_rows(seconds, len(texts), "torch_fp32")
    base = out["torch_fp32"]
    return {
        "articles": len(texts),
        "windows": int(base.shape[0]),
        "window": fp32.max_chunk_length,
        "batch_size": args.batch_size,
        "repeat": args.repeat,
        "variants": {
            name: {**row, "cosine": round(float(torch.nn.functional.cosine_similarity(out[name], base).min()), 5)}
            for name, row in rows.items()
        },
    }


def quality(workspace: Path, batch_size: int) -> dict[str, Any]:
    from lexgraph.metrics.ir import evaluate_run, exact_top_k, per_query
    from lexgraph.metrics.significance import paired_randomization_test

    config = workspace_params(SECTION, workspace, ZeroshotConfig)
    df = read_parquet(workspace / "data" / "clean" / "articles.parquet", ["id", "article"])
    ids, texts = df["id"].to_numpy().astype(np.int64), [str(t) for t in df["article"].to_list()]
    order = np.argsort(ids, kind="stable")
    ids, texts = ids[order], [texts[i] for i in order]
    questions = read_parquet(
        workspace / "data" / "clean" / "questions.parquet", ["id", "question", "article_ids", "split"]
    )
    test = questions.filter(questions["split"] == "test")
    qrels = {q: set(a) for q, a in zip(test["id"].to_list(), test["article_ids"].to_list())}
    queries = load_system(workspace, "cpu").encode(test["question"].to_list())  # (nq, dim), float32
    result: dict[str, Any] = {"articles": len(ids), "questions": len(qrels)}
    per: dict[str, list[float]] = {}
    for precision in ("fp32", "bf16"):
        encoder = cast_backbone_of(article_encoder(workspace / "models" / "pretrain", config).eval(), precision)
        table = encode_chunk_table(encoder, ids, texts, batch_size, stable=True)
        articles = embed_from_chunks(encoder, table)  # (n, dim)
        top, _ = exact_top_k(queries, articles, ids, 100)
        run = {q: top[i].tolist() for i, q in enumerate(qrels)}
        scores = evaluate_run(run, qrels)
        result[precision] = {m: round(100 * scores[m], 2) for m in ("recall@100", "ndcg@10")}
        per[precision] = [row["recall@100"] for row in per_query(run, qrels).values()]
    result["recall@100_change"] = round(result["bf16"]["recall@100"] - result["fp32"]["recall@100"], 2)
    result["p_recall@100"] = round(paired_randomization_test(per["bf16"], per["fp32"], 10000, 0), 4)
    return result


def cast_backbone_of(encoder, precision: str):
    cast_backbone(encoder.backbone, precision)
    return encoder


#: how the docs name each variant
LABELS = {
    "torch_fp32": "torch fp32, shape-stable batches (`lexgraph index`, its default)",
    "torch_fp32_longest_first": "torch fp32, longest first (the `zeroshot` stage)",
    "torch_autocast_bf16": "torch fp32 weights under CPU autocast to bf16",
    "torch_bf16": "**torch bf16 weights (`lexgraph index --precision bf16`)**",
    "st_torch_fp32": "sentence-transformers, torch backend, fp32",
    "openvino": "OpenVINO, default precision (bf16 on AMX)",
    "openvino_fp32": "OpenVINO, f32",
}


def table(saved: dict[str, Any]) -> str:
    """The Markdown table of a saved result: each variant's articles/s, ratio and smallest cosine."""
    rows = [
        "| Variant | articles/s | vs torch fp32 | smallest cosine to fp32 |",
        "|:---|---:|---:|---:|",
    ]
    for name, row in saved["speed"]["variants"].items():
        rows.append(f"| {LABELS[name]} | {row['articles_per_s']:.1f} | {row['ratio']:.2f}x | {row['cosine']:.5f} |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> None:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("."), help="a workspace after `dvc repro zeroshot`")
    parser.add_argument("--n", type=positive_int, default=300, help="articles encoded for the speed figures")
    parser.add_argument("--batch-size", type=positive_int, default=32)
    parser.add_argument("--repeat", type=positive_int, default=3, help="timed rounds, the variants in turns")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch threads")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    parser.add_argument("--table", type=Path, metavar="JSON", help="print the Markdown table of a saved result")
    args = parser.parse_args(argv)
    if args.table is not None:
        import json

        print(table(json.loads(args.table.read_text(encoding="utf-8"))))
        return
    torch.set_num_threads(args.threads)
    flags = cpu_flags()
    result = {
        "machine": describe(args.threads),
        "cpu_flags": {flag: flag in flags for flag in FLAGS},
        "speed": speed(args, args.workspace),
        "quality": quality(args.workspace, args.batch_size),
    }
    write_json(result, args.out)
    for name, row in result["speed"]["variants"].items():
        print(f"{name:>26}: {row['articles_per_s']:7.2f} articles/s  ratio {row['ratio']:.3f}  cosine {row['cosine']}")
    print(result["quality"])


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: the cost of shape-stable chunk encoding (encode_chunk_table's ``stable``) on the sample.

    .venv/bin/python benchmarks/stable_batches.py [--articles data/clean/articles.parquet]
        [--model models/pretrain] [--n 300] [--batch-size 32] [--steps 16 32] [--repeat 3]
        [--threads 2] [--out benchmarks/stable_batches.json]

(run in a workspace after ``dvc repro``: the sample's clean articles and its e5-small checkpoint)

``n`` articles spread evenly over ``--articles`` are chunked and encoded by the e5 backbone of
``--model`` (``max_chunk_length`` 256, ``max_document_length`` 1024, mean token pooling, as
``encode_chunks``) with :func:`lexgraph.encoding.chunks.encode_chunk_table`: today's batches
(``default``: longest first, padded to the batch's longest chunk) and shape-stable ones
(:mod:`lexgraph.encoding.stable_batches`) at each bucket step of ``--steps`` (the module's
``STABLE_STEP`` set for the run), ``--batch-size`` rows. The variants run in turns, ``--repeat``
rounds (the order rotated each round), after one untimed warm-up each; a variant's figure is its
median articles/s, its ``ratio`` that over the default's.

``padding``: token positions computed (rows x padded length, dummy rows included) over the real
tokens, from the plans alone; ``padding_by_corpus``: the same for ``--plan-sizes`` articles spread
over the whole file (and all of them), a small update's cost against a whole index's.
``identical``: of the articles kept when every third one is dropped, how many get the same
chunk-vector bits as in the whole run (the incremental index's requirement: all of them with
``stable``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

import lexgraph.encoding.chunks as chunks
from lexgraph.core.arguments import OneLineParser, positive_int
from lexgraph.core.io import read_parquet, write_json
from lexgraph.core.machine import describe
from lexgraph.core.timing import interleaved, rate_rows
from lexgraph.encoding.stable_batches import stable_batches
from lexgraph.models.article_encoder import HierarchicalArticleEncoder

SETTINGS = dict(max_chunk_length=256, max_document_length=1024, token_pooling="mean", num_layers=0)


def encode(encoder, texts: Sequence[str], batch_size: int, step: int | None) -> chunks.ChunkTable:
    """encode_chunk_table of ``texts``: the default path (``step`` None) or stable at ``step``."""
    if step is not None:
        chunks.STABLE_STEP = step
    ids = list(range(len(texts)))
    return chunks.encode_chunk_table(encoder, ids, texts, batch_size, stable=step is not None)


def padding(lengths: list[int], batch_size: int, step: int | None, max_length: int) -> float:
    """Token positions computed over real tokens, for the default plan (``step`` None) or a stable one."""
    if step is None:
        ordered = sorted(lengths, reverse=True)
        computed = sum(len(b) * b[0] for b in (ordered[s : s + batch_size] for s in range(0, len(ordered), batch_size)))
    else:
        computed = sum(b.size * b.length for b in stable_batches(lengths, batch_size, step, max_length))
    return round(computed / sum(lengths), 4)


def spread(df, n: int) -> list[str]:
    """``n`` articles of ``df`` spread evenly over it."""
    rows = np.linspace(0, df.height - 1, min(n, df.height)).round().astype(int)
    return [str(df["article"][int(r)]) for r in rows]


def padding_by_corpus(encoder, df, sizes: Sequence[int], batch_size: int, steps: Sequence[int]) -> dict[str, Any]:
    """:func:`padding` of each plan for ``sizes`` articles and for all of ``df``, keyed by the count."""
    out = {}
    for n in [*sizes, df.height]:
        lengths = [len(c) for doc in encoder.chunk(spread(df, n)) for c in doc]
        plans = {"default": None, **{f"stable_{s}": s for s in steps}}
        out[str(min(n, df.height))] = {
            k: padding(lengths, batch_size, v, encoder.max_chunk_length) for k, v in plans.items()
        }
    return out


def identical(encoder, texts: list[str], whole: chunks.ChunkTable, batch_size: int, step: int | None) -> list[int]:
    """``[same, kept]``: articles of the two-thirds subset whose chunk vectors equal the whole run's bits."""
    kept = [i for i in range(len(texts)) if i % 3]
    part = encode(encoder, [texts[i] for i in kept], batch_size, step)
    same = 0
    for r, i in enumerate(kept):
        a = part.vectors[part.offsets[r] : part.offsets[r + 1]]
        same += torch.equal(a, whole.vectors[whole.offsets[i] : whole.offsets[i + 1]])
    return [same, len(kept)]


def measure(args) -> dict[str, Any]:
    """The figures of the module docstring."""
    torch.set_num_threads(args.threads)
    df = read_parquet(args.articles, ["id", "article"])
    texts = spread(df, args.n)
    encoder = HierarchicalArticleEncoder.from_pretrained(args.model, **SETTINGS).eval()
    lengths = [len(c) for doc in encoder.chunk(texts) for c in doc]
    variants: dict[str, int | None] = {"default": None, **{f"stable_{s}": s for s in args.steps}}
    for step in variants.values():  # warm-up
        encode(encoder, texts[:32], args.batch_size, step)
    runs = {name: (lambda step=step: encode(encoder, texts, args.batch_size, step)) for name, step in variants.items()}
    seconds, whole = interleaved(runs, args.repeat)
    rows = rate_rows(seconds, len(texts), "default")
    return {
        "machine": describe(args.threads),
        "articles": len(texts),
        "chunks": len(lengths),
        "chunk_tokens_mean": round(float(np.mean(lengths)), 1),
        "batch_size": args.batch_size,
        "repeat": args.repeat,
        "variants": {
            name: {
                **rows[name],
                "padding": padding(lengths, args.batch_size, step, encoder.max_chunk_length),
                "identical": identical(encoder, texts, whole[name], args.batch_size, step),
            }
            for name, step in variants.items()
        },
        "padding_by_corpus": padding_by_corpus(encoder, df, args.plan_sizes, args.batch_size, args.steps),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--articles",
        type=Path,
        default=Path("data/clean/articles.parquet"),
        help="a workspace's clean articles (`dvc repro clean`)",
    )
    parser.add_argument(
        "--model", type=Path, default=Path("models/pretrain"), help="the base checkpoint (`dvc repro pretrain`)"
    )
    parser.add_argument("--n", type=positive_int, default=300, help="articles encoded")
    parser.add_argument("--batch-size", type=positive_int, default=32)
    parser.add_argument("--steps", type=positive_int, nargs="+", default=[16, 32], help="bucket steps of stable")
    parser.add_argument("--repeat", type=positive_int, default=3, help="timed rounds, the variants in turns")
    parser.add_argument("--plan-sizes", type=positive_int, nargs="+", default=[20, 300, 2760], help="padding_by_corpus")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch threads")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    args = parser.parse_args(argv)
    result = measure(args)
    write_json(result, args.out)
    for name, row in result["variants"].items():
        print(
            f"{name:>10}: {row['articles_per_s']:6.2f} articles/s  ratio {row['ratio']:.3f}  "
            f"padding x{row['padding']:.2f}  identical {row['identical'][0]}/{row['identical'][1]}"
        )


if __name__ == "__main__":
    sys.exit(main())

"""Synthetic queries for the articles (training data for the dense retriever).

Generators (``queries.generator``):

``crop`` (embedded sample)
    Contriever-style random cropping (Izacard et al., TMLR 2022): each query is a
    span of ``min_words``-``max_words`` consecutive words drawn at random from its
    article. Needs no model; each article's spans come from a generator seeded by
    ``(seed, article id)``, so they do not depend on the other articles.
``doc2query`` (paper profile)
    G-DSR (Louis et al., EACL 2023) trains on questions generated from every article
    with a French mT5 doc2query model (``doc2query/msmarco-french-mt5-base-v1``):
    ``per_article`` sampled queries (top-k / nucleus sampling) per article, the
    article truncated to ``max_input_length`` tokens.
``none``
    no synthetic queries (an empty file with the right schema), for the ablation.

Empty queries and repeats of the same text for the same article are dropped; a text
generated for several different articles is dropped for all of them (each synthetic
query has exactly one gold article, so an ambiguous one would be a false negative).

The output follows the clean questions schema (see DEVELOPERS.md): ``id`` int64
(``first_id``, ``first_id`` + 1, … in article order), ``question``, ``category`` =
"synthetic", ``subcategory`` = the generator, ``extra_description`` = "",
``article_ids`` = [source article], ``split`` = "synthetic".
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lexgraph.core.config import params_error, section_config
from lexgraph.core.errors import ConfigError, DataError
from lexgraph.core.provenance import output
from lexgraph.data.schema import CLEAN_QUESTION_SCHEMA

log = logging.getLogger(__name__)

SECTION = "queries"
GENERATORS = ("none", "crop", "doc2query")


@dataclass(frozen=True)
class QueriesConfig:
    """The ``queries`` section of ``params.yaml``."""

    generator: str  # none | crop | doc2query
    per_article: int
    first_id: int  # ids of synthetic queries start here (no clash with real questions)
    # crop
    min_words: int
    max_words: int
    # doc2query
    model: str
    top_k: int
    top_p: float
    max_length: int  # generated tokens
    max_input_length: int  # article tokens fed to the model
    batch_size: int  # articles per generate() call
    mixed_precision: bool  # bf16 autocast on CUDA (mT5 is unstable in fp16)

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> QueriesConfig:
        return section_config(cls, params, SECTION)

    def validate(self) -> None:
        def bad(key: str, expected: str) -> ConfigError:
            return params_error(f"'{SECTION}.{key}' = {getattr(self, key)!r}, expected {expected}")

        if self.generator not in GENERATORS:
            raise bad("generator", f"one of {', '.join(GENERATORS)}")
        for key in ("per_article", "min_words", "max_words", "top_k", "max_length", "max_input_length", "batch_size"):
            if getattr(self, key) < 1:  # integers: section_config checked the types
                raise bad(key, "a positive integer")
        if self.first_id < 0:
            raise bad("first_id", "a non-negative integer")
        if self.max_words < self.min_words:
            raise bad("max_words", f"an integer >= min_words ({self.min_words})")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "a number in (0, 1]")


# ---------------------------------------------------------------------------
# generators: each returns [(article_id, query_text), ...] in article order
# ---------------------------------------------------------------------------


def crop_queries(
    articles: Sequence[tuple[int, str]], *, per_article: int, min_words: int, max_words: int, seed: int
) -> list[tuple[int, str]]:
    """``per_article`` random spans of consecutive words per article.

    A span's length is uniform in ``[min_words, max_words]`` (capped at the article's
    length) and its start uniform over the positions where it fits.
    """
    import numpy as np

    from lexgraph.core.progress import progress

    pairs: list[tuple[int, str]] = []
    for article_id, text in progress(articles, "crop", unit="article", leave=False):
        words = text.split()
        if not words:
            continue
        rng = np.random.default_rng([seed % 2**32, int(article_id) % 2**63])
        for _ in range(per_article):
            length = min(int(rng.integers(min_words, max_words + 1)), len(words))
            start = int(rng.integers(0, len(words) - length + 1))
            pairs.append((article_id, " ".join(words[start : start + length])))
    return pairs


def doc2query_queries(
    articles: Sequence[tuple[int, str]],
    *,
    model_name: str,
    per_article: int,
    top_k: int,
    top_p: float,
    max_length: int,
    max_input_length: int,
    batch_size: int,
    seed: int,
    device,
    mixed_precision: bool = True,
    distributed: bool = True,
) -> list[tuple[int, str]]:
    """``per_article`` sampled doc2query questions per article (seq2seq model).

    The batch plan is global: articles longest first in batches of ``batch_size``, batch
    ``b`` sampled under the seed ``(seed, b)``. Under ``torchrun`` (a process group open,
    ``distributed``) each rank generates a contiguous slice of the batches and every rank
    gets all queries back (:func:`lexgraph.core.distributed.map_batches`): the same queries as
    one process, since an article's samples depend on its batch, never on the process.
    """
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from lexgraph.core.config import autocast
    from lexgraph.core.distributed import map_batches
    from lexgraph.core.hub import from_pretrained
    from lexgraph.core.progress import progress

    param = f"{SECTION}.model"
    tokenizer = from_pretrained(AutoTokenizer.from_pretrained, model_name, param=param)
    model = from_pretrained(AutoModelForSeq2SeqLM.from_pretrained, model_name, param=param)
    model.to(device).eval()
    use_amp = mixed_precision and device.type == "cuda"
    if use_amp and not torch.cuda.is_bf16_supported():
        log.warning("this GPU has no bf16; running doc2query in fp32 (mT5 overflows in fp16)")
        use_amp = False

    # Longest articles first: batches of similar length waste less padding. The order
    # is a pure function of the input, and each batch is seeded by its index.
    order = sorted((i for i in range(len(articles)) if articles[i][1].strip()), key=lambda i: (-len(articles[i][1]), i))
    log.info(
        "doc2query: %d articles, %d queries each, batches of %d on %s", len(articles), per_article, batch_size, device
    )
    batches = list(enumerate(order[start : start + batch_size] for start in range(0, len(order), batch_size)))

    def run(batch: tuple[int, list[int]]) -> list[str]:
        batch_no, idx = batch
        enc = tokenizer(
            [articles[i][1] for i in idx],
            truncation=True,
            max_length=max_input_length,
            padding=True,
            return_tensors="pt",
        )
        torch.manual_seed((seed * 100_003 + batch_no) % 2**63)
        with torch.no_grad(), autocast(device, use_amp):
            out = model.generate(
                input_ids=enc["input_ids"].to(device),  # (batch, <= max_input_length)
                attention_mask=enc["attention_mask"].to(device),
                do_sample=True,
                top_k=top_k,
                top_p=top_p,
                max_length=max_length,
                num_return_sequences=per_article,
            )  # (batch * per_article, <= max_length)
        return tokenizer.batch_decode(out.cpu(), skip_special_tokens=True)

    results = map_batches(
        run, batches, distributed=distributed, wrap=lambda local: progress(local, "doc2query", unit="batch")
    )
    generated: dict[int, list[str]] = {}
    for (_, idx), texts in zip(batches, results):
        for row, i in enumerate(idx):
            generated[i] = texts[row * per_article : (row + 1) * per_article]
    return [(articles[i][0], text) for i in range(len(articles)) for text in generated.get(i, [])]


# ---------------------------------------------------------------------------
# post-processing and I/O
# ---------------------------------------------------------------------------


def deduplicate(pairs: Iterable[tuple[int, str]]) -> list[tuple[int, str]]:
    """Normalise whitespace, drop empty queries and repeats per article, and drop any
    text that occurs for more than one article. Keeps first-occurrence order."""
    seen: set[tuple[int, str]] = set()
    kept: list[tuple[int, str]] = []
    for article_id, text in pairs:
        text = " ".join(str(text).split())
        if not text or (article_id, text) in seen:
            continue
        seen.add((article_id, text))
        kept.append((article_id, text))
    owners = Counter(text for _, text in kept)
    ambiguous = {text for text, n in owners.items() if n > 1}
    if ambiguous:
        log.info("dropping %d query text(s) generated for several articles", len(ambiguous))
    return [(a, t) for a, t in kept if t not in ambiguous]


def to_frame(pairs: Sequence[tuple[int, str]], generator: str, first_id: int):
    """The synthetic questions table (clean questions schema)."""
    import polars as pl

    n = len(pairs)
    return pl.DataFrame(
        {
            "id": list(range(first_id, first_id + n)),
            "question": [t for _, t in pairs],
            "category": ["synthetic"] * n,
            "subcategory": [generator] * n,
            "extra_description": [""] * n,
            "article_ids": [[int(a)] for a, _ in pairs],
            "split": ["synthetic"] * n,
        },
        schema=CLEAN_QUESTION_SCHEMA,
    )


def read_articles(path: str | os.PathLike) -> list[tuple[int, str]]:
    """``(id, article)`` pairs of a clean articles file, in file order."""
    from lexgraph.core.io import read_parquet

    df = read_parquet(path, required=["id", "article"])
    for column in ("id", "article"):
        nulls = df[column].is_null()
        if nulls.any():
            raise DataError(path, "null value; expected a value on every row", row=int(nulls.arg_max()), column=column)
    dup = df["id"].is_duplicated()
    if dup.any():
        raise DataError(
            path,
            f"duplicate article id {df['id'][int(dup.arg_max())]}; expected unique ids",
            row=int(dup.arg_max()),
            column="id",
        )
    return list(zip(df["id"].cast(int).to_list(), df["article"].to_list()))


def generate(articles: Sequence[tuple[int, str]], cfg: QueriesConfig, *, seed: int, device="cpu"):
    """Synthetic questions for ``articles`` as a DataFrame (see module docstring)."""
    if cfg.generator == "none":
        pairs: list[tuple[int, str]] = []
    elif cfg.generator == "crop":
        pairs = crop_queries(
            articles, per_article=cfg.per_article, min_words=cfg.min_words, max_words=cfg.max_words, seed=seed
        )
    else:
        import torch

        pairs = doc2query_queries(
            articles,
            model_name=cfg.model,
            per_article=cfg.per_article,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
            max_length=cfg.max_length,
            max_input_length=cfg.max_input_length,
            batch_size=cfg.batch_size,
            seed=seed,
            device=torch.device(device) if isinstance(device, str) else device,
            mixed_precision=cfg.mixed_precision,
        )
    raw = len(pairs)
    pairs = deduplicate(pairs)
    covered = len({a for a, _ in pairs})
    log.info(
        "%s: %d queries kept of %d generated, covering %d of %d articles",
        cfg.generator,
        len(pairs),
        raw,
        covered,
        len(articles),
    )
    return to_frame(pairs, cfg.generator, cfg.first_id)


def run(articles: str | os.PathLike, out: str | os.PathLike, cfg: QueriesConfig, *, seed: int, device: str = "auto"):
    """The ``generate_queries`` stage: clean articles -> synthetic questions Parquet."""
    from lexgraph.core.config import resolve_device
    from lexgraph.core.distributed import is_main, session
    from lexgraph.core.io import write_parquet

    rows = read_articles(articles)
    dev = resolve_device(device) if cfg.generator == "doc2query" else "cpu"
    with session(dev) as dev:  # under torchrun: doc2query batches shared out, rank 0 writes
        df = generate(rows, cfg, seed=seed, device=dev)
        if is_main():
            write_parquet(df, out)
            log.info("wrote %s (%d queries)", out, df.height)
    return df


@dataclass(frozen=True)
class QueriesPaths:
    """The ``generate_queries`` stage's input and output (``dvc.yaml`` names them); :func:`run`."""

    articles: Path = field(metadata={"help": "clean articles (Parquet)"})
    out: Path = output("output synthetic questions (Parquet)")

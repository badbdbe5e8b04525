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

Fetched synthetic questions (``fetch.synthetic``): when the clean questions hold rows of
split ``synthetic`` (the hub's own doc2query questions, G-DSR §4.2: "We generate five
queries per article, which results in a total of around 118k synthetic queries"), they are
the output's first rows, exactly as clean has them (ids included: ``fetch`` moved them past
the human ids, and ``mine_negatives`` finds the hub's BM25 negatives under those ids), and the
generator runs only for the articles that no fetched question cites. Without such rows (the
embedded sample) every article goes to the generator.

Empty queries and repeats of the same text for the same article are dropped; a text
generated for several different articles is dropped for all of them (each synthetic
query has exactly one gold article, so an ambiguous one would be a false negative), and so
is a generated text that repeats a fetched question (which cites another article).

The generated rows follow the clean questions schema (see DEVELOPERS.md): ``id`` int64
(``first_id``, ``first_id`` + 1, … in article order), ``question``, ``category`` =
"synthetic", ``subcategory`` = the generator, ``extra_description`` = "",
``article_ids`` = [source article], ``split`` = "synthetic".
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from typing import Annotated, Literal

from pydantic import Field, model_validator

from lexgraph.core.errors import DataError
from lexgraph.core.settings import Bool, Float, Int, Invalid, Section, Str, params_error
from lexgraph.core.stage import StageContext, stage_paths
from lexgraph.data.schema import CLEAN_QUESTION_SCHEMA

log = logging.getLogger(__name__)

SECTION = "queries"
#: the generators (module docstring)
Generator = Literal["none", "crop", "doc2query"]
#: a count of at least one
Positive = Annotated[Int, Field(gt=0)]


class QueriesConfig(Section, section=SECTION):
    """The ``queries`` section of ``params.yaml``."""

    generator: Generator = Field(description="crop (random word spans), doc2query (mT5) or none (ablation)")
    per_article: Positive = Field(description="queries drawn per article (before dropping empty/duplicate ones)")
    first_id: Annotated[Int, Field(ge=0)] = Field(
        description="ids of synthetic queries start here (no clash with real questions)"
    )
    min_words: Positive = Field(description="crop: span length uniform in [min_words, max_words]")
    max_words: Positive = Field(description="crop: the longest span, >= min_words")
    model: Str = Field(description="doc2query: the model")
    top_k: Positive = Field(description="doc2query sampling")
    top_p: Annotated[Float, Field(gt=0, le=1)] = Field(description="doc2query nucleus sampling")
    max_length: Positive = Field(description="doc2query: generated tokens")
    max_input_length: Positive = Field(description="doc2query: article tokens fed to the model")
    batch_size: Positive = Field(description="doc2query: articles per generate() call")
    mixed_precision: Bool = Field(description="doc2query: bf16 autocast on CUDA (mT5 is unstable in fp16)")

    @model_validator(mode="after")
    def _span(self) -> QueriesConfig:
        if self.max_words < self.min_words:
            raise Invalid("max_words", self.max_words, f"an integer >= min_words ({self.min_words})")
        return self


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
    articles: Sequence[tuple[int, str]], cfg: QueriesConfig, *, seed: int, device, distributed: bool = True
) -> list[tuple[int, str]]:
    """``cfg.per_article`` sampled doc2query questions per article (the seq2seq model ``cfg.model``,
    sampled and truncated as ``cfg`` says; bf16 on CUDA with ``cfg.mixed_precision``).

    The batch plan is global: articles longest first in batches of ``cfg.batch_size``, batch
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
    tokenizer = from_pretrained(AutoTokenizer.from_pretrained, cfg.model, param=param)
    model = from_pretrained(AutoModelForSeq2SeqLM.from_pretrained, cfg.model, param=param)
    model.to(device).eval()
    per_article, batch_size = cfg.per_article, cfg.batch_size
    use_amp = cfg.mixed_precision and device.type == "cuda"
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
            max_length=cfg.max_input_length,
            padding=True,
            return_tensors="pt",
        )
        torch.manual_seed((seed * 100_003 + batch_no) % 2**63)
        with torch.no_grad(), autocast(device, use_amp):
            out = model.generate(
                input_ids=enc["input_ids"].to(device),  # (batch, <= max_input_length)
                attention_mask=enc["attention_mask"].to(device),
                do_sample=True,
                top_k=cfg.top_k,
                top_p=cfg.top_p,
                max_length=cfg.max_length,
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


def generate(
    articles: Sequence[tuple[int, str]],
    cfg: QueriesConfig,
    *,
    seed: int,
    device="cpu",
    reserved: Collection[str] = (),
):
    """Synthetic questions for ``articles`` as a DataFrame (see module docstring); a generated
    text in ``reserved`` (the fetched questions' texts, whitespace-normalised) is dropped."""
    if cfg.generator == "none":
        pairs: list[tuple[int, str]] = []
    elif cfg.generator == "crop":
        pairs = crop_queries(
            articles, per_article=cfg.per_article, min_words=cfg.min_words, max_words=cfg.max_words, seed=seed
        )
    else:
        import torch

        pairs = doc2query_queries(
            articles, cfg, seed=seed, device=torch.device(device) if isinstance(device, str) else device
        )
    raw = len(pairs)
    pairs = deduplicate(pairs)
    if reserved:
        kept = [(a, t) for a, t in pairs if t not in reserved]
        if len(kept) < len(pairs):
            log.info("dropping %d generated query text(s) that repeat a fetched question", len(pairs) - len(kept))
        pairs = kept
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


def read_fetched(path: str | os.PathLike):
    """The fetched synthetic questions of a clean questions file: its rows of split
    ``synthetic``, in file order, in the clean questions schema (none: an empty table)."""
    import polars as pl

    from lexgraph.core.io import read_parquet

    df = read_parquet(path, required=list(CLEAN_QUESTION_SCHEMA))
    dtype = df.schema["article_ids"]
    if not (isinstance(dtype, pl.List) and dtype.inner.is_integer()):
        raise DataError(
            path, f"expected a list of int64 article ids (clean stage output), got {dtype}", column="article_ids"
        )
    return df.filter(pl.col("split") == "synthetic").select(
        pl.col(name).cast(dtype) for name, dtype in CLEAN_QUESTION_SCHEMA.items()
    )


def with_fetched(
    articles: Sequence[tuple[int, str]],
    fetched,
    cfg: QueriesConfig,
    *,
    seed: int,
    device="cpu",
    source: str | os.PathLike = "questions",
):
    """The stage's table: the ``fetched`` synthetic questions (clean's rows, as they are), then
    ``cfg.generator``'s questions for the articles that none of them cites (ids from
    ``cfg.first_id``). Without fetched rows, :func:`generate` of every article."""
    import polars as pl

    if fetched.height == 0:
        return generate(articles, cfg, seed=seed, device=device)
    cited = {int(a) for ids in fetched["article_ids"].to_list() for a in (ids or [])}
    todo = [(a, t) for a, t in articles if int(a) not in cited]
    reserved = {" ".join(str(t).split()) for t in fetched["question"].to_list()}
    generated = generate(todo, cfg, seed=seed, device=device, reserved=reserved)
    taken = set(fetched["id"].to_list())
    clash = [i for i in generated["id"].to_list() if i in taken]
    if clash:
        raise params_error(
            f"'{SECTION}.first_id' = {cfg.first_id}: the generated questions' ids "
            f"{cfg.first_id}..{cfg.first_id + generated.height - 1} reuse the id {clash[0]} of a fetched synthetic "
            f"question of {source}; expected a first_id above {max(taken)}"
        )
    log.info(
        "synthetic questions: %d from the hub (citing %d articles), %d generated (%s) for the %d other articles",
        fetched.height,
        len(cited),
        generated.height,
        cfg.generator,
        len(todo),
    )
    return pl.concat([fetched, generated], how="vertical")


def write_queries(
    articles: str | os.PathLike,
    out: str | os.PathLike,
    cfg: QueriesConfig,
    *,
    seed: int,
    device: str = "auto",
    questions: str | os.PathLike | None = None,
):
    """Clean articles (and the clean ``questions``, whose fetched synthetic rows are kept; None:
    nothing fetched) -> synthetic questions Parquet: :func:`run_generate_queries`'s work."""
    from lexgraph.core.config import resolve_device
    from lexgraph.core.distributed import is_main, session
    from lexgraph.core.io import write_parquet

    rows = read_articles(articles)
    fetched = read_fetched(questions) if questions is not None else to_frame([], cfg.generator, cfg.first_id)
    dev = resolve_device(device) if cfg.generator == "doc2query" else "cpu"
    with session(dev) as dev:  # under torchrun: doc2query batches shared out, rank 0 writes
        df = with_fetched(rows, fetched, cfg, seed=seed, device=dev, source=questions)
        if is_main():
            write_parquet(df, out)
            log.info("wrote %s (%d queries)", out, df.height)
    return df


QueriesPaths = stage_paths("generate_queries")


def run_generate_queries(paths: QueriesPaths, config: QueriesConfig, context: StageContext):
    """The ``generate_queries`` stage: synthetic queries per article (random crops, doc2query or none)."""
    return write_queries(
        paths.articles, paths.out, config, seed=context.seed, device=context.device, questions=paths.questions
    )

"""The ``fetch`` stage: BSARD (hub or a local copy) or the embedded sample → ``data/raw``.

Four sources, one output (``articles.parquet``, ``questions.parquet`` with a
``split`` column, ``negatives.parquet``), in BSARD's schema:

- ``sample``: the embedded French Code civil in ``data/sample`` (BSARD's file layout);
- ``local``: a directory holding the hub's files (``articles.csv``,
  ``questions_{train,test,synthetic}.csv``, ``negatives/bm25_negatives_*.json``);
- ``corpus`` (:mod:`lexgraph.data.corpus`): the field's JSON-lines/CSV/Parquet corpus with string
  ids and heading paths of any depth (``fetch.corpus_file``), and its questions
  (``fetch.questions_file``), both under ``data/corpus/`` (fetch's dvc.yaml dep, so that DVC
  sees an edit; a file elsewhere is refused); the string ids go to ``keys.parquet``;
- ``hub`` (:mod:`lexgraph.data.fetch_hub`): ``datasets.load_dataset("maastrichtlawtech/bsard", config, revision=…)``
  with configs ``corpus`` (split ``corpus``), ``questions`` (``train``, ``test``,
  ``synthetic``); the BM25 negatives (``negatives/bm25_negatives_{train,synthetic}.json``)
  are downloaded as files, only with ``fetch.negatives`` (``mine_negatives`` then uses
  them: never fetched and ignored).

Question ids are unique across every split, synthetic included: the hub numbers its
synthetic questions 1..N over the human ids, so when the two overlap every synthetic id (and
its BM25 negatives' ``question_id``) is moved past the largest human id by one offset
(:func:`lexgraph.data.integrity.synthetic_offset`: a function of the id sets, not of the
order of the splits; logged). No id then repeats: the train, dev and test ids are checked unique
across those splits as they are read, the synthetic ones among themselves, and dev is carved from train.

When a source has no dev split, one is carved from train deterministically (a hash of
the seed and the normalised question text decides) and without leaks: questions with
the same text always land in the same split, and no dev question repeats a test one. A
``fetch.dev_fraction`` that leaves train or dev without a question is refused here, naming
the setting and the counts (``train_dsr`` would otherwise fail on it, stages later).

Ids follow one rule (:mod:`lexgraph.data.schema`: non-negative decimal integers within int64,
no sign or leading zero; ``-1`` is padding in search), a corpus has at least
:data:`lexgraph.data.schema.MIN_ARTICLES` articles, and a column outside BSARD's layout (a
ninth hierarchy level, a misspelt column) is refused rather than dropped (a warning on the
hub, whose tables a new revision may widen).
Whatever the source, no question text may be in two of the train, dev and test splits
(``lexgraph.data.integrity``: train → test leakage is an error naming both rows).

Every row is validated as it is read (:mod:`lexgraph.data.readers`), where the file the user
edits is known: an error names that file (``data/sample/questions_dev.csv``, or the hub dataset
and config), the 1-based data row (the header is not a row) with the line it starts on, and the
column. A CSV must have comma-separated columns, each named once, and every row the header's
number of fields; ids are integers without whitespace or control characters; a JSON file (the
negatives, or JSON-lines tables on the hub) names each key of an object once. ``clean`` checks
the same things again on ``data/raw``, where they can no longer fail for a fetched table.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Annotated, Literal

import polars as pl
from pydantic import Field, model_validator

from lexgraph.core import layout
from lexgraph.core.errors import ConfigError, DataError
from lexgraph.core.inputs import require_directory
from lexgraph.core.io import atomic_path
from lexgraph.core.settings import Bool, Expect, Float, Invalid, Section, Str, params_error
from lexgraph.core.stage import StageContext, stage_paths
from lexgraph.data.integrity import (
    HUMAN_SPLITS,
    question_key,
    refuse_shared_texts,
    renumber_synthetic,
)
from lexgraph.data.keys import KEYS_FILE
from lexgraph.data.readers import (
    Source,
    empty_negatives,
    read_csv_source,
    read_negatives,
    validate_articles,
    validate_questions,
)
from lexgraph.data.schema import (
    ARTICLE_COLUMNS,
    CORPUS_FILES,
    NEGATIVE_FILES,
    QUESTION_COLUMNS,
    QUESTION_FILES,
    REQUIRED_ARTICLE_COLUMNS,
    REQUIRED_QUESTION_COLUMNS,
)

log = logging.getLogger(__name__)

#: where fetch reads the corpus and questions (module docstring)
SourceName = Literal["sample", "hub", "local", "corpus"]

#: the file keys a source needs (null elsewhere), and what each must name
_NEEDED = {
    "local": {"local_dir": "a directory holding the hub's files, since 'fetch.source' is local"},
    "corpus": {
        key: "a JSON-lines, CSV or Parquet file, since 'fetch.source' is corpus"
        for key in ("corpus_file", "questions_file")
    },
}
_UNDER_CORPUS = (
    f"a file under {layout.CORPUS}/, fetch's dvc.yaml dependency (DVC would not see edits to a file elsewhere, "
    "and fetch would not rerun)"
)


class FetchConfig(Section, section="fetch"):
    """The ``fetch`` section of params.yaml."""

    source: SourceName = Field(description="where the corpus and questions come from")
    sample_dir: Str = Field(description="the embedded sample (BSARD's file layout), for source sample")
    hub_repo: Str = Field(description="the hub dataset, for source hub")
    revision: Str | None = Field(description="a branch, tag or commit of the hub dataset")
    local_dir: Annotated[Str | None, Expect("null or a directory (for source local)")] = Field(
        description="a directory holding the hub's files, for source local"
    )
    corpus_file: Annotated[Str | None, Expect("null or a corpus file (for source corpus)")] = Field(
        description="source corpus: a JSON-lines, CSV or Parquet corpus (lexgraph.data.corpus) under data/corpus/"
    )
    questions_file: Annotated[Str | None, Expect("null or a questions file (for source corpus)")] = Field(
        description="source corpus: its questions, under data/corpus/"
    )
    dev_fraction: Annotated[Float, Field(gt=0, lt=1, description="train's share carved into dev (no dev file)")]
    synthetic: Bool = Field(description="also fetch the hub's synthetic questions")
    negatives: Bool = Field(
        description="fetch the hub's BM25 negatives (train, and synthetic with `synthetic`): mine_negatives then "
        "uses them wherever a question has a list; false: not fetched, every list mined here"
    )

    @model_validator(mode="after")
    def _source_files(self) -> FetchConfig:
        """The files the source reads are named; a corpus's lie under data/corpus/, fetch's dvc.yaml
        dependency (whether a directory exists is checked when fetch reads it)."""
        for key, needed in _NEEDED.get(self.source, {}).items():
            value = getattr(self, key)
            if not value:
                expected = needed
            else:
                expected = None if key == "local_dir" or inside(value, layout.CORPUS) else _UNDER_CORPUS
            if expected:
                raise Invalid(key, value, expected)
        return self


def inside(path: str, folder) -> bool:
    """Whether ``path`` names a file under ``folder`` (both relative to the workspace, the current
    directory, or absolute), by its name (``..`` resolved, links not followed)."""
    target, root = Path(os.path.abspath(path)), Path(os.path.abspath(folder))
    return target != root and target.is_relative_to(root)


# --------------------------------------------------------------------------- sources


def fetch_directory(root: Path, synthetic: bool, negatives: bool = True):
    """Read the hub's file layout from directory ``root`` (sources ``sample`` and ``local``; the
    caller checked that it is one): the articles, each split's questions with their
    :class:`Source`, and (``negatives``) the BM25 negatives."""
    corpus = next((root / f for f in CORPUS_FILES if (root / f).is_file()), None)
    if corpus is None:
        raise DataError(root, f"no corpus file; expected one of {list(CORPUS_FILES)}")
    articles, corpus_source = read_csv_source(corpus, REQUIRED_ARTICLE_COLUMNS, ARTICLE_COLUMNS)
    validate_articles(articles, corpus_source)
    sources: dict[str, tuple[pl.DataFrame, Source]] = {}
    wanted = ("train", "dev", "test", "synthetic") if synthetic else ("train", "dev", "test")
    for split in wanted:
        path = next((root / f for f in QUESTION_FILES[split] if (root / f).is_file()), None)
        if path is None:
            if split in ("train", "test"):
                raise DataError(root, f"no {split} questions; expected one of {list(QUESTION_FILES[split])}")
            if split == "synthetic":
                log.warning("%s: no synthetic questions file; continuing without", root)
            continue
        sources[split] = read_csv_source(path, REQUIRED_QUESTION_COLUMNS, QUESTION_COLUMNS)
    validate_questions(sources, set(articles["id"].to_list()), corpus_source)
    lists = [empty_negatives()]
    for split, rel in NEGATIVE_FILES.items():
        path = root / rel
        if negatives and path.is_file() and (synthetic or split == "train"):
            lists.append(read_negatives(path, split, path))
    return articles, sources, pl.concat(lists)


# --------------------------------------------------------------------------- dev split


def normalise_question(text: str) -> str:
    """The text whose hash places a question in train or dev: :func:`question_key` in NFC,
    not NFKC, so that a carved dev split stays the one earlier releases carved."""
    return question_key(text, form="NFC")


def carve_dev(train: pl.DataFrame, test: pl.DataFrame, fraction: float, seed: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split ``train`` into (train, dev) by a seeded hash of the normalised question text.

    Questions that are the same question (:func:`lexgraph.data.integrity.question_key`) land in
    the same split (the lowest hash of the group decides); a question whose text also appears
    in ``test`` is never put in dev (fetch then refuses it as train → test leakage).
    """
    test_keys = set(question_key(q) for q in test["question"].to_list())
    texts = train["question"].to_list()
    keys = [question_key(q) for q in texts]
    digest: dict[str, float] = {}
    for key, text in zip(keys, texts):
        value = int(hashlib.sha256(f"{seed}\x1f{normalise_question(text)}".encode()).hexdigest()[:15], 16) / 16**15
        digest[key] = min(value, digest.get(key, 1.0))
    mask = pl.Series([digest[k] < fraction and k not in test_keys for k in keys], dtype=pl.Boolean)
    carved = int(mask.sum())
    for split, count in (("train", train.height - carved), ("dev", carved)):
        if count == 0:
            raise params_error(
                f"'fetch.dev_fraction' = {fraction!r} leaves 0 {split} questions of {train.height} (the source has "
                f"no dev file, so dev is carved from its {train.height} train questions); expected a fraction that "
                "leaves at least one question in each of train and dev"
                + (", or more train questions" if train.height < 2 else "")
            )
    return train.filter(~mask), train.filter(mask)


# --------------------------------------------------------------------------- stage


def fetch(config: FetchConfig, seed: int) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Run the configured source; return (articles, questions with ``split``, negatives)."""
    return fetch_with_keys(config, seed)[:3]


def fetch_with_keys(config: FetchConfig, seed: int):
    """:func:`fetch`, and the user's string ids (``source: corpus``; None for BSARD's layout)."""
    keys = names = None  # source corpus: the user's ids, and those of the questions for messages
    if config.source == "corpus":
        from lexgraph.data.corpus import read_corpus_source

        corpus = Path(config.corpus_file)
        articles, sources, keys = read_corpus_source(corpus, Path(config.questions_file))
        names = dict(keys.filter(pl.col("kind") == "question").select("id", "key").iter_rows())
        validate_questions(sources, set(articles["id"].to_list()), Source(corpus), names)
        negatives = empty_negatives()
    elif config.source in ("sample", "local"):
        key = "sample_dir" if config.source == "sample" else "local_dir"
        root = require_directory(
            getattr(config, key),
            label=f"params.yaml: 'fetch.{key}' =",
            expected=f"a directory holding the {'embedded sample' if key == 'sample_dir' else 'hub'}'s files "
            "(articles.csv, questions_train.csv, …)",
            error=ConfigError,
        )
        articles, sources, negatives = fetch_directory(root, config.synthetic, config.negatives)
    else:
        from lexgraph.data.fetch_hub import fetch_hub  # imported when used: it needs the datasets library

        articles, sources, negatives = fetch_hub(config.hub_repo, config.revision, config.synthetic, config.negatives)
    negatives = renumber_synthetic(sources, negatives)
    questions = {split: df for split, (df, _) in sources.items()}
    if "dev" not in questions:
        train, dev = carve_dev(questions["train"], questions["test"], config.dev_fraction, seed)
        log.info("carved a dev split of %d questions from %d train questions", dev.height, questions["train"].height)
        questions["train"], questions["dev"] = train, dev
    rows = {
        qid: (source, i)
        for split, (df, source) in sources.items()
        if split in HUMAN_SPLITS
        for i, qid in enumerate(df["id"].to_list())
    }
    refuse_shared_texts(questions, rows, names)  # after the dev split is assigned, carved or read
    table = pl.concat(
        [df.with_columns(pl.lit(split).alias("split")) for split, df in questions.items()], how="vertical"
    )
    log.info(
        "fetched %d articles, questions %s, %d negative lists",
        articles.height,
        {s: d.height for s, d in questions.items()},
        negatives.height,
    )
    return articles, table, negatives, keys


FetchPaths = stage_paths("fetch")


def run_fetch(paths: FetchPaths, config: FetchConfig, context: StageContext) -> None:
    """The ``fetch`` stage: the corpus, the questions and the hub negatives -> ``paths.out``
    (Parquet), written atomically."""
    articles, questions, negatives, keys = fetch_with_keys(config, context.seed)
    with atomic_path(paths.out, directory=True) as tmp:
        articles.write_parquet(tmp / "articles.parquet", statistics=False)
        questions.write_parquet(tmp / "questions.parquet", statistics=False)
        negatives.write_parquet(tmp / "negatives.parquet", statistics=False)
        if keys is not None:  # the user's string ids (source corpus): data/raw/keys.parquet
            keys.write_parquet(tmp / KEYS_FILE, statistics=False)

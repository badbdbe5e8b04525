"""The ``fetch`` stage: BSARD (hub or a local copy) or the embedded sample → ``data/raw``.

Three sources, one output (``articles.parquet``, ``questions.parquet`` with a
``split`` column, ``negatives.parquet``), in BSARD's schema:

- ``sample``: the embedded French Code civil in ``data/sample`` (BSARD's file layout);
- ``local``: a directory holding the hub's files (``articles.csv``,
  ``questions_{train,test,synthetic}.csv``, ``negatives/bm25_negatives_*.json``);
- ``hub``: ``datasets.load_dataset("maastrichtlawtech/bsard", config, revision=…)``
  with configs ``corpus`` (split ``corpus``), ``questions`` (``train``, ``test``,
  ``synthetic``); the BM25 negatives (``negatives/bm25_negatives_{train,synthetic}.json``)
  are downloaded as files.

When a source has no dev split, one is carved from train deterministically (a hash of
the seed and the normalised question text decides) and without leaks: questions with
the same text always land in the same split, and no dev question repeats a test one.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import unicodedata
from pathlib import Path
from typing import Any

import polars as pl

from lexgraph.data.schema import (
    ARTICLE_COLUMNS,
    CORPUS_FILES,
    NEGATIVE_FILES,
    QUESTION_COLUMNS,
    QUESTION_FILES,
    REQUIRED_ARTICLE_COLUMNS,
    REQUIRED_QUESTION_COLUMNS,
)
from lexgraph.errors import ConfigError, DataError, HubUnreachableError, LexgraphError

log = logging.getLogger(__name__)

SOURCES = ("sample", "hub", "local")
NEGATIVES_SCHEMA = {"question_id": pl.Int64, "split": pl.Utf8, "article_ids": pl.List(pl.Int64)}


# --------------------------------------------------------------------------- readers


def read_csv_table(path: Path, required: tuple[str, ...], columns: tuple[str, ...]) -> pl.DataFrame:
    """Read a UTF-8 CSV with every value as text; check required columns; add absent optional ones."""
    if not path.is_file():
        raise DataError(path, "file not found")
    raw = path.read_bytes()
    if not raw.strip():
        raise DataError(path, f"file is empty; expected a CSV header with columns {list(required)} and rows")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(path, f"not valid UTF-8 at byte {exc.start} (line {line}); expected a UTF-8 encoded CSV") from exc
    try:
        df = pl.read_csv(io.StringIO(text), infer_schema=False)
    except pl.exceptions.PolarsError as exc:
        raise DataError(path, f"not a readable CSV ({exc})") from exc
    return conform(df, required, columns, path)


def conform(df: pl.DataFrame, required: tuple[str, ...], columns: tuple[str, ...], path: Any) -> pl.DataFrame:
    """Check required columns, add missing optional ones as nulls, cast ``id`` to int64."""
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise DataError(path, f"missing column(s) {missing}; expected at least {list(required)}, found {df.columns}")
    if df.height == 0:
        raise DataError(path, "no rows; expected at least one")
    df = df.with_columns([pl.lit(None, dtype=pl.Utf8).alias(c) for c in columns if c not in df.columns])
    df = df.select([pl.col(c).cast(pl.Utf8) if c != "id" else pl.col(c) for c in columns])
    ids = df["id"].cast(pl.Utf8).str.strip_chars()
    parsed = ids.cast(pl.Int64, strict=False)
    bad = (parsed.is_null()).arg_true()
    if len(bad):
        row = int(bad[0])
        raise DataError(path, f"id {ids[row]!r} is not an integer", row=row + 1, column="id")
    return df.with_columns(parsed.alias("id"))


def _negatives_from_json(obj: Any, split: str, path: Any) -> pl.DataFrame:
    """BM25 negatives, either ``{qid: [ids]}`` or a list of ``{question_id|id, article_ids|negatives}``."""
    rows: list[tuple[int, list[int]]] = []
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, list):
        items = []
        for i, rec in enumerate(obj, 1):
            qid = next((rec[k] for k in ("question_id", "id", "qid") if k in rec), None)
            ids = next((rec[k] for k in ("article_ids", "negatives", "negative_ids") if k in rec), None)
            if qid is None or ids is None:
                raise DataError(path, "expected keys question_id and article_ids (or negatives)", row=i)
            items.append((qid, ids))
    else:
        raise DataError(path, "expected a JSON object {question_id: [article ids]} or a list of records")
    for qid, ids in items:
        if isinstance(ids, str):
            ids = [x for x in ids.replace(" ", "").split(",") if x]
        try:
            rows.append((int(qid), [int(x) for x in ids]))
        except (TypeError, ValueError) as exc:
            raise DataError(path, f"question {qid!r}: negatives must be integer article ids ({exc})") from exc
    return pl.DataFrame(
        {"question_id": [r[0] for r in rows], "split": [split] * len(rows), "article_ids": [r[1] for r in rows]},
        schema=NEGATIVES_SCHEMA,
    )


def empty_negatives() -> pl.DataFrame:
    return pl.DataFrame(schema=NEGATIVES_SCHEMA)


# --------------------------------------------------------------------------- sources


def fetch_directory(root: Path, synthetic: bool) -> tuple[pl.DataFrame, dict[str, pl.DataFrame], pl.DataFrame]:
    """Read the hub's file layout from a directory (sources ``sample`` and ``local``)."""
    if not root.is_dir():
        raise DataError(root, "directory not found; expected the BSARD files (articles.csv, questions_train.csv, …)")
    corpus = next((root / f for f in CORPUS_FILES if (root / f).is_file()), None)
    if corpus is None:
        raise DataError(root, f"no corpus file; expected one of {list(CORPUS_FILES)}")
    articles = read_csv_table(corpus, REQUIRED_ARTICLE_COLUMNS, ARTICLE_COLUMNS)
    questions: dict[str, pl.DataFrame] = {}
    wanted = ("train", "dev", "test", "synthetic") if synthetic else ("train", "dev", "test")
    for split in wanted:
        path = next((root / f for f in QUESTION_FILES[split] if (root / f).is_file()), None)
        if path is None:
            if split in ("train", "test"):
                raise DataError(root, f"no {split} questions; expected one of {list(QUESTION_FILES[split])}")
            if split == "synthetic":
                log.warning("%s: no synthetic questions file; continuing without", root)
            continue
        questions[split] = read_csv_table(path, REQUIRED_QUESTION_COLUMNS, QUESTION_COLUMNS)
    negatives = [empty_negatives()]
    for split, rel in NEGATIVE_FILES.items():
        path = root / rel
        if path.is_file() and (synthetic or split == "train"):
            try:
                obj = json.loads(path.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise DataError(path, f"not valid UTF-8 JSON ({exc})") from exc
            negatives.append(_negatives_from_json(obj, split, path))
    return articles, questions, pl.concat(negatives)


def _hub_error(repo: str, exc: BaseException) -> HubUnreachableError:
    return HubUnreachableError(
        f"could not load '{repo}' from the Hugging Face hub ({type(exc).__name__}); check your internet "
        "connection and HF_TOKEN, or download the dataset's files and set fetch.source=local and "
        "fetch.local_dir=<that directory> in params.yaml"
    )


def _load_config(repo: str, config: str, revision: str | None):
    import datasets
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return datasets.load_dataset(repo, config, revision=revision)
    except (ConnectionError, TimeoutError, HfHubHTTPError, datasets.exceptions.DatasetNotFoundError) as exc:
        raise _hub_error(repo, exc) from exc
    except ValueError as exc:  # unknown config name: the hub layout changed
        raise LexgraphError(f"'{repo}' has no config '{config}' ({exc}); the hub layout may have changed") from exc


def _hub_file(repo: str, rel: str, revision: str | None) -> Path | None:
    """Download one file of the dataset repo (or take it from a local clone); None if absent."""
    if Path(repo).is_dir():
        path = Path(repo) / rel
        return path if path.is_file() else None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

    try:
        return Path(hf_hub_download(repo, rel, repo_type="dataset", revision=revision))
    except EntryNotFoundError:
        return None
    except (ConnectionError, TimeoutError, HfHubHTTPError) as exc:
        raise _hub_error(repo, exc) from exc


def _pick_split(dd, names: tuple[str, ...], repo: str, config: str, required: bool = True):
    for name in names:
        if name in dd:
            return dd[name]
    if required:
        raise LexgraphError(
            f"'{repo}' config '{config}' has splits {sorted(dd)}, expected {' or '.join(names)}; "
            "the hub layout may have changed (pin fetch.revision to a known commit)"
        )
    return None


def _to_polars(ds) -> pl.DataFrame:
    return pl.from_arrow(ds.data.table)


def fetch_hub(repo: str, revision: str | None, synthetic: bool):
    where = f"{repo}@{revision or 'main'}"
    corpus = _load_config(repo, "corpus", revision)
    articles = conform(
        _to_polars(_pick_split(corpus, ("corpus",), repo, "corpus")),
        REQUIRED_ARTICLE_COLUMNS,
        ARTICLE_COLUMNS,
        f"{where} (corpus)",
    )
    qs = _load_config(repo, "questions", revision)
    questions = {}
    for split in ("train", "test", "synthetic") if synthetic else ("train", "test"):
        ds = _pick_split(qs, (split,), repo, "questions", required=split != "synthetic")
        if ds is not None:
            questions[split] = conform(
                _to_polars(ds), REQUIRED_QUESTION_COLUMNS, QUESTION_COLUMNS, f"{where} (questions/{split})"
            )
    # The negatives are JSON files in a repo whose first config is CSV: `datasets` infers one
    # builder (csv) for every config of such a repo, so they are downloaded and parsed directly.
    negatives = [empty_negatives()]
    for split, rel in NEGATIVE_FILES.items():
        if split == "synthetic" and not synthetic:
            continue
        path = _hub_file(repo, rel, revision)
        if path is None:
            log.warning("%s: no file %s; continuing without %s negatives", where, rel, split)
            continue
        try:
            obj = json.loads(Path(path).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DataError(f"{where}/{rel}", f"not valid UTF-8 JSON ({exc})") from exc
        negatives.append(_negatives_from_json(obj, split, f"{where}/{rel}"))
    return articles, questions, pl.concat(negatives)


# --------------------------------------------------------------------------- dev split


def normalise_question(text: str) -> str:
    text = unicodedata.normalize("NFC", text or "").casefold()
    return " ".join("".join(ch if ch.isalnum() else " " for ch in text).split())


def carve_dev(train: pl.DataFrame, test: pl.DataFrame, fraction: float, seed: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split ``train`` into (train, dev) by a seeded hash of the normalised question text.

    Questions with identical normalised text share a hash and so a split; a question whose
    text also appears in ``test`` is never put in dev.
    """
    if not 0 < fraction < 1:
        raise ConfigError(f"params.yaml: 'fetch.dev_fraction' = {fraction!r}, expected a number in (0, 1)")
    test_texts = set(normalise_question(q) for q in test["question"].to_list())
    keys = [normalise_question(q) for q in train["question"].to_list()]
    digest = [int(hashlib.sha256(f"{seed}\x1f{k}".encode()).hexdigest()[:15], 16) / 16**15 for k in keys]
    is_dev = [d < fraction and k not in test_texts for d, k in zip(digest, keys)]
    mask = pl.Series(is_dev)
    return train.filter(~mask), train.filter(mask)


# --------------------------------------------------------------------------- stage


def fetch(params: dict, seed: int) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Run the configured source; return (articles, questions with ``split``, negatives)."""
    source = params.get("source")
    if source not in SOURCES:
        raise ConfigError(f"params.yaml: 'fetch.source' = {source!r}, expected one of {', '.join(SOURCES)}")
    synthetic = bool(params.get("synthetic", False))
    if source == "sample":
        articles, questions, negatives = fetch_directory(Path(params.get("sample_dir", "data/sample")), synthetic)
    elif source == "local":
        if not params.get("local_dir"):
            raise ConfigError("params.yaml: fetch.source is 'local' but 'fetch.local_dir' is not set")
        articles, questions, negatives = fetch_directory(Path(params["local_dir"]), synthetic)
    else:
        articles, questions, negatives = fetch_hub(params["hub_repo"], params.get("revision"), synthetic)
    if "dev" not in questions:
        train, dev = carve_dev(questions["train"], questions["test"], float(params.get("dev_fraction", 0.1)), seed)
        log.info("carved a dev split of %d questions from %d train questions", dev.height, questions["train"].height)
        questions["train"], questions["dev"] = train, dev
    table = pl.concat(
        [df.with_columns(pl.lit(split).alias("split")) for split, df in questions.items()], how="vertical"
    )
    log.info(
        "fetched %d articles, questions %s, %d negative lists",
        articles.height,
        {s: d.height for s, d in questions.items()},
        negatives.height,
    )
    return articles, table, negatives

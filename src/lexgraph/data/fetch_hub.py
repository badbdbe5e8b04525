"""The ``fetch`` stage's ``hub`` source: BSARD from the Hugging Face hub (or a local directory in the
hub's layout, for tests), each table validated as the CSV sources are (:mod:`lexgraph.data.readers`)."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import polars as pl

from lexgraph.core.errors import DataError, HubUnreachableError, LexgraphError
from lexgraph.core.hub import first_line, hub_access, offline_requested, unreachable_reason
from lexgraph.data.readers import (
    Source,
    conform,
    empty_negatives,
    read_negatives,
    validate_articles,
    validate_questions,
)
from lexgraph.data.schema import (
    ARTICLE_COLUMNS,
    NEGATIVE_FILES,
    QUESTION_COLUMNS,
    REQUIRED_ARTICLE_COLUMNS,
    REQUIRED_QUESTION_COLUMNS,
)

log = logging.getLogger("lexgraph.data.fetch")  # the fetch stage's logger, as before the split


def _hub_error(repo: str, exc: BaseException, online: bool, requested: bool) -> HubUnreachableError:
    """One sentence: why ``repo`` could not be loaded and the two ways out."""
    if online:
        why, fix = f"the hub answered: {first_line(exc)}", "check fetch.hub_repo, fetch.revision and HF_TOKEN"
    else:
        why, fix = unreachable_reason(repo, requested), "connect to the internet"
    return HubUnreachableError(
        f"could not load '{repo}' (params 'fetch.hub_repo'): {why}; {fix}, or download the dataset's files "
        "and set fetch.source=local and fetch.local_dir=<that directory> in params.yaml"
    )


def _load_config(repo: str, config: str, revision: str | None, fail):
    import datasets
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return datasets.load_dataset(repo, config, revision=revision)
    except (ConnectionError, TimeoutError, HfHubHTTPError, datasets.exceptions.DatasetNotFoundError) as exc:
        raise fail(exc) from exc
    except datasets.exceptions.DatasetGenerationError as exc:  # a data file its builder cannot parse
        cause = exc.__cause__ or exc
        raise DataError(
            f"{repo}@{revision or 'main'} ({config})",
            f"its files could not be read ({first_line(cause)}); "
            "expected UTF-8 CSV or JSON-lines files in BSARD's schema, each column or key once",
        ) from None
    except ValueError as exc:  # unknown config name: the hub layout changed
        raise LexgraphError(
            f"'{repo}' has no config '{config}' ({first_line(exc)}); the hub layout may have changed "
            "(pin fetch.revision to a known commit in params.yaml)"
        ) from exc


def _hub_file(repo: str, rel: str, revision: str | None, fail) -> Path | None:
    """Download one file of the dataset repo (or take it from a local clone); None if absent."""
    if Path(repo).is_dir():
        path = Path(repo) / rel
        return path if path.is_file() else None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(hf_hub_download(repo, rel, repo_type="dataset", revision=revision))
    except LocalEntryNotFoundError as exc:  # offline and not cached: absent or not, we cannot tell
        raise fail(exc) from exc
    except EntryNotFoundError:
        return None
    except (ConnectionError, TimeoutError, HfHubHTTPError) as exc:
        raise fail(exc) from exc


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


def fetch_hub(repo: str, revision: str | None, synthetic: bool, negatives: bool = True):
    """BSARD from the hub (or a local directory in the hub's layout, for tests).

    Hub calls run under :func:`lexgraph.core.hub.hub_access`: no retry logs, and when the
    hub cannot be reached, cached files only and one sentence instead of a minute of retries."""
    import datasets  # noqa: F401 - imported before hub_access, which sets its log level

    requested = offline_requested()
    local = Path(repo).is_dir()
    with contextlib.nullcontext(True) if local else hub_access() as online:
        return _fetch_hub(repo, revision, synthetic, negatives, lambda exc: _hub_error(repo, exc, online, requested))


def _fetch_hub(repo: str, revision: str | None, synthetic: bool, fetch_negatives: bool, fail):
    where = f"{repo}@{revision or 'main'}"
    corpus = _load_config(repo, "corpus", revision, fail)
    corpus_source = Source(f"{where} (corpus)")
    articles = conform(
        _to_polars(_pick_split(corpus, ("corpus",), repo, "corpus")),
        REQUIRED_ARTICLE_COLUMNS,
        ARTICLE_COLUMNS,
        corpus_source,
        extra="warn",
    )
    validate_articles(articles, corpus_source)
    qs = _load_config(repo, "questions", revision, fail)
    sources: dict[str, tuple[pl.DataFrame, Source]] = {}
    for split in ("train", "test", "synthetic") if synthetic else ("train", "test"):
        ds = _pick_split(qs, (split,), repo, "questions", required=split != "synthetic")
        if ds is not None:
            source = Source(f"{where} (questions/{split})")
            sources[split] = (
                conform(_to_polars(ds), REQUIRED_QUESTION_COLUMNS, QUESTION_COLUMNS, source, extra="warn"),
                source,
            )
    validate_questions(sources, set(articles["id"].to_list()), corpus_source)
    # The negatives are JSON files in a repo whose first config is CSV: `datasets` infers one
    # builder (csv) for every config of such a repo, so they are downloaded and parsed directly.
    negatives = [empty_negatives()]
    for split, rel in NEGATIVE_FILES.items():
        if not fetch_negatives or (split == "synthetic" and not synthetic):
            continue
        path = _hub_file(repo, rel, revision, fail)
        if path is None:
            log.warning("%s: no file %s; continuing without %s negatives", where, rel, split)
            continue
        negatives.append(read_negatives(path, split, f"{where}/{rel}"))
    return articles, sources, pl.concat(negatives)

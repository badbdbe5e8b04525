"""The re-ranking systems ``mvcl`` and ``xrerank``: a first-stage system's top-k re-ranked by
MVCL's interaction network.

:func:`load_reranker` reads ``models/<variant>/`` (weights, the first stage, ``k`` and, with
fusion, the interpolation weight alpha chosen on dev by the ``rerank`` stage), loads the
first-stage system from the same workspace and the PLM for the questions' token states: the
fine-tuned one saved in ``models/<variant>/plm`` (``plm: finetune``; the articles' states are
then encoded by it when the system loads) or the frozen base encoder (``models/pretrain``,
with the articles' states of ``data/rerank`` when that cache has the re-ranker's article
length and truncation). A search takes the first stage's list, re-scores its top-``k``
(:meth:`lexgraph.methods.rerank.model.Tournament.scores`: a round robin of the pairwise classifier scored by
the re-ranker's ``ranking``: the sum of a candidate's probabilities in all its pairs, MVCL's
Appendix B, or lexgraph's mean margin) and fuses or,
without fusion, orders by the network's scores (:func:`lexgraph.methods.rerank.model.fuse_list`);
ranks below ``k`` keep the first stage's order. Questions and articles are cut as the
re-ranker was trained (``truncation``: MVCL's "from the front" for ``mvcl``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lexgraph.core import layout
from lexgraph.methods.system import Reranker

log = logging.getLogger(__name__)


class MvclRetriever:
    def __init__(self, name: str, first, model, encoder, articles, settings: dict, device, source: str) -> None:
        self.name = name
        self.first, self.model, self.encoder, self.articles = first, model, encoder, articles
        self.settings, self.device, self.source = settings, device, source
        self.first_stage = settings["first_stage"]
        self.k = int(settings["k"])
        self.alpha = None if settings["alpha"] is None else float(settings["alpha"])  # None: no fusion
        self.article_ids = first.article_ids

    def search(self, questions: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        from lexgraph.core.progress import progress
        from lexgraph.methods.rerank.model import Tournament, fuse_list

        depth = max(int(k), self.k)
        ids, scores = self.first.search(questions, depth)
        cfg = self.settings["config"]
        states = self.encoder.encode_queries(
            list(questions), int(cfg["max_query_length"]), int(cfg["encode_batch_size"]), cfg["truncation"]
        )
        out_ids = np.full((len(questions), ids.shape[1]), -1, dtype=np.int64)
        out_scores = np.zeros((len(questions), ids.shape[1]), dtype=np.float32)
        rows = progress(
            range(len(questions)),
            f"{self.name} re-rank",
            total=len(questions),
            unit="question",
            disable=len(questions) < 20,
        )
        tournament = Tournament(self.model, self.articles, self.device, int(cfg["eval_batch_size"]))
        for i in rows:
            cands = [int(a) for a in ids[i][ids[i] >= 0][: self.k]]
            net = tournament.scores(states[i], cands)
            out_ids[i], out_scores[i] = fuse_list(ids[i], scores[i], net, self.alpha, self.k)
        return out_ids[:, :k], out_scores[:, :k]


def load_reranker(
    variant: str, workspace: Path, device: str = "auto", *, load: Callable[..., Any], corpus: Path | None = None
) -> MvclRetriever:
    """The re-ranker ``variant`` of ``workspace`` (``models/<variant>``, its PLM, its first stage,
    loaded by name with ``load``: the registry's ``load_retriever``, which passes itself); ``corpus``:
    an index of another corpus (``lexgraph index``), whose articles and token states it re-ranks."""
    from lexgraph.core.config import resolve_device
    from lexgraph.core.io import read_parquet
    from lexgraph.methods.rerank.config import PLM_DIR, RerankConfig
    from lexgraph.methods.rerank.features import FrozenTokenEncoder, TokenStore, cache_matches
    from lexgraph.methods.rerank.io import load_model

    workspace = Path(workspace)
    dev = resolve_device(device)
    model_dir = layout.RERANKERS[variant].under(workspace)
    model, settings = load_model(model_dir, dev)
    config = RerankConfig(**settings["config"])
    first = load(settings["first_stage"], workspace, device, corpus=corpus)
    plm_dir = model_dir / PLM_DIR if config.plm == "finetune" else layout.PRETRAIN.under(workspace)
    encoder = FrozenTokenEncoder(plm_dir, dev)
    cache = layout.RERANK_FEATURES.under(corpus or workspace)
    at_length = {"max_article_length": str(config.max_article_length)}  # the part of the cache's metadata read here
    if config.plm == "frozen" and cache_matches(cache, config, at_length, names=("articles",)):
        articles = TokenStore.load(cache / "articles.safetensors")
    else:  # the fine-tuned PLM's states (or a frozen one's at another length): encoded now
        log.info("%s: encoding the articles with %s", variant, plm_dir)
        articles = article_states(
            encoder, read_parquet(layout.articles(corpus or workspace), ["id", "article"]), config
        )
    return MvclRetriever(variant, first, model, encoder, articles, settings, dev, str(model_dir))


def article_states(encoder, articles, config):
    """The :class:`~lexgraph.methods.rerank.features.TokenStore` of ``articles`` (``id``, ``article``):
    ``encoder``'s token states at the re-ranker's article length and truncation (``config``: its RerankConfig)."""
    toks = encoder.tokenize(
        articles["article"].to_list(), encoder.passage_prefix, config.max_article_length, config.truncation
    )
    return encoder.encode_store(
        articles["id"].to_list(), [t["input_ids"] for t in toks], config.encode_batch_size, "encode articles"
    )


def load_xrerank(
    workspace: Path, device: str = "auto", *, load: Callable[..., Any], corpus: Path | None = None
) -> MvclRetriever:
    """lexgraph's re-ranker (``models/xrerank``)."""
    return load_reranker("xrerank", workspace, device, load=load, corpus=corpus)


def load_mvcl(
    workspace: Path, device: str = "auto", *, load: Callable[..., Any], corpus: Path | None = None
) -> MvclRetriever:
    """MVCL as published (``models/mvcl``)."""
    return load_reranker("mvcl", workspace, device, load=load, corpus=corpus)


def first_stage_of(workspace: Path, variant: str) -> str | None:
    """The first stage named in ``models/<variant>/mvcl.json`` (None when absent)."""
    from lexgraph.core.inputs import read_json_object
    from lexgraph.methods.rerank.config import SETTINGS, SETTINGS_WHAT

    path = layout.RERANKERS[variant].under(workspace, SETTINGS)
    if not path.exists():  # absent, or switched off (rerank.<variant>.enabled: false)
        return None
    return read_json_object(
        path,
        what=SETTINGS_WHAT,
        fix=layout.restore_hint(path),
        keys={"first_stage": (lambda v: v in first_stages(), "a retrieval system other than a re-ranker")},
    )["first_stage"]


def first_stages() -> tuple[str, ...]:
    """The systems a re-ranker may re-rank: every system of the registry but the re-rankers."""
    from lexgraph.methods.catalog import systems

    return tuple(name for name, spec in systems().items() if spec.kind != "reranker")


def check_first_stage(config) -> None:
    """Refuse a ``rerank.first_stage`` (``config``: a RerankConfig) that names no system a re-ranker
    can re-rank, in one line naming the key (the ``rerank`` stage's check, where the name is read)."""
    from lexgraph.core.settings import bad_value

    if config.first_stage not in first_stages():
        expected = "a retrieval system other than a re-ranker (" + ", ".join(first_stages()) + ")"
        raise bad_value("rerank", config.key("first_stage"), config.first_stage, expected)


def stage_settings(raw: dict) -> dict:
    """The rerank stage's settings: each re-ranker's (:meth:`RerankConfig.per_variant`), each first
    stage checked against the registry (:func:`check_first_stage`), before seeding and any work."""
    from lexgraph.methods.rerank.config import RerankConfig

    settings = RerankConfig.per_variant(raw)
    for config in settings.values():
        check_first_stage(config)
    return settings


def is_switched_off(workspace: Path, variant: str) -> bool:
    """True when the ``rerank@<variant>`` stage ran switched off (a placeholder in models/<variant>)."""
    return layout.RERANKERS[variant].under(workspace, "disabled.json").is_file()


def index_side(variant: str):
    """``lexgraph index`` for ``variant``: the corpus's article token states on the frozen base
    encoder (``data/rerank``, what its loader reads when the length is its own; written once, by the
    first frozen re-ranker); a fine-tuned PLM encodes the articles as it loads."""

    def write(job) -> None:
        from lexgraph.methods.rerank.config import RerankConfig
        from lexgraph.methods.rerank.features import FrozenTokenEncoder
        from lexgraph.methods.rerank.io import load_model

        config = RerankConfig(**load_model(layout.RERANKERS[variant].under(job.workspace), job.device)[1]["config"])
        out = layout.RERANK_FEATURES.under(job.root)
        if config.plm != "frozen" or out.exists():
            return
        encoder = FrozenTokenEncoder(layout.PRETRAIN.under(job.workspace), job.device)
        store = article_states(encoder, job.articles, config)
        out.mkdir(parents=True)
        store.save(out / "articles.safetensors", {"max_article_length": str(config.max_article_length)})
        log.info("index: re-ranker token states of %d articles", job.articles.height)

    return write


def _switched_off(variant: str):
    def why(workspace: Path) -> str:
        off = is_switched_off(workspace, variant)
        return f"params.yaml 'rerank.{variant}.enabled': false; a placeholder" if off else ""

    return why


def _first_stage(variant: str):
    def components(workspace: Path) -> list[str]:
        first = first_stage_of(workspace, variant)
        return [first] if first else []

    return components


_VARIANTS = {
    "xrerank": ("lexgraph's re-ranker: MVCL's interaction network over the frozen PLM's cached states", load_xrerank),
    "mvcl": ("MVCL as published: an interaction re-ranker over a fine-tuned PLM", load_mvcl),
}

SYSTEMS = tuple(
    Reranker(
        name=variant,
        summary=summary,
        load=load,
        reads=(layout.RERANKERS[variant],),
        index_models=(layout.PRETRAIN.posix(), layout.RERANKERS[variant].posix()),
        index_side=(layout.RERANK_FEATURES.posix(),),  # the frozen PLM's token states, not the network
        index=index_side(variant),
        components=_first_stage(variant),
        switched_off=_switched_off(variant),
    )
    for variant, (summary, load) in _VARIANTS.items()
)

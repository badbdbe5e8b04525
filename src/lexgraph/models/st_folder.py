"""A query encoder and an article side as one sentence-transformers folder (a ``Router``).

``SentenceTransformer(folder, trust_remote_code=True)`` (sentence-transformers >= 6) then has both
sides of a lexgraph system: ``encode_query`` (and a plain ``encode``) runs the ``query`` route,
``encode_document`` the ``document`` route. The folder::

    modules.json                      Router (the folder itself) -> Normalize (cosine systems only)
    router_config.json                the routes, each module's class and folder
    config_sentence_transformers.json the prompts (``query``: the family's prefix, used by default;
                                      ``document``: empty, the article side adds its own prefix per
                                      chunk) and the similarity
    lexgraph_st.py                    :mod:`lexgraph.models.st_article`, the article side's code
    query_0_Transformer/              the query encoder's backbone and tokenizer
    query_1_Pooling/                  its pooling (``cls`` or ``mean``)
    document_0_ArticleEncoder/        the hierarchical article encoder: backbone, tokenizer, the
                                      chunk-level weights and settings; or, for a system whose
                                      article vectors need the statute graph, a
    document_0_GraphArticleSide/      module that refuses ``encode_document`` in one line

BERT-like backbones are saved and loaded without the pooler lexgraph never uses (``model_kwargs``:
``add_pooling_layer: false``), so a load reports no weights "newly initialized". Every file's bytes
depend only on the encoders' weights and settings.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from lexgraph.core.io import save_tensors, write_json
from lexgraph.models.article_encoder import HierarchicalArticleEncoder
from lexgraph.models.backbone import _no_pooler_kwargs
from lexgraph.models.encoders import QueryEncoder
from lexgraph.models.st_article import WEIGHTS

#: the module file's name in the folder, and so the prefix of its classes' references
MODULE_FILE = "lexgraph_st"
ROUTER = "router_config.json"


def _pooling(dim: int, token_pooling: str) -> dict:
    return {
        "word_embedding_dimension": int(dim),
        "pooling_mode_cls_token": token_pooling == "cls",
        "pooling_mode_mean_tokens": token_pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }


def _save_backbone(encoder, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    encoder.backbone.save_pretrained(directory)
    encoder.tokenizer.save_pretrained(directory)


def _query_route(directory: Path, encoder: QueryEncoder) -> list[tuple[str, str]]:
    """The query encoder as Transformer -> Pooling; ``[(folder, class)]``."""
    transformer, pooling = directory / "query_0_Transformer", directory / "query_1_Pooling"
    _save_backbone(encoder, transformer)
    settings = {"max_seq_length": encoder.max_length, "do_lower_case": False}
    write_json(
        {**settings, "model_kwargs": _no_pooler_kwargs(encoder.backbone_config)},
        transformer / "sentence_bert_config.json",
    )
    pooling.mkdir()
    write_json(_pooling(encoder.dim, encoder.token_pooling), pooling / "config.json")
    return [
        (transformer.name, "sentence_transformers.base.modules.transformer.Transformer"),
        (pooling.name, "sentence_transformers.sentence_transformer.modules.pooling.Pooling"),
    ]


def _document_route(
    directory: Path, article: HierarchicalArticleEncoder | None, system: str, dim: int
) -> tuple[str, str]:
    """The article side: the hierarchical encoder, or (``article`` None) the graph's refusal."""
    if article is None:
        folder = directory / "document_0_GraphArticleSide"
        folder.mkdir()
        write_json({"system": system, "dim": int(dim)}, folder / "lexgraph_article.json")
        return folder.name, f"{MODULE_FILE}.GraphArticleSide"
    folder = directory / "document_0_ArticleEncoder"
    _save_backbone(article, folder)
    chunk_level = {
        k: v.detach().cpu().contiguous() for k, v in article.state_dict().items() if not k.startswith("backbone.")
    }
    save_tensors(chunk_level, folder / WEIGHTS)
    config = article.backbone_config
    settings = {
        "max_chunk_length": article.max_chunk_length,
        "max_document_length": article.max_document_length,
        "pooling": article.pooling,
        "num_layers": article.num_layers,
        "num_heads": article.num_heads,
        "norm_first": article.identity_init,
        "layer_norm_eps": float(getattr(config, "layer_norm_eps", 1e-5)),
        "token_pooling": article.token_pooling,
        "prefix": article.prefix,
        "model_kwargs": _no_pooler_kwargs(config),
    }
    write_json(settings, folder / "lexgraph_article.json")
    return folder.name, f"{MODULE_FILE}.ArticleEncoder"


def write_st_folder(
    directory: str | Path, query: QueryEncoder, article: HierarchicalArticleEncoder | None, system: str, normalize: bool
) -> None:
    """Write the folder (module docstring) into the existing, empty ``directory``."""
    directory = Path(directory)
    shutil.copyfile(Path(__file__).with_name("st_article.py"), directory / f"{MODULE_FILE}.py")
    routes = {
        "query": _query_route(directory, query),
        "document": [_document_route(directory, article, system, query.dim)],
    }
    router = {
        "types": {folder: kind for route in routes.values() for folder, kind in route},
        "structure": {name: [folder for folder, _ in route] for name, route in routes.items()},
        "parameters": {"default_route": "query", "allow_empty_key": True, "route_mappings": {}},
    }
    write_json(router, directory / ROUTER)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.router.Router"}]
    if normalize:
        modules.append(
            {
                "idx": 1,
                "name": "1",
                "path": "1_Normalize",
                "type": "sentence_transformers.base.modules.normalize.Normalize",
            }
        )
        (directory / "1_Normalize").mkdir()
    write_json(modules, directory / "modules.json")
    prompts = {"query": query.prefix, "document": ""} if query.prefix else {}
    settings = {
        "prompts": prompts,
        "default_prompt_name": "query" if prompts else None,
        "similarity_fn_name": "cosine" if normalize else "dot",
    }
    write_json(settings, directory / "config_sentence_transformers.json")

"""Frozen chunk encoder, chunk-vector cache, identity-initialised chunk Transformer,
model-family prefixes, partial fine-tuning and the zeroshot system (tiny local BERT)."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import torch

from helpers_config import sample_section
from helpers_frozen_dsr import CORPUS, frozen_config, frozen_data
from lexgraph.core.errors import ConfigError, DataError
from lexgraph.encoding.chunks import (
    embed_from_chunks,
    encode_chunk_table,
    load_chunk_table,
    save_chunk_table,
    write_chunk_cache,
)
from lexgraph.methods.dsr.config import DSRConfig, build_dsr
from lexgraph.methods.dsr.train import train_dsr
from lexgraph.models.article_encoder import HierarchicalArticleEncoder
from lexgraph.models.backbone import set_trainable_layers
from lexgraph.models.base import write_base_info
from lexgraph.models.dsr import DSR
from lexgraph.models.encoders import QueryEncoder
from lexgraph.models.packing import chunk_token_ids

SETTINGS = dict(
    max_chunk_length=12, max_document_length=48, pooling="token_mean", num_layers=1, num_heads=2, token_pooling="mean"
)


@pytest.fixture(scope="module")
def prefixed_dir(tiny_model_dir, tmp_path_factory):
    """The tiny checkpoint with E5-style prefixes in lexgraph_base.json."""
    import shutil

    directory = tmp_path_factory.mktemp("tiny_e5")
    shutil.copytree(tiny_model_dir, directory, dirs_exist_ok=True)
    write_base_info(directory, {"query_prefix": "article: ", "passage_prefix": "loi: ", "source": "local"})
    return directory


def _encoder(path, **kw) -> HierarchicalArticleEncoder:
    torch.manual_seed(3)
    return HierarchicalArticleEncoder.from_pretrained(path, **{**SETTINGS, "freeze_backbone": True, **kw}).eval()


def test_prefixes_come_from_the_base_checkpoint(prefixed_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(prefixed_dir)
    enc = _encoder(prefixed_dir)
    assert enc.prefix == "loi: "
    (chunks,) = enc.chunk(["le contrat de bail " * 6])
    prefix_ids = tok("loi:", add_special_tokens=False)["input_ids"]
    body = 12 - 2 - len(prefix_ids)
    content = tok("le contrat de bail " * 6, add_special_tokens=False)["input_ids"]
    for i, chunk in enumerate(chunks):
        assert chunk[: 1 + len(prefix_ids)] == [tok.cls_token_id, *prefix_ids] and chunk[-1] == tok.sep_token_id
        assert chunk[1 + len(prefix_ids) : -1] == content[i * body : (i + 1) * body]
    query = QueryEncoder.from_pretrained(prefixed_dir, max_length=16, token_pooling="mean")
    ids = query.tokenize(["bail ?"])["input_ids"][0].tolist()
    assert ids == tok("article: bail ?")["input_ids"]


def test_chunk_cache_aggregates_to_the_full_encoder(tiny_model_dir, tmp_path):
    """Cached chunk vectors + aggregate == running the whole encoder on the texts."""
    enc = _encoder(tiny_model_dir, identity_init=False)
    with torch.no_grad():  # give the chunk Transformer non-trivial weights
        for p in enc.chunk_transformer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    texts = list(CORPUS.values())
    table = encode_chunk_table(enc, list(CORPUS), texts, batch_size=3)
    assert table.offsets[-1] == table.tokens.numel() == table.vectors.shape[0]
    assert [int(n) for n in np.diff(table.offsets)] == [len(c) for c in enc.chunk(texts)]
    save_chunk_table(table, tmp_path / "a.safetensors")
    loaded = load_chunk_table(tmp_path / "a.safetensors")
    assert loaded.settings == table.settings and torch.equal(loaded.vectors, table.vectors)
    direct = enc.encode(texts, batch_size=4, show_progress=False)  # (6, 16)
    cached = embed_from_chunks(enc, loaded, loaded.rows([6, 5, 4, 3, 2, 1]))
    torch.testing.assert_close(cached, direct.flip(0), atol=1e-5, rtol=1e-5)
    with pytest.raises(KeyError):
        loaded.rows([1, 99])


def test_identity_init_is_the_token_weighted_mean_of_chunks(tiny_model_dir):
    enc = _encoder(tiny_model_dir, identity_init=True, num_layers=2)
    text = CORPUS[1]
    batch = enc.tokenize([text])
    with torch.no_grad():
        chunks, mask, tokens = enc.chunk_vectors(**batch)
        out = enc(**batch)[0]
    weights = tokens[0, mask[0]].float()  # tokens of each real chunk, by hand
    expected = (chunks[0, mask[0]] * weights[:, None]).sum(0) / weights.sum()
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
    # the same as the zeroshot-style encoder (no chunk layers at all)
    plain = _encoder(tiny_model_dir, num_layers=0)
    torch.testing.assert_close(plain.encode([text], show_progress=False)[0], out, atol=1e-6, rtol=1e-6)


def test_trainable_layers(tiny_model_dir):
    from transformers import BertConfig, BertModel

    model = BertModel(
        BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=3, num_attention_heads=2, intermediate_size=16)
    )
    set_trainable_layers(model, 2)
    trainable = {
        n.split(".")[0] + "." + n.split(".")[2] if n.startswith("encoder") else n.split(".")[0]
        for n, p in model.named_parameters()
        if p.requires_grad
    }
    assert trainable == {"encoder.1", "encoder.2"}  # embeddings and block 0 frozen
    set_trainable_layers(model, None)
    assert all(p.requires_grad for p in model.parameters())
    with pytest.raises(ConfigError):
        set_trainable_layers(model, 4)
    enc = QueryEncoder.from_pretrained(tiny_model_dir, trainable_layers=0)
    assert not any(p.requires_grad for p in enc.parameters())


def test_frozen_training_keeps_epoch_zero_and_saves_the_backbone_by_reference(tiny_model_dir, tmp_path):
    config = frozen_config()
    torch.manual_seed(0)
    model = build_dsr(config, tiny_model_dir)
    backbone_before = {k: v.clone() for k, v in model.article_encoder.backbone.state_dict().items()}
    table = encode_chunk_table(model.article_encoder, list(CORPUS), list(CORPUS.values()))
    result = train_dsr(model, frozen_data(table), config, torch.device("cpu"), seed=5)
    assert result.history[0]["epoch"] == 0 and len(result.history) == 3
    untrained = result.history[0]["dev_recall@200"]
    assert result.dev_metrics["recall@200"] >= untrained  # selection never ends below epoch 0
    for k, v in model.article_encoder.backbone.state_dict().items():
        assert torch.equal(v, backbone_before[k]), k  # the chunk encoder did not move
    model.save(tmp_path / "dsr", backbone_source=tiny_model_dir)
    article_dir = tmp_path / "dsr" / "article_encoder"
    assert not (article_dir / "model.safetensors").exists()  # referenced, not copied
    assert json.loads((article_dir / "backbone.json").read_text())["path"] == str(tiny_model_dir)
    light = DSR.load(tmp_path / "dsr", with_article_backbone=False)
    assert light.article_encoder.backbone is None
    torch.testing.assert_close(
        embed_from_chunks(light.article_encoder, table), embed_from_chunks(model.article_encoder, table)
    )
    full = DSR.load(tmp_path / "dsr")
    texts = list(CORPUS.values())
    torch.testing.assert_close(
        full.encode_articles(texts, show_progress=False),
        model.eval().encode_articles(texts, show_progress=False),
        atol=1e-5,
        rtol=1e-5,
    )
    assert full.query_encoder.trainable_layers == 1


def test_frozen_requires_pretrain_init():
    """A frozen chunk encoder caches models/pretrain's chunk vectors: refused where the section is read."""
    values = {**sample_section("dsr"), "chunk_encoder": "frozen", "article_init": "base"}
    with pytest.raises(ConfigError) as info:
        DSRConfig.from_params(values)
    assert str(info.value) == (
        "params.yaml: 'dsr.article_init' = 'base', expected pretrain with 'dsr.chunk_encoder' = frozen "
        "(the cached chunk vectors are models/pretrain's)"
    )


def test_encode_chunks_stage_and_settings_check(tiny_model_dir, tmp_path):
    from lexgraph.core.io import write_parquet
    from lexgraph.encoding.chunks import check_settings

    write_parquet(pl.DataFrame({"id": list(CORPUS), "article": list(CORPUS.values())}), tmp_path / "a.parquet")
    write_parquet(pl.DataFrame({"heading_id": [0, 1], "text": ["Livre I", "Du mariage"]}), tmp_path / "h.parquet")
    counts = write_chunk_cache(
        frozen_config(), tiny_model_dir, tmp_path / "a.parquet", tmp_path / "h.parquet", tmp_path / "chunks", "cpu"
    )
    assert counts["articles"]["texts"] == 6 and counts["headings"] == {"texts": 2, "chunks": 2}
    table = load_chunk_table(tmp_path / "chunks" / "articles.safetensors")
    check_settings(table, _encoder(tiny_model_dir), "x")
    with pytest.raises(DataError, match="other settings"):
        check_settings(table, _encoder(tiny_model_dir, max_chunk_length=16), "x")
    # finetune: chunking only, no vectors
    write_chunk_cache(
        frozen_config(chunk_encoder="finetune"),
        tiny_model_dir,
        tmp_path / "a.parquet",
        tmp_path / "h.parquet",
        tmp_path / "chunks2",
        "cpu",
    )
    assert load_chunk_table(tmp_path / "chunks2" / "articles.safetensors").vectors is None


def test_zeroshot_system_end_to_end(tiny_model_dir, tmp_path):
    from lexgraph.core.io import write_parquet
    from lexgraph.encoding.embed import load_embeddings
    from lexgraph.methods.zeroshot.system import ZeroshotConfig, zeroshot_embeddings
    from lexgraph.systems.registry import load_retriever

    ws = tmp_path / "ws"
    import shutil

    shutil.copytree(tiny_model_dir, ws / "models" / "pretrain")
    write_base_info(ws / "models" / "pretrain", {"query_prefix": "article: ", "passage_prefix": "loi: "})
    write_parquet(pl.DataFrame({"id": list(CORPUS), "article": list(CORPUS.values())}), tmp_path / "a.parquet")
    params = {"token_pooling": "mean", "max_length": 12, "max_document_length": 96, "batch_size": 4}
    zeroshot_embeddings(
        ws / "models" / "pretrain",
        tmp_path / "a.parquet",
        ws / "data" / "zeroshot",
        ZeroshotConfig.from_params(params),
        "cpu",
    )
    ids, emb = load_embeddings(ws / "data" / "zeroshot" / "articles.safetensors")
    assert ids.tolist() == list(CORPUS) and emb.shape == (6, 16)
    # by hand: windows of 12 tokens ([CLS] loi : ... [SEP]), mean-pooled, averaged by token count
    from transformers import AutoModel, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(tiny_model_dir), AutoModel.from_pretrained(tiny_model_dir).eval()
    windows = chunk_token_ids(tok, [CORPUS[1]], 12, 96, prefix="loi: ")[0]
    assert len(windows) > 1
    with torch.no_grad():
        means = [model(input_ids=torch.tensor([w])).last_hidden_state[0].mean(0) for w in windows]
    lengths = torch.tensor([len(w) for w in windows], dtype=torch.float32)
    expected = (torch.stack(means) * lengths[:, None]).sum(0) / lengths.sum()
    torch.testing.assert_close(emb[0], expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match="zeroshot.max_length"):
        zeroshot_embeddings(
            ws / "models" / "pretrain",
            tmp_path / "a.parquet",
            tmp_path / "z",
            ZeroshotConfig.from_params({**params, "max_length": 0}),
            "cpu",
        )
    with pytest.raises(ConfigError, match="unknown key"):
        zeroshot_embeddings(
            ws / "models" / "pretrain",
            tmp_path / "a.parquet",
            tmp_path / "z",
            ZeroshotConfig.from_params({**params, "window": 3}),
            "cpu",
        )
    retriever = load_retriever("zeroshot", ws, "cpu")
    found, scores = retriever.search(["le contrat de bail", "le mariage"], 3)
    assert found.shape == (2, 3) and np.all(np.diff(scores, axis=1) <= 0)
    assert retriever.query_encoder.prefix == "article: "


def test_zeroshot_reuses_a_cache_with_the_same_windows_only(tiny_model_dir, tmp_path, caplog):
    import logging

    from lexgraph.core.io import write_parquet
    from lexgraph.encoding.embed import load_embeddings
    from lexgraph.methods.zeroshot.system import ZeroshotConfig, zeroshot_embeddings

    write_parquet(pl.DataFrame({"id": list(CORPUS), "article": list(CORPUS.values())}), tmp_path / "a.parquet")
    write_parquet(pl.DataFrame({"heading_id": [0], "text": ["Livre I"]}), tmp_path / "h.parquet")
    params = {"token_pooling": "mean", "max_length": 12, "max_document_length": 48, "batch_size": 4}
    zeroshot_embeddings(
        tiny_model_dir, tmp_path / "a.parquet", tmp_path / "plain", ZeroshotConfig.from_params(params), "cpu"
    )
    _, plain = load_embeddings(tmp_path / "plain" / "articles.safetensors")
    for chunk_length, reused in ((12, True), (16, False)):
        cache = tmp_path / f"chunks{chunk_length}"
        write_chunk_cache(
            frozen_config(max_chunk_length=chunk_length),
            tiny_model_dir,
            tmp_path / "a.parquet",
            tmp_path / "h.parquet",
            cache,
            "cpu",
        )
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="lexgraph.methods.zeroshot.system"):
            zeroshot_embeddings(
                tiny_model_dir,
                tmp_path / "a.parquet",
                tmp_path / "z",
                ZeroshotConfig.from_params(params),
                "cpu",
                chunks=cache,
            )
        assert ("reusing the chunk vectors" in caplog.text) == reused
        _, got = load_embeddings(tmp_path / "z" / "articles.safetensors")
        torch.testing.assert_close(got, plain, atol=1e-5, rtol=1e-5)  # same vectors either way

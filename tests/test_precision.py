"""Issue 44, item 3: the chunk encoder in bfloat16 on the CPU (lexgraph.models.precision).

``auto`` follows the CPU's flags; a bf16 encoder gives float32 vectors close to float32's but not
equal to them (it did run in bf16), still bit-stable across the texts encoded with it (what an
incremental index needs); an index records its precision, and an update at another precision
reuses nothing of the earlier one. Speed and quality on the real encoder:
benchmarks/cpu_precision.py."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors import safe_open

from helpers_workspace import build_tiny_workspace, random_texts
from lexgraph.cli.main import main
from lexgraph.models.precision import cpu_flags, resolve_precision


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile\nflags\t: other\n", encoding="utf-8")
    assert cpu_flags(info) == {"fpu", "avx512f", "amx_bf16", "amx_tile"}
    assert cpu_flags(tmp_path / "missing") == frozenset()


@pytest.mark.parametrize(
    ("asked", "device", "flags", "expected"),
    [
        ("auto", "cpu", {"avx512f", "amx_bf16"}, "bf16"),
        ("auto", "cpu", {"avx512f", "avx512_bf16"}, "fp32"),  # no AMX: the gain was not measured
        ("auto", "cpu", set(), "fp32"),
        ("bf16", "cpu", set(), "bf16"),  # asked for: slow without the flags, but what was asked
        ("fp32", "cpu", {"amx_bf16"}, "fp32"),
        ("bf16", "cuda", {"amx_bf16"}, "fp32"),  # CUDA: the encoders' own autocast
        ("auto", "meta", {"amx_bf16"}, "fp32"),
    ],
)
def test_resolve_precision(asked, device, flags, expected):
    assert resolve_precision(asked, torch.device(device), frozenset(flags)) == expected


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="fp16.*auto, fp32, bf16"):
        resolve_precision("fp16", torch.device("cpu"), frozenset())


def _encoder(tiny_model_dir, precision: str):
    from lexgraph.models.article_encoder import HierarchicalArticleEncoder
    from lexgraph.models.precision import cast_backbone

    encoder = HierarchicalArticleEncoder.from_pretrained(
        tiny_model_dir, max_chunk_length=16, max_document_length=64, token_pooling="mean", num_layers=0
    ).eval()
    cast_backbone(encoder.backbone, precision)
    return encoder


def test_bf16_chunk_vectors_are_float32_near_fp32s_and_stable(tiny_model_dir):
    from lexgraph.encoding.chunks import encode_chunk_table

    texts = random_texts(12, 3)
    ids = list(range(len(texts)))
    fp32 = encode_chunk_table(_encoder(tiny_model_dir, "fp32"), ids, texts, 4, stable=True).vectors
    bf16_encoder = _encoder(tiny_model_dir, "bf16")
    assert next(bf16_encoder.backbone.parameters()).dtype == torch.bfloat16
    whole = encode_chunk_table(bf16_encoder, ids, texts, 4, stable=True)
    bf16 = whole.vectors
    assert bf16.dtype == torch.float32 and bf16.shape == fp32.shape
    assert not torch.equal(bf16, fp32)  # it ran in bf16
    assert torch.nn.functional.cosine_similarity(bf16, fp32).min() > 0.99
    kept = [i for i in ids if i % 3]
    part = encode_chunk_table(bf16_encoder, kept, [texts[i] for i in kept], 4, stable=True)
    for row, i in enumerate(kept):  # a text's bits do not depend on its companions
        a = part.vectors[part.offsets[row] : part.offsets[row + 1]]
        assert torch.equal(a, whole.vectors[whole.offsets[i] : whole.offsets[i + 1]]), i


@pytest.fixture(scope="module")
def tiny_ws(tiny_model_dir, tmp_path_factory):
    return build_tiny_workspace(tmp_path_factory.mktemp("precision_ws"), tiny_model_dir)


def test_an_index_records_its_precision_and_never_mixes_two(tiny_ws, tmp_path, caplog):
    """``--precision bf16`` is recorded in index.json and in the chunk file's batching key; the same
    corpus indexed over it in fp32 reuses none of its vectors and equals a fresh fp32 index."""
    corpus = tmp_path / "c.jsonl"
    records = [{"id": f"a{i}", "text": t, "path": ["Code"]} for i, t in enumerate(random_texts(9, 5))]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    args = ["index", "--workspace", str(tiny_ws), "--corpus", str(corpus), "--device", "cpu", "--systems", "zeroshot"]
    out = tmp_path / "idx"
    assert main([*args, "--out", str(out), "--precision", "bf16"]) == 0
    assert json.loads((out / "index.json").read_text())["precision"] == "bf16"
    chunk_file = out / "data" / "chunks" / "articles.safetensors"
    with safe_open(str(chunk_file), "pt") as fh:
        assert fh.metadata()["batching"].endswith("precision=bf16")
        bf16 = fh.get_tensor("vectors")
    with caplog.at_level(logging.INFO, logger="lexgraph.systems.corpus_index"):
        assert main([*args, "--out", str(out), "--precision", "fp32"]) == 0
    assert "earlier articles were encoded otherwise" in caplog.text
    assert "articles: 0 of 9 reused from the earlier index, 9 encoded" in caplog.text
    assert main([*args, "--out", str(tmp_path / "fresh"), "--precision", "fp32"]) == 0
    with (
        safe_open(str(chunk_file), "pt") as a,
        safe_open(str(tmp_path / "fresh" / chunk_file.relative_to(out)), "pt") as b,
    ):
        assert torch.equal(a.get_tensor("vectors"), b.get_tensor("vectors"))
        assert not torch.equal(a.get_tensor("vectors"), bf16)
    assert json.loads((out / "index.json").read_text())["precision"] == "fp32"


def test_an_unknown_precision_on_the_command_line_is_refused_by_name(tiny_ws, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["index", "--workspace", str(tiny_ws), "--corpus", "c.jsonl", "--out", "x", "--precision", "fp16"])
    assert exit_.value.code != 0
    err = capsys.readouterr().err.strip()  # argparse's usage, then its error line
    assert "Traceback" not in err
    assert err.splitlines()[-1].endswith(
        "argument --precision: invalid choice: 'fp16' (choose from 'auto', 'fp32', 'bf16')"
    )

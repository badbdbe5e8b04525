"""Shared fixtures: tiny BSARD-layout directories written by the tests themselves."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import string
import sys
from pathlib import Path

import pytest

from paper_fixture import HUB_README  # the hub layout of BSARD, one copy for every test

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark(name: str, folder: str = "benchmarks"):
    """The script ``<folder>/<name>.py`` (a benchmark or a stage driver) as a module
    (``<folder>_<name>``), loaded from its path once: the scripts are not a package, and
    tests must not edit ``sys.path``."""
    module_name = f"{folder}_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, ROOT / folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


# a backslash ending a line continues its row on the next (the lines stay within 120 characters)
ARTICLES_CSV = """id,article,reference,law_type,code,book,part,act,chapter,section,subsection,description
1,"Le propriétaire d'un mur mitoyen
peut le faire exhausser.",Art. 1,regional,Code A,Livre 1,,,Chapitre 1,,,Code A
2,"Tout propriétaire peut obliger son voisin au bornage de leurs propriétés contiguës.",Art. 2,regional,\
Code A,Livre 1,,,Chapitre 1,,,Code A
3,"La réparation et la reconstruction du mur mitoyen sont à la charge de tous ceux qui y ont droit.",Art. 3,\
regional,Code A,Livre 1,,,Chapitre 2,,,Code A
4,"Le bail est un contrat par lequel une partie s'oblige à faire jouir l'autre d'une chose.",Art. 4,federal,\
Code B,,,,,,,Code B
5,"Le preneur est tenu de payer le prix du bail aux termes convenus.",Art. 5,federal,Code B,,,,,,,Code B
"""

QUESTIONS = {
    "train": [
        (1, "Qui paie la réparation du mur entre mon jardin et celui du voisin ?", "3,1"),
        (2, "Mon voisin peut-il refuser le bornage ?", "2"),
        (3, "Quand dois-je payer mon loyer ?", "5"),
        (4, "Puis-je surélever le mur mitoyen ?", "1"),
        (5, "Qu'est-ce qu'un bail ?", "4"),
        (6, "Le voisin doit-il participer au bornage ?", "2"),
    ],
    "test": [(7, "Qui répare le mur mitoyen ?", "3"), (8, "Mon propriétaire peut-il exiger le loyer ?", "5,4")],
    "synthetic": [(1, "mur mitoyen exhausser", "1"), (2, "bornage voisin", "2")],
}


def write_questions(path: Path, rows) -> None:
    lines = ["id,question,category,subcategory,extra_description,article_ids"]
    for qid, q, ids in rows:
        lines.append(f'{qid},"{q}",Logement,Voisinage,,"{ids}"')
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_bsard_layout(root: Path, *, readme: bool = False) -> Path:
    """The hub's file layout: articles.csv, questions_*.csv, negatives/*.json (+ README configs)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "articles.csv").write_text(ARTICLES_CSV, encoding="utf-8")
    for split, rows in QUESTIONS.items():
        write_questions(root / f"questions_{split}.csv", rows)
    (root / "negatives").mkdir(exist_ok=True)
    (root / "negatives" / "bm25_negatives_train.json").write_text(
        json.dumps([{"question_id": 1, "article_ids": [2, 4]}, {"question_id": 2, "article_ids": [5]}]),
        encoding="utf-8",
    )
    (root / "negatives" / "bm25_negatives_synthetic.json").write_text(
        json.dumps([{"question_id": 1, "article_ids": [3]}]), encoding="utf-8"
    )
    if readme:
        (root / "README.md").write_text(HUB_README, encoding="utf-8")
    return root


@pytest.fixture
def one_thread():
    """Tiny tensors: one intra-op thread (on a shared CPU, more threads only wait on each other)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def bsard_dir(tmp_path) -> Path:
    return write_bsard_layout(tmp_path / "bsard")


@pytest.fixture
def hub_dir(tmp_path, monkeypatch) -> Path:
    """A local directory the `datasets` library loads exactly like the hub repo (configs in README)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    return write_bsard_layout(tmp_path / "hub", readme=True)


# ---------------------------------------------------------------------------
# A tiny BERT checkpoint (like models/pretrain), shared by the encoder tests
# ---------------------------------------------------------------------------

TINY_WORDS = ["le", "la", "les", "de", "du", "article", "loi", "contrat", "bail", "mariage", "enfant", "divorce"]


def _vocab() -> dict[str, int]:
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *TINY_WORDS]
    chars = string.ascii_lowercase + string.digits + ".,'?"
    pieces += list(chars) + ["##" + c for c in chars]
    return {p: i for i, p in enumerate(pieces)}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A saved tiny BertForMaskedLM + WordPiece tokenizer, like models/pretrain."""
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    directory = tmp_path_factory.mktemp("tiny_bert")
    tokenizer = BertTokenizer(vocab=_vocab())
    config = BertConfig(
        vocab_size=len(_vocab()),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    )
    import torch

    torch.manual_seed(0)
    BertForMaskedLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tiny_query_encoder_dir(tmp_path_factory):
    """A saved tiny QueryEncoder (DIM-wide BERT, WordPiece trained on the toy graph's texts), like models/dsr."""
    import torch
    from transformers import BertConfig, BertModel

    from helpers_graph import ARTICLES, DIM, QUESTIONS
    from lexgraph.methods.pretrain.model import train_wordpiece_tokenizer
    from lexgraph.models.encoders import QueryEncoder

    texts = QUESTIONS["question"].to_list() + ARTICLES["article"].to_list()
    tokenizer = train_wordpiece_tokenizer(texts * 5, vocab_size=120)
    torch.manual_seed(0)
    backbone = BertModel(
        BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=DIM,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=16,
            max_position_embeddings=64,
        ),
        add_pooling_layer=False,
    )
    path = tmp_path_factory.mktemp("dsr") / "query_encoder"
    QueryEncoder(backbone, tokenizer, max_length=32).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_mt5(tmp_path_factory):
    """A randomly initialised 2-layer mT5 and a word-level tokenizer (helpers_queries.ARTICLES' words), saved
    like a hub checkpoint."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import MT5Config, MT5ForConditionalGeneration, PreTrainedTokenizerFast

    from helpers_queries import ARTICLES

    words = sorted({w for _, t in ARTICLES for w in t.replace("'", " ").replace(",", " ").split()})
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2} | {w: i + 3 for i, w in enumerate(words)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    backend.decoder = decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    config = MT5Config(
        vocab_size=len(vocab),
        d_model=16,
        d_kv=8,
        d_ff=32,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-mt5")
    MT5ForConditionalGeneration(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# ---------------------------------------------------------------------------
# Complete params sections (every key is required: no silent defaults)
# ---------------------------------------------------------------------------


def sample_params() -> dict:
    """A fresh copy of the repository's params.yaml (the sample profile)."""
    import yaml

    return yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))


def section(name: str, **overrides) -> dict:
    """params.yaml's ``name`` section with ``overrides`` applied (a complete section)."""
    return {**sample_params()[name], **overrides}


def write_params(path, **sections) -> Path:
    """Write a complete params file to ``path``: params.yaml with each given section's keys
    replaced (a section passed as a dict is merged over params.yaml's)."""
    import yaml

    params = sample_params()
    for name, values in sections.items():
        params[name] = {**params.get(name, {}), **values} if isinstance(values, dict) else values
    path = Path(path)
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def dense_model(tiny_model_dir, tmp_path_factory):
    """A saved tiny DSR query encoder and article embeddings for helpers_cli.ARTICLES' ids 1-3
    (dim 16): copy it into a workspace for the ``dsr`` system."""
    import torch

    from helpers_cli import ARTICLES
    from lexgraph.encoding.embed import save_embeddings
    from lexgraph.models.encoders import QueryEncoder

    root = tmp_path_factory.mktemp("dense")
    QueryEncoder.from_pretrained(tiny_model_dir, max_length=32, token_pooling="mean").save_pretrained(
        root / "models" / "dsr" / "query_encoder"
    )
    (root / "data" / "embed").mkdir(parents=True)
    torch.manual_seed(0)
    save_embeddings(root / "data" / "embed" / "articles.safetensors", list(ARTICLES), torch.randn(3, 16))
    return root


def replace_loader(monkeypatch, name: str, load) -> None:
    """Make system ``name`` of the registry load with ``load`` for the test (its declaration otherwise kept)."""
    from dataclasses import replace

    from lexgraph.methods.catalog import declared, systems

    monkeypatch.setitem(systems(), name, replace(declared(name), load=load))


@dataclasses.dataclass(frozen=True)
class NoPaths:
    """The paths of a test stage that reads and writes no file (``lexgraph.core.stage.Stage``)."""

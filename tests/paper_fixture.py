"""What the paper profile needs offline, built from nothing but the embedded sample.

``profiles/paper.yaml`` names hub checkpoints (``camembert-base``, a French mT5 doc2query
model) and the hub dataset ``maastrichtlawtech/bsard``. Offline and on CPU this module
writes stand-ins that go through the same code paths:

- :func:`build_camembert`: a tiny random ``CamembertForMaskedLM`` (``CamembertConfig``) and a
  unigram (SentencePiece-style) tokenizer trained here on the corpus text, saved with
  ``save_pretrained`` (loads with ``AutoTokenizer`` / ``CamembertTokenizerFast``);
- :func:`build_mt5`: a tiny random ``MT5ForConditionalGeneration`` (``MT5Config``) with its
  own unigram tokenizer (``T5Tokenizer``, mT5's);
- :func:`build_bsard_hub`: a directory that ``datasets.load_dataset(dir, config)`` reads as it
  reads the hub repo: a README.md whose YAML ``configs:`` block declares ``corpus`` (split
  ``corpus``), ``questions`` (``train``, ``test``, ``synthetic``) and ``negatives`` (BM25
  negatives as JSON, the files ``fetch`` downloads), built from ``data/sample`` (BSARD's
  schema) and cut to :data:`SIZES` for the CPU budget. As on the hub, there is no dev split
  (``fetch`` carves it), ``article_ids`` are comma-separated strings and the synthetic
  questions are numbered 1..N, overlapping the train ids;
- :func:`paper_params`: profiles/paper.yaml with only what offline CPU forces changed
  (:data:`CHANGED`).

Reusable outside pytest (e.g. on a GPU box with bigger stand-ins)::

    python tests/paper_fixture.py --out /tmp/paper [--hidden 768 --layers 12]
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample"
PROFILE = ROOT / "profiles" / "paper.yaml"

log = logging.getLogger(__name__)

#: keys (dotted) that name a model; each becomes a tiny local checkpoint directory
MODEL_KEYS = {"pretrain.model": "camembert", "dsr.base_model": "camembert", "queries.model": "mt5"}
#: step and epoch counts, shrunk wherever they occur in the tree (key name → value)
COUNT_KEYS = {
    "max_steps": 6,  # pretrain: MLM steps (its warm-up is pretrain.warmup_ratio of them: it scales)
    "log_every": 2,  # pretrain: steps between loss logs
    "epochs": 2,  # dsr.epochs, gnn.<variant>.epochs, rerank.<variant>.epochs
    "per_article": 1,  # queries: doc2query questions per article
}
#: (dotted key, value): the data source and the device
FIXED = {"base.device": "cpu"}
#: what the test may change against profiles/paper.yaml: the model keys, the data source key, any
#: key named in COUNT_KEYS, and FIXED (checked by tests/test_paper_profile.py, whose docstring lists each change)
CHANGED = (*MODEL_KEYS, "fetch.hub_repo", *(f"*.{k}" for k in COUNT_KEYS), *FIXED)

HUB_README = """---
configs:
- config_name: corpus
  data_files:
  - split: corpus
    path: articles.csv
- config_name: questions
  data_files:
  - split: train
    path: questions_train.csv
  - split: test
    path: questions_test.csv
  - split: synthetic
    path: questions_synthetic.csv
- config_name: negatives
  data_files:
  - split: bm25_train
    path: negatives/bm25_negatives_train.json
  - split: bm25_synthetic
    path: negatives/bm25_negatives_synthetic.json
---
# BSARD stand-in (tests/paper_fixture.py), built from lexgraph's embedded sample
"""

QUESTION_HEADER = ["id", "question", "category", "subcategory", "extra_description", "article_ids"]
WORD = re.compile(r"\w{4,}")


# --------------------------------------------------------------------------- data


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def _write_csv(path: Path, header: list[str], rows: Iterable[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)


def synthetic_questions(articles: list[dict[str, str]], n: int) -> list[dict[str, Any]]:
    """``n`` hub-style synthetic questions, ids 1..n (the hub numbers them from 1, so they
    overlap the train ids), each the opening words of one article (every k-th article)."""
    step = max(1, len(articles) // n)
    rows = []
    for i, art in enumerate(articles[::step][:n], 1):
        words = art["article"].split()[:12]
        rows.append(
            {
                "id": i,
                "question": " ".join(words).rstrip(".,;:") + " ?",
                "category": "",
                "subcategory": "",
                "extra_description": "",
                "article_ids": art["id"],
            }
        )
    return rows


def overlap_negatives(questions: list[dict[str, Any]], articles: list[dict[str, str]], k: int = 10) -> list[dict]:
    """Hard negatives in the hub's negatives format: the ``k`` non-gold articles sharing the
    most words (4+ letters) with the question (a cheap stand-in for BSARD's BM25 lists)."""
    bags = [(int(a["id"]), set(WORD.findall(a["article"].lower()))) for a in articles]
    out = []
    for q in questions:
        words = set(WORD.findall(q["question"].lower()))
        gold = {int(x) for x in str(q["article_ids"]).split(",")}
        scored = sorted(((-len(words & bag), aid) for aid, bag in bags if aid not in gold))[:k]
        out.append({"question_id": int(q["id"]), "article_ids": [aid for _, aid in scored]})
    return out


#: the stand-in's size (CPU budget): questions kept per split, synthetic questions, and articles
#: (every article a kept question cites, then the corpus in order up to this count)
SIZES = {"train": 60, "test": 20, "synthetic": 50, "articles": 300}


def subset_articles(articles: list[dict[str, str]], questions: list[dict], n: int) -> list[dict[str, str]]:
    """The cited articles plus the first ones in corpus order, ``n`` in all (corpus order kept)."""
    cited = {int(x) for q in questions for x in str(q["article_ids"]).split(",")}
    keep, filler = set(cited), max(0, n - len(cited))
    for art in articles:
        if filler == 0:
            break
        if int(art["id"]) not in keep:
            keep.add(int(art["id"]))
            filler -= 1
    return [a for a in articles if int(a["id"]) in keep]


def build_bsard_hub(out: Path, sample: Path = SAMPLE, sizes: dict[str, int] = SIZES) -> Path:
    """The hub's dataset layout (see the module docstring) from the embedded sample, cut to ``sizes``."""
    out.mkdir(parents=True, exist_ok=True)
    # the hub has no dev split: fetch carves it from train, so the sample's dev joins train
    train = _read_csv(sample / "questions_train.csv") + _read_csv(sample / "questions_dev.csv")
    train = sorted(train, key=lambda r: int(r["id"]))[: sizes["train"]]
    test = _read_csv(sample / "questions_test.csv")[: sizes["test"]]
    articles = subset_articles(_read_csv(sample / "articles.csv"), train + test, sizes["articles"])
    _write_csv(out / "articles.csv", list(articles[0]), articles)
    synthetic = synthetic_questions(articles, sizes["synthetic"])
    for split, rows in (("train", train), ("test", test), ("synthetic", synthetic)):
        _write_csv(out / f"questions_{split}.csv", QUESTION_HEADER, rows)
    (out / "negatives").mkdir(exist_ok=True)
    for split, rows in (("train", train), ("synthetic", synthetic)):
        negatives = overlap_negatives(rows, articles)
        (out / "negatives" / f"bm25_negatives_{split}.json").write_text(json.dumps(negatives), encoding="utf-8")
    (out / "README.md").write_text(HUB_README, encoding="utf-8")
    return out


def corpus_texts(sample: Path = SAMPLE) -> list[str]:
    """Article and question texts: what the tokenizers are trained on."""
    texts = [a["article"] for a in _read_csv(sample / "articles.csv")]
    for split in ("train", "dev", "test"):
        texts += [q["question"] for q in _read_csv(sample / f"questions_{split}.csv")]
    return texts


# --------------------------------------------------------------------------- models


def unigram_vocab(texts: list[str], vocab_size: int, specials: list[str]) -> list[tuple[str, float]]:
    """A unigram (SentencePiece) vocabulary trained on ``texts``: ``specials`` first (score 0),
    then the learned pieces with their log-probabilities."""
    from tokenizers import SentencePieceUnigramTokenizer

    tok = SentencePieceUnigramTokenizer()
    tok.train_from_iterator(
        texts, vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>", show_progress=False
    )
    pieces = json.loads(tok.to_str())["model"]["vocab"]
    learned = [(p, float(s)) for p, s in pieces if p not in specials]
    return [(s, 0.0) for s in specials] + learned


def build_camembert(
    out: Path,
    texts: list[str],
    *,
    hidden: int = 48,
    layers: int = 2,
    heads: int = 4,
    vocab_size: int = 2000,
    seed: int = 0,
) -> Path:
    """A tiny random CamemBERT (masked LM) + its unigram tokenizer, as camembert-base's layout:
    ``<s>``=0, ``<pad>``=1, ``</s>``=2, ``<unk>``=3, ``<mask>`` last, 514 positions."""
    import torch
    from transformers import CamembertConfig, CamembertForMaskedLM, CamembertTokenizer

    vocab = unigram_vocab(texts, vocab_size, ["<s>", "<pad>", "</s>", "<unk>"]) + [("<mask>", 0.0)]
    tokenizer = CamembertTokenizer(vocab=vocab, additional_special_tokens=[], model_max_length=512)
    config = CamembertConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden,
        max_position_embeddings=514,
        bos_token_id=0,
        pad_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    CamembertForMaskedLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_mt5(
    out: Path,
    texts: list[str],
    *,
    d_model: int = 32,
    layers: int = 1,
    heads: int = 4,
    vocab_size: int = 2000,
    seed: int = 0,
) -> Path:
    """A tiny random mT5 (seq2seq) + a unigram tokenizer (``<pad>``=0, ``</s>``=1, ``<unk>``=2)."""
    import torch
    from transformers import MT5Config, MT5ForConditionalGeneration, T5Tokenizer

    vocab = unigram_vocab(texts, vocab_size, ["<pad>", "</s>", "<unk>"])
    tokenizer = T5Tokenizer(vocab=vocab, extra_ids=0, model_max_length=512)
    config = MT5Config(
        vocab_size=len(tokenizer),
        d_model=d_model,
        d_kv=d_model // heads,
        d_ff=2 * d_model,
        num_layers=layers,
        num_decoder_layers=layers,
        num_heads=heads,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    MT5ForConditionalGeneration(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# --------------------------------------------------------------------------- params


def _shrink(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: (COUNT_KEYS[k] if k in COUNT_KEYS and not isinstance(v, (dict, list)) and v is not None else _shrink(v))
            for k, v in node.items()
        }
    return node


def set_key(params: dict, dotted: str, value: Any) -> None:
    *path, last = dotted.split(".")
    node = params
    for key in path:
        node = node[key]
    if last not in node:
        raise KeyError(f"profiles/paper.yaml has no key {dotted}")
    node[last] = value


def paper_params(models: dict[str, Path], hub_dir: Path, profile: Path = PROFILE) -> dict:
    """profiles/paper.yaml with the model names → ``models[kind]``, ``fetch.hub_repo`` → ``hub_dir``,
    the step/epoch counts of :data:`COUNT_KEYS` shrunk, and :data:`FIXED`."""
    import yaml

    params = _shrink(yaml.safe_load(profile.read_text(encoding="utf-8")))
    for key, kind in MODEL_KEYS.items():
        set_key(params, key, str(models[kind]))
    set_key(params, "fetch.hub_repo", str(hub_dir))
    for key, value in FIXED.items():
        set_key(params, key, value)
    return params


def build_all(out: Path, data_sizes: dict[str, int] = SIZES, **sizes: int) -> dict:
    """Everything under ``out``: ``bsard/``, ``camembert/``, ``mt5/``; returns the params."""
    texts = corpus_texts()
    hub = build_bsard_hub(out / "bsard", sizes=data_sizes)
    cam = {k[4:]: v for k, v in sizes.items() if k.startswith("cam_")}
    mt5 = {k[4:]: v for k, v in sizes.items() if k.startswith("mt5_")}
    models = {
        "camembert": build_camembert(out / "camembert", texts, **cam),
        "mt5": build_mt5(out / "mt5", texts, **mt5),
    }
    return paper_params(models, hub)


def copy_project(dest: Path, root: Path = ROOT) -> Path:
    """A scratch git clone of ``root`` with the working tree's uncommitted and untracked (not
    ignored) files laid over it and committed, so that ``dvc repro`` there runs the code as it
    is checked out (the stages then import ``dest/src`` when ``PYTHONPATH`` says so)."""
    import shutil
    import subprocess

    def git(*args: str, cwd: Path = root) -> str:
        return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout

    git("clone", "-q", str(root), str(dest))
    changed = git("ls-files", "-z", "--modified", "--others", "--exclude-standard").split("\0")
    for rel in filter(None, changed):
        if (root / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, dest / rel)
        elif (dest / rel).exists():  # deleted in the working tree
            (dest / rel).unlink()
    git("add", "-A", cwd=dest)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "working tree", "--allow-empty", cwd=dest)
    return dest


def main(argv: list[str] | None = None) -> None:
    import yaml

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for bsard/, camembert/, mt5/, params.yaml")
    parser.add_argument("--cam-hidden", type=int, default=48)
    parser.add_argument("--cam-layers", type=int, default=2)
    parser.add_argument("--cam-heads", type=int, default=4)
    parser.add_argument("--full", action="store_true", help="the whole sample (2,760 articles), not SIZES")
    args = parser.parse_args(argv)
    data_sizes = {"train": 10**6, "test": 10**6, "synthetic": 300, "articles": 10**6} if args.full else SIZES
    params = build_all(
        args.out.resolve(), data_sizes, cam_hidden=args.cam_hidden, cam_layers=args.cam_layers, cam_heads=args.cam_heads
    )
    (args.out / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    logging.basicConfig(level=logging.INFO)
    log.info("wrote %s", args.out)


if __name__ == "__main__":
    main()

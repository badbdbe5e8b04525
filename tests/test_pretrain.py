"""Domain-adaptive MLM pre-training (stage `pretrain`): tiny, CPU-only, a few seconds."""

from __future__ import annotations

import json
import logging
import math
import random

import polars as pl
import pytest
import torch

from conftest import section, write_params
from lexgraph.core.errors import ConfigError, HubUnreachableError
from lexgraph.core.stage import StageContext
from lexgraph.methods.pretrain import model as pt
from lexgraph.methods.pretrain import train as mlm

WORDS = (
    "le juge la loi contrat bail propriétaire locataire héritier succession mariage époux enfant "
    "donation testament servitude fonds voisin créancier débiteur obligation nullité dommage "
    "réparation article présent code civil peut doit être sans que dans pour par avec"
).split()

TINY = section(  # the pretrain section of params.yaml, tiny
    "pretrain",
    mode="scratch",
    vocab_size=300,
    hidden_size=32,
    num_layers=1,
    num_heads=2,
    max_length=32,
    max_steps=8,
    batch_size=8,
    learning_rate=3e-3,
    warmup_ratio=0.125,  # 1 of 8 steps
    eval_fraction=0.1,
    log_every=4,
)


def make_articles(n: int = 50, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(6, 40))]
        words[0] = words[0].capitalize()
        texts.append(" ".join(words) + ".")
    return texts


@pytest.fixture()
def articles_file(tmp_path):
    texts = make_articles()
    path = tmp_path / "articles.parquet"
    pl.DataFrame(
        {"id": list(range(1, len(texts) + 1)), "article": texts}, schema={"id": pl.Int64, "article": pl.Utf8}
    ).write_parquet(path)
    return path


def run_tiny(articles_file, out_dir, params=None, seed=13):
    metrics_path = out_dir.parent / f"{out_dir.name}.json"
    paths = pt.PretrainPaths(
        articles=articles_file, out=out_dir, metrics=metrics_path, plot=out_dir.parent / f"{out_dir.name}_curve.csv"
    )
    config = pt.PretrainConfig.from_params(dict(TINY, **(params or {})))
    metrics = mlm.run_pretrain(paths, config, StageContext(seed=seed, device="cpu"))
    return metrics, json.loads(metrics_path.read_text())


def test_scratch_checkpoint_loads_with_auto_classes_and_loss_drops(articles_file, tmp_path):
    from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

    out = tmp_path / "pretrain"
    metrics, written = run_tiny(articles_file, out)
    assert written == metrics
    assert "seconds" not in written  # no wall-clock times in a DVC-tracked metrics file
    for key in ("train_loss", "eval_loss", "perplexity", "steps"):
        assert key in written
    assert written["steps"] == TINY["max_steps"]
    assert math.isfinite(written["train_loss"]) and math.isfinite(written["eval_loss"])
    assert written["perplexity"] == pytest.approx(math.exp(written["eval_loss"]), rel=1e-3)
    # from random init, a few steps at a high lr move the eval loss well below ln(vocab)
    assert written["eval_loss"] < written["eval_loss_initial"]
    assert not list(tmp_path.glob(".pretrain.*")), "temporary directory left behind"

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModel.from_pretrained(out)
    mlm = AutoModelForMaskedLM.from_pretrained(out)
    enc = tok(["Le juge applique la loi ?", "ÉTAT"], padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state
        logits = mlm(**enc).logits
    assert hidden.shape == (2, enc["input_ids"].shape[1], TINY["hidden_size"])
    # the reloaded tokenizer is still cased, accent-preserving and [UNK]-free
    assert tok.tokenize("Héritier") != tok.tokenize("héritier") and "é" in "".join(tok.tokenize("héritier"))
    assert tok.unk_token not in tok.tokenize("Puis-je ? QUÉBEC")
    assert tok.model_max_length == 512
    assert logits.shape[-1] == len(tok)


def test_same_seed_same_weights(articles_file, tmp_path):
    from safetensors.torch import load_file

    run_tiny(articles_file, tmp_path / "a")
    run_tiny(articles_file, tmp_path / "b")
    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()


def test_tokenizer_is_cased_keeps_accents_and_avoids_unk():
    tok = pt.train_wordpiece_tokenizer(make_articles(200), vocab_size=300)
    assert tok.tokenize("Héritier") != tok.tokenize("héritier")  # cased
    assert "é" in "".join(tok.tokenize("héritier"))  # accents kept
    # characters absent from the training text still get real pieces, not [UNK]
    for text in ("Puis-je ?", "QUÉBEC", "50 % « Œuvre »", "zyx"):
        assert tok.unk_token not in tok.tokenize(text), text
    ids = tok("loi")["input_ids"]
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id


def test_blocks_pack_articles_with_separators():
    tok = pt.train_wordpiece_tokenizer(make_articles(100), vocab_size=300)
    texts = make_articles(30, seed=1)
    blocks = mlm.make_blocks(texts, tok, max_length=24)
    assert all(len(b) <= 24 for b in blocks) and all(len(b) == 24 for b in blocks[:-1])
    assert all(b[0] == tok.cls_token_id and b[-1] == tok.sep_token_id for b in blocks)
    stream = [i for b in blocks for i in b[1:-1]]
    expected = []
    for ids in tok(texts, add_special_tokens=False)["input_ids"]:
        expected += ([tok.sep_token_id] if expected else []) + ids
    assert stream == expected


def test_masking_rates_and_special_tokens():
    tok = pt.train_wordpiece_tokenizer(make_articles(100), vocab_size=300)
    specials = [tok.cls_token_id, tok.sep_token_id]
    ids = torch.randint(10, len(tok), (64, 256))
    ids[:, 0], ids[:, -1] = specials
    attention = torch.ones_like(ids)
    attention[:8, 200:] = 0  # padding is never a target
    masked, labels = mlm.mask_tokens(ids, attention, tok, 0.15, torch.Generator().manual_seed(0))
    targets = labels != -100
    assert not targets[:, 0].any() and not targets[:, -1].any() and not targets[:8, 200:].any()
    assert torch.equal(labels[targets], ids[targets])
    assert torch.equal(masked[~targets], ids[~targets])
    rate = targets.float().sum() / (attention.sum() - 2 * 64)
    assert 0.14 < rate < 0.16
    as_mask = (masked[targets] == tok.mask_token_id).float().mean()
    unchanged = (masked[targets] == ids[targets]).float().mean()
    assert 0.77 < as_mask < 0.83
    assert 0.08 < unchanged < 0.12 + 1 / len(tok)


def test_masked_only_loss_matches_the_model_loss():
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    model = BertForMaskedLM(
        BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    ).eval()
    ids = torch.randint(5, 50, (3, 12))
    attention = torch.ones_like(ids)
    labels = torch.full_like(ids, -100)
    labels[:, 3], labels[2, 7] = ids[:, 3], ids[2, 7]
    ours = mlm.mlm_loss(model, ids, attention, labels)
    theirs = model(input_ids=ids, attention_mask=attention, labels=labels).loss
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-5)


def test_continue_mode_from_a_local_checkpoint_through_the_driver(articles_file, tmp_path):
    import importlib.util
    from pathlib import Path

    from lexgraph.core.stage import run_stage

    run_tiny(articles_file, tmp_path / "base")
    params = write_params(
        tmp_path / "params.yaml",
        base={"seed": 1, "device": "cpu"},
        pretrain=dict(TINY, mode="continue", model=str(tmp_path / "base"), source="auto", max_steps=2),
    )
    driver_path = Path(__file__).resolve().parents[1] / "stages" / "pretrain.py"
    spec = importlib.util.spec_from_file_location("stage_pretrain", driver_path)
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    out, metrics = tmp_path / "adapted", tmp_path / "metrics" / "pretrain.json"
    curve = tmp_path / "metrics" / "pretrain_curve.csv"
    argv = ["--params", str(params), "--articles", str(articles_file), "--out", str(out), "--metrics", str(metrics)]
    argv += ["--plot", str(curve)]
    assert run_stage(driver.STAGE, argv) == 0
    written = json.loads(metrics.read_text())
    assert written["mode"] == "continue" and math.isfinite(written["eval_loss"])
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    # the training curve: the eval loss before training, then one row per step of the 2
    rows = curve.read_text().splitlines()
    assert rows[0] == "step,loss,eval_loss" and [r.split(",")[0] for r in rows[1:]] == ["0", "1", "2"]
    assert rows[1].split(",")[1] == "nan" and "nan" not in [r.split(",")[1] for r in rows[2:]]
    assert float(rows[-1].split(",")[2]) == pytest.approx(written["eval_loss"], abs=1e-4)


def test_continue_mode_offline_is_one_sentence(articles_file, tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubUnreachableError) as info:
        run_tiny(
            articles_file,
            tmp_path / "x",
            {"mode": "continue", "model": "lexgraph-test/no-such-model", "source": "auto"},
        )
    message = str(info.value)
    assert "\n" not in message and "lexgraph-test/no-such-model" in message and "pretrain.model" in message
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "params",
    [
        {"mode": "finetune"},
        {"hidden_size": 30, "num_heads": 4},
        {"learning_rate": "fast"},
        {"max_length": 4},
        {"epochs": 3},
    ],
)
def test_bad_params_are_config_errors(params):
    with pytest.raises(ConfigError):
        pt.PretrainConfig.from_params(dict(TINY, **params))


def test_float_strings_from_yaml_are_accepted():
    assert pt.PretrainConfig.from_params(section("pretrain", learning_rate="5e-5")).learning_rate == 5e-5


def test_warmup_is_a_share_of_max_steps_and_scales_with_a_shortened_run():
    """The paper profile's warm-up is a ratio: shrinking max_steps shrinks it instead of refusing
    the run; the default 0.1 of 600 and the paper's 0.05 of 50000 keep their step counts. The
    paper profile's MLM optimiser is gdsr scripts/run_mlm_training.sh's: --warmup_ratio 0.05 and
    no --weight_decay (Hugging Face TrainingArguments' default 0.0), for G-DSR §4.2's 50k steps."""
    from pathlib import Path

    from lexgraph.core.config import read_params

    root = Path(__file__).resolve().parents[1]
    paper = read_params(root / "profiles" / "paper.yaml")["pretrain"]
    default = read_params(root / "params.yaml")["pretrain"]
    config = pt.PretrainConfig.from_params(paper)
    assert (config.warmup_ratio, config.weight_decay, config.max_steps) == (0.05, 0.0, 50000)
    assert config.warmup_steps == 2500  # 0.05 x 50000
    assert pt.PretrainConfig.from_params(default).warmup_steps == 60  # 0.1 x 600: the sample's schedule
    short = pt.PretrainConfig.from_params(dict(paper, max_steps=200))
    assert short.warmup_steps == 10 and short.max_steps == 200
    assert pt.PretrainConfig.from_params(dict(paper, max_steps=9)).warmup_steps == 0  # 0.45 rounds to 0
    with pytest.raises(ConfigError, match=r"'pretrain.warmup_ratio' = 1.0, expected a share of max_steps in \[0, 1\)"):
        pt.PretrainConfig.from_params(dict(default, warmup_ratio=1.0))


def test_a_killed_mlm_run_resumes_at_its_last_checkpoint_with_the_same_weights(
    articles_file, tmp_path, monkeypatch, caplog
):
    """Issue 28: MLM pre-training checkpoints every ``checkpoint_every`` steps; a run killed
    after its second checkpoint and rerun resumes there (one log line) and writes the weights
    of an uninterrupted run, which are those of a run cut into one "epoch" (the cut does not
    change the batches)."""
    from safetensors.torch import load_file

    def weights(out):
        return load_file(out / "model.safetensors")

    whole, _ = run_tiny(articles_file, tmp_path / "whole")  # checkpoint_every (params.yaml) > max_steps: one cut
    cut, _ = run_tiny(articles_file, tmp_path / "cut", {"checkpoint_every": 3})  # 3 + 3 + 2 steps
    reference = weights(tmp_path / "whole")
    assert cut == whole and all(torch.equal(v, weights(tmp_path / "cut")[k]) for k, v in reference.items())

    batches = mlm.MLMTask.batches

    def killed_at_the_third(self, epoch):
        if epoch == 3:
            raise KeyboardInterrupt("killed")
        yield from batches(self, epoch)

    monkeypatch.setattr(mlm.MLMTask, "batches", killed_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        run_tiny(articles_file, tmp_path / "resumed", {"checkpoint_every": 3})
    assert not (tmp_path / "resumed").exists() and (tmp_path / ".resumed.resume" / "fit-1.pt").is_file()
    monkeypatch.setattr(mlm.MLMTask, "batches", batches)
    caplog.set_level(logging.INFO, logger="lexgraph")
    resumed, _ = run_tiny(articles_file, tmp_path / "resumed", {"checkpoint_every": 3})
    assert "pretrain: resumed after epoch 2 of 3" in caplog.text
    assert resumed == whole
    assert all(torch.equal(v, weights(tmp_path / "resumed")[k]) for k, v in reference.items())
    assert not (tmp_path / ".resumed.resume").exists()

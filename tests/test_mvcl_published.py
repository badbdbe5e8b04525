"""MVCL as published (``rerank.mvcl``) next to lexgraph's re-ranker (``rerank.xrerank``),
each piece against the paper's equations computed by hand (Zhaowei Wang, IJCNN 2022;
/work/shared/papers/mvcl-ijcnn2022.txt): eq. 2-4's alignment and strengthening on the PLM's own
states (no projection), eq. 6's attention pooling with its own weights, the truncation "from
the front", the epoch chosen by the pairwise accuracy on dev, the paper's 5.5 epochs (the last
one partial), a list ranked by the sum of each candidate's probabilities in all its pairs (the
paper's Appendix B); then xrerank's network and training unchanged, a fine-tuned PLM (a tiny random
XLM-R made here) that gets gradients from the training step, or (the sample's budget rule,
``plm_layers``) whose top blocks alone train over cached states of the frozen ones, the re-ranked
list alone without fusion, the fine-tuned PLM saved with the network and loaded by the search
side, and the ``rerank`` section's params rule (shared keys + one mapping per re-ranker, equal to
what dvc.yaml tracks)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from lexgraph.core.config import ConfigError
from lexgraph.core.stage import StageContext
from lexgraph.methods.rerank.config import ENCODE_KEYS, VARIANTS, RerankConfig
from lexgraph.methods.rerank.features import TokenStore
from lexgraph.methods.rerank.io import build_model
from lexgraph.methods.rerank.model import Eq6Pooling, InteractionModel, Tournament, fuse_list

ROOT = Path(__file__).resolve().parents[1]


def _params(path: str = "params.yaml") -> dict:
    return yaml.safe_load((ROOT / path).read_text(encoding="utf-8"))


def _config(variant: str, shared: dict | None = None, own: dict | None = None, profile: str = "params.yaml"):
    section = copy.deepcopy(_params(profile)["rerank"])
    section.update(shared or {})
    section[variant].update(own or {})
    return RerankConfig.from_params(section, variant)


def _lstm_input(model, q, d):
    """What the BiLSTM receives for the query tokens (captured by a hook)."""
    from torch.nn.utils.rnn import pad_packed_sequence

    captured = []
    handle = model.lstm.register_forward_hook(lambda mod, inp, out: captured.append(inp[0]))
    ones_q = torch.ones(q.shape[:2], dtype=torch.bool)
    ones_d = torch.ones(d.shape[:2], dtype=torch.bool)
    model.match(q, ones_q, d, ones_d)
    handle.remove()
    return pad_packed_sequence(captured[0], batch_first=True)[0]  # (1, Lq, 4 * width)


def _softmax(xs):
    top = max(xs)
    ex = [math.exp(x - top) for x in xs]
    return [x / sum(ex) for x in ex]


# ---------------------------------------------------------------------------
# MVCL's equations, by hand
# ---------------------------------------------------------------------------


def test_eq_2_to_4_align_and_strengthen_the_plm_states_themselves():
    """MVCL §III-B, eq. 2: "e_ij = h_a_i^T h_b_j / sqrt(d)", alpha_{a_i b_j} = exp(e_ij) / sum_k exp(e_ik),
    alpha_{b_j a_i} = exp(e_ij) / sum_k exp(e_kj), "h~_a_i = sum_j alpha_{a_i b_j} h_b_j",
    "h~_b_j = sum_i alpha_{b_j a_i} h_a_i"; eq. 3: "m_a_i = [h_a_i; h~_a_i; h_a_i - h~_a_i; h_a_i ⊙ h~_a_i]";
    eq. 4: "v_a = BiLSTM(m_a)". Hand-written PLM states (d = 2, two query and three candidate
    tokens): with ``projection: false`` the strengthened vectors, and what the BiLSTM reads, are
    these of the PLM's states (no linear map before it)."""
    ha = [[1.0, 0.5], [-0.5, 2.0]]  # (o = 2, d = 2)
    hb = [[0.0, 1.0], [2.0, -1.0], [1.0, 1.0]]  # (m = 3, d = 2)
    d = 2
    e = [[sum(x * y for x, y in zip(a, b)) / math.sqrt(d) for b in hb] for a in ha]  # (2, 3)
    rows = [_softmax(e[i]) for i in range(2)]  # alpha_{a_i b_j}: over j for each i
    cols = [_softmax([e[i][j] for i in range(2)]) for j in range(3)]  # alpha_{b_j a_i}: over i for each j
    ha_t = [[sum(rows[i][j] * hb[j][c] for j in range(3)) for c in range(d)] for i in range(2)]
    hb_t = [[sum(cols[j][i] * ha[i][c] for i in range(2)) for c in range(d)] for j in range(3)]

    def m(h, t):
        return h + t + [x - y for x, y in zip(h, t)] + [x * y for x, y in zip(h, t)]

    model = InteractionModel(
        input_dim=d, hidden=4, dropout=0.0, alignment="scaled_dot", pooling="eq6", projection=False
    ).eval()
    q, c = torch.tensor([ha]), torch.tensor([hb])
    ones_q, ones_c = torch.ones(1, 2, dtype=torch.bool), torch.ones(1, 3, dtype=torch.bool)
    with torch.no_grad():
        ma, mb = model.strengthen(q, ones_q, c, ones_c)
        fed = _lstm_input(model, q, c)
    for i in range(2):
        assert ma[0, i].tolist() == pytest.approx(m(ha[i], ha_t[i]), abs=1e-6)
    for j in range(3):
        assert mb[0, j].tolist() == pytest.approx(m(hb[j], hb_t[j]), abs=1e-6)
    torch.testing.assert_close(fed, ma)  # the BiLSTM reads m itself: 4 * d wide
    assert model.proj is None and model.lstm.input_size == 4 * d and model.lstm.hidden_size == 4 // 2
    unscaled = _softmax([x * math.sqrt(d) for x in e[0]])
    assert max(abs(x - y) for x, y in zip(rows[0], unscaled)) > 1e-3  # the 1 / sqrt(d) shows
    # both profiles' mvcl: the PLM's states, scaled dot; xrerank keeps its projection and cosine
    for profile in ("params.yaml", "profiles/paper.yaml"):
        mvcl = build_model(6, _config("mvcl", {"hidden": 4}, profile=profile))
        assert (mvcl.alignment, mvcl.proj, mvcl.lstm.input_size) == ("scaled_dot", None, 24)
        xrerank = build_model(6, _config("xrerank", {"hidden": 4}, profile=profile))
        assert (xrerank.alignment, xrerank.lstm.input_size) == ("cosine", 16) and xrerank.proj is not None


def test_eq_6_pools_the_activated_transform_with_its_own_weights():
    """MVCL §III-D, eq. 6: "u_i = ReLU(W h_i + b)", "alpha_i = exp(u_i^T u_w) / sum_i exp(u_i^T u_w)",
    "h̄ = sum_i alpha_i u_i", "where W and b are parameters to transform PLM representations and
    u_w is a parameter to select words". By hand, with the module's own W, b and u_w; the
    padding token counts for nothing."""
    pool = Eq6Pooling(input_dim=2, hidden=3)
    W, b, u_w = [[1.0, -1.0], [0.5, 2.0], [-1.0, 0.25]], [0.0, -1.0, 0.5], [2.0, 1.0, -0.5]
    with torch.no_grad():
        pool.transform.weight.copy_(torch.tensor(W))
        pool.transform.bias.copy_(torch.tensor(b))
        pool.context.copy_(torch.tensor(u_w))
    h = [[1.0, 2.0], [2.0, 0.5], [-1.0, 1.0]]
    x = torch.tensor([h + [[9.0, 9.0]]])  # (1, 4, 2): the last token is padding
    mask = torch.tensor([[True, True, True, False]])
    u = [[max(sum(W[o][k] * t[k] for k in range(2)) + b[o], 0.0) for o in range(3)] for t in h]
    alpha = _softmax([sum(ui * wi for ui, wi in zip(row, u_w)) for row in u])
    expected = [sum(a * row[o] for a, row in zip(alpha, u)) for o in range(3)]
    with torch.no_grad():
        got = pool(x, mask)[0].tolist()
    assert got == pytest.approx(expected, abs=1e-6)
    pre = [[sum(W[o][k] * t[k] for k in range(2)) + b[o] for o in range(3)] for t in h]
    assert any(v < 0 for row in pre for v in row)  # the activation shows: pooling W h + b would differ
    assert got != pytest.approx([sum(a * row[o] for a, row in zip(alpha, pre)) for o in range(3)], abs=1e-3)
    # mvcl's network pools with eq. 6 and weights of its own; xrerank with tanh over its projection
    mvcl, xrerank = build_model(6, _config("mvcl", {"hidden": 4})), build_model(6, _config("xrerank", {"hidden": 4}))
    assert isinstance(mvcl.pool, Eq6Pooling) and mvcl.pool.transform.in_features == 6
    assert {n for n, _ in mvcl.named_parameters() if n.startswith("pool.")} == {
        "pool.transform.weight",
        "pool.transform.bias",
        "pool.context",
    }
    assert not isinstance(xrerank.pool, Eq6Pooling) and xrerank.pool._proj[0] is xrerank.proj


def test_truncation_left_keeps_a_long_texts_last_tokens_and_right_its_first(tiny_model_dir):
    """MVCL §IV-C: "the documents longer than 512 tokens are truncated from the front", read as
    Hugging Face's ``truncation_side='left'``: ``left`` keeps the last tokens (and equals that
    truncation without a prefix), ``right`` the first ones; the special tokens and a prefix
    stay. The re-ranker's token inputs (questions and articles) are cut at the variant's end."""
    import polars as pl
    from transformers import AutoTokenizer

    from lexgraph.methods.rerank.features import token_inputs, tokenize

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "a b c d e f g h i j"  # ten tokens

    def words(side, prefix="", limit=6):
        return tok.convert_ids_to_tokens(tokenize(tok, [text], prefix, limit, side)[0]["input_ids"])

    assert words("right") == ["[CLS]", "a", "b", "c", "d", "[SEP]"]
    assert words("left") == ["[CLS]", "g", "h", "i", "j", "[SEP]"]
    hf_left = AutoTokenizer.from_pretrained(tiny_model_dir, truncation_side="left")
    assert words("left") == hf_left.convert_ids_to_tokens(hf_left(text, truncation=True, max_length=6)["input_ids"])
    assert words("left", prefix="loi ", limit=7) == ["[CLS]", "loi", "g", "h", "i", "j", "[SEP]"]
    assert words("left", limit=20) == words("right", limit=20) == ["[CLS]", *text.split(), "[SEP]"]
    articles = pl.DataFrame({"id": [1], "article": [text]})
    questions = pl.DataFrame({"id": [7], "question": [text], "article_ids": [[1]], "split": ["train"]})
    config = _config("mvcl", {"del_token": "[MASK]"}, {"max_query_length": 8, "max_article_length": 9})
    assert config.truncation == "left" and _config("xrerank").truncation == "right"
    inputs = token_inputs(articles, questions, config, tok, "", "", 0, config.truncation)
    assert tok.convert_ids_to_tokens(inputs.articles[0]) == ["[CLS]", "d", "e", "f", "g", "h", "i", "j", "[SEP]"]
    assert tok.convert_ids_to_tokens(inputs.questions[0]) == ["[CLS]", "e", "f", "g", "h", "i", "j", "[SEP]"]


def _stores(dim=8, n_articles=12, n_questions=20):
    """Token states: article i carries its 'topic'; question q shares its gold's (q % n_articles)."""
    g = torch.Generator().manual_seed(0)
    topics = torch.randn(n_articles, dim, generator=g)
    arts = [(topics[i] + 0.3 * torch.randn(5, dim, generator=g)).half() for i in range(n_articles)]
    qs = [(topics[q % n_articles] + 0.3 * torch.randn(3, dim, generator=g)).half() for q in range(n_questions)]
    articles = TokenStore.from_list(list(range(n_articles)), arts, dim)
    queries = TokenStore.from_list(list(range(100, 100 + n_questions)), qs, dim)
    views = TokenStore.from_list(list(range(n_articles)), [a[:3] for a in arts], dim)
    return articles, queries, views


def _lists(qids, width, n_articles=12, gold_first=True):
    from lexgraph.methods.rerank.train import Lists

    rows = np.array([[(q - 100 + j) % n_articles for j in range(width)] for q in qids])
    if not gold_first:
        rows = rows[:, ::-1].copy()
    return Lists(
        list(qids), {q: [(q - 100) % n_articles] for q in qids}, rows, np.tile(np.linspace(1, 0, width), (len(qids), 1))
    )


def _on_frozen_states(config: RerankConfig, **changes) -> RerankConfig:
    """``config`` trained on cached states (a PLM-free test of what the training loop does)."""
    return config.model_copy(update={"plm": "frozen", "plm_lr": None, "plm_layers": None, **changes})


def test_the_epoch_is_chosen_by_the_pairwise_dev_accuracy_for_mvcl_and_by_map_for_xrerank(one_thread, monkeypatch):
    """MVCL §IV-C: "best model is selected in the training process according to the accuracy
    measure on the validation set". Scripted games of the classifier on two dev questions
    (top-2: the gold article and one other), [b, c] = logit_0 - logit_1 of (B=b, C=c):
    epoch 1 ranks both golds first (mAP 1) but gets the dev triples right in one order only
    (accuracy 1/2); epoch 2 ranks one gold second (mAP 3/4) and gets 3 of the 4 ordered
    triples right (accuracy 3/4); epoch 3 is worse on both. mvcl keeps epoch 2, xrerank (map) epoch 1."""
    from lexgraph.methods.rerank import train as rerank

    games = {  # epoch -> per dev question (gold at 0): (margin[gold, other], margin[other, gold])
        1: [(-1.0, -2.0), (-1.0, -2.0)],  # gold scores above the other; (B, C) wrong, (C, B) right
        2: [(1.0, -1.0), (2.0, 3.0)],  # question 2: gold below; (B, C) right, (C, B) wrong
        3: [(2.0, 3.0), (2.0, 3.0)],
    }
    calls = []

    def scripted(tournament, q_states, cands):
        epoch, question = divmod(len(calls), 2)
        calls.append(1)
        bc, cb = games[epoch + 1][question]
        margins = np.array([[0.0, bc], [cb, 0.0]], dtype=np.float32)
        return margins.sum(1), margins  # n = 2: the tournament score is the one game

    monkeypatch.setattr(rerank.Tournament, "games", scripted)
    monkeypatch.setattr(rerank.Tournament, "scores", lambda *args: scripted(*args)[0])
    args = (*_stores(), _lists(range(100, 112), 2), _lists(range(112, 114), 2))
    sizes = {"k": 2, "hidden": 4, "batch_size": 8, "eval_batch_size": 8}
    mvcl = _on_frozen_states(_config("mvcl", sizes), epochs=3)
    _, report = rerank.train(mvcl, *args, device=torch.device("cpu"), seed=13)
    history = {h["epoch"]: h for h in report["history"]}
    assert [history[e]["dev_accuracy"] for e in (1, 2, 3)] == [0.5, 0.75, 0.5]
    assert [history[e]["dev_map"] for e in (1, 2, 3)] == [1.0, 0.75, 0.5]  # the lists' IR metrics are kept
    assert report["epoch"] == 2 and report["metric"] == "accuracy" and report["dev_triples"] == 2
    assert report["dev"]["accuracy"] == 0.75 and report["dev"]["map"] == 0.75
    calls.clear()
    xrerank = _config("xrerank", sizes, {"interpolation": [1.0]}).model_copy(
        update={"epochs": 3, "match_features": False, "warm_start": False}
    )
    _, report = rerank.train(xrerank, *args, device=torch.device("cpu"), seed=13)
    assert report["epoch"] == 1 and report["metric"] == "map" and "accuracy" not in report["dev"]
    assert [h["dev_map"] for h in report["history"]] == [1.0, 0.75, 0.5]


@pytest.mark.parametrize(
    "pairs, batch_size, steps, total, warmup",
    [
        (24, 6, 4, 22, 2),  # 5.5 x 4 = 22 steps, 2.2 warming up
        (18, 2, 9, 50, 5),  # 5.5 x 9 = 49.5 -> 50 steps, 5 warming up (10 % of 49.5 would be 4)
    ],
)
def test_fractional_epochs_run_round_epochs_times_steps_with_a_tenth_warming_up(
    pairs, batch_size, steps, total, warmup, one_thread, monkeypatch
):
    """MVCL §IV-C: "We train our model for 3500 (about 5.5 epochs) iterations and use a linear
    learning rate scheduler with the first 350 steps (10%) for warmup": 5.5 epochs of N steps are
    round(5.5 N) optimizer steps, the first int(0.1 x that) warming up, the last epoch partial and
    followed by a dev selection as every whole one."""
    from lexgraph.methods.rerank import train as rerank
    from lexgraph.training import engine

    scheduled, per_epoch = [], {}
    build = engine.build_scheduler
    monkeypatch.setattr(
        engine, "build_scheduler", lambda opt, kind, w, t: (scheduled.append((kind, w, t)), build(opt, kind, w, t))[1]
    )
    batches = rerank.RerankTrainer.batches

    def counted(self, epoch):
        for batch in batches(self, epoch):
            per_epoch[epoch] = per_epoch.get(epoch, 0) + 1
            yield batch

    monkeypatch.setattr(rerank.RerankTrainer, "batches", counted)
    config = _on_frozen_states(_config("mvcl", {"k": 4, "hidden": 4, "batch_size": batch_size, "eval_batch_size": 8}))
    assert config.epochs == 5.5 and config.warmup_ratio == 0.1 and config.negatives == 1
    train_lists, dev_lists = _lists(range(100, 100 + pairs), 4), _lists(range(100 + pairs, 106 + pairs), 4)
    _, report = rerank.train(config, *_stores(n_questions=pairs + 6), train_lists, dev_lists, torch.device("cpu"), 13)
    assert math.ceil(pairs / batch_size) == steps and round(5.5 * steps) == total and int(0.1 * total) == warmup
    assert report["steps"] == total == sum(per_epoch.values())
    assert per_epoch == {**{e: steps for e in range(1, 6)}, 6: total - 5 * steps}  # the sixth epoch partial
    assert scheduled == [("linear", warmup, total)]
    assert [h["epoch"] for h in report["history"]] == [1, 2, 3, 4, 5, 6]  # a dev selection after each


def test_xrerank_is_the_network_and_the_training_of_before(one_thread):
    """The new keys' xrerank values (projection: true, pooling: tanh, truncation: right, metric:
    map, epochs 5, ranking: margin) reproduce the code path of before: the values below were
    computed with it (same seed, same inputs) before MVCL's equations and Appendix B's ranking
    were added."""
    from lexgraph.methods.rerank.train import train

    torch.manual_seed(0)
    model = build_model(6, _config("xrerank", {"hidden": 4})).eval()
    g = torch.Generator().manual_seed(1)
    q, d = torch.randn(3, 4, 6, generator=g), torch.randn(3, 5, 6, generator=g)
    q_mask, d_mask = torch.ones(3, 4, dtype=torch.bool), torch.ones(3, 5, dtype=torch.bool)
    d_mask[2, 3:] = False
    assert list(model.state_dict()) == [
        "proj.weight",
        "proj.bias",
        *(f"lstm.{k}_l0{r}" for r in ("", "_reverse") for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")),
        "classifier.mlp.0.weight",
        "classifier.mlp.0.bias",
        "classifier.mlp.3.weight",
        "classifier.mlp.3.bias",
        "classifier.skip.weight",
        "pool.score.weight",
    ]
    with torch.no_grad():
        h = model.match(q, q_mask, d, d_mask)
        assert h.sum(1).tolist() == pytest.approx([1.460944, 4.162846, 3.396292], abs=1e-5)
        assert h[0, :4].tolist() == pytest.approx([-0.194082, 0.0167, -0.011125, 0.299649], abs=1e-5)
        pooled = model.pool(d, d_mask).tolist()
        assert pooled[0] == pytest.approx([0.020969, -0.118151, 0.783436, -0.512151], abs=1e-5)
        assert pooled[2] == pytest.approx([-0.421792, -0.09747, 0.413413, -0.168977], abs=1e-5)
        assert model.ranking == "margin"
        assert model.tournament_scores(h).tolist() == pytest.approx([1.852488, -0.375873, -1.476615], abs=1e-5)
        model.classifier.mlp[-1].weight.normal_(generator=torch.Generator().manual_seed(2))
        assert model.tournament_scores(h).tolist() == pytest.approx([1.783611, 0.123153, -1.368359], abs=1e-5)
    # a toy training run (tests/test_mvcl.py's toy): the report of before
    gen = torch.Generator().manual_seed(0)
    topics = torch.randn(30, 16, generator=gen)
    arts = [(topics[i] + 0.3 * torch.randn(6, 16, generator=gen)).half() for i in range(30)]
    qs = [(topics[i % 30] + 0.3 * torch.randn(4, 16, generator=gen)).half() for i in range(40)]
    stores = (
        TokenStore.from_list(list(range(30)), arts, 16),
        TokenStore.from_list(list(range(100, 140)), qs, 16),
        TokenStore.from_list(list(range(30)), [a[:3] for a in arts], 16),
    )
    train_lists, dev_lists = (
        _lists(range(100, 130), 10, 30, gold_first=False),
        _lists(range(130, 140), 10, 30, gold_first=False),
    )
    sizes = {"k": 10, "hidden": 8, "batch_size": 8, "negatives": 2, "dropout": 0.0}
    config = _config("xrerank", sizes, {"lr": 1e-2, "epochs": 3, "interpolation": [0.0, 0.3, 0.6]})
    _, report = train(config, *stores, train_lists, dev_lists, device=torch.device("cpu"), seed=13)
    assert (report["epoch"], report["alpha"], report["steps"], report["dev"]["map"]) == (2, 0.6, 24, 0.6667)
    assert report["dev_by_alpha"] == {"0.0": 0.1, "0.3": 0.1405, "0.6": 0.6667}
    assert [h["dev_map"] for h in report["history"]] == pytest.approx([0.65, 0.65, 0.666667, 0.666667], abs=1e-6)
    losses = [0.001849239008151926, 0.0009562859777361155, 0.0008163877392917129]
    assert [h["loss"] for h in report["history"][1:]] == pytest.approx(losses, rel=1e-4)


# ---------------------------------------------------------------------------
# The ranking rule: MVCL's Appendix B
# ---------------------------------------------------------------------------


class _ScriptedGames(torch.nn.Module):
    """The pairwise classifier, scripted: the candidates' matching vectors are one-hot rows
    (``H_b = e_b``), so the game with B = b and C = c reads ``H_b - H_c = e_b - e_c`` and returns the
    logits chosen for it; the diagonal (no game) returns logits that must count for nothing."""

    def __init__(self, logits: dict[tuple[int, int], tuple[float, float]]) -> None:
        super().__init__()
        self.logits = logits

    def forward(self, diff: torch.Tensor) -> torch.Tensor:  # (n, n, n) -> (n, n, 2)
        out = torch.zeros(*diff.shape[:-1], 2)
        for b in range(diff.shape[0]):
            for c in range(diff.shape[1]):
                if b == c:
                    out[b, c] = torch.tensor([3.0, -3.0])
                    continue
                assert (int(diff[b, c].argmax()), int(diff[b, c].argmin())) == (b, c)
                out[b, c] = torch.tensor(self.logits[b, c])
        return out


#: (B, C) -> (logit_0, logit_1) of the game; class 0: B is the more relevant. Candidate 0 wins one
#: game by a wide margin (10) and loses its two others; candidate 1 wins all three by small ones.
GAMES = {
    (0, 1): (0.0, 1.0),
    (0, 2): (6.0, -4.0),
    (0, 3): (0.0, 0.5),
    (1, 0): (0.5, -0.5),
    (1, 2): (1.0, 0.0),
    (1, 3): (0.25, -0.25),
    (2, 0): (-5.0, 5.0),
    (2, 1): (0.0, 1.0),
    (2, 3): (-1.0, 0.0),
    (3, 0): (1.0, 0.0),
    (3, 1): (-0.5, 0.0),
    (3, 2): (1.5, 0.0),
}


def test_mvcl_ranks_by_the_sum_of_a_candidates_probabilities_in_all_pairs(monkeypatch):
    """MVCL §III-A: "many methods can convert those preferences into a ranked list of candidates
    (see examples in Appendix B)"; Appendix B: "We could sum the probabilities of a candidate in
    all pairs and rank candidates according to their summations of probabilities." Candidate b's
    probability in its pair with c: the classifier's softmax probability of class 0 (B = b is the
    more relevant) in the game (b, c), exp(l0) / (exp(l0) + exp(l1)); b's score: its sum over the
    three other candidates, by hand from the chosen logits. The margin rule (lexgraph's mean
    logit margin) ranks candidate 0 first on its one lopsided win; the probabilities, which
    saturate, rank candidate 1 (it wins every game) first."""
    from lexgraph.methods.rerank import model as models_rerank

    def p(b, c):
        l0, l1 = GAMES[b, c]
        return math.exp(l0) / (math.exp(l0) + math.exp(l1))

    summed = [sum(p(b, c) for c in range(4) if c != b) for b in range(4)]
    assert summed == pytest.approx([1.646437, 2.084576, 0.537928, 1.926174], abs=1e-6)
    mean_margin = [sum(GAMES[b, c][0] - GAMES[b, c][1] for c in range(4) if c != b) / 3 for b in range(4)]
    assert mean_margin == pytest.approx([17 / 6, 5 / 6, -4.0, 2 / 3])
    h = torch.eye(4)  # (n, match_dim): one-hot matching vectors
    scored = {}
    for ranking in ("probability", "margin"):
        model = InteractionModel(4, 4, 0.0, ranking=ranking).eval()
        model.classifier = _ScriptedGames(GAMES)
        with torch.no_grad():
            scored[ranking] = model.tournament_scores(h).tolist()
        # the search (Tournament.scores) and the dev pass (Tournament.games) score with the network's ranking
        monkeypatch.setattr(models_rerank.Tournament, "match", lambda *args: h)
        cands = [10, 11, 12, 13]
        assert Tournament(model, None, torch.device("cpu")).scores(None, cands).tolist() == pytest.approx(
            scored[ranking], abs=1e-6
        )
        scores, margins = Tournament(model, None, torch.device("cpu"), 4).games(None, cands)
        assert scores.tolist() == pytest.approx(scored[ranking], abs=1e-6)
        expected = [[GAMES[b, c][0] - GAMES[b, c][1] if b != c else 0.0 for c in range(4)] for b in range(4)]
        np.testing.assert_allclose(margins, expected, atol=1e-6)  # the pairwise accuracy still reads the margins
    assert scored["probability"] == pytest.approx(summed, abs=1e-6)
    assert scored["margin"] == pytest.approx(mean_margin, abs=1e-6)
    ids, first = np.array([10, 11, 12, 13]), np.linspace(1, 0, 4)
    assert fuse_list(ids, first, np.array(scored["probability"]), None, 4)[0].tolist() == [11, 13, 10, 12]
    assert fuse_list(ids, first, np.array(scored["margin"]), None, 4)[0].tolist() == [10, 11, 13, 12]
    # mvcl ranks by App. B's probabilities in both profiles; xrerank keeps its margins
    for profile in ("params.yaml", "profiles/paper.yaml"):
        assert build_model(6, _config("mvcl", {"hidden": 4}, profile=profile)).ranking == "probability"
        assert build_model(6, _config("xrerank", {"hidden": 4}, profile=profile)).ranking == "margin"


# ---------------------------------------------------------------------------
# The re-ranked list alone (fusion: false)
# ---------------------------------------------------------------------------


def test_without_fusion_the_list_is_the_networks_order_then_the_first_stages_tail():
    ids = np.array([10, 11, 12, 13, 14, 15, -1])
    first = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.0])
    net = np.array([0.2, 5.0, -1.0, 0.2])  # 10 and 13 tie: the first stage's order breaks it
    out, scores = fuse_list(ids, first, net, None, k=4)
    assert out.tolist() == [11, 10, 13, 12, 14, 15, -1]
    assert scores[:4].tolist() == pytest.approx([5.0, 0.2, 0.2, -1.0])  # the network's own scores
    assert scores[3] > scores[4] > scores[5]  # the tail stays below, in its order
    # whatever the first stage's scores say (fusion would move 10 up at any alpha < 1)
    assert fuse_list(ids, first * 100, net, None, k=4)[0].tolist() == out.tolist()


class _First:
    """A first stage with fixed lists (question i: articles i, i+1, ... of a ring of 12)."""

    name = "stub"

    def __init__(self, n=12):
        self.article_ids = np.arange(n)

    def search(self, questions, k):
        n = len(self.article_ids)
        ids = np.array([[(int(q.split()[-1]) + j) % n for j in range(min(k, n))] for q in questions])
        return ids, np.tile(np.linspace(1, 0, ids.shape[1]), (len(questions), 1))


def test_mvcl_search_without_fusion_orders_by_the_network(one_thread):
    from lexgraph.methods.rerank.system import MvclRetriever

    torch.manual_seed(0)
    model = InteractionModel(4, 4, 0.0).eval()
    articles = TokenStore.from_list(list(range(12)), [torch.randn(3, 4).half() for _ in range(12)], 4)
    states = [torch.randn(2, 4).half(), torch.randn(3, 4).half()]

    class Encoder:
        def encode_queries(self, texts, max_length, batch_size, truncation):
            assert truncation == "left"
            return states[: len(texts)]

    settings = {
        "first_stage": "bm25",
        "k": 6,
        "alpha": None,
        "config": {"max_query_length": 8, "encode_batch_size": 4, "eval_batch_size": 4, "truncation": "left"},
    }
    retriever = MvclRetriever("mvcl", _First(), model, Encoder(), articles, settings, torch.device("cpu"), "x")
    ids, _ = retriever.search(["q 0", "q 5"], 8)
    for i, start in enumerate((0, 5)):
        cands = [(start + j) % 12 for j in range(6)]
        net = Tournament(model, articles, torch.device("cpu")).scores(states[i], cands)
        expected = [cands[j] for j in np.lexsort((np.arange(6), -net))]
        assert ids[i, :6].tolist() == expected
        assert ids[i, 6:].tolist() == [(start + 6) % 12, (start + 7) % 12]


# ---------------------------------------------------------------------------
# The fine-tuned PLM
# ---------------------------------------------------------------------------


def _tiny_xlmr(vocab=40, layers=1):
    from transformers import XLMRobertaConfig, XLMRobertaModel

    torch.manual_seed(0)
    config = XLMRobertaConfig(
        vocab_size=vocab,
        hidden_size=16,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=40,
        pad_token_id=1,
    )
    return XLMRobertaModel(config, add_pooling_layer=False)


def _token_lists(n_articles=12, n_questions=16):
    """Token ids: article i holds its 'topic' tokens; question q shares its gold's."""
    g = np.random.default_rng(0)
    arts = [[0] + [4 + (i % 6) * 5 + int(t) for t in g.integers(0, 5, 8)] + [2] for i in range(n_articles)]
    qs = [[0] + [4 + (q % 6) * 5 + int(t) for t in g.integers(0, 5, 4)] + [2] for q in range(n_questions)]
    return arts, qs


def test_a_finetuned_plm_gets_gradients_from_the_training_step(one_thread):
    """plm: finetune: token ids go into the PLM inside the step, so the losses' gradients reach it
    (today's frozen path takes cached states and has no PLM to train)."""
    from lexgraph.methods.rerank.plm import PLMTokens
    from lexgraph.methods.rerank.train import Lists, train

    plm = _tiny_xlmr()
    before = {k: v.clone() for k, v in plm.state_dict().items()}
    arts, qs = _token_lists()
    articles = PLMTokens(range(12), arts, plm, pad_id=1)
    queries = PLMTokens(range(100, 116), qs, plm, pad_id=1)
    views = PLMTokens(range(12), [a[:5] + [3] * 4 + a[-1:] for a in arts], plm, pad_id=1)

    def lists(qids):
        ids = np.array([[(q - 100 + j) % 12 for j in range(6)] for q in qids])
        return Lists(
            list(qids), {q: [(q - 100) % 12] for q in qids}, ids, np.tile(np.linspace(1, 0, 6), (len(qids), 1))
        )

    sizes = {"k": 6, "hidden": 8, "batch_size": 8, "eval_batch_size": 8}
    config = _config("mvcl", sizes, {"epochs": 1, "plm_layers": None})  # every weight trains
    assert config.plm == "finetune" and not config.fusion
    model, report = train(
        config,
        articles,
        queries,
        views,
        lists(range(100, 112)),
        lists(range(112, 116)),
        torch.device("cpu"),
        seed=13,
        plm=plm,
    )
    assert report["plm"] == "finetune" and report["steps"] == 2  # 12 pairs, batch 8
    assert report["plm_grad_norm_first_step"] > 0
    changed = [k for k, v in plm.state_dict().items() if not torch.equal(v, before[k])]
    assert "encoder.layer.0.attention.self.query.weight" in changed and "embeddings.word_embeddings.weight" in changed
    # no fusion: the kept lists are the re-ranker's alone (the kept epoch's pairwise accuracy beside them)
    assert report["alpha"] is None and "dev_by_alpha" not in report
    assert {k: v for k, v in report["dev"].items() if k != "accuracy"} == report["dev_mvcl_only"]
    assert 0 <= report["dev"]["accuracy"] <= 1 and report["dev_triples"] == 4


def _lists6(qids):
    from lexgraph.methods.rerank.train import Lists

    ids = np.array([[(q - 100 + j) % 12 for j in range(6)] for q in qids])
    return Lists(list(qids), {q: [(q - 100) % 12] for q in qids}, ids, np.tile(np.linspace(1, 0, 6), (len(qids), 1)))


def _token_inputs():
    from lexgraph.methods.rerank.features import TokenInputs

    arts, qs = _token_lists()
    views = [a[:5] + [3] * 4 + a[-1:] for a in arts]  # the element views: other token sequences
    return TokenInputs(list(range(12)), arts, list(range(100, 116)), qs, list(range(12)), views)


def test_plm_layers_trains_the_top_blocks_over_states_cached_once_per_text(one_thread):
    """The sample's budget rule (rerank.mvcl.plm_layers: N): only the PLM's top N blocks train
    (the embeddings and the blocks below frozen); the states entering them are computed once per
    article and question (the embeddings see each of those texts exactly once, before training)
    and a step runs the top blocks alone over them; an element view (MVCL eq. 8: another token
    sequence) goes through the frozen blocks on every call, without gradients, and the top ones
    with gradients. Dev scoring in eval mode gives the states, and so the scores, of the whole
    trained PLM's forward."""
    import contextlib

    from lexgraph.methods.rerank.plm import CACHE_DTYPE, PLMTokens, plm_stores
    from lexgraph.methods.rerank.train import train

    plm = _tiny_xlmr(layers=3)
    before = {k: v.clone() for k, v in plm.state_dict().items()}
    inputs = _token_inputs()
    seen: list[list[int]] = []  # every text the embeddings (the frozen part's input) ran on

    def record(module, args, kwargs, out):
        seen.extend([t for t in row if t != 1] for row in kwargs["input_ids"].tolist())  # padding (1) dropped

    plm.embeddings.register_forward_hook(record, with_kwargs=True)
    cpu = torch.device("cpu")
    articles, queries, views = plm_stores(inputs, plm, 1, 2, 5, cpu)
    assert sorted(seen) == sorted(inputs.articles + inputs.questions)  # each article and question once
    assert articles.cache.states.dtype == CACHE_DTYPE == torch.float32 and views.cache is None
    trains = {k for k, p in plm.named_parameters() if p.requires_grad}
    assert trains == {k for k in before if k.startswith(("encoder.layer.1.", "encoder.layer.2."))}
    seen.clear()
    sizes = {"k": 6, "hidden": 8, "batch_size": 8, "eval_batch_size": 8}
    config = _config("mvcl", sizes, {"epochs": 1})
    assert config.plm_layers == 2 and config.lambda_ele > 0
    train_lists, dev_lists = _lists6(range(100, 112)), _lists6(range(112, 116))
    model, report = train(config, articles, queries, views, train_lists, dev_lists, cpu, seed=13, plm=plm)
    assert report["steps"] == 2 and report["plm_grad_norm_first_step"] > 0
    assert seen and all(row in inputs.views for row in seen)  # in training and dev scoring: the views alone
    changed = {k for k, v in plm.state_dict().items() if not torch.equal(v, before[k])}
    assert "encoder.layer.2.attention.self.query.weight" in changed and "encoder.layer.1.output.dense.weight" in changed
    assert not {k for k in changed if not k.startswith(("encoder.layer.1.", "encoder.layer.2."))}
    # the element view's states: the frozen blocks, then the top ones with gradients into them
    plm.train()
    v, v_mask = views.batch([0, 3], cpu)
    v[v_mask].sum().backward()
    assert plm.encoder.layer[1].attention.self.query.weight.grad.abs().sum() > 0
    assert plm.encoder.layer[0].attention.self.query.weight.grad is None
    plm.zero_grad()
    # dev scoring (eval mode): the cached states through the trained top blocks = the whole PLM's forward
    whole = [
        PLMTokens(i, s, plm, 1)
        for i, s in ((inputs.article_ids, inputs.articles), (inputs.question_ids, inputs.questions))
    ]
    plm.eval()
    with torch.no_grad():
        for cached, full in zip((articles, queries), whole):
            keys = sorted(cached.sequences)
            (got, mask), (ref, _) = cached.batch(keys, cpu), full.batch(keys, cpu)
            torch.testing.assert_close(got[mask], ref[mask], rtol=0, atol=1e-5)
    stores = [s.encode_store(s.sequences, 8, cpu, contextlib.nullcontext) for s in (articles, queries, *whole)]
    for qid, row in zip(range(112, 116), _lists6(range(112, 116)).ids):
        cands = row.tolist()
        got = Tournament(model, stores[0], cpu).scores(stores[1].get(qid), cands)
        ref = Tournament(model, stores[2], cpu).scores(stores[3].get(qid), cands)
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)


def test_plm_layers_beyond_the_plms_blocks_names_the_key(tiny_model_dir):
    import polars as pl

    from lexgraph.methods.rerank.features import StoreSource
    from lexgraph.methods.rerank.stage import _plm_inputs

    articles = pl.DataFrame({"id": [1], "article": ["la loi du bail."]})
    questions = pl.DataFrame({"id": [7], "question": ["le bail ?"], "article_ids": [[1]], "split": ["train"]})
    config = _config("mvcl", {"del_token": "[MASK]"}, {"max_query_length": 16, "max_article_length": 16})
    with pytest.raises(ConfigError, match=r"'rerank\.mvcl\.plm_layers' = 2, expected null or an integer in \[1, 1\]"):
        _plm_inputs(StoreSource(articles, questions, config, Path(tiny_model_dir), 13), torch.device("cpu"))


@pytest.fixture(scope="module")
def deep_model_dir(tiny_model_dir, tmp_path_factory):
    """tiny_model_dir's tokenizer with a three-block BERT (what plm_layers: 2 needs below it)."""
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    directory = tmp_path_factory.mktemp("deep_bert")
    tokenizer = BertTokenizer.from_pretrained(tiny_model_dir)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=16,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    )
    torch.manual_seed(1)
    BertForMaskedLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.mark.parametrize("plm_layers, model_dir", [(None, "tiny_model_dir"), (2, "deep_model_dir")])
def test_the_finetuned_plm_is_saved_with_the_network_and_search_loads_it(
    plm_layers, model_dir, request, tmp_path, one_thread, monkeypatch
):
    """The rerank stage's path for mvcl (run_rerank): the PLM trains (every weight, or its top
    ``plm_layers`` blocks over cached states of the frozen ones), models/mvcl/plm holds it, and the
    search side scores with it (its article states encoded by the saved PLM's whole forward): the
    scores of a toy list are those of the model in memory at the end of training, scored as its dev
    pass scores (the stores of the training step, in eval mode)."""
    import contextlib
    import json

    import polars as pl

    from lexgraph.core.io import write_parquet
    from lexgraph.methods.rerank import stage as rerank_stage
    from lexgraph.methods.rerank import train as rerank
    from lexgraph.methods.rerank.stage import RerankPaths, run_rerank
    from lexgraph.methods.rerank.system import load_mvcl
    from lexgraph.models.backbone import load_backbone

    model_dir = Path(request.getfixturevalue(model_dir))
    words = ["loi", "contrat", "bail", "mariage", "enfant", "divorce"]
    articles = pl.DataFrame(
        {"id": list(range(12)), "article": [f"la {words[i % 6]} {words[(i + 1) % 6]} de l'article." for i in range(12)]}
    )
    questions = pl.DataFrame(
        {
            "id": list(range(100, 116)),
            "question": [f"le {words[q % 6]} ?" for q in range(16)],
            "article_ids": [[q % 12] for q in range(16)],
            "split": ["train"] * 12 + ["dev"] * 4,
        }
    )
    (tmp_path / "data/clean").mkdir(parents=True)
    write_parquet(articles, tmp_path / "data/clean/articles.parquet")
    write_parquet(questions, tmp_path / "data/clean/questions.parquet")
    config = _config(
        "mvcl",
        {
            "k": 6,
            "hidden": 8,
            "batch_size": 8,
            "eval_batch_size": 8,
            "encode_batch_size": 8,
            "del_token": "[MASK]",
            "first_stage": "bm25",
        },
        {"epochs": 1, "enabled": True, "max_query_length": 16, "max_article_length": 24, "plm_layers": plm_layers},
    )
    paths = RerankPaths(
        questions=tmp_path / "data/clean/questions.parquet",
        articles=tmp_path / "data/clean/articles.parquet",
        features=tmp_path / "data/rerank",
        pretrain=model_dir,
        workspace=tmp_path,
        out=tmp_path / "models/mvcl",
        metrics=tmp_path / "rerank_mvcl.json",
        plot=tmp_path / "rerank_mvcl_curve.csv",
    )

    class First(_First):
        def search(self, texts, k):
            index = {t: i for i, t in enumerate(questions["question"].to_list())}
            return super().search([f"q {index[t] % 12}" for t in texts], k)

    trained = {}
    fit = rerank.train

    def keep(config, articles, queries, views, *args, **kwargs):
        model, report = fit(config, articles, queries, views, *args, **kwargs)
        trained.update(model=model, articles=articles, queries=queries)
        return model, report

    monkeypatch.setattr(rerank_stage, "train", keep)
    run_rerank(paths, config, StageContext(seed=13, device="cpu"), First)
    report = json.loads(paths.metrics.read_text())
    assert report["plm_grad_norm_first_step"] > 0 and report["steps"] == 2
    curve = paths.plot.read_text().splitlines()  # the training curve: one row per epoch of the report's history
    assert curve[0].startswith("epoch,loss,dev_accuracy,dev_recall@10,") and "dev_map," in curve[0]
    assert len(curve) == 1 + len(report["history"])
    assert (paths.out / "plm" / "config.json").is_file() and (paths.out / "mvcl.json").is_file()
    assert trained["articles"].layers == plm_layers and (trained["articles"].cache is not None) == bool(plm_layers)
    retriever = load_mvcl(tmp_path, "cpu", load=lambda name, workspace, device, corpus=None: First())
    assert retriever.encoder.model.config.hidden_size == 16 and retriever.alpha is None
    assert retriever.model.ranking == "probability"
    ids, scores = retriever.search(["le bail ?", "le loi ?"], 8)
    assert ids.shape == (2, 8) and sorted(ids[0, :6].tolist()) == sorted(
        First().search(["le bail ?"], 6)[0][0].tolist()
    )
    # the saved model scores a list as the model in memory did: the same network, the same states
    cpu, model = torch.device("cpu"), trained["model"]
    torch.testing.assert_close(retriever.model.state_dict(), model.state_dict(), rtol=0, atol=0)
    q_store = trained["queries"].encode_store([102, 101], 8, cpu, contextlib.nullcontext)
    a_store = trained["articles"].encode_store(range(12), 8, cpu, contextlib.nullcontext)
    states = retriever.encoder.encode_queries(["le bail ?", "le contrat ?"], 16, 8, "left")
    for qid, saved_q, text in zip((102, 101), states, ("le bail ?", "le contrat ?")):
        cands = First().search([text], 6)[0][0].tolist()
        in_memory = Tournament(model, a_store, cpu).scores(q_store.get(qid), cands)
        saved = Tournament(retriever.model, retriever.articles, cpu).scores(saved_q, cands)
        np.testing.assert_allclose(saved, in_memory, rtol=0, atol=1e-6)
        expected = [cands[j] for j in np.lexsort((np.arange(6), -in_memory))]
        assert retriever.search([text], 6)[0][0].tolist() == expected
    if plm_layers:  # the blocks below the top 2, and the embeddings, are the base checkpoint's
        base, _ = load_backbone(model_dir)
        saved_plm = retriever.encoder.model.state_dict()
        for k, v in base.state_dict().items():
            assert torch.equal(saved_plm[k], v) == (not k.startswith(("encoder.layer.1.", "encoder.layer.2."))), k


# ---------------------------------------------------------------------------
# The params rule: shared keys + one mapping per re-ranker; what DVC tracks
# ---------------------------------------------------------------------------


def test_dvc_tracks_each_shared_key_and_the_variants_own_mapping():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    rerank = stages["rerank"]
    assert rerank["foreach"] == ["mvcl", "xrerank"] and set(VARIANTS) == set(rerank["foreach"])
    assert rerank["do"]["params"] == ["base", *(f"rerank.{k}" for k in RerankConfig.shared_keys()), "rerank.${item}"]
    assert stages["encode_rerank"]["params"] == ["base", *(f"rerank.{k}" for k in ENCODE_KEYS)]
    for profile in ("params.yaml", "profiles/paper.yaml"):
        section = _params(profile)["rerank"]
        assert set(section) == {*RerankConfig.shared_keys(), *VARIANTS}, profile


def test_a_key_the_variant_would_not_read_is_refused_not_ignored():
    with pytest.raises(ConfigError, match=r"'rerank\.mvcl\.align_temperature' is read only with alignment: cosine"):
        _config("mvcl", own={"align_temperature": 0.05})
    with pytest.raises(ConfigError, match=r"'rerank\.xrerank\.plm_lr' is read only with plm: finetune"):
        _config("xrerank", own={"plm_lr": 1e-5})
    with pytest.raises(ConfigError, match=r"'rerank\.xrerank\.plm_layers' is read only with plm: finetune") as err:
        _config("xrerank", own={"plm_layers": 2})
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"'rerank\.mvcl\.interpolation' is read only with fusion: true"):
        _config("mvcl", own={"interpolation": [0.5]})
    with pytest.raises(ConfigError, match=r"missing key 'rerank\.xrerank\.plm_lr'"):
        _config("xrerank", own={"plm": "finetune"})
    from lexgraph.methods.rerank.system import check_first_stage  # the rerank stage's check: names are the registry's

    with pytest.raises(
        ConfigError, match=r"'rerank\.first_stage' = 'xrerank', expected a retrieval system other than a re-ranker"
    ):
        check_first_stage(_config("mvcl", {"first_stage": "xrerank"}))


@pytest.mark.parametrize(
    "own, words",
    [
        (
            {"pooling": "tanh"},
            r"'rerank\.mvcl\.pooling' = 'tanh', expected eq6 with projection: false \(tanh pools the projected",
        ),
        (
            {"alignment": "projected"},
            r"'rerank\.mvcl\.alignment' = 'projected', expected scaled_dot or cosine with projection: false",
        ),
        (
            {"fusion": True, "interpolation": [1.0]},
            r"'rerank\.mvcl\.metric' = 'accuracy', expected one of recall@10, .* with fusion: true \(accuracy is",
        ),
        ({"pooling": "relu"}, r"'rerank\.mvcl\.pooling' = 'relu', expected eq6"),
        ({"truncation": "front"}, r"'rerank\.mvcl\.truncation' = 'front', expected left"),
        ({"epochs": 0}, r"'rerank\.mvcl\.epochs' = 0\.0, expected a positive number"),
        ({"metric": "f1"}, r"'rerank\.mvcl\.metric' = 'f1', expected one of recall@10, .*, accuracy"),
        ({"ranking": "borda"}, r"'rerank\.mvcl\.ranking' = 'borda', expected probability \(MVCL App\. B"),
        (
            {"plm_layers": 0},
            r"'rerank\.mvcl\.plm_layers' = 0, expected null \(every weight of the PLM trains\) or an integer >= 1",
        ),
    ],
)
def test_settings_that_exclude_each_other_are_one_line_naming_both(own, words):
    with pytest.raises(ConfigError, match=words) as err:
        _config("mvcl", own=own)
    assert "\n" not in str(err.value)
    # eq. 6 does not need the projection: with it, the pooling keeps its own weights
    assert isinstance(build_model(6, _config("mvcl", {"hidden": 4}, {"projection": True})).pool, Eq6Pooling)


def test_the_sample_keeps_xrerank_as_todays_recipe_and_mvcl_as_published():
    x = _config("xrerank")
    assert (
        x.enabled,
        x.plm,
        x.truncation,
        x.projection,
        x.alignment,
        x.align_temperature,
        x.pooling,
        x.match_features,
        x.warm_start,
        x.fusion,
        x.lr,
        x.weight_decay,
        x.epochs,
        x.metric,
        x.max_query_length,
        x.max_article_length,
        x.ranking,
        x.plm_layers,
    ) == (
        True,
        "frozen",
        "right",
        True,
        "cosine",
        0.05,
        "tanh",
        True,
        True,
        True,
        3e-4,
        0.01,
        5,
        "map",
        64,
        128,
        "margin",
        None,
    )
    for profile, enabled, layers in (("params.yaml", False, 2), ("profiles/paper.yaml", True, None)):
        m = _config("mvcl", profile=profile)
        assert (m.ranking, m.plm_layers) == ("probability", layers), profile
        assert (
            m.enabled,
            m.plm,
            m.plm_lr,
            m.truncation,
            m.projection,
            m.alignment,
            m.pooling,
            m.match_features,
            m.warm_start,
            m.fusion,
            m.lr,
            m.weight_decay,
            m.epochs,
            m.metric,
            m.max_query_length,
            m.max_article_length,
            m.batch_size,
            m.warmup_ratio,
            m.lambda_case,
            m.lambda_ele,
        ) == (
            enabled,
            "finetune",
            2e-5,
            "left",
            False,
            "scaled_dot",
            "eq6",
            False,
            False,
            False,
            2e-5,
            0.0,
            5.5,
            "accuracy",
            512,
            512,
            16,
            0.1,
            0.01,
            0.01,
        ), profile
    assert not _config("xrerank", profile="profiles/paper.yaml").enabled

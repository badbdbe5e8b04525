"""The re-rankers mvcl and xrerank: the three losses against hand computations (each view's
negatives counted), the interaction network's shapes, masking and attentions (MVCL's
h_a . h_b / sqrt(d), xrerank's cosine), the views' pooling, list fusion and the list
alone, the token store, tiny training runs (frozen states; a fine-tuned PLM) and the params
rule of the ``rerank`` section. The element indicator and view: tests/test_elements.py."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from helpers_config import sample_config
from lexgraph.losses.CaseViewLoss import CaseViewLoss
from lexgraph.losses.ElementViewLoss import ElementViewLoss
from lexgraph.losses.PairwiseTripleLoss import PairwiseTripleLoss
from lexgraph.methods.rerank.config import RerankConfig
from lexgraph.methods.rerank.features import TokenStore
from lexgraph.methods.rerank.model import InteractionModel, fuse_list
from lexgraph.methods.rerank.train import Lists, train

# ---------------------------------------------------------------------------
# Losses vs hand computations
# ---------------------------------------------------------------------------


def _ce(logits, target):
    """-log softmax(logits)[target], by hand."""
    return -(logits[target] - math.log(sum(math.exp(v) for v in logits)))


def _linear():
    lin = nn.Linear(2, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 2.0], [0.5, -1.0]]))
        lin.bias.copy_(torch.tensor([0.1, -0.2]))
    return lin


def test_pairwise_triple_loss_matches_hand_computation_with_and_without_swap():
    h_ab = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    h_ac = torch.tensor([[0.0, 1.0], [1.0, -0.5]])
    lin = _linear()

    def logits(d):  # W d + b by hand
        return [1.0 * d[0] + 2.0 * d[1] + 0.1, 0.5 * d[0] - 1.0 * d[1] - 0.2]

    diffs = [(1.0, -1.0), (-0.5, 1.0)]
    plain = sum(_ce(logits(d), 0) for d in diffs) / 2
    swapped = sum(_ce(logits((-d[0], -d[1])), 1) for d in diffs) / 2
    assert PairwiseTripleLoss(swap=False)(h_ab, h_ac, lin).item() == pytest.approx(plain, rel=1e-6)
    assert PairwiseTripleLoss(swap=True)(h_ab, h_ac, lin).item() == pytest.approx(0.5 * (plain + swapped), rel=1e-6)


def test_case_view_loss_matches_hand_computation_with_in_batch_negatives():
    a = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    b = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    c = torch.tensor([[0.0, 1.0], [3.0, 0.0]])
    t1 = 0.5
    r = 1 / math.sqrt(2)
    # candidates [b_1, b_2, c_1, c_2]; cos(a_i, .) by hand
    cos = [
        [r, 0.0, 0.0, 1.0],  # a_1 = (1, 0)
        [r, 1.0, 1.0, 0.0],
    ]  # a_2 = (0, 1)
    expected = (_ce([x / t1 for x in cos[0]], 0) + _ce([x / t1 for x in cos[1]], 1)) / 2
    assert CaseViewLoss(t1)(a, b, c).item() == pytest.approx(expected, rel=1e-6)
    # b_2 excluded from a_1's negatives (say, another gold article of question 1)
    exclude = torch.zeros(2, 4, dtype=torch.bool)
    exclude[0, 1] = True
    expected = (_ce([cos[0][k] / t1 for k in (0, 2, 3)], 0) + _ce([x / t1 for x in cos[1]], 1)) / 2
    assert CaseViewLoss(t1)(a, b, c, exclude).item() == pytest.approx(expected, rel=1e-6)


def _negatives(loss, temperature):
    """With cos(anchor, positive) = 1 and cos(anchor, negative) = 0 for every negative,
    ``loss = log(1 + n * exp(-1 / T))``: the number of negatives ``n`` it saw."""
    return (math.exp(loss) - 1) * math.exp(1 / temperature)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_case_view_loss_counts_2n_minus_1_in_batch_negatives(n):
    """a_i = b_i = e_i, c_i = e_{n+i}: a_i is orthogonal to every case but its own b_i, so
    the loss counts its negatives: its own c_i and the other triples' b_j and c_j."""
    eye = torch.eye(2 * n)
    a, b, c = eye[:n], eye[:n].clone(), eye[n:]
    assert _negatives(CaseViewLoss(0.5)(a, b, c).item(), 0.5) == pytest.approx(2 * n - 1, rel=1e-5)
    if n > 1:  # masking k false negatives of every row leaves 2n - 1 - k
        exclude = torch.zeros(n, 2 * n, dtype=torch.bool)
        exclude[:, 2 * n - 1] = True  # c_n for every row (row n - 1 loses its own c)
        exclude[0, 1] = True  # b_2 for row 0
        exclude[1, 1] = True  # row 1's own positive: never excluded
        loss = CaseViewLoss(0.5)(a, b, c, exclude)
        per_row = [2 * n - 1 - 2] + [2 * n - 1 - 1] * (n - 1)  # row 0: two masked; the others: one
        expected = sum(math.log(1 + k * math.exp(-2.0)) for k in per_row) / n
        assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_element_view_loss_matches_hand_computation_with_2n_minus_2_negatives():
    texts = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    views = torch.tensor([[2.0, 0.0], [1.0, 1.0], [0.0, -1.0]])
    t2 = 0.2
    r = 1 / math.sqrt(2)
    cos_v = [[1.0, r, 0.0], [0.0, r, -1.0], [r, 1.0, -r]]  # cos(t_i, t+_j) by hand
    cos_t = [[1.0, 0.0, r], [0.0, 1.0, r], [r, r, 1.0]]  # cos(t_i, t_j) by hand
    expected = 0.0
    for i in range(3):  # the positive t+_i, then t+_j and t_j for j != i
        logits = [cos_v[i][i]] + [cos_v[i][j] for j in range(3) if j != i] + [cos_t[i][j] for j in range(3) if j != i]
        assert len(logits) == 1 + 2 * 3 - 2
        expected += _ce([x / t2 for x in logits], 0) / 3
    assert ElementViewLoss(t2)(texts, views).item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("n", [2, 3, 6])
def test_element_view_loss_counts_2n_minus_2_negatives(n):
    """t_i = t+_i = e_i: t_i is orthogonal to every other text and view, and parallel to its
    own view and to itself; counting exp(1/T) once (the positive) and n_neg zeros shows that
    t_i itself is left out and the other n - 1 texts and n - 1 views are the negatives."""
    eye = torch.eye(n)
    assert _negatives(ElementViewLoss(0.25)(eye, eye.clone()).item(), 0.25) == pytest.approx(2 * n - 2, rel=1e-5)


def test_losses_refuse_bad_shapes_and_temperatures():
    with pytest.raises(ValueError):
        CaseViewLoss(0.0)
    with pytest.raises(ValueError):
        ElementViewLoss(-1.0)
    with pytest.raises(ValueError):
        PairwiseTripleLoss()(torch.zeros(2, 3), torch.zeros(3, 3), nn.Linear(3, 2))


# ---------------------------------------------------------------------------
# Interaction network
# ---------------------------------------------------------------------------


def test_interaction_shapes_and_padding_invariance():
    torch.manual_seed(0)
    model = InteractionModel(input_dim=12, hidden=8, dropout=0.0).eval()
    q, d = torch.randn(3, 5, 12), torch.randn(3, 7, 12)
    q_mask = torch.ones(3, 5, dtype=torch.bool)
    d_mask = torch.ones(3, 7, dtype=torch.bool)
    d_mask[1, 4:] = False
    h = model.match(q, q_mask, d, d_mask)
    assert h.shape == (3, 32) and model.match_dim == 32
    assert model.compare(h[:2], h[1:]).shape == (2, 2)
    assert model.pool(d, d_mask).shape == (3, 8)
    # row 1 alone, without its padding, gives the same matching vector
    alone = model.match(q[1:2], q_mask[1:2], d[1:2, :4], d_mask[1:2, :4])
    torch.testing.assert_close(alone, h[1:2], rtol=1e-5, atol=1e-5)
    # garbage in padded positions changes nothing
    d2 = d.clone()
    d2[1, 4:] = 100.0
    torch.testing.assert_close(model.match(q, q_mask, d2, d_mask), h, rtol=1e-5, atol=1e-5)


def test_tournament_scores_are_mean_margins_over_the_other_candidates():
    torch.manual_seed(1)
    model = InteractionModel(input_dim=4, hidden=4, dropout=0.0).eval()
    h = torch.randn(4, model.match_dim)
    with torch.no_grad():
        scores = model.tournament_scores(h)
        games = {(b, c): model.compare(h[b : b + 1], h[c : c + 1])[0] for b in range(4) for c in range(4)}
    for b in range(4):
        expected = sum(float(games[b, c][0] - games[b, c][1]) for c in range(4) if c != b) / 3
        assert float(scores[b]) == pytest.approx(expected, abs=1e-5)


# ---------------------------------------------------------------------------
# Fusion of a re-ranked list with its first stage
# ---------------------------------------------------------------------------


def test_fuse_list_reorders_the_head_and_keeps_the_tail_below():
    ids = np.array([10, 11, 12, 13, 14, -1])
    first = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.0])
    mvcl = np.array([0.0, 1.0, 3.0])  # the re-ranker's scores of the top-3
    out, scores = fuse_list(ids, first, mvcl, alpha=1.0, k=3)
    assert out.tolist() == [12, 11, 10, 13, 14, -1]
    assert np.all(np.diff(scores[:5]) <= 0)
    # alpha = 0 is the first stage itself
    assert fuse_list(ids, first, mvcl, alpha=0.0, k=3)[0].tolist() == ids.tolist()
    # alpha = 0.5: z(first) = [1.2247, 0, -1.2247], z(mvcl) = [-1.069, -0.267, 1.336]
    #   -> 10: 0.078, 11: -0.134, 12: 0.056
    assert fuse_list(ids, first, mvcl, alpha=0.5, k=3)[0].tolist() == [10, 12, 11, 13, 14, -1]


# ---------------------------------------------------------------------------
# Token store and a tiny training run
# ---------------------------------------------------------------------------


def test_token_store_round_trip_and_padding(tmp_path):
    states = [torch.arange(6, dtype=torch.float16).reshape(3, 2), torch.ones(1, 2, dtype=torch.float16)]
    store = TokenStore.from_list([7, 3], states, dim=2)
    store.save(tmp_path / "s.safetensors", {"a": "b"})
    back = TokenStore.load(tmp_path / "s.safetensors")
    x, mask = back.batch([3, 7], torch.device("cpu"))
    assert x.shape == (2, 3, 2) and mask.tolist() == [[True, False, False], [True, True, True]]
    assert x[1].tolist() == [[0, 1], [2, 3], [4, 5]] and x[0, 1:].abs().sum() == 0


def _toy(seed=0, n_articles=30, dim=16):
    """Articles whose token states carry their id's 'topic'; questions share their gold's."""
    g = torch.Generator().manual_seed(seed)
    topics = torch.randn(n_articles, dim, generator=g)
    arts = [(topics[i] + 0.3 * torch.randn(6, dim, generator=g)).half() for i in range(n_articles)]
    qs = [(topics[i % n_articles] + 0.3 * torch.randn(4, dim, generator=g)).half() for i in range(40)]
    articles = TokenStore.from_list(list(range(n_articles)), arts, dim)
    queries = TokenStore.from_list(list(range(100, 140)), qs, dim)
    views = TokenStore.from_list(list(range(n_articles)), [a[:3] for a in arts], dim)

    def lists(qids):
        ids = np.array([[(q - 100 + j) % n_articles for j in range(10)] for q in qids])[:, ::-1].copy()  # gold 9th
        return Lists(
            list(qids),
            {q: [(q - 100) % n_articles] for q in qids},
            ids,
            np.linspace(1, 0, 10)[None].repeat(len(qids), 0),
        )

    return articles, queries, views, lists(range(100, 130)), lists(range(130, 140))


def _toy_config(**changes):
    """The sample's xrerank settings, sized for :func:`_toy`, with ``changes``."""
    sizes = {"k": 10, "hidden": 8, "batch_size": 8, "negatives": 2, "lr": 1e-2, "dropout": 0.0}
    return sample_config(RerankConfig, "rerank", "xrerank", **{**sizes, **changes})


def test_tiny_training_learns_and_is_deterministic(one_thread):
    # the paper's plain network (no MaxSim warm start): whatever it ranks well, it learned
    config = _toy_config(epochs=6, alignment="projected", match_features=False, warm_start=False)
    args = _toy()
    model_a, report_a = train(config, *args, device=torch.device("cpu"), seed=13)
    model_b, report_b = train(config, *args, device=torch.device("cpu"), seed=13)
    for (k, a), b in zip(model_a.state_dict().items(), model_b.state_dict().values()):
        assert torch.equal(a, b), k
    assert report_a["history"] == report_b["history"]
    # the first stage ranks every gold 10th: the trained re-ranker lifts it
    assert report_a["dev_first_stage"]["map"] == pytest.approx(0.1)
    assert report_a["dev_mvcl_only"]["map"] > 0.5
    assert report_a["alpha"] in config.interpolation and set(report_a["history"][0]) >= {
        "train_triple",
        "train_case",
        "train_element",
        "dev_map",
    }


def test_alignment_features_match_a_hand_computation_and_ignore_padding():
    q = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [9.0, 9.0]]])  # (1, 3, 2): the last token is padding
    d = torch.tensor([[[1.0, 1.0], [2.0, 0.0], [0.0, -1.0]]])  # (1, 3, 2)
    q_mask, d_mask = torch.tensor([[True, True, False]]), torch.ones(1, 3, dtype=torch.bool)
    r = 1 / math.sqrt(2)
    # cosines: q0 -> (r, 1, 0), q1 -> (r, 0, -1)
    maxsim_q = (1 + r) / 2  # q0's best 1, q1's best r
    maxsim_d = (r + 1 + 0) / 3  # d0's best r, d1's 1, d2's 0
    mean_cos = r  # mean(q) = (.5, .5) without the padding, mean(d) = (1, 0)
    cos = nn.functional.normalize(q, dim=-1) @ nn.functional.normalize(d, dim=-1).transpose(1, 2)
    got = InteractionModel.alignment_features(q, q_mask, d, d_mask, cos)
    assert got[0].tolist() == pytest.approx([maxsim_q, maxsim_d, mean_cos], abs=1e-6)


@pytest.mark.parametrize("alignment", ["cosine", "projected", "scaled_dot"])
def test_plm_alignment_and_features_keep_shapes_and_padding_invariance(alignment):
    torch.manual_seed(0)
    model = InteractionModel(input_dim=12, hidden=8, dropout=0.0, alignment=alignment, features=True).eval()
    q, d = torch.randn(3, 5, 12), torch.randn(3, 7, 12)
    q_mask, d_mask = torch.ones(3, 5, dtype=torch.bool), torch.ones(3, 7, dtype=torch.bool)
    d_mask[1, 4:] = False
    h = model.match(q, q_mask, d, d_mask)
    assert h.shape == (3, 35) and model.match_dim == 35
    d2 = d.clone()
    d2[1, 4:] = 100.0
    torch.testing.assert_close(model.match(q, q_mask, d2, d_mask), h, rtol=1e-5, atol=1e-5)
    alone = model.match(q[1:2], q_mask[1:2], d[1:2, :4], d_mask[1:2, :4])
    torch.testing.assert_close(alone, h[1:2], rtol=1e-5, atol=1e-5)


def test_plm_alignment_attends_by_the_plm_cosine():
    """The aligned vector of a query token is the projected candidate tokens weighted by
    softmax(cos / temperature) of the PLM's states, whatever the projection."""
    torch.manual_seed(0)
    model = InteractionModel(input_dim=3, hidden=2, dropout=0.0, alignment="cosine", temperature=0.1).eval()
    q, d = torch.randn(1, 2, 3), torch.randn(1, 4, 3)
    ones_q, ones_d = torch.ones(1, 2, dtype=torch.bool), torch.ones(1, 4, dtype=torch.bool)
    captured = {}
    model.lstm.register_forward_hook(lambda mod, inp, out: captured.setdefault("x", []).append(inp[0]))
    model.match(q, ones_q, d, ones_d)
    from torch.nn.utils.rnn import pad_packed_sequence

    mq, _ = pad_packed_sequence(captured["x"][0], batch_first=True)  # (1, 2, 4 * hidden): [h; h~; h - h~; h * h~]
    hd = model.proj(d)[0]  # (4, 2)
    cos = torch.stack(
        [torch.stack([nn.functional.cosine_similarity(q[0, i], d[0, j], dim=0) for j in range(4)]) for i in range(2)]
    )  # (2, 4)
    expected = torch.softmax(cos / 0.1, dim=1) @ hd  # (2, 2)
    torch.testing.assert_close(mq[0, :, 2:4], expected, rtol=1e-5, atol=1e-5)


def test_projected_alignment_is_a_scaled_dot_product():
    """``alignment: projected``: the aligned vector of a query token is the projected candidate
    tokens weighted by softmax(h_q . h_d / sqrt(hidden)), computed here by hand, entry by entry."""
    torch.manual_seed(0)
    hidden = 4
    model = InteractionModel(input_dim=3, hidden=hidden, dropout=0.0, alignment="projected").eval()
    q, d = torch.randn(1, 2, 3), torch.randn(1, 3, 3)
    ones_q, ones_d = torch.ones(1, 2, dtype=torch.bool), torch.ones(1, 3, dtype=torch.bool)
    captured = {}
    model.lstm.register_forward_hook(lambda mod, inp, out: captured.setdefault("x", []).append(inp[0]))
    model.match(q, ones_q, d, ones_d)
    from torch.nn.utils.rnn import pad_packed_sequence

    mq, _ = pad_packed_sequence(captured["x"][0], batch_first=True)  # (1, 2, 4 * hidden)
    W, b = model.proj.weight.detach().tolist(), model.proj.bias.detach().tolist()

    def proj(x):  # W x + b by hand
        return [sum(W[o][i] * x[i] for i in range(3)) + b[o] for o in range(hidden)]

    hq = [proj(q[0, i].tolist()) for i in range(2)]
    hd = [proj(d[0, j].tolist()) for j in range(3)]
    for i in range(2):
        e = [sum(x * y for x, y in zip(hq[i], hd[j])) / math.sqrt(hidden) for j in range(3)]
        w = [math.exp(x) / sum(math.exp(y) for y in e) for x in e]
        aligned = [sum(w[j] * hd[j][o] for j in range(3)) for o in range(hidden)]
        assert mq[0, i, hidden : 2 * hidden].tolist() == pytest.approx(aligned, abs=1e-5)
        unscaled = [math.exp(x * 2) / sum(math.exp(y * 2) for y in e) for x in e]  # without 1/sqrt(4) = 1/2
        assert max(abs(x - y) for x, y in zip(w, unscaled)) > 1e-3  # the scaling shows


def test_case_view_negatives_leave_out_the_questions_gold_articles():
    """In a batch, an article of another triple that is gold for the question is no negative:
    question 100 has golds 0 and 1 and appears twice; question 101 has gold 2."""
    from lexgraph.methods.rerank.train import RerankTrainer

    articles, queries, views, _, dev = _toy()
    train = Lists([100, 101], {100: [0, 1], 101: [2]}, np.array([[0, 1, 5, 6], [2, 0, 7, 8]]), np.ones((2, 4)))
    trainer = RerankTrainer(
        InteractionModel(16, 4),
        sample_config(RerankConfig, "rerank", "xrerank", k=4),
        articles,
        queries,
        views,
        train,
        dev,
        torch.device("cpu"),
        seed=0,
    )
    qids, golds, negs = (100, 100, 101), (0, 1, 2), (5, 0, 7)  # columns: b = 0, 1, 2; c = 5, 0, 7
    exclude = trainer.case_exclusions(qids, golds, negs)
    assert exclude.tolist() == [
        [True, True, False, False, True, False],
        [True, True, False, False, True, False],
        [False, False, True, False, False, False],
    ]
    # the loss keeps each row's own positive: row 0 has 6 - 3 = 3 negatives (b_3, c_1, c_3)
    eye = torch.eye(6)
    a, b, c = eye[[0, 1, 2]], eye[[0, 1, 2]], eye[[3, 4, 5]]
    loss = CaseViewLoss(0.5)(a, b, c, exclude).item()
    expected = (2 * math.log(1 + 3 * math.exp(-2.0)) + math.log(1 + 5 * math.exp(-2.0))) / 3
    assert loss == pytest.approx(expected, rel=1e-5)


def test_warm_start_ranks_by_maxsim_before_training():
    """Untrained, with the warm start: margin(b, c) = (maxsim_b - maxsim_c) / temperature, so a
    candidate's tournament score is (maxsim_b - mean of the others' maxsim) / temperature."""
    torch.manual_seed(3)
    model = InteractionModel(
        input_dim=8, hidden=4, dropout=0.0, alignment="cosine", temperature=0.05, features=True, warm_start=True
    ).eval()
    q = torch.randn(1, 5, 8).expand(6, -1, -1)
    d = torch.randn(6, 7, 8)
    q_mask, d_mask = torch.ones(6, 5, dtype=torch.bool), torch.ones(6, 7, dtype=torch.bool)
    with torch.no_grad():
        h = model.match(q, q_mask, d, d_mask)
        scores = model.tournament_scores(h)
    cos = nn.functional.normalize(q, dim=-1) @ nn.functional.normalize(d, dim=-1).transpose(1, 2)
    maxsim = cos.max(2).values.mean(1)  # (6,)
    expected = (maxsim - (maxsim.sum() - maxsim) / 5) / 0.05
    torch.testing.assert_close(scores, expected, rtol=1e-4, atol=1e-4)
    assert torch.argsort(scores, descending=True).tolist() == torch.argsort(maxsim, descending=True).tolist()


def test_weights_that_do_not_fit_the_settings_name_the_file(tmp_path):
    """A models/mvcl trained with another network shape (here: before the alignment features)
    gets one line naming the weights file and the command that rebuilds them."""
    from lexgraph.core.errors import DataError
    from lexgraph.methods.rerank.io import build_model, load_model, save_model

    old = sample_config(
        RerankConfig,
        "rerank",
        "xrerank",
        hidden=4,
        alignment="projected",
        align_temperature=None,  # what the stage saves without the cosine alignment
        match_features=False,
        warm_start=False,
    )
    save_model(build_model(6, old), old, {"alpha": 0.5, "epoch": 1}, tmp_path / "models/mvcl")
    assert load_model(tmp_path / "models/mvcl", torch.device("cpu"))[0].match_dim == 16
    settings = json.loads((tmp_path / "models/mvcl/mvcl.json").read_text())
    settings["config"]["match_features"] = True
    (tmp_path / "models/mvcl/mvcl.json").write_text(json.dumps(settings))
    with pytest.raises(DataError, match=r"mvcl\.safetensors: weights that do not fit .*dvc repro rerank@mvcl"):
        load_model(tmp_path / "models/mvcl", torch.device("cpu"))


def test_switched_off_rerank_leaves_a_placeholder_that_loading_names(tmp_path):
    from lexgraph.core.errors import LexgraphError
    from lexgraph.methods.rerank.features import write_disabled
    from lexgraph.methods.rerank.io import load_model
    from lexgraph.methods.rerank.system import first_stage_of, is_switched_off

    assert not is_switched_off(tmp_path, "mvcl")
    write_disabled(tmp_path / "models/mvcl", "mvcl")
    assert is_switched_off(tmp_path, "mvcl") and first_stage_of(tmp_path, "mvcl") is None
    assert not is_switched_off(tmp_path, "xrerank")
    with pytest.raises(LexgraphError, match=r"rerank\.mvcl\.enabled: false.*dvc exp run -S rerank\.mvcl\.enabled=true"):
        load_model(tmp_path / "models/mvcl", torch.device("cpu"))


def test_the_views_pooling_shares_the_interaction_projection():
    """With the PLM frozen, the case and element losses can only change the ranking through
    weights the interaction uses: their gradient must reach its projection."""
    torch.manual_seed(0)
    model = InteractionModel(input_dim=6, hidden=4, dropout=0.0)
    x, mask = torch.randn(3, 5, 6), torch.ones(3, 5, dtype=torch.bool)
    loss = CaseViewLoss(0.1)(model.pool(x, mask), model.pool(x.flip(0), mask), model.pool(x.roll(1, 0), mask))
    loss.backward()
    assert model.proj.weight.grad is not None and model.proj.weight.grad.abs().sum() > 0
    assert model.lstm.weight_ih_l0.grad is None  # the views do not touch the rest
    names = [n for n, _ in model.named_parameters()]
    assert len(names) == len(set(id(p) for p in model.parameters()))  # no parameter counted twice


def _fused_config():
    """A warm-started toy re-ranker fused with its first stage, over a grid without alpha = 1."""
    return _toy_config(epochs=4, interpolation=[0.0, 0.3, 0.6])


def test_epoch_and_alpha_are_chosen_together_by_the_fused_dev_metric(one_thread):
    # a grid without alpha = 1: the re-ranker alone is not a system that can be kept, so
    # selecting the epoch by it would differ from selecting by what `mvcl` returns
    config = _fused_config()
    model, report = train(config, *_toy(), device=torch.device("cpu"), seed=13)
    history = report["history"]
    assert [h["epoch"] for h in history] == [0, 1, 2, 3, 4]  # warm start: epoch 0 is a candidate
    fused = [h["dev_map"] for h in history]
    best = max(fused)
    assert report["epoch"] == history[fused.index(best)]["epoch"]  # the earliest best epoch
    kept = history[fused.index(best)]
    assert report["alpha"] == kept["alpha"] and report["dev"]["map"] == pytest.approx(best, abs=1e-4)
    # the kept alpha is the best of the grid for the kept weights, recomputed after training
    assert report["dev_by_alpha"][str(report["alpha"])] == max(report["dev_by_alpha"].values())
    # the history also records the re-ranker alone, which is not what selects
    assert all("dev_map_alone" in h for h in history)
    assert any(abs(h["dev_map_alone"] - h["dev_map"]) > 1e-3 for h in history)


def test_a_killed_rerank_training_resumes_to_the_same_model_and_report(one_thread, tmp_path, monkeypatch, caplog):
    """Issue 28: the re-ranker's epochs and alphas so far (its task state) come back with the
    weights, so the resumed run's report (history, kept epoch and alpha) is the uninterrupted one's."""
    import logging

    from lexgraph.methods.rerank.train import RerankTrainer
    from lexgraph.training.resume import resumable

    config, cpu = _fused_config(), torch.device("cpu")
    model, report = train(config, *_toy(), device=cpu, seed=13)
    batches = RerankTrainer.batches

    def killed_at_the_third(self, epoch):
        if epoch == 3:
            raise KeyboardInterrupt("killed")
        yield from batches(self, epoch)

    monkeypatch.setattr(RerankTrainer, "batches", killed_at_the_third)
    with pytest.raises(KeyboardInterrupt), resumable(tmp_path / "xrerank", {}, {}) as resume:
        train(config, *_toy(), device=cpu, seed=13, resume=resume)
    monkeypatch.setattr(RerankTrainer, "batches", batches)
    caplog.set_level(logging.INFO, logger="lexgraph")
    with resumable(tmp_path / "xrerank", {}, {}) as resume:
        resumed, resumed_report = train(config, *_toy(), device=cpu, seed=13, resume=resume)
    assert "xrerank: resumed after epoch 2 of 4" in caplog.text
    assert repr(resumed_report) == repr(report)  # history, kept epoch and alpha, dev metrics
    for (k, a), b in zip(model.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), k

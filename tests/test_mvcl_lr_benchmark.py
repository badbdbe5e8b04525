"""benchmarks/mvcl_lr.py: its run spec, the train subset of the first stage's lists and the
weight shift, checked by hand on toy values."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from conftest import load_benchmark
from lexgraph.methods.rerank.train import Lists

probe = load_benchmark("mvcl_lr")


def test_a_run_is_lr_colon_epochs_and_nonsense_is_refused():
    assert probe.parse_run("2e-5:5") == (2e-5, 5)
    for bad in ("2e-5", "x:5", "0:5", "1e-3:0"):
        with pytest.raises(argparse.ArgumentTypeError, match="LR:EPOCHS|learning rate"):
            probe.parse_run(bad)


def test_train_subset_keeps_a_seeded_share_of_the_questions_with_their_rows():
    ids = np.arange(12).reshape(4, 3)  # (4 questions, depth 3): row r = 3r .. 3r + 2
    lists = Lists([10, 11, 12, 13], {10: [0], 11: [3], 12: [6], 13: [9]}, ids, -ids.astype(float))
    half = probe.train_subset(lists, 0.5, seed=13)
    assert len(half.qids) == 2 and half.qids == sorted(half.qids, key=lists.qids.index)  # original order
    for q, row, scores in zip(half.qids, half.ids, half.scores):
        r = lists.qids.index(q)  # each question keeps its own list and golds
        assert row.tolist() == ids[r].tolist() and scores.tolist() == (-ids[r]).tolist()
        assert half.qrels[q] == lists.qrels[q]
    assert set(half.qrels) == set(half.qids)
    assert probe.train_subset(lists, 0.5, seed=13).qids == half.qids  # deterministic per seed
    assert len(probe.train_subset(lists, 0.01, seed=13).qids) == 1  # at least one
    assert probe.train_subset(lists, 1.0, seed=13).qids == lists.qids


def test_relative_shift_is_the_norm_of_the_change_over_the_norm_of_the_start():
    model = torch.nn.Linear(2, 1, bias=True)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[3.0, 0.0]]))
        model.bias.copy_(torch.tensor([4.0]))
    start = {k: v.clone() for k, v in model.state_dict().items()}  # ||W0|| = 5
    with torch.no_grad():
        model.weight.add_(torch.tensor([[0.0, 1.0]]))  # moved by (0, 1, 0): ||dW|| = 1
    assert probe.relative_shift(start, model) == pytest.approx(0.2)


@pytest.mark.parametrize("name", ["mvcl_lr", "gdsr_pairs"])
def test_a_missing_table_is_one_line_not_a_traceback(name, tmp_path, capsys):
    """Run as ``python benchmarks/<name>.py`` runs it, in this process (tests/helpers_scripts.py:
    its ``__main__`` block; a traceback fails the test): a fresh interpreter spent 5 to 12 s
    importing torch and the graph libraries before the one line."""
    from conftest import ROOT
    from helpers_scripts import run_script

    params = tmp_path / "params.yaml"
    params.write_text((ROOT / "params.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    script = ROOT / "benchmarks" / f"{name}.py"
    returncode = run_script(script, "--workspace", tmp_path, "--params", params, cwd=tmp_path)
    stderr = capsys.readouterr().err
    lines = stderr.strip().splitlines()
    assert returncode == 2 and "Traceback" not in stderr
    assert lines[-1].startswith(f"{name}.py: error: ") and "file not found" in lines[-1] and str(tmp_path) in lines[-1]


def test_merged_results_replace_a_rerun_and_keep_the_rest(tmp_path):
    import json

    path = tmp_path / "r.json"
    run = {"scored": "dev", "fraction": 1.0, "lr": 2e-5, "epochs": 5, "map": [0.1]}
    other = {**run, "lr": 1e-3, "map": [0.2]}
    assert probe.merged(path, {"runs": [run]}) == {"runs": [run]}  # nothing there yet
    path.write_text(json.dumps({"dev_map_first_stage": 0.3, "runs": [run, other]}), encoding="utf-8")
    again = {**run, "map": [0.15]}
    train = {**run, "scored": "train", "train_map_first_stage": 0.8}
    out = probe.merged(path, {"train_map_first_stage": 0.8, "runs": [again, train]})
    assert out["dev_map_first_stage"] == 0.3 and out["train_map_first_stage"] == 0.8
    assert out["runs"] == [again, other, train]  # the rerun replaced, sorted by split, fraction, lr, epochs

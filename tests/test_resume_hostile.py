"""Checkpoints are not trusted blindly (issue 40, item 4; item 8's NaN and `dvc exp run --temp`
parts): a damaged checkpoint (a flipped bit, 0xFF bytes, truncated, empty, without its digest,
with nan weights, saved over other frozen weights) is discarded with one log line naming it and
the run starts afresh; a full disk during a checkpoint write is one line naming the file and
leaves the last good checkpoint to resume from; a symbolic link for the resume folder (or its
parent) works through; a checkpoint holds what trains, not the frozen weights; weights that are
not finite before the first step are never blamed on a setting; the checkpoints of a run in
DVC's temporary experiment copy live outside it, keyed by the fingerprint, so the same
experiment run again resumes. The toy task and the bit-identity reference: tests/test_resume.py."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers_resume import EPOCHS, Killed, Task, run, state
from lexgraph.core.errors import DataError, LexgraphError
from lexgraph.training import resume as resume_module
from lexgraph.training.engine import FitConfig, ParamGroup, Runtime, build_optimizer, build_scheduler, fit
from lexgraph.training.resume import checkpoint_dir, resumable

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def reference():
    task = Task()
    result = run(task)
    return state(task), result


def same(task: Task, expected: dict[str, torch.Tensor]) -> bool:
    got = state(task)
    return got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)


def killed_at(out: Path, epoch: int = 3, settings=None) -> Path:
    """A run of the toy task killed at the start of ``epoch``; its resume folder."""
    with pytest.raises(Killed), resumable(out, settings or {}, {}) as resume:
        run(Task(kill_at=epoch), resume.next_fit())
    return resume.directory


def rerun(out: Path, caplog, settings=None) -> Task:
    caplog.clear()
    caplog.set_level(logging.INFO, logger="lexgraph")
    with resumable(out, settings or {}, {}) as resume:
        task = Task()
        run(task, resume.next_fit())
    return task


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def flip_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def ones(path: Path) -> None:  # 64 bytes of 0xFF in the middle
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def empty(path: Path) -> None:
    path.write_bytes(b"")


def weights_at(path: Path, where: int) -> None:
    """Overwrite 64 bytes inside the first weight tensor stored in the checkpoint (zip member
    ``data/0``) with 0xFF: nan weights, the rest of the file intact."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("/data/0"))
    with open(path, "r+b") as fh:
        fh.seek(info.header_offset + 26)
        name_length, extra_length = (int.from_bytes(fh.read(2), "little") for _ in range(2))
        fh.seek(info.header_offset + 30 + name_length + extra_length + where)
        fh.write(b"\xff" * min(64, info.file_size - where))


DAMAGE = {
    "a flipped bit": flip_bit,
    "64 bytes of 0xFF": ones,
    "64 bytes of 0xFF in the weights": lambda p: weights_at(p, 0),
    "truncated": truncate,
    "empty": empty,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("which", ["fit-1.pt", "fit-1.rank-0.epoch-2.pt"])
def test_a_damaged_checkpoint_is_discarded_in_one_line_and_the_run_starts_afresh(
    tmp_path, reference, caplog, damage, which
):
    expected, _ = reference
    out = tmp_path / "model"
    folder = killed_at(out)
    DAMAGE[damage](folder / which)
    task = rerun(out, caplog)
    (line,) = warnings(caplog)
    assert line.startswith(f"resume: {folder / which} ") and "this training starts afresh" in line, line
    assert "\n" not in line and "resumed" not in caplog.text
    assert task.evaluated == EPOCHS + 1 and same(task, expected)  # never a nan step: the whole fresh run
    assert not folder.exists()


def test_a_checkpoint_whose_digest_was_not_recorded_is_not_trusted(tmp_path, reference, caplog):
    """A kill after the file's rename and before its digest was written (simulated: the digest
    removed from fingerprint.json)."""
    expected, _ = reference
    out = tmp_path / "model"
    folder = killed_at(out)
    record = json.loads((folder / "fingerprint.json").read_text())
    del record["sha256"]["fit-1.pt"]
    (folder / "fingerprint.json").write_text(json.dumps(record))
    task = rerun(out, caplog)
    (line,) = warnings(caplog)
    assert f"{folder / 'fit-1.pt'} has no SHA-256 recorded" in line and "starts afresh" in line
    assert same(task, expected)


def test_nan_weights_never_reach_training(tmp_path, reference, caplog):
    """A checkpoint whose bytes match its recorded digest but whose weights are nan (saved so,
    or rewritten along with its digest) is discarded after loading, never trained from."""
    from lexgraph.core.provenance import digest_path

    expected, _ = reference
    out = tmp_path / "model"
    folder = killed_at(out)
    common = torch.load(folder / "fit-1.pt", weights_only=False)
    next(iter(common["modules"][0].values())).fill_(float("nan"))
    torch.save(common, folder / "fit-1.pt")
    record = json.loads((folder / "fingerprint.json").read_text())
    record.setdefault("sha256", {})["fit-1.pt"] = [digest_path(folder / "fit-1.pt")]
    (folder / "fingerprint.json").write_text(json.dumps(record))
    task = rerun(out, caplog)
    (line,) = warnings(caplog)
    assert line.startswith(f"resume: {folder / 'fit-1.pt'} holds nan or infinite weights ('0.weight')"), line
    assert same(task, expected)


def test_checkpoints_of_an_older_lexgraph_are_not_resumed_from(tmp_path, reference, caplog):
    """A folder of the earlier layout (whole weights, no digests: fingerprint.json without its
    format) with the same fingerprint: it starts afresh, saying why."""
    expected, _ = reference
    out = tmp_path / "model"
    folder = killed_at(out)
    record = json.loads((folder / "fingerprint.json").read_text())
    (folder / "fingerprint.json").write_text(json.dumps({"digest": record["digest"]}))
    task = rerun(out, caplog)
    assert f"the checkpoints in {folder} were written by an older lexgraph; starting afresh" in caplog.text
    assert "resumed" not in caplog.text and same(task, expected)


class NanStart(Task):
    def __init__(self) -> None:
        super().__init__()
        with torch.no_grad():
            self.model[0].bias[3] = float("nan")

    def nan_error(self, value, epoch, step):
        return LexgraphError(f"toy: the loss became {value}; lower 'toy.lr'")


def test_weights_nan_before_the_first_step_are_not_blamed_on_the_learning_rate():
    with pytest.raises(LexgraphError) as error:
        run(NanStart())
    message = str(error.value)
    assert message.startswith("toy: weight '0.bias' holds nan or infinite values before the first training step")
    assert "lr" not in message and "\n" not in message and "damaged" in message


class Fold(nn.Module):
    def forward(self, x):  # (batch, 4096) -> (batch, 4)
        return x.view(len(x), 4, -1).mean(-1)


class FrozenBody(Task):
    """The toy with a frozen body in front (4,096 x 4 weights and 4,096 biases that do not
    train) and a buffer that changes as it trains."""

    def __init__(self, seed: int = 0, kill_at: int | None = None, body_seed: int = 7) -> None:
        super().__init__(seed, kill_at)
        body = nn.Linear(4, 4096)
        with torch.no_grad():
            body.weight.copy_(torch.randn(4096, 4, generator=torch.Generator().manual_seed(body_seed)))
        body.requires_grad_(False)
        self.net = nn.Sequential(body, Fold(), self.model)
        self.net.register_buffer("calls", torch.zeros(()))

    def modules(self):
        return [self.net]

    def train(self):
        self.net.train()

    def step(self, batch):
        self.net.calls += 1
        return nn.functional.mse_loss(self.net(self.x[batch]), self.y[batch])


def run_frozen(task: FrozenBody, checkpoint=None):
    params = [p for p in task.net.parameters() if p.requires_grad]
    optimizer = build_optimizer([ParamGroup(params, 0.01, 0.01)], [task.net])
    scheduler = build_scheduler(optimizer, "linear", 2, 4 * EPOCHS)
    config = FitConfig("toy", EPOCHS, 4, selection_metric="neg_loss", select_epoch_zero=True)
    return fit(task, optimizer, scheduler, config, Runtime("cpu"), checkpoint)


def test_a_checkpoint_holds_what_trains_not_the_frozen_weights(tmp_path, caplog):
    whole = FrozenBody()
    run_frozen(whole)
    out = tmp_path / "model"
    with pytest.raises(Killed), resumable(out, {}, {}) as resume:
        run_frozen(FrozenBody(kill_at=3), resume.next_fit())
    common = torch.load(resume.directory / "fit-1.pt", weights_only=False)
    frozen_bytes = (4096 * 4 + 4096) * 4
    assert {"0.weight", "0.bias"}.isdisjoint(common["modules"][0]) and "calls" in common["modules"][0]
    assert (resume.directory / "fit-1.pt").stat().st_size < frozen_bytes
    assert len(common["optimizer"]["state"]) == len([p for p in whole.net.parameters() if p.requires_grad])
    caplog.set_level(logging.INFO, logger="lexgraph")
    with resumable(out, {}, {}) as resume:
        task = FrozenBody()
        run_frozen(task, resume.next_fit())
    assert "toy: resumed after epoch 2 of 4" in caplog.text
    for key, value in whole.net.state_dict().items():
        assert torch.equal(task.net.state_dict()[key], value), key


def test_a_checkpoint_saved_over_other_frozen_weights_is_discarded(tmp_path, caplog):
    out = tmp_path / "model"
    with pytest.raises(Killed), resumable(out, {}, {}) as resume:
        run_frozen(FrozenBody(kill_at=3), resume.next_fit())
    caplog.set_level(logging.INFO, logger="lexgraph")
    with resumable(out, {}, {}) as resume:
        task = FrozenBody(body_seed=8)  # the fingerprint missed a change in what the frozen part is built from
        run_frozen(task, resume.next_fit())
    (line,) = warnings(caplog)
    assert "fit-1.pt was saved over other frozen weights" in line and "starts afresh" in line
    assert "resumed" not in caplog.text and task.evaluated == EPOCHS + 1


# --- a full disk ---------------------------------------------------------------------------------


def test_a_full_disk_during_a_checkpoint_write_is_one_line_and_the_last_good_one_resumes(
    tmp_path, reference, caplog, monkeypatch
):
    expected, _ = reference
    out = tmp_path / "model"
    real_open = open
    failing = {"on": False}

    class Full:
        def __init__(self, fh):
            self.fh, self.written = fh, 0

        def write(self, data):
            self.written += len(data)
            if self.written > 512:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.fh.write(data)

        def __getattr__(self, name):
            return getattr(self.fh, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

    def full_open(file, mode="r", *args, **kwargs):
        fh = real_open(file, mode, *args, **kwargs)
        return Full(fh) if failing["on"] and "w" in mode and "fit-1.pt" in os.fspath(file) else fh

    from lexgraph.training import checkpoint as checkpoint_files  # where checkpoint files are written

    monkeypatch.setattr(checkpoint_files, "open", full_open, raising=False)

    class FullAt3(Task):
        def batches(self, epoch):
            failing["on"] = epoch == 3  # the disk fills during epoch 3's checkpoint
            return super().batches(epoch)

    with pytest.raises(DataError) as error, resumable(out, {}, {}) as resume:
        run(FullAt3(), resume.next_fit())
    failing["on"] = False
    message = str(error.value)
    assert message.startswith(f"{resume.directory / 'fit-1.pt'}: not written, no space left on device; free space")
    assert "\n" not in message
    assert not [p for p in resume.directory.iterdir() if p.name.endswith(".tmp")]  # nothing half-written left
    task = rerun(out, caplog)
    assert "toy: resumed after epoch 2 of 4" in caplog.text  # the last good checkpoint
    assert same(task, expected)


FULL_DISK = """
import resource, signal, sys
from helpers_resume import Task, run
from lexgraph.core.errors import LexgraphError
from lexgraph.training.resume import resumable
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    with resumable(sys.argv[1], {}, {}) as resume:
        run(Task(), resume.next_fit())
except LexgraphError as exc:
    sys.exit(f"error: {exc}")
"""


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs RLIMIT_FSIZE")
def test_a_write_the_file_system_refuses_is_one_line_naming_the_checkpoint(tmp_path, reference, caplog):
    """A real refusal by the kernel (a file size limit: EFBIG, as ENOSPC or EDQUOT would be) in
    the middle of ``torch.save``: one line, nothing half-written, and the rerun's model is the
    uninterrupted one."""
    expected, _ = reference
    out = tmp_path / "model"
    import lexgraph

    source = Path(lexgraph.__file__).parents[1]  # the lexgraph this test runs on
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(source), str(ROOT / "tests")])}
    proc = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(out), "2048"], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines[0].startswith(f"error: {checkpoint_dir(out)}/fit-1.") and ": not written, file too large" in lines[0]
    assert not [p for p in checkpoint_dir(out).iterdir() if p.name.endswith(".tmp")]
    task = rerun(out, caplog)
    assert same(task, expected)


# --- symbolic links ------------------------------------------------------------------------------


@pytest.mark.parametrize("link", ["resume folder", "its parent", "resume folder to a missing folder"])
def test_a_symlinked_resume_folder_resumes_and_is_emptied_at_the_end(tmp_path, reference, caplog, link):
    expected, _ = reference
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    out = tmp_path / "models" / "model"
    if link == "its parent":
        (scratch / "models").mkdir()
        (tmp_path / "models").symlink_to(scratch / "models")
        target = scratch / "models" / ".model.resume"
    else:
        out.parent.mkdir()
        target = scratch / "model.resume"
        if link == "resume folder":
            target.mkdir()
            (target / "notes.txt").write_text("the user's")  # a link to a folder of other files too
        checkpoint_dir(out).symlink_to(target)
    killed_at(out)
    assert (target / "fit-1.pt").is_file()
    task = rerun(out, caplog)
    assert "toy: resumed after epoch 2 of 4" in caplog.text and same(task, expected)
    assert not warnings(caplog)
    if link == "its parent":
        assert not target.exists()
    else:  # the link and the folder it points to stay, emptied of the checkpoints
        assert checkpoint_dir(out).is_symlink() and target.is_dir()
        assert [p.name for p in target.iterdir()] == (["notes.txt"] if link == "resume folder" else [])
    task = rerun(out, caplog, settings={"lr": 0.01})  # and runs on through the link
    assert "resumed" not in caplog.text


def test_a_symlinked_resume_folder_of_another_run_is_emptied_through_the_link(tmp_path, reference, caplog):
    expected, _ = reference
    target = tmp_path / "scratch"
    target.mkdir()
    out = tmp_path / "model"
    checkpoint_dir(out).symlink_to(target)
    killed_at(out, settings={"lr": 1})
    task = rerun(out, caplog)
    assert "of a run with other settings or inputs; starting afresh" in caplog.text and same(task, expected)
    assert checkpoint_dir(out).is_symlink() and not list(target.iterdir())


@pytest.mark.parametrize("case", ["a broken parent", "a link loop", "a file"])
def test_a_resume_folder_that_cannot_be_made_is_one_line(tmp_path, case):
    out = tmp_path / "models" / "model"
    if case == "a broken parent":
        (tmp_path / "models").symlink_to(tmp_path / "gone")
    else:
        out.parent.mkdir()
        if case == "a link loop":
            checkpoint_dir(out).symlink_to(checkpoint_dir(out))
        else:
            checkpoint_dir(out).write_text("x")
    with pytest.raises(DataError) as error, resumable(out, {}, {}):
        pass
    message = str(error.value)
    assert message.startswith(str(checkpoint_dir(out))) and "\n" not in message
    if case == "a broken parent":
        assert f"{tmp_path / 'models'} is a broken symbolic link" in message


# --- `dvc exp run --temp` --------------------------------------------------------------------------


def temp_copy(main: Path, name: str, queued: bool = False) -> Path:
    """A workspace copy as DVC makes one for an experiment (``.dvc/tmp/exps/standalone/tmpXXXX``
    with ``--temp``, ``.dvc/tmp/exps/tmpXXXX`` from the queue)."""
    copy = main / ".dvc" / "tmp" / "exps" / ("" if queued else "standalone") / name
    (copy / ".dvc").mkdir(parents=True)
    return copy


def test_the_resume_folder_of_a_temporary_experiment_lies_outside_its_copy_keyed_by_the_fingerprint(tmp_path):
    main = tmp_path / "repo"
    (main / ".dvc").mkdir(parents=True)
    assert checkpoint_dir(main / "models" / "dsr", "ab" * 32) == main / "models" / ".dsr.resume"
    assert resume_module.experiment_copy(main / "models" / "dsr") is None
    for queued in (False, True):
        copy = temp_copy(main, f"tmp{int(queued)}", queued)
        assert resume_module.experiment_copy(copy / "models" / "dsr") == (copy, main / ".dvc" / "tmp")
        folder = checkpoint_dir(copy / "models" / "gnn_gdsr", "ab" * 32)
        assert folder == main / ".dvc" / "tmp" / "resume" / f"models--gnn_gdsr.{'ab' * 8}"
    other = temp_copy(main, "tmpother")
    assert checkpoint_dir(other / "models" / "gnn_gdsr", "ab" * 32) == folder  # the same experiment again
    assert checkpoint_dir(other / "models" / "gnn_gdsr", "cd" * 32) != folder  # other settings or inputs


def test_a_killed_temporary_experiment_resumes_when_run_again(tmp_path, reference, caplog, monkeypatch):
    """``dvc exp run --temp`` killed: its copy stays behind and the rerun gets a new one; the
    rerun resumes from the checkpoints kept outside the copies, and removes them at the end."""
    expected, _ = reference
    main = tmp_path / "repo"
    (main / ".dvc").mkdir(parents=True)
    first = temp_copy(main, "tmpaaaa")
    monkeypatch.chdir(first)  # DVC runs the stage in the copy, with the paths of dvc.yaml
    folder = killed_at(Path("models/model"), settings={"lr": 0.05})
    assert folder.parent == main / ".dvc" / "tmp" / "resume" and not (first / "models").exists()
    second = temp_copy(main, "tmpbbbb")
    monkeypatch.chdir(second)
    task = rerun(Path("models/model"), caplog, settings={"lr": 0.05})
    assert f"toy: resumed after epoch 2 of 4 from {folder / 'fit-1.pt'}" in caplog.text and same(task, expected)
    assert not folder.exists()


# --- several processes ---------------------------------------------------------------------------


@pytest.mark.slow
def test_two_processes_agree_to_start_afresh_when_one_process_state_is_damaged(tmp_path):
    """Under a 2-process launch, rank 1's own state of epoch 2 damaged: rank 0 alone finds its
    files whole, yet both start afresh together (one line names the file) and end with the
    weights of a run never killed."""
    import lexgraph

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(lexgraph.__file__).parents[1]), str(ROOT / "tests")]),
        "OMP_NUM_THREADS": "1",
    }

    def launch(out, *extra):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        cmd += [str(ROOT / "tests" / "engine_worker.py"), str(out), "--runs", "8:1", "--epochs", "4", *extra]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)

    whole = launch(tmp_path / "whole.json", "--resume", str(tmp_path / "w"), "--die-at", "99")
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = launch(tmp_path / "killed.json", "--resume", str(tmp_path / "k"), "--die-at", "3")
    assert killed.returncode != 0
    damaged = tmp_path / "k" / ".model.resume" / "fit-1.rank-1.epoch-2.pt"
    flip_bit(damaged)
    resumed = launch(tmp_path / "killed.json", "--resume", str(tmp_path / "k"), "--die-at", "99")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (
        resumed.stderr.count("this training starts afresh") == 1 and f"resume: {damaged} is damaged" in resumed.stderr
    )
    assert "resumed after" not in resumed.stderr
    (a,), (b,) = json.loads((tmp_path / "whole.json").read_text()), json.loads((tmp_path / "killed.json").read_text())
    assert a["weights"] == b["weights"] and a["step_losses"] == b["step_losses"]


def test_a_frozen_dsr_resumes_from_a_checkpoint_without_its_frozen_weights(
    tiny_model_dir, tmp_path, monkeypatch, caplog
):
    """train_dsr with `chunk_encoder: frozen` (the sample's): the checkpoint holds neither the
    frozen article backbone nor the query encoder's frozen layers, and the resumed model is the
    uninterrupted one, bit for bit."""
    from helpers_frozen_dsr import CORPUS, frozen_config, frozen_data
    from lexgraph.encoding.chunks import encode_chunk_table
    from lexgraph.methods.dsr import train as dsr
    from lexgraph.methods.dsr.config import build_dsr

    config = frozen_config(epochs=3)
    cpu = torch.device("cpu")

    def build():
        torch.manual_seed(0)
        return build_dsr(config, tiny_model_dir)

    model = build()
    table = encode_chunk_table(model.article_encoder, list(CORPUS), list(CORPUS.values()))
    dsr.train_dsr(model, frozen_data(table), config, cpu, seed=5)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    batches = dsr.DSRTask.batches

    def killed_at_3(self, epoch):
        if epoch == 3:
            raise Killed(epoch)
        yield from batches(self, epoch)

    monkeypatch.setattr(dsr.DSRTask, "batches", killed_at_3)
    out = tmp_path / "dsr"
    with pytest.raises(Killed), resumable(out, {}, {}) as resume:
        dsr.train_dsr(build(), frozen_data(table), config, cpu, seed=5, resume=resume)
    saved = torch.load(resume.directory / "fit-1.pt", weights_only=False)["modules"][0]
    frozen = {k for k, p in model.named_parameters() if not p.requires_grad}
    assert frozen and any(k.startswith("article_encoder.backbone.") for k in frozen) and frozen.isdisjoint(saved)
    monkeypatch.setattr(dsr.DSRTask, "batches", batches)
    caplog.set_level(logging.INFO, logger="lexgraph")
    with resumable(out, {}, {}) as resume:
        resumed = build()
        dsr.train_dsr(resumed, frozen_data(table), config, cpu, seed=5, resume=resume)
    assert "train_dsr: resumed after epoch 2 of 3" in caplog.text and not warnings(caplog)
    got = resumed.state_dict()
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)

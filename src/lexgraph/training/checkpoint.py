"""Checkpoint files of resumable training (:mod:`lexgraph.training.resume`): what one holds
and how it is trusted.

What trains (:func:`trained_state`): of a module, the parameters that require a gradient and
the buffers; the frozen parameters are left out and referenced by :func:`states_digest` (a
SHA-256 of every key, dtype, shape and byte), which a resumed run must start from too.

Each checkpoint file is written atomically through a hashing writer (:func:`save_hashed`:
the SHA-256 of the bytes written, and a failed write, disk full or quota, as one
:class:`~lexgraph.core.errors.DataError` naming the file rather than ``torch.save``'s
traceback); the resume folder's manifest (:data:`MANIFEST`, which also holds the run's
fingerprint) records the digests; :func:`verified_load` loads a file only when its bytes
match one of them, else raises :class:`Damaged` naming it and why.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lexgraph.core.errors import LexgraphError
from lexgraph.core.inputs import json_object
from lexgraph.core.io import atomic_path, write_json
from lexgraph.core.provenance import digest_path

#: the resume folder's manifest: the run's fingerprint and the SHA-256 of each checkpoint file
MANIFEST = "fingerprint.json"
#: the checkpoints' layout; a folder of another format is not resumed from
FORMAT = 2


# --- what trains ------------------------------------------------------------------------------


def trained_keys(module: nn.Module) -> set[str]:
    """The state keys of ``module`` that training may change: its parameters that require a
    gradient and its (persistent) buffers."""
    return {
        key
        for key, value in module.state_dict(keep_vars=True).items()
        if not isinstance(value, nn.Parameter) or value.requires_grad
    }


def trained_state(module: nn.Module, *, copy: bool = False) -> dict[str, torch.Tensor]:
    """``module``'s state without its frozen parameters (``copy``: detached copies on the CPU)."""
    keys = trained_keys(module)
    state = {key: value for key, value in module.state_dict().items() if key in keys}
    return {key: value.detach().to("cpu", copy=True) for key, value in state.items()} if copy else state


def frozen_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """``module``'s frozen parameters (what :func:`trained_state` leaves out)."""
    keys = trained_keys(module)
    return {key: value for key, value in module.state_dict().items() if key not in keys}


def load_trained_state(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a :func:`trained_state` into ``module`` (its frozen parameters stay as they are)."""
    expected = trained_keys(module)
    if set(state) != expected:
        raise ValueError(f"the weights of {type(module).__name__} differ: {sorted(set(state) ^ expected)[:3]}")
    module.load_state_dict(state, strict=False)


def states_digest(states: Sequence[dict[str, torch.Tensor]]) -> str:
    """SHA-256 of ``states`` (one state dict per module): every key, dtype, shape and byte."""
    digest = hashlib.sha256()
    for index, state in enumerate(states):
        for key in sorted(state):
            tensor = state[key].detach()
            digest.update(f"{index}:{key}:{tensor.dtype}:{tuple(tensor.shape)}:".encode())
            data = tensor.to("cpu").contiguous().reshape(-1)
            digest.update(data.view(torch.uint8).numpy() if data.numel() else b"")
    return digest.hexdigest()


def not_finite(states: Sequence[dict[str, torch.Tensor]]) -> str | None:
    """The first key of ``states`` holding a nan or an infinite value, or ``None``."""
    for state in states:
        for key, tensor in state.items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                return key
    return None


def check_weights(name: str, modules: Sequence[nn.Module]) -> None:
    """Refuse weights that hold a nan or an infinite value as a training starts: the model it
    starts from is damaged, which no setting (a learning rate) is to blame for."""
    key = not_finite([module.state_dict() for module in modules])
    if key is not None:
        raise LexgraphError(
            f"{name}: weight '{key}' holds nan or infinite values before the first training step: the model "
            "this training starts from is damaged (no setting is at fault); restore it (`dvc checkout`, or "
            "rerun the stage that writes it) and rerun"
        )


# --- files --------------------------------------------------------------------------------------


class _HashingFile:
    """A binary file that hashes what is written to it and keeps the :class:`OSError` of a
    failed write (``torch.save`` turns it into a ``RuntimeError`` without its errno)."""

    def __init__(self, fh) -> None:
        self.fh, self.sha256, self.error = fh, hashlib.sha256(), None

    def write(self, data) -> int:
        try:
            written = self.fh.write(data)
        except OSError as exc:
            self.error = exc
            raise
        self.sha256.update(data)
        return written

    def flush(self) -> None:
        try:
            self.fh.flush()
        except OSError as exc:
            self.error = exc
            raise


def save_hashed(state: dict[str, Any], target: Path, before_rename=None) -> str:
    """Write ``state`` to ``target`` atomically and return the SHA-256 of its bytes;
    ``before_rename(digest)`` runs once the temporary is complete. A failed write (disk full,
    quota, ...) is a :class:`DataError` naming ``target`` (:func:`lexgraph.core.io.atomic_path`)."""
    with atomic_path(target) as tmp:
        with open(tmp, "wb") as fh:
            out = _HashingFile(fh)
            try:
                torch.save(state, out)
            except RuntimeError:
                if out.error is not None:
                    raise out.error from None
                raise
        digest = out.sha256.hexdigest()
        if before_rename is not None:
            before_rename(digest)
    return digest


def read_manifest(directory: Path) -> dict[str, Any]:
    """:data:`MANIFEST` of ``directory`` ({} when missing or unreadable)."""
    with contextlib.suppress(OSError, ValueError, UnicodeDecodeError):
        record = json_object((directory / MANIFEST).read_text(encoding="utf-8"))
        if isinstance(record, dict):
            return record
    return {}


def recorded_digests(directory: Path) -> dict[str, list[str]]:
    """The SHA-256 digests :data:`MANIFEST` records per checkpoint file."""
    files = read_manifest(directory).get("sha256")
    if not isinstance(files, dict):
        return {}
    return {k: [d for d in v if isinstance(d, str)] for k, v in files.items() if isinstance(v, list)}


def write_manifest(directory: Path, digest: str, files: dict[str, list[str]]) -> None:
    """:data:`MANIFEST`: the run's fingerprint ``digest``, :data:`FORMAT` and ``files``' digests."""
    write_json({"digest": digest, "format": FORMAT, "sha256": files}, directory / MANIFEST, sort_keys=True)


class Damaged(Exception):
    """A checkpoint file that is not to be used: ``path`` and why (a phrase: "is damaged ...")."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(path, reason)
        self.path, self.reason = path, reason


def verified_load(path: Path, recorded: dict[str, list[str]]) -> dict[str, Any]:
    """The checkpoint ``path`` once its bytes match a digest ``recorded`` for it."""
    digests = recorded.get(path.name)
    if not digests:
        raise Damaged(path, f"has no SHA-256 recorded in {MANIFEST} (its write was cut short)")
    try:
        actual = digest_path(path)
    except OSError as exc:
        raise Damaged(path, f"is unreadable ({exc.strerror or exc})") from None
    if actual not in digests:
        raise Damaged(
            path,
            f"is damaged: its SHA-256 is not the one {MANIFEST} recorded when it was written "
            "(a changed, truncated or partly written file)",
        )
    try:
        # lexgraph's own file in the user's workspace (it holds NumPy random states, so not weights_only)
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - any reader failure is a bad checkpoint
        first = (str(exc).splitlines() or [""])[0][:200]
        raise Damaged(path, f"is unreadable ({type(exc).__name__}: {first})") from None
    if not isinstance(state, dict) or not isinstance(state.get("epoch"), int):
        raise Damaged(path, "is not a checkpoint of this training")
    return state

"""Sharding inference work (``embed``, ``doc2query``) across processes.

Launched under ``torchrun --nproc_per_node N`` (or ``accelerate launch``), every process
sees ``WORLD_SIZE``/``RANK``/``LOCAL_RANK`` in its environment. :func:`session` then opens
the process group (NCCL on CUDA, gloo on CPU) and puts each rank on its own GPU;
:func:`map_batches` runs a *global* batch plan: rank ``r`` takes a contiguous slice of the
batches, and every rank gets back all results in plan order. Only the main rank writes
outputs (:func:`is_main`).

Outputs are byte-identical to a single process because the plan (which items go in which
batch, and each batch's seed) is a function of the data, never of the number of
processes: a batch is computed by exactly the same code on the same tensors whichever rank
runs it. (On CPU keep the intra-op thread count the same when comparing: ``torchrun`` sets
``OMP_NUM_THREADS=1``.) Without ``WORLD_SIZE`` > 1 everything runs in-process, unchanged.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


def shard(batch: Sequence, index: int, count: int) -> Sequence:
    """Part ``index`` of ``count`` contiguous, near-equal parts of ``batch`` (the first
    ``len % count`` parts one longer; a part may be empty)."""
    n = len(batch)
    size, extra = divmod(n, count)
    start = index * size + min(index, extra)
    return batch[start : start + size + (1 if index < extra else 0)]


def world_size() -> int:
    """Processes of this launch (``WORLD_SIZE``, 1 without a launcher)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    """This process's rank (0 without a launcher)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    """Whether this process writes the outputs (rank 0)."""
    return rank() == 0


def shard_range(n: int, rank: int, world: int) -> tuple[int, int]:
    """The contiguous slice ``[start, end)`` of ``n`` items that ``rank`` of ``world`` owns;
    the first ``n % world`` ranks take one item more."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} of world size {world}")
    size, extra = divmod(n, world)
    start = rank * size + min(rank, extra)
    return start, start + size + (1 if rank < extra else 0)


def local_device(device):
    """``device`` for this process: with several processes on CUDA, ``cuda:LOCAL_RANK``."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and world_size() > 1 and device.index is None:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def _close() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def session(device) -> Iterator[Any]:
    """Open the process group for a sharded run when launched with ``WORLD_SIZE`` > 1
    (NCCL on CUDA, else gloo) and yield this process's device. Ranks meet at a barrier
    on the way out (rank 0 has written by then). The group stays open for later sessions
    of the same process (a launcher's rendezvous serves one group) and closes at exit."""
    import torch
    import torch.distributed as dist

    device = local_device(device)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        atexit.register(_close)
        log.info("rank %d of %d on %s", dist.get_rank(), dist.get_world_size(), device)
    yield device
    if dist.is_initialized():
        dist.barrier()


def map_batches(
    fn: Callable[[T], R],
    batches: Sequence[T],
    *,
    distributed: bool = True,
    wrap: Callable[[Sequence[T]], Any] | None = None,
) -> list[R]:
    """``[fn(b) for b in batches]`` with the batches shared out across ranks (a contiguous
    slice each) when a process group is open and ``distributed``; every rank gets the
    whole list back, in plan order. ``wrap`` decorates the local iterable (a progress bar).
    Results travel pickled (``all_gather_object``): keep them on the CPU."""
    import torch.distributed as dist

    sharded = distributed and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    start, end = shard_range(len(batches), dist.get_rank(), dist.get_world_size()) if sharded else (0, len(batches))
    local = batches[start:end]
    if sharded:
        log.info("rank %d: batches %d-%d of %d", dist.get_rank(), start, end, len(batches))
    results = [fn(batch) for batch in (wrap(local) if wrap is not None else local)]
    if not sharded:
        return results
    gathered: list[list[R] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, results)
    return [item for part in gathered for item in part]

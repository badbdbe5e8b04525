"""Micro-batching with a fair share: questions that concurrent requests send to one system are searched
together, and a large request does not make a small one wait for all of it.

A dense system spends most of a lone question's time in one encoder call whose cost barely grows
with the batch, so the server gathers what arrives while it waits (at most ``max_wait`` seconds
after the first question, at most ``max_batch`` questions) and runs one
:meth:`lexgraph.serve.searcher.Searcher.hits` call per distinct ``k`` on the single worker thread
that every system shares (model calls never overlap, so they do not fight over the cores). The
event loop stays free for other requests meanwhile.

**The fair share.** A batch takes at most :data:`SHARE` questions of each waiting request, never more
than ``max_batch`` questions in all; what is left of a request waits for a later batch. The oldest
request waiting has the first share (so every request moves on, however many come after it), then
the requests that have had the fewest questions searched so far, the smallest first, then in the
order they came. A request that comes while large ones are searched has had none searched, so it
goes next: a lone question behind eight ``POST /search`` of 64 questions is in the next batch, one
batch's time away, not behind all 512 of them (docs/serve.md, "Fair share").
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

#: the questions of one request that a batch takes at a time (the searcher's own chunk: a batch is
#: searched in length order this many at a time, lexgraph.serve.searcher.SEARCH_CHUNK)
SHARE = 8


@dataclass(eq=False)
class _Request:
    """One request's questions, the hits found so far and the future its handler awaits."""

    questions: list[str]
    k: int
    future: asyncio.Future
    as_of: str | None = None  # the date whose law is searched (None: today's)
    seq: int = 0  # the order it came in
    hits: list = field(default_factory=list)
    taken: int = 0  # questions handed to a batch so far

    @property
    def left(self) -> int:
        return len(self.questions) - self.taken


class MicroBatcher:
    """The queue of one system's requests and the task that answers them in fair batches."""

    def __init__(self, searcher, executor: Executor, max_batch: int, max_wait_s: float) -> None:
        self.searcher, self.executor = searcher, executor
        self.max_batch, self.max_wait_s = max_batch, max_wait_s
        self.waiting: list[_Request] = []
        self._seq = 0
        self._arrived = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.calls = 0  # system calls made (a test counts them)

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        for request in self.waiting:
            if not request.future.done():
                request.future.cancel()
        self.waiting.clear()
        self.searcher = None  # the models go with the catalogue (a retired batcher holds none)

    async def submit(self, questions: Sequence[str], k: int, as_of: str | None = None) -> list[list]:
        """Each question's hits (best first, at most ``k``, of the law in force on ``as_of`` on a
        corpus of versions), searched with whatever else is queued."""
        self._seq += 1
        future = asyncio.get_running_loop().create_future()
        request = _Request(list(questions), k, future, as_of, self._seq)
        request.hits = [None] * len(request.questions)
        self.waiting.append(request)
        self._arrived.set()
        return await request.future

    def _queued(self) -> int:
        return sum(r.left for r in self.waiting)

    async def _gather(self) -> list[tuple[_Request, int, int]]:
        """The next batch: ``(request, start, stop)`` slices, :data:`SHARE` questions of each waiting
        request in turn, at most ``max_batch`` in all (after waiting up to ``max_wait_s`` for company)."""
        loop = asyncio.get_running_loop()
        while not self.waiting:
            self._arrived.clear()
            await self._arrived.wait()
        deadline = loop.time() + self.max_wait_s
        while self._queued() < self.max_batch:
            left = deadline - loop.time()
            if left <= 0:
                break
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                break
        self.waiting = [r for r in self.waiting if not r.future.done()]  # a client gone: search nothing more for it
        batch: list[tuple[_Request, int, int]] = []
        size = 0
        oldest = min(self.waiting, key=lambda r: r.seq, default=None)
        others = sorted((r for r in self.waiting if r is not oldest), key=lambda r: (r.taken, r.left, r.seq))
        for request in [oldest, *others] if oldest is not None else []:  # the oldest, then the least served
            if size >= self.max_batch:
                break
            n = min(SHARE, request.left, self.max_batch - size)
            batch.append((request, request.taken, request.taken + n))
            request.taken += n
            size += n
        self.waiting = [r for r in self.waiting if r.left]  # the rest of a request waits for a later batch
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._gather()
            # one call per k and date: each request gets what its k and date alone give
            for k, as_of in sorted({(r.k, r.as_of or "") for r, _, _ in batch}):
                group = [(r, a, b) for r, a, b in batch if (r.k, r.as_of or "") == (k, as_of) and not r.future.done()]
                questions = [q for r, a, b in group for q in r.questions[a:b]]
                if not questions:
                    continue
                try:
                    self.calls += 1
                    hits = await loop.run_in_executor(self.executor, self.searcher.hits, questions, k, as_of or None)
                except Exception as exc:  # the requests waiting on it get the error; the batcher goes on
                    for request, _, _ in group:
                        if not request.future.done():
                            request.future.set_exception(exc)
                    continue
                at = 0
                for request, a, b in group:
                    request.hits[a:b] = hits[at : at + b - a]
                    at += b - a
                    if b == len(request.questions) and not request.future.done():
                        request.future.set_result(request.hits)

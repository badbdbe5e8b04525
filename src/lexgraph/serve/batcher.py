"""Micro-batching: questions that concurrent requests send to one system are searched together.

A dense system spends most of a lone question's time in one encoder call whose cost barely grows
with the batch, so the server gathers what arrives while it waits (at most ``max_wait`` seconds
after the first question, at most ``max_batch`` questions) and runs one
:meth:`lexgraph.serve.searcher.Searcher.hits` call per distinct ``k`` on the single worker thread
that every system shares (model calls never overlap, so they do not fight over the cores). The
event loop stays free for other requests meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Executor


class MicroBatcher:
    """The queue of one system's questions and the task that answers it in batches."""

    def __init__(self, searcher, executor: Executor, max_batch: int, max_wait_s: float) -> None:
        self.searcher, self.executor = searcher, executor
        self.max_batch, self.max_wait_s = max_batch, max_wait_s
        self.queue: asyncio.Queue = asyncio.Queue()
        self.task: asyncio.Task | None = None
        self.calls = 0  # system calls made (a test counts them)

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def submit(self, questions: Sequence[str], k: int) -> list[list]:
        """Each question's hits (best first, at most ``k``), searched with whatever else is queued."""
        future = asyncio.get_running_loop().create_future()
        await self.queue.put((list(questions), k, future))
        return await future

    async def _gather(self) -> list[tuple[list[str], int, asyncio.Future]]:
        loop = asyncio.get_running_loop()
        batch = [await self.queue.get()]
        size, deadline = len(batch[0][0]), loop.time() + self.max_wait_s
        while size < self.max_batch:
            try:
                item = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self.queue.get(), left)
                except TimeoutError:
                    break
            batch.append(item)
            size += len(item[0])
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._gather()
            for k in sorted({k for _, k, _ in batch}):  # one call per k: each request gets what k alone gives
                group = [(qs, fut) for qs, kk, fut in batch if kk == k and not fut.cancelled()]
                questions = [q for qs, _ in group for q in qs]
                if not questions:
                    continue
                try:
                    self.calls += 1
                    hits = await loop.run_in_executor(self.executor, self.searcher.hits, questions, k)
                except Exception as exc:  # the requests waiting on it get the error; the batcher goes on
                    for _, fut in group:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                start = 0
                for qs, fut in group:
                    if not fut.done():
                        fut.set_result(hits[start : start + len(qs)])
                    start += len(qs)

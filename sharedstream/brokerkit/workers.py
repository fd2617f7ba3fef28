"""Poll workers: the background tasks of one poll and the inbox of what they received.

A broker whose client receives in background tasks (several receive loops,
a streaming pull) rather than in the poll itself hands what it received to
the poll's generator through an inbox, beside the tasks that settle and
renew. :class:`PollWorkers` is that arrangement for any broker.

Contract:

* :meth:`~PollWorkers.start` runs each ``(name, work)`` as a task of the
  running loop, named ``"<label> <name>"``.
* :meth:`~PollWorkers.put` hands one received batch to the poll; it never
  blocks (what bounds the inbox is the producer's in-flight limit).
* :meth:`~PollWorkers.batches` is the poll's side: it yields each batch in
  the order put, and raises the error of the first worker that failed.
* A worker that raises is the end of the poll: its error is kept as
  :attr:`~PollWorkers.broken`, every ``on_broken`` callback runs at once
  (to wake whoever waits on a helper that is gone: a settle sender, the
  in-flight limit), and the error goes to the inbox, so the poll raises it
  in the engine's task and the group restarts. What was received and not
  advanced is redelivered by the broker: nothing is lost.
* :meth:`~PollWorkers.stop` cancels every task and waits for them; it is
  idempotent.

Everything runs on the owner's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Generic, TypeVar

__all__ = ["PollWorkers", "Work"]

T = TypeVar("T")

Work = Callable[[], Awaitable[None]]
"""A worker: runs until cancelled, or raises (which ends the poll)."""


class PollWorkers(Generic[T]):
    """Background tasks of one poll, and the inbox of the batches they received."""

    def __init__(self, *, on_broken: Iterable[Callable[[], None]] = ()) -> None:
        self._inbox: asyncio.Queue[Sequence[T] | BaseException] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._on_broken = tuple(on_broken)
        self.broken: BaseException | None = None
        """The error of the first worker that failed (``None`` while all run)."""

    def start(self, label: str, workers: Iterable[tuple[str, Work]]) -> None:
        """Run each worker as a task named ``"<label> <name>"``."""
        loop = asyncio.get_running_loop()
        for name, work in workers:
            self._tasks.append(loop.create_task(self._guard(work), name=f"{label} {name}"))

    def put(self, batch: Sequence[T]) -> None:
        """Hand a received batch to the poll (never blocks)."""
        self._inbox.put_nowait(batch)

    async def batches(self) -> AsyncIterator[Sequence[T]]:
        """The batches put, in order; raises the first failed worker's error."""
        inbox = self._inbox
        while True:
            item = await inbox.get()
            if isinstance(item, BaseException):
                raise item
            yield item

    async def stop(self) -> None:
        """Cancel every worker and wait for them (idempotent)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _guard(self, work: Work) -> None:
        try:
            await work()
        except Exception as exc:  # noqa: BLE001 - handed to the poll, which raises it
            if self.broken is None:
                self.broken = exc
            for wake in self._on_broken:
                wake()
            self._inbox.put_nowait(exc)

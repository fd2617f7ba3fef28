"""Settle senders: a bounded backlog of settle requests, sent in batches by a few senders.

Once the engine advances a message, the producer *settles* it on the broker:
SQS deletes it, Pub/Sub acks it, Service Bus completes it. Those calls take
batches (SQS: 10 entries, Pub/Sub: 2,500 ack ids) and need not hold up
``advance``: the events are already stored, so a crash before the settle
only redelivers the message, and the store skips its events as duplicates.
A :class:`SettleSender` is that queue for any broker, given one function
that sends a batch.

Contract:

* :meth:`~SettleSender.put` queues items in order and never sends itself.
  It returns at once while the backlog holds at most ``backlog`` items
  (default: two rounds of every sender, ``senders * batch_size * 2``);
  past that it waits until the senders take it back down to ``backlog``,
  or until :meth:`~SettleSender.interrupt` (back-pressure: a message waiting
  here is no longer renewed, so ``advance`` waits and receiving pauses
  behind it).
* :meth:`~SettleSender.run` runs ``senders`` concurrent senders until it is
  cancelled. Each takes up to ``batch_size`` items off the front of the
  backlog and awaits ``send(batch)``, so at most ``senders`` calls are in
  flight; batches leave in queue order and may complete out of order.
* ``send(batch)`` returns the items the broker failed *transiently*, each
  with a detail (its error code, say); they are sent again, alone, after the
  retry policy's next delay, and once the policy has no delay left they are
  given up: reported one by one to ``on_given_up(item, detail)`` and
  dropped. Items the broker refused for good are ``send``'s to report and
  drop. A ``send`` that raises one of ``retry_on`` is retried whole after
  the next delay.
* A batch whose call still raises once the policy is exhausted, or that
  raises anything else, ends :meth:`~SettleSender.run` with that error
  (the other senders are cancelled, :meth:`~SettleSender.interrupt` is
  called): the owner treats its client as broken. What was queued and not
  settled is redelivered by the broker.
* :meth:`~SettleSender.drain` waits until everything queued was sent (the
  backlog is empty and no batch is in flight), or until interrupted; the
  owner bounds it with a timeout as it closes (:meth:`~SettleSender.flush`),
  and what is still queued then is its to report (:attr:`~SettleSender.queued`).

Everything runs on the owner's event loop; ``sleep`` is injected so tests
run without waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Generic, TypeVar

from sharedstream.brokerkit.retry import RetryPolicy

__all__ = ["Send", "SettleSender"]

T = TypeVar("T")

Send = Callable[[Sequence[T]], Awaitable[Sequence[tuple[T, str]]]]
"""Settle one batch; return the ``(item, detail)`` pairs the broker failed transiently."""


class SettleSender(Generic[T]):
    """A bounded backlog of settle requests drained in batches by ``senders`` senders.

    See the module docstring for the contract. ``queued`` is the backlog's
    length; ``idle`` is true when nothing is queued or in flight.
    """

    def __init__(
        self,
        send: Send[T],
        *,
        batch_size: int,
        senders: int,
        policy: RetryPolicy,
        retry_on: type[Exception] | tuple[type[Exception], ...],
        on_given_up: Callable[[T, str], None],
        backlog: int | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if batch_size < 1 or senders < 1:
            raise ValueError(f"batch_size and senders must be >= 1, got {batch_size}, {senders}")
        self.batch_size = batch_size
        self.senders = senders
        self.backlog = senders * batch_size * 2 if backlog is None else backlog
        self._send = send
        self._policy = policy
        self._retry_on = retry_on
        self._on_given_up = on_given_up
        self._sleep = sleep
        self._queue: deque[T] = deque()
        self._sending = 0
        self._interrupted = False
        self._work = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._room = asyncio.Event()
        self._room.set()

    @property
    def queued(self) -> int:
        """Items waiting in the backlog (not those of batches in flight)."""
        return len(self._queue)

    @property
    def idle(self) -> bool:
        """Whether nothing is queued and no batch is in flight."""
        return not self._queue and not self._sending

    async def put(self, items: Iterable[T]) -> None:
        """Queue ``items``; wait for room if the backlog is now over ``backlog``.

        The items are queued before any wait, so cancelling the wait does not
        take them back. Does not wait after :meth:`interrupt`.
        """
        queue = self._queue
        before = len(queue)
        queue.extend(items)
        if len(queue) == before:
            return
        self._drained.clear()
        self._work.set()
        if len(queue) > self.backlog and not self._interrupted:
            self._room.clear()
            await self._room.wait()

    def interrupt(self) -> None:
        """The owner is going down: stop :meth:`put` and :meth:`drain` waiting, for good.

        Senders still running keep sending until cancelled. Idempotent.
        """
        self._interrupted = True
        self._room.set()
        self._drained.set()  # wakes a drain; it then reports what is left (see idle)

    async def drain(self) -> bool:
        """Wait until everything queued was sent; whether it was.

        Does not wait once interrupted (an interrupt also ends a wait); then
        it says whether anything is left. Unbounded itself: the owner bounds
        it (``async with asyncio.timeout(...)``), as it closes.
        """
        if not self._interrupted:
            await self._drained.wait()
        return self.idle

    async def flush(self, within: float) -> int:
        """:meth:`drain` for at most ``within`` seconds; how many items are still queued.

        What a closing owner calls before stopping the senders (and reports
        the number it returns: those messages come again).
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await self.drain()
        return self.queued

    async def run(self) -> None:
        """Run the senders until cancelled; raise the error of a batch that failed for good.

        The senders are tasks of a task group owned here, named after the
        calling task. On a failure the others are cancelled and the first
        error is raised as is (not wrapped in an exception group).
        """
        current = asyncio.current_task()
        name = current.get_name() if current is not None else "settle"
        try:
            async with asyncio.TaskGroup() as group:
                for index in range(self.senders):
                    group.create_task(self._sender(), name=f"{name} sender-{index}")
        except BaseExceptionGroup as failure:
            self.interrupt()
            raise failure.exceptions[0]  # noqa: B904 - the sender's own error, its cause kept

    async def _sender(self) -> None:
        queue = self._queue
        while True:
            while not queue:
                if not self._sending:
                    self._drained.set()
                self._work.clear()
                await self._work.wait()
            batch = [queue.popleft() for _ in range(min(self.batch_size, len(queue)))]
            if len(queue) <= self.backlog:
                self._room.set()
            self._sending += 1
            try:
                await self._settle(batch)
            finally:
                self._sending -= 1

    async def _settle(self, batch: list[T]) -> None:
        """Send one batch, retrying per the policy what failed transiently."""
        pending: Sequence[T] = batch
        delays = self._policy.delays()
        while True:
            try:
                failed = await self._send(pending)
            except self._retry_on:
                delay = next(delays, None)
                if delay is None:
                    raise
                await self._sleep(delay)
                continue
            if not failed:
                return
            delay = next(delays, None)
            if delay is None:
                for item, detail in failed:
                    self._on_given_up(item, detail)
                return
            pending = [item for item, _ in failed]
            await self._sleep(delay)

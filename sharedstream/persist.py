"""The persistence gate: every trigger event is stored by one writer, in group commits.

Triggers hand events to :meth:`PersistGate.put` (awaiting when the gate is
full, which pushes back on their filters; ack-mode events, which carry a seq,
never wait: their producers' read-ahead limits bound them). The writer takes whatever is
queued - up to ``batch_max`` events, after lingering ``linger`` seconds for
more - writes it in one transaction on the database thread, and only then
calls ``confirm`` with the batch's seqs, which lets the engine advance the
broker. Invariants:

* a seq is confirmed only after the transaction holding its event committed;
* a failed write confirms nothing: a transient failure is retried (with
  backoff, a bounded number of times), then events are written one by one so
  a single bad event cannot hold back the others; an event the store still
  refuses is logged and dropped - if it is gated (has a seq) the ack timeout
  fails its raw event and the broker redelivers it, otherwise (fast path,
  standalone triggers) it is lost and the log says so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from sharedstream.store.base import PendingEvent, WriteResult
from sharedstream.telemetry import instruments

__all__ = ["PersistGate"]

log = logging.getLogger("sharedstream.runtime")

Write = Callable[[Sequence[PendingEvent]], Awaitable[WriteResult]]

RETRIES = 3
"""Attempts at a whole batch before it is split into single-event writes."""


@dataclass(slots=True)
class _Queued:
    event: PendingEvent
    seq: int | None


class PersistGate:
    """Queues trigger events, writes them in batches, confirms their seqs after commit.

    ``write`` stores a batch in one transaction (on the database thread) and
    raises if nothing was stored; ``confirm`` is the manager's
    ``confirm_persisted``. ``capacity`` bounds the queued events that
    nothing upstream bounds: those without a seq (fast path, standalone
    triggers). Events with a seq are always queued: their raw events count
    against their producer's read-ahead limit, which is the back-pressure of
    ack mode, and holding their filters here could only let the other raw
    events pile up in those triggers' queues until they overflow.
    """

    def __init__(
        self,
        *,
        write: Write,
        confirm: Callable[[list[int]], None],
        batch_max: int = 2000,
        linger: float = 0.002,
        capacity: int = 20_000,
        retry_delay: float = 0.05,
    ) -> None:
        self._write = write
        self._confirm = confirm
        self._batch_max = batch_max
        self._linger = linger
        self._capacity = capacity
        self._retry_delay = retry_delay
        self._queue: deque[_Queued] = deque()
        self._has_items = asyncio.Event()
        self._has_room = asyncio.Event()
        self._has_room.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopping = False
        self.stored = 0
        self.duplicates = 0
        self.runs_queued = 0
        self.dropped = 0
        self.last_confirm_latency = 0.0

    async def put(self, event: PendingEvent, seq: int | None) -> None:
        """Queue one event (and the seq that gates its raw event, if any).

        Waits while the queue is full; see :meth:`offer` for the common case.
        """
        while not self.offer(event, seq):
            self._has_room.clear()
            await self._has_room.wait()

    def offer(self, event: PendingEvent, seq: int | None) -> bool:
        """:meth:`put` without waiting: queue the event and return ``True``, or ``False`` if full.

        The hot path (one call per trigger event, no coroutine); on ``False``
        nothing was queued and the caller awaits :meth:`put`. An event with a
        seq is never refused (see the class docstring).
        """
        if seq is None and len(self._queue) >= self._capacity:
            return False
        self._queue.append(_Queued(event, seq))
        self._idle.clear()
        self._has_items.set()
        return True

    async def flush(self) -> None:
        """Wait until everything queued so far has been written (or dropped)."""
        await self._idle.wait()

    def stop(self) -> None:
        """Make :meth:`run` return once the queue is empty."""
        self._stopping = True
        self._has_items.set()

    async def run(self) -> None:
        """Write batches until stopped and drained."""
        while True:
            if not self._queue:
                self._idle.set()
                if self._stopping:
                    return
                self._has_items.clear()
                await self._has_items.wait()
                continue
            if self._linger > 0 and len(self._queue) < self._batch_max:
                await asyncio.sleep(self._linger)
            batch = [self._queue.popleft() for _ in range(min(self._batch_max, len(self._queue)))]
            self._has_room.set()
            await self._write_batch(batch)

    async def _write_batch(self, batch: list[_Queued]) -> None:
        metrics = instruments()
        started = time.perf_counter()
        for attempt in range(1, RETRIES + 1):
            try:
                result = await self._write([item.event for item in batch])
            except Exception as exc:  # noqa: BLE001 - any store error: retried, then isolated
                # A failed transaction stored nothing and confirms nothing.
                log.warning("storing %d trigger events failed (attempt %d/%d): %s",
                            len(batch), attempt, RETRIES, exc)
                await asyncio.sleep(self._retry_delay * 2 ** (attempt - 1))
            else:
                self._committed(batch, result, started)
                metrics.persist_batch_size.record(len(batch))
                return
        if len(batch) > 1:
            for item in batch:
                await self._write_batch([item])
            return
        item = batch[0]
        self.dropped += 1
        log.error(
            "the store refused an event of trigger %d; %s", item.event.trigger_id,
            "its raw event will be redelivered after the ack timeout" if item.seq is not None
            else "it is lost (not gated: fast path or standalone trigger)",
        )

    def _committed(self, batch: list[_Queued], result: WriteResult, started: float) -> None:
        seqs = [item.seq for item in batch if item.seq is not None]
        if seqs:
            self._confirm(seqs)
        latency = time.perf_counter() - started
        self.last_confirm_latency = latency
        self.stored += result.stored
        self.duplicates += result.duplicates
        self.runs_queued += len(result.dag_runs)
        metrics = instruments()
        metrics.persist_latency.record(latency)
        metrics.events_stored.add(result.stored)
        for run in result.dag_runs:
            log.info("queued DAG run %s", run)

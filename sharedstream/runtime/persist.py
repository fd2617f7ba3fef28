"""The persistence gate: every trigger event is stored by one writer, in group commits.

Triggers hand events to :meth:`PersistGate.put` (awaiting when the gate is
full, which pushes back on their filters; ack-mode events, which carry a seq,
never wait: their producers' read-ahead limits bound them). The writer takes whatever is
queued - up to ``batch_max`` events, after lingering ``linger`` seconds for
more - writes it in one transaction on the database thread, and only then
calls ``confirm`` with the batch's seqs, which lets the engine advance the
broker. Invariants:

* a seq is confirmed only after the transaction holding its event committed;
* a failed write confirms nothing and drops nothing: the batch is retried
  with backoff (doubling up to ``MAX_RETRY_DELAY``) until the store takes
  it. A store that cannot take an event for good is not something to find
  out here - payloads are checked where their trigger yields them (see
  :func:`~sharedstream.runtime.serde.pack_event_payload`) - and telling a broken
  store from a bad event by guessing would risk turning an outage into
  dead-lettered data. Gated events whose raw events time out meanwhile are
  redelivered, and the store's idempotency keys absorb the second copy;
* while the store is failing, or more than ``capacity`` events are queued,
  the gate reports *pressure* (``on_pressure(True)``; ``False`` once the
  writes succeed again and the queue is down to half), which the runtime
  uses to pause every shared stream's intake: memory stays bounded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from opentelemetry.trace import Tracer

from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.telemetry import instruments
from sharedstream.engine.tracing import record_stored
from sharedstream.store.base import PendingEvent, WriteResult

__all__ = ["PersistGate"]

log = key_value_logger("sharedstream.runtime")

Write = Callable[[Sequence[PendingEvent]], Awaitable[WriteResult]]

RETRIES = 3
"""Failed attempts at one batch before the store is reported as failing (pressure on)."""

MAX_RETRY_DELAY = 2.0
"""Longest wait, in seconds, between two attempts at a batch the store refused."""


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
    triggers). Events with a seq are always queued (holding a filter here
    would only pile raw events up in its queue); they are bounded by
    ``on_pressure``, which the runtime wires to the shared streams' intake.
    With a ``tracer``, each committed event that carries a ``trace_parent``
    gets a ``store`` span over its transaction (see
    :mod:`sharedstream.engine.tracing`).
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
        on_pressure: Callable[[bool], None] | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self._write = write
        self._confirm = confirm
        self._batch_max = batch_max
        self._linger = linger
        self._capacity = capacity
        self._retry_delay = retry_delay
        self._on_pressure = on_pressure
        self._tracer = tracer
        self._pressure = False
        self._failing_since: float | None = None
        self._queue: deque[_Queued] = deque()
        self._has_items = asyncio.Event()
        self._has_room = asyncio.Event()
        self._has_room.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopping = False
        self.stored = 0
        self.duplicates = 0
        self.renamed = 0  # stored events whose key another message had (see _committed)
        self.runs_queued = 0
        self.failed_writes = 0
        self.last_confirm_latency = 0.0
        self.commits = 0  # batches committed, and the seconds they took in all (write latency)
        self.commit_seconds = 0.0

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
        queue = self._queue
        if len(queue) >= self._capacity:
            if seq is None:
                return False
            self._set_pressure(True)
        queue.append(_Queued(event, seq))
        self._idle.clear()
        self._has_items.set()
        return True

    @property
    def store_failing(self) -> bool:
        """Whether the store has refused the current batch ``RETRIES`` times or more."""
        return self._failing_since is not None

    @property
    def queued(self) -> int:
        """Events waiting to be written."""
        return len(self._queue)

    def _set_pressure(self, on: bool) -> None:
        if on != self._pressure:
            self._pressure = on
            if self._on_pressure is not None:
                self._on_pressure(on)

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
        """Write ``batch`` until the store takes it (see the module docstring)."""
        metrics = instruments()
        started = time.perf_counter()
        started_ns = time.time_ns() if self._tracer is not None else 0
        delay = self._retry_delay
        attempt = 0
        while True:
            try:
                result = await self._write([item.event for item in batch])
            except Exception as exc:  # noqa: BLE001 - any store error: retried, never dropped
                # A failed transaction stored nothing and confirms nothing.
                attempt += 1
                self.failed_writes += 1
                self._write_failed(len(batch), attempt, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_DELAY)
                continue
            if self._failing_since is not None:
                log.warning("the store takes writes again; resuming intake",
                            elapsed_s=round(time.monotonic() - self._failing_since, 1))
                self._failing_since = None
            self._committed(batch, result, started)
            if self._tracer is not None:
                record_stored(self._tracer, [(q.event.trace_parent, q.event.trigger_id)
                                             for q in batch], started_ns, time.time_ns())
            metrics.persist_batch_size.record(len(batch))
            if self._pressure and len(self._queue) <= self._capacity // 2:
                self._set_pressure(False)
            return

    def _renamed(self, renamed: Sequence[tuple[int, str]]) -> None:
        """Say, once per trigger and batch, that new messages reused stored messages' names.

        The store kept them under new keys (their fingerprints differed from
        the stored messages'), so nothing was lost; the line is there because
        it means the broker's names repeated: a topic, queue or entity
        deleted and created again, or a broker's storage reset. One line per
        trigger per batch, not per event: a recreated topic's whole backlog
        can come this way. It names the first and last raw event of the batch.
        """
        self.renamed += len(renamed)
        names: dict[int, list[str]] = {}
        for trigger_id, idem_key in renamed:
            # the key is "<trigger id>/<raw event name>#<index>" (see the supervisor)
            name = idem_key.partition("/")[2].rpartition("#")[0] or idem_key
            names.setdefault(trigger_id, []).append(name)
        for trigger_id, raw_events in names.items():
            log.warning("new messages reused the names of stored messages (topic or entity "
                        "recreated? broker storage reset?); stored as new events, not as "
                        "duplicates", trigger=trigger_id, count=len(raw_events),
                        raw_event=raw_events[0], last=raw_events[-1])

    def _write_failed(self, size: int, attempt: int, exc: Exception, delay: float) -> None:
        """Say it once when a batch fails, once when the store counts as failing."""
        if attempt < RETRIES:
            log.warning("storing trigger events failed; retrying", count=size, attempt=attempt,
                        error=exc, delay_s=round(delay, 2))
        elif attempt == RETRIES:
            self._failing_since = time.monotonic()
            self._set_pressure(True)
            log.error(
                "the store keeps failing; pausing intake and retrying until it takes writes "
                "again (nothing is acknowledged meanwhile)",
                error=exc, max_delay_s=MAX_RETRY_DELAY,
            )

    def _committed(self, batch: list[_Queued], result: WriteResult, started: float) -> None:
        seqs = [item.seq for item in batch if item.seq is not None]
        if seqs:
            self._confirm(seqs)
        latency = time.perf_counter() - started
        self.last_confirm_latency = latency
        self.commits += 1
        self.commit_seconds += latency
        self.stored += result.stored
        self.duplicates += result.duplicates
        if result.renamed:
            self._renamed(result.renamed)
        self.runs_queued += len(result.dag_runs)
        metrics = instruments()
        metrics.persist_latency.record(latency)
        metrics.events_stored.add(result.stored)
        if log.isEnabledFor(logging.DEBUG):  # one check per batch, not one call per run
            for run in result.dag_runs:
                log.debug("queued DAG run", run=run)

"""The advance pump: the one task of a group that awaits ``producer.advance``.

Invariants:

* At most one ``advance`` call is awaited at any moment (there is one pump
  per group and it awaits each call before taking the next batch).
* A batch is a lane's contiguous resolved prefix, taken synchronously right
  before the call, so a lane's batches go out in fan-out order and the next
  batch of a lane is only taken after the previous call returned. For a
  producer that ``advances_lanes_together``, one call carries the prefixes
  of every ready lane (each contiguous and in order) up to
  ``MAX_ADVANCE_ITEMS`` items.
* Ready lanes are served oldest-ready first; a lane that becomes ready again
  queues behind the others, so no lane waits on another's unresolved head.
* If ``advance`` raises, the pump reports it through ``on_failure`` (which
  terminates the group) and advances nothing more.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from opentelemetry.metrics import Counter

from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.producer import MAX_ADVANCE_ITEMS, AdvanceItem, SharedStreamProducer
from sharedstream.engine.resolution import ResolutionBook
from sharedstream.engine.telemetry import instruments

__all__ = ["AdvancePump", "StreamTotals"]

log = key_value_logger("sharedstream.stream")


@dataclass
class StreamTotals:
    """Raw events advanced by a manager's groups, by outcome, since it was made.

    Written only by the pumps (on the event loop); read by the runtime for
    its progress lines and stop summary.
    """

    advanced: int = 0
    clean: int = 0
    failed: int = 0
    rejected: int = 0
    dead_lettered: int = 0
    """As counted by the producers (``SharedStreamProducer.dead_lettered``)."""


class AdvancePump:
    """Dispatches ready lanes of ``book`` to ``producer.advance``, one call at a time.

    ``notify`` is wired to the book's ``on_ready`` hook. ``request_stop``
    makes :meth:`run` return once nothing is ready any more (a drain, not a
    cancel).
    """

    def __init__(
        self,
        book: ResolutionBook,
        producer: SharedStreamProducer,
        *,
        on_failure: Callable[[BaseException], None],
        totals: StreamTotals | None = None,
    ) -> None:
        self._book = book
        self._totals = totals if totals is not None else StreamTotals()
        self._producer = producer
        self._on_failure = on_failure
        self._waiter: asyncio.Future[None] | None = None
        self._stopping = False
        self._attributes = {"stream": repr(book.key)}

    def notify(self) -> None:
        """Wake the pump if it is waiting for work. Synchronous and cheap."""
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def request_stop(self) -> None:
        """Ask :meth:`run` to advance what is ready, then return."""
        self._stopping = True
        self.notify()

    async def run(self) -> None:
        """Advance ready lanes until stopped or until ``advance`` raises."""
        book = self._book
        ready = book.ready
        metrics = instruments()
        together = self._producer.advances_lanes_together
        while True:
            if not ready:
                if self._stopping:
                    return
                waiter = self._waiter = asyncio.get_running_loop().create_future()
                await waiter
                continue
            lane = next(iter(ready))
            batch = book.take_batch(lane)
            if together:  # every ready lane's prefix in one call, up to the cap
                while ready and len(batch) < MAX_ADVANCE_ITEMS:
                    batch += book.take_batch(next(iter(ready)))
            if not batch:
                continue
            started = time.perf_counter()
            if self._producer.counts_deliveries:
                await self._count_failures(batch)
            dead_lettered = self._producer.dead_lettered
            tracer = book.tracer
            spans = tracer.settling(batch) if tracer is not None else None
            try:
                await self._producer.advance(batch)
            except Exception as exc:
                if spans:
                    tracer.settled(spans, exc)  # type: ignore[union-attr]
                # Whatever broke, nothing past this batch may be advanced:
                # the group ends and the broker redelivers what was not
                # advanced (at-least-once, never a silent skip).
                log.exception(
                    "producer.advance raised; terminating the shared stream",
                    stream=book.name,
                    lane=lane,
                    other_lanes=together,
                    batch_size=len(batch),
                )
                self._on_failure(exc)
                return
            if spans:
                tracer.settled(spans, None)  # type: ignore[union-attr]
            metrics.advance_latency.record(time.perf_counter() - started, self._attributes)
            metrics.advanced_events.add(len(batch), self._attributes)
            self._totals.dead_lettered += self._producer.dead_lettered - dead_lettered
            self._count_outcomes(batch, metrics.outcomes)

    async def _count_failures(self, batch: Sequence[AdvanceItem]) -> None:
        """Count, in the producer's failure ledger, the raw events a subscriber failed on itself.

        Done before ``advance`` hands them back to the broker, so a
        redelivery never comes before its failure is counted. A ledger that
        cannot count is logged and passed over: the message is still handed
        back, and its failure is only not remembered across a restart.
        """
        ledger = self._producer.failure_ledger
        if ledger is None:
            return
        name = self._producer.raw_event_name
        names = [n for payload, outcome in batch
                 if outcome.failed and outcome.failed_itself and (n := name(payload)) is not None]
        if not names:
            return
        try:
            await ledger.add(names)
        except Exception as exc:  # noqa: BLE001 - any store failure: say so, go on
            log.warning("could not count raw events' failures in the store; after a restart "
                        "their redeliveries cannot be told from a crash's", stream=self._book.name,
                        raw_events=len(names), error=f"{type(exc).__name__}: {exc}")

    def _count_outcomes(self, batch: Sequence[AdvanceItem], counter: Counter) -> None:
        failed = rejected = unobserved = 0
        for _payload, outcome in batch:
            if outcome.failed:
                failed += 1
            elif outcome.rejected:
                rejected += 1
            elif not outcome.acked:
                unobserved += 1
        clean = len(batch) - failed - rejected - unobserved
        totals = self._totals
        totals.advanced += len(batch)
        totals.clean += clean
        totals.failed += failed
        totals.rejected += rejected
        for name, count in (("clean", clean), ("failed", failed), ("rejected", rejected),
                            ("unobserved", unobserved)):
            if count:
                counter.add(count, {**self._attributes, "outcome": name})

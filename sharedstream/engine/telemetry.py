"""OpenTelemetry instruments of the engine (no-ops until an SDK is installed).

Only ``opentelemetry-api`` is a dependency; an application that installs
and configures the SDK gets the measurements, everyone else pays a no-op
call. Instruments are recorded per batch or per exceptional event, never
per (event, subscriber) pair.

Observable-gauge callbacks run on whatever thread collects: an SDK
reader's own thread (``PeriodicExportingMetricReader``) while the event
loop keeps fanning out and resolving. So every callback here is a pure
read: it changes no state (nothing is trimmed, popped or cached), walks
only copies made by the books' thread-safe readers (see
:mod:`sharedstream.engine.resolution`), takes the watched books from a
registry guarded by a lock, and measures age with each book's own
(injected) clock.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from opentelemetry import metrics
from opentelemetry.metrics import (
    CallbackOptions,
    Counter,
    Histogram,
    ObservableGauge,
    Observation,
    UpDownCounter,
)

if TYPE_CHECKING:
    from sharedstream.engine.resolution import ResolutionBook

__all__ = ["Instruments", "instruments", "unwatch_book", "watch_book"]

# WeakSet iterates in Python code, so a copy taken while the loop adds a book
# could fail with "Set changed size during iteration": the lock serializes them.
_books: weakref.WeakSet[ResolutionBook] = weakref.WeakSet()
_books_lock = threading.Lock()


def watch_book(book: ResolutionBook) -> None:
    """Report ``book``'s outstanding events and head-of-line age while it lives.

    Read by observable gauges only when an SDK collects, so it costs nothing
    on the hot path. Called on the event loop when a group starts.
    """
    instruments()  # make sure the gauges exist
    with _books_lock:
        _books.add(book)


def unwatch_book(book: ResolutionBook) -> None:
    """Stop reporting ``book`` (its group ended). Idempotent."""
    with _books_lock:
        _books.discard(book)


def _watched() -> list[ResolutionBook]:
    """The books to report, copied under the lock (any thread)."""
    with _books_lock:
        return list(_books)


def _outstanding(_options: CallbackOptions) -> Iterable[Observation]:
    return [Observation(book.outstanding(), {"stream": book.name}) for book in _watched()]


def _subscriber_lag(_options: CallbackOptions) -> Iterable[Observation]:
    return [
        Observation(queued, {"stream": book.name, "trigger": str(trigger_id)})
        for book in _watched()
        for trigger_id, queued in book.queued_snapshot()
    ]


def _lane_outstanding(_options: CallbackOptions) -> Iterable[Observation]:
    return [
        Observation(records, {"stream": book.name, "lane": repr(lane)})
        for book in _watched()
        for lane, records in book.lanes_snapshot()
    ]


def _head_of_line_age(_options: CallbackOptions) -> Iterable[Observation]:
    observations = []
    for book in _watched():
        since = book.oldest_unresolved_at()
        age = 0.0 if since is None else max(0.0, book.clock() - since)
        observations.append(Observation(age, {"stream": book.name}))
    return observations


@dataclass(frozen=True)
class Instruments:
    """The engine's metric instruments."""

    advance_latency: Histogram
    advanced_events: Counter
    outcomes: Counter
    forced_failures: Counter
    persist_batch_size: Histogram
    persist_latency: Histogram
    events_stored: Counter
    events_refused: Counter
    triggers_running: UpDownCounter
    outstanding: ObservableGauge
    head_of_line_age: ObservableGauge
    pauses: Counter
    subscriber_lag: ObservableGauge
    lane_outstanding: ObservableGauge
    broker_requests: Counter


@cache
def instruments() -> Instruments:
    """The process-wide instruments, created on first use."""
    meter = metrics.get_meter("sharedstream")
    return Instruments(
        advance_latency=meter.create_histogram(
            "sharedstream.advance.duration",
            unit="s",
            description="Time one producer.advance call took",
        ),
        advanced_events=meter.create_counter(
            "sharedstream.advance.events",
            unit="{event}",
            description="Raw events handed to producer.advance",
        ),
        outcomes=meter.create_counter(
            "sharedstream.advance.outcomes",
            unit="{event}",
            description="Advanced events by outcome: clean, failed, rejected, unobserved",
        ),
        forced_failures=meter.create_counter(
            "sharedstream.subscriber.forced_failures",
            unit="{subscriber}",
            description="Subscribers force-failed (overflow or ack timeout)",
        ),
        persist_batch_size=meter.create_histogram(
            "sharedstream.runtime.persist.batch_size",
            unit="{event}",
            description="Trigger events written per group commit",
        ),
        persist_latency=meter.create_histogram(
            "sharedstream.runtime.persist.duration",
            unit="s",
            description="From taking a batch to confirming its seqs (commit included)",
        ),
        events_stored=meter.create_counter(
            "sharedstream.engine.events.stored",
            unit="{event}",
            description="Trigger events stored (duplicates excluded)",
        ),
        events_refused=meter.create_counter(
            "sharedstream.engine.events.refused",
            unit="{event}",
            description="Trigger events whose payload could not be stored (raw event rejected)",
        ),
        triggers_running=meter.create_up_down_counter(
            "sharedstream.triggers.running",
            unit="{trigger}",
            description="Triggers currently running in this process",
        ),
        outstanding=meter.create_observable_gauge(
            "sharedstream.engine.events.outstanding",
            callbacks=[_outstanding],
            unit="{event}",
            description="Raw events fanned out and not yet advanced, per stream",
        ),
        head_of_line_age=meter.create_observable_gauge(
            "sharedstream.engine.events.head_of_line_age",
            callbacks=[_head_of_line_age],
            unit="s",
            description="Age of the oldest unresolved raw event, per stream (0 if none)",
        ),
        pauses=meter.create_counter(
            "sharedstream.engine.stream.pauses",
            unit="{pause}",
            description="Times a poll paused: a durable subscriber's queue was full",
        ),
        subscriber_lag=meter.create_observable_gauge(
            "sharedstream.subscriber.lag",
            callbacks=[_subscriber_lag],
            unit="{event}",
            description="Raw events queued for a subscriber and not yet pulled, per trigger",
        ),
        lane_outstanding=meter.create_observable_gauge(
            "sharedstream.lane.outstanding",
            callbacks=[_lane_outstanding],
            unit="{event}",
            description="Raw events fanned out and not yet advanced, per lane",
        ),
        broker_requests=meter.create_counter(
            "sharedstream.broker.requests",
            unit="{request}",
            description="Broker API calls made by producers, by broker and operation",
        ),
    )

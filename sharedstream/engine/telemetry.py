"""OpenTelemetry instruments of the engine (no-ops until an SDK is installed).

Only ``opentelemetry-api`` is a dependency; an application that installs
and configures the SDK gets the measurements, everyone else pays a no-op
call. Instruments are recorded per batch or per exceptional event, never
per (event, subscriber) pair.
"""

from __future__ import annotations

import time
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

_books: weakref.WeakSet[ResolutionBook] = weakref.WeakSet()


def watch_book(book: ResolutionBook) -> None:
    """Report ``book``'s outstanding events and head-of-line age while it lives.

    Read by observable gauges only when an SDK collects, so it costs nothing
    on the hot path.
    """
    instruments()  # make sure the gauges exist
    _books.add(book)


def unwatch_book(book: ResolutionBook) -> None:
    """Stop reporting ``book`` (its group ended). Idempotent."""
    _books.discard(book)


def _outstanding(_options: CallbackOptions) -> Iterable[Observation]:
    for book in list(_books):
        yield Observation(book.outstanding(), {"stream": repr(book.key)})


def _subscriber_lag(_options: CallbackOptions) -> Iterable[Observation]:
    # Reads only (copies first): this may run on an exporter thread.
    for book in list(_books):
        for sub in list(book.subscribers.values()):
            yield Observation(len(sub.inbox), {"stream": repr(book.key),
                                               "trigger": str(sub.trigger_id)})


def _lane_outstanding(_options: CallbackOptions) -> Iterable[Observation]:
    for book in list(_books):
        for lane, records in list(book.lanes.items()):
            yield Observation(len(records), {"stream": repr(book.key), "lane": repr(lane)})


def _head_of_line_age(_options: CallbackOptions) -> Iterable[Observation]:
    now = time.monotonic()
    for book in list(_books):
        deadline = book.peek_deadline()
        age = 0.0 if deadline is None else max(0.0, now - (deadline - book.ack_timeout))
        yield Observation(age, {"stream": repr(book.key)})


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
    )

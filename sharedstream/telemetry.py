"""OpenTelemetry instruments of the engine (no-ops until an SDK is installed).

Only ``opentelemetry-api`` is a dependency; an application that installs
and configures the SDK gets the measurements, everyone else pays a no-op
call. Instruments are recorded per batch or per exceptional event, never
per (event, subscriber) pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from opentelemetry import metrics
from opentelemetry.metrics import Counter, Histogram, UpDownCounter

__all__ = ["Instruments", "instruments"]


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
    triggers_running: UpDownCounter


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
            "sharedstream.persist.batch_size",
            unit="{event}",
            description="Trigger events written per group commit",
        ),
        persist_latency=meter.create_histogram(
            "sharedstream.persist.duration",
            unit="s",
            description="From taking a batch to confirming its seqs (commit included)",
        ),
        events_stored=meter.create_counter(
            "sharedstream.events.stored",
            unit="{event}",
            description="Trigger events stored (duplicates excluded)",
        ),
        triggers_running=meter.create_up_down_counter(
            "sharedstream.triggers.running",
            unit="{trigger}",
            description="Triggers currently running in this process",
        ),
    )

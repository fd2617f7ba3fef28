"""What a target is told about a run: the run document.

A :class:`RunDocument` is built from a claimed run (:class:`~sharedstream.store.ClaimedRun`)
once per attempt and handed to the target. Its JSON form
(:meth:`RunDocument.to_json`) is what leaves the process - an Airflow run's
``conf``, a webhook's body, a local command's standard input - and is stable:
keys are only ever added.

The identity of a run is ``(dag_id, run_id)``; it is the same on every
attempt and after every restart, so a target that already has the run can
say so instead of running it twice. ``idempotency_key`` is that identity as
one string.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sharedstream.store import ClaimedRun

__all__ = ["DOCUMENT_VERSION", "EventDocument", "RunDocument", "document_of", "json_safe"]

DOCUMENT_VERSION = 1
"""The ``version`` key of :meth:`RunDocument.to_json`; raised only if a key changes meaning."""


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON types.

    Times become ISO 8601 text, bytes text when they are UTF-8 (else hex),
    sets and tuples lists, anything else its ``str``.
    """
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [json_safe(item) for item in value]
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.hex()
    return value.isoformat() if isinstance(value, datetime) else str(value)


@dataclass(frozen=True, slots=True)
class EventDocument:
    """One event that triggered the run: its asset, ids, payload and trace context.

    ``payload`` is what the trigger's ``TriggerEvent`` carried, as stored
    (JSON types, or values :func:`json_safe` turns into them).
    """

    asset: str
    asset_event_id: int
    event_id: int
    payload: Any
    created_at: datetime
    trace_parent: str | None

    def to_json(self) -> dict[str, Any]:
        """The event as plain JSON types."""
        return {"asset": self.asset, "asset_event_id": self.asset_event_id,
                "event_id": self.event_id, "payload": json_safe(self.payload),
                "created_at": self.created_at.isoformat(), "trace_parent": self.trace_parent}


@dataclass(frozen=True, slots=True)
class RunDocument:
    """A DAG run as a target sees it, for one attempt.

    ``attempt`` counts every attempt made so far, this one included;
    ``recovered`` says the previous attempt's outcome is unknown (its
    triggerer stopped before recording it): a target should look whether
    the run already reached it. ``conf`` is a manual run's configuration
    (``None`` otherwise); ``events`` are empty for time-based and manual
    runs. ``external_id``/``external_url`` are the target's own name of the
    run once it gave one (following a dispatched run).
    """

    dag_id: str
    run_id: str
    run_type: str
    queued_at: datetime
    logical_date: datetime | None
    data_interval_start: datetime | None
    data_interval_end: datetime | None
    conf: dict[str, Any] | None
    trace_parent: str | None
    events: tuple[EventDocument, ...]
    attempt: int
    recovered: bool = False
    external_id: str | None = None
    external_url: str | None = None

    @property
    def idempotency_key(self) -> str:
        """``dag_id/run_id``: the run's identity as one string, the same on every attempt."""
        return f"{self.dag_id}/{self.run_id}"

    def to_json(self) -> dict[str, Any]:
        """The document as plain JSON types (see the module docstring)."""

        def when(value: datetime | None) -> str | None:
            return None if value is None else value.isoformat()

        return {
            "version": DOCUMENT_VERSION,
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "run_type": self.run_type,
            "queued_at": self.queued_at.isoformat(),
            "logical_date": when(self.logical_date),
            "data_interval_start": when(self.data_interval_start),
            "data_interval_end": when(self.data_interval_end),
            "conf": json_safe(self.conf),
            "trace_parent": self.trace_parent,
            "attempt": self.attempt,
            "events": [event.to_json() for event in self.events],
        }


def document_of(run: ClaimedRun, payload_of: Callable[[bytes], Any]) -> RunDocument:
    """The document of a claimed run; ``payload_of`` unpacks a stored event payload.

    Raises whatever ``payload_of`` raises for a payload it cannot read (the
    dispatcher records the run undeliverable with that reason).
    """
    events = tuple(
        EventDocument(asset=e.asset, asset_event_id=e.asset_event_id, event_id=e.event_id,
                      payload=payload_of(e.payload), created_at=e.created_at,
                      trace_parent=e.trace_parent)
        for e in run.events
    )
    return RunDocument(
        dag_id=run.dag_id, run_id=run.run_id, run_type=run.run_type, queued_at=run.queued_at,
        logical_date=run.logical_date, data_interval_start=run.data_interval_start,
        data_interval_end=run.data_interval_end, conf=run.conf, trace_parent=run.trace_parent,
        events=events, attempt=run.attempt, recovered=run.recovered,
        external_id=run.external_id, external_url=run.external_url,
    )

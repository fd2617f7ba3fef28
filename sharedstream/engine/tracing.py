"""Traces of a shared stream's raw events: process → fan-out → filter → store → settle.

Made only when the manager was given an OpenTelemetry tracer provider
(``SharedStreamManager(tracer_provider=...)``, the runtime's ``[traces]``
section). Off, the engine pays one ``is None`` test per raw event, per
pull and per advance batch, and nothing else.

The spans of one raw event, named and attributed after OpenTelemetry's
messaging conventions (``messaging.system``, ``messaging.destination.name``,
``messaging.consumer.group.name``, ``messaging.message.id``,
``messaging.operation.type``):

* ``process <destination>`` (kind ``CONSUMER``): the raw event's time in
  sharedstream, from the moment the poll hands it to the fan-out until the
  producer advanced past it. Its parent is the trace context the message
  carries (``traceparent`` in the headers, attributes or application
  properties the producer's :meth:`~sharedstream.engine.producer.SharedStreamProducer.trace_carrier`
  returns; read with the globally configured propagator), so a message
  published inside a trace continues it. It ends with the resolution counts
  (``sharedstream.outcome.acked`` / ``.failed`` / ``.rejected``) and one span
  event per non-clean verdict, naming the trigger and the reason.
* ``fan-out <destination>``: the broadcast to the snapshot, with the
  subscriber count and how many prefilters declined it.
* ``filter`` (one per subscriber that received it, ``sharedstream.trigger.id``):
  from the subscriber's pull to its next pull, i.e. the binding window. It is
  the current span while the filter works on the event, so spans the
  trigger's own code starts are its children, and it is the span whose
  context travels with each trigger event the filter yields (see
  :meth:`StreamTracer.traceparent`): the stored event and its DAG run carry it.
* ``store`` (one per trigger event, made by the runtime's persistence gate
  with :func:`record_stored`): the transaction that made it durable.
* ``settle <destination>`` (kind ``CLIENT``): the producer's ``advance`` call
  that acked, nacked or dead-lettered it.

A raw event whose group ends before it was advanced ends its span with
``sharedstream.abandoned = true``: the broker redelivers it.

Everything here runs on the event loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider

from sharedstream.engine.producer import AdvanceItem

if TYPE_CHECKING:
    from sharedstream.engine.producer import SharedStreamProducer

__all__ = ["TRACER_NAME", "StreamTracer", "carrier_of", "format_traceparent", "parent_of",
           "record_stored"]

TRACER_NAME = "sharedstream"
"""The instrumentation scope of every span sharedstream makes."""

_EMPTY = otel_context.Context()


def format_traceparent(span: Span) -> str | None:
    """The W3C ``traceparent`` value of ``span`` (``None`` for a span that is not valid)."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def parent_of(traceparent: str | None) -> otel_context.Context:
    """The context a span continuing ``traceparent`` starts in (empty: a new trace)."""
    if not traceparent:
        return _EMPTY
    return propagate.extract({"traceparent": traceparent}, context=_EMPTY)


def record_stored(
    tracer: trace.Tracer, traceparents: Iterable[tuple[str | None, Hashable]],
    started_ns: int, ended_ns: int,
) -> None:
    """One ``store`` span per ``(traceparent, trigger id)``, over one committed transaction.

    Events without a ``traceparent`` get none (they did not come from a traced
    raw event).
    """
    for traceparent, trigger_id in traceparents:
        if traceparent is None:
            continue
        span = tracer.start_span(
            "store", context=parent_of(traceparent), start_time=started_ns,
            attributes={"sharedstream.trigger.id": str(trigger_id)},
        )
        span.end(end_time=ended_ns)


class StreamTracer:
    """The spans of one group's raw events (see the module docstring)."""

    def __init__(
        self, provider: TracerProvider, stream: str, producer: SharedStreamProducer
    ) -> None:
        self._tracer = provider.get_tracer(TRACER_NAME)
        self._producer = producer
        attributes: dict[str, Any] = dict(producer.messaging_attributes)
        destination = str(attributes.setdefault("messaging.destination.name", stream))
        self._attributes = attributes
        self._names = (f"process {destination}", f"fan-out {destination}",
                       f"settle {destination}")
        self._spans: dict[int, Span] = {}  # id(broker payload) -> its process span
        self._filters: dict[Hashable, tuple[Span, object]] = {}  # trigger id -> span, token
        self._fanout: Span | None = None

    @property
    def tracer(self) -> trace.Tracer:
        """The tracer the spans come from (the persistence gate's ``store`` spans use it too)."""
        return self._tracer

    # -- the poll ----------------------------------------------------------------------

    def received(self, raw: Any, payload: Any) -> None:
        """Start the raw event's ``process`` span and its ``fan-out`` child."""
        producer = self._producer
        carrier = producer.trace_carrier(raw, payload)
        parent = propagate.extract(carrier, context=_EMPTY) if carrier else _EMPTY
        attributes = dict(self._attributes)
        attributes["messaging.operation.type"] = "process"
        name = producer.raw_event_name(payload)
        if name is not None:
            attributes["messaging.message.id"] = name
        span = self._tracer.start_span(self._names[0], context=parent, kind=SpanKind.CONSUMER,
                                       attributes=attributes)
        self._spans[id(payload)] = span
        self._fanout = self._tracer.start_span(self._names[1],
                                               context=trace.set_span_in_context(span))

    def fanned_out(self, subscribers: int, declined: int) -> None:
        """End the ``fan-out`` span: ``subscribers`` in the snapshot, ``declined`` by prefilters."""
        span, self._fanout = self._fanout, None
        if span is not None:
            span.set_attribute("sharedstream.fanout.subscribers", subscribers)
            span.set_attribute("sharedstream.fanout.declined", declined)
            span.end()

    # -- the subscribers ---------------------------------------------------------------

    def pulled(self, trigger_id: Hashable, payload: Any) -> None:
        """Subscriber ``trigger_id`` opened its window on ``payload``'s raw event.

        Called in the task consuming the subscriber's iterator: the ``filter``
        span becomes that task's current span until :meth:`moved_on`.
        """
        self.moved_on(trigger_id)
        parent = self._spans.get(id(payload))
        span = self._tracer.start_span(
            "filter", context=_EMPTY if parent is None else trace.set_span_in_context(parent),
            attributes={"sharedstream.trigger.id": str(trigger_id)},
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        self._filters[trigger_id] = (span, token)

    def moved_on(self, trigger_id: Hashable) -> None:
        """Subscriber ``trigger_id`` closed its window (pulled again, or its iterator ended)."""
        entry = self._filters.pop(trigger_id, None)
        if entry is None:
            return
        span, token = entry
        with contextlib.suppress(Exception):  # another context: the span ends all the same
            otel_context.detach(token)  # type: ignore[arg-type]
        span.end()

    def traceparent(self, trigger_id: Hashable) -> str | None:
        """The ``traceparent`` of subscriber ``trigger_id``'s open ``filter`` span, if any."""
        entry = self._filters.get(trigger_id)
        return None if entry is None else format_traceparent(entry[0])

    # -- advancing ---------------------------------------------------------------------

    def settling(self, batch: Sequence[AdvanceItem]) -> list[tuple[Span, Span]]:
        """Start a ``settle`` span under each item's ``process`` span; what :meth:`settled` ends."""
        spans = self._spans
        started = []
        for item in batch:
            process = spans.pop(id(item.broker_payload), None)
            if process is None:
                continue
            settle = self._tracer.start_span(
                self._names[2], context=trace.set_span_in_context(process), kind=SpanKind.CLIENT,
                attributes={**self._attributes, "messaging.operation.type": "settle"})
            _annotate(process, item)
            started.append((process, settle))
        return started

    def settled(self, started: list[tuple[Span, Span]], error: BaseException | None) -> None:
        """End what :meth:`settling` started; ``error``: ``advance`` raised it."""
        for process, settle in started:
            if error is not None:
                for span in (settle, process):
                    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            settle.end()
            process.end()

    def close(self) -> None:
        """The group ended: end the spans of raw events left to redelivery."""
        spans, self._spans = self._spans, {}
        for span in spans.values():
            span.set_attribute("sharedstream.abandoned", True)
            span.end()
        if self._fanout is not None:
            self._fanout.end()
            self._fanout = None


def _annotate(span: Span, item: AdvanceItem) -> None:
    """The resolution counts and verdicts of ``item`` on its ``process`` span."""
    outcome = item.outcome
    span.set_attribute("sharedstream.outcome.acked", outcome.acked)
    span.set_attribute("sharedstream.outcome.failed", outcome.failed)
    span.set_attribute("sharedstream.outcome.rejected", outcome.rejected)
    verdicts = getattr(outcome, "verdicts", ())
    for verdict in verdicts:
        span.add_event(verdict.resolution, {"sharedstream.trigger.id": str(verdict.trigger_id),
                                            "sharedstream.reason": verdict.reason})


def carrier_of(pairs: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> dict[str, str]:
    """Text-map carrier from headers or attributes: keys lowered, bytes decoded as UTF-8.

    Values that are neither text nor bytes are left out. A ``googclient_``
    prefix (Google's client instrumentation) is dropped, and Azure's
    ``Diagnostic-Id`` counts as ``traceparent`` when there is none.
    """
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    carrier: dict[str, str] = {}
    for key, value in items:
        if isinstance(value, bytes):
            text = value.decode("utf-8", "replace")
        elif isinstance(value, str):
            text = value
        else:
            continue
        name = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
        carrier[name.lower().removeprefix("googclient_")] = text
    if "traceparent" not in carrier and "diagnostic-id" in carrier:
        carrier["traceparent"] = carrier["diagnostic-id"]
    return carrier

"""Spans of ack-mode raw events: process, fan-out, filter, settle, in the message's trace."""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable, Iterator, Mapping
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from sharedstream import (
    SharedStreamManager,
    SharedStreamProducer,
    TriggerEvent,
    reject_shared_stream_event,
)
from sharedstream.engine.tracing import carrier_of, format_traceparent
from tests.engine.harness import FEEDS, Feed, FeedProducer, FeedTrigger, Runner, eventually


class TracedProducer(FeedProducer):
    """Payloads are ``(value, headers)``: the headers carry the trace context."""

    def trace_carrier(self, raw_event: Any, broker_payload: Any) -> Mapping[str, str] | None:
        return carrier_of(broker_payload[1])

    @property
    def messaging_attributes(self) -> Mapping[str, str]:
        return {"messaging.system": "feed", "messaging.destination.name": "orders"}

    def raw_event_name(self, broker_payload: Any) -> str | None:
        return f"orders/{broker_payload[0]}"


class TracedTrigger(FeedTrigger):
    """Starts a span of its own around each event it passes on."""

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        return TracedProducer(FEEDS[kwargs["feed"]])

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        tracer = trace.get_tracer("user-code", tracer_provider=PROVIDERS[0])
        async for raw in shared_stream:
            if raw in self.rejects:
                reject_shared_stream_event("not wanted")
                continue
            if raw in self.skip:
                continue
            with tracer.start_as_current_span(f"user-work {self.name}"):
                pass
            yield TriggerEvent({"raw": raw, "by": self.name})


PROVIDERS: list[TracerProvider] = []


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    PROVIDERS[:] = [provider]
    yield exporter
    PROVIDERS.clear()


def by_name(exporter: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        found.setdefault(span.name, []).append(span)
    return found


def times(span: ReadableSpan) -> tuple[int, int]:
    assert span.start_time is not None
    assert span.end_time is not None
    return span.start_time, span.end_time


def parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def start(manager: SharedStreamManager, name: str, trigger_id: Hashable, **kw: Any) -> Runner:
    return Runner(manager, TracedTrigger("f", name, **kw), trigger_id).start()  # type: ignore[arg-type]


async def test_a_message_s_trace_continues_through_fan_out_filter_and_settle(
    feed: Feed, spans: InMemorySpanExporter
) -> None:
    publisher = PROVIDERS[0].get_tracer("publisher")
    with publisher.start_as_current_span("publish orders") as publish:
        traceparent = format_traceparent(publish)
    assert traceparent is not None
    manager = SharedStreamManager(tracer_provider=PROVIDERS[0])
    a, b = start(manager, "a", 1), start(manager, "b", 2, skip=["m1"])
    feed.items.put_nowait(("m1", ("m1", [("traceparent", traceparent.encode())])))
    await eventually(lambda: len(feed.advanced()) == 1)
    await eventually(lambda: "settle orders" in by_name(spans))
    await a.stop()
    await b.stop()
    await manager.stop_all()
    found = by_name(spans)
    (process,) = found["process orders"]
    publish_context = publish.get_span_context()
    assert process.context.trace_id == publish_context.trace_id
    assert parent_id(process) == publish_context.span_id
    assert process.kind is SpanKind.CONSUMER
    assert process.attributes is not None
    assert dict(process.attributes) == {
        "messaging.system": "feed", "messaging.destination.name": "orders",
        "messaging.operation.type": "process", "messaging.message.id": "orders/m1",
        "sharedstream.outcome.acked": 2, "sharedstream.outcome.failed": 0,
        "sharedstream.outcome.rejected": 0,
    }
    (fanout,) = found["fan-out orders"]
    assert parent_id(fanout) == process.context.span_id
    assert fanout.attributes == {"sharedstream.fanout.subscribers": 2,
                                 "sharedstream.fanout.declined": 0}
    filters = {str(s.attributes["sharedstream.trigger.id"]): s  # type: ignore[index]
               for s in found["filter"]}
    assert sorted(filters) == ["1", "2"]
    assert {parent_id(s) for s in filters.values()} == {process.context.span_id}
    # The filter span is current while trigger code works: its own spans are children.
    (work,) = found["user-work a"]
    assert parent_id(work) == filters["1"].context.span_id
    (settle,) = found["settle orders"]
    assert parent_id(settle) == process.context.span_id
    assert settle.kind is SpanKind.CLIENT
    assert settle.attributes is not None
    assert settle.attributes["messaging.operation.type"] == "settle"
    # The order of events in one message's trace.
    assert times(process)[0] <= times(fanout)[0] <= times(filters["1"])[0]
    assert times(filters["1"])[1] <= times(settle)[0] <= times(settle)[1] <= times(process)[1]
    assert a.raws() == ["m1"]
    assert b.raws() == []


async def test_a_message_without_context_starts_its_own_trace_and_shows_its_verdicts(
    feed: Feed, spans: InMemorySpanExporter
) -> None:
    manager = SharedStreamManager(tracer_provider=PROVIDERS[0])
    runner = start(manager, "a", 1, rejects=["m1"])
    feed.items.put_nowait(("m1", ("m1", [])))
    await eventually(lambda: "process orders" in by_name(spans))
    await runner.stop()
    await manager.stop_all()
    (process,) = by_name(spans)["process orders"]
    assert process.parent is None
    assert process.attributes is not None
    assert process.attributes["sharedstream.outcome.rejected"] == 1
    (event,) = process.events
    assert event.name == "rejected"
    assert event.attributes == {"sharedstream.trigger.id": "1",
                                "sharedstream.reason": "not wanted"}


async def test_raw_events_left_unresolved_at_stop_end_as_abandoned(
    feed: Feed, spans: InMemorySpanExporter
) -> None:
    manager = SharedStreamManager(tracer_provider=PROVIDERS[0])
    runner = Runner(manager, TracedTrigger("f", "a"), 1, auto_confirm=False).start()
    feed.items.put_nowait(("m1", ("m1", [])))
    await eventually(lambda: len(runner.events) == 1)
    await runner.stop()
    await manager.stop_all()
    (process,) = by_name(spans)["process orders"]
    assert process.attributes is not None
    assert process.attributes["sharedstream.abandoned"] is True
    assert "settle orders" not in by_name(spans)


async def test_without_a_provider_nothing_is_traced(
    feed: Feed, spans: InMemorySpanExporter
) -> None:
    manager = SharedStreamManager()
    runner = start(manager, "a", 1)
    header = ("traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01")
    feed.items.put_nowait(("m1", ("m1", [header])))
    await eventually(lambda: len(feed.advanced()) == 1)
    await runner.stop()
    await manager.stop_all()
    assert runner.events
    assert not [s for s in spans.get_finished_spans()
                                  if not s.name.startswith("user-work")]


def test_carriers_are_built_from_headers_attributes_and_properties() -> None:
    assert carrier_of([("TraceParent", b"00-a"), ("n", 3)]) == {"traceparent": "00-a"}
    assert carrier_of({"googclient_traceparent": "00-b"}) == {"traceparent": "00-b"}
    assert carrier_of({b"Diagnostic-Id": b"00-c"}) == {"diagnostic-id": "00-c",
                                                     "traceparent": "00-c"}

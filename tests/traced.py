"""One traced message through a broker's conformance harness: its ``process`` span.

Each broker's tests publish a message carrying :data:`TRACEPARENT` the way
that broker carries it (attributes, application properties) and check, with
:func:`assert_continues`, that the producer's ``trace_carrier`` found it: the
``process`` span is a child of the publisher's span, in its trace.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sharedstream.testing.conformance import Session
from sharedstream.testing.harness import BrokerHarness, Stream
from sharedstream.testing.runner import eventually

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
PUBLISHER_SPAN_ID = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE_ID:032x}-{PUBLISHER_SPAN_ID:016x}-01"


async def traced_process_span(
    harness: BrokerHarness, stream: Stream, publish: Callable[[str], Awaitable[None]],
) -> tuple[ReadableSpan, list[ReadableSpan]]:
    """Publish one message with ``publish(traceparent)`` to a traced stream; its spans."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    session = Session(harness, stream)
    session.manager.tracer_provider = provider
    try:
        session.run()
        await publish(TRACEPARENT)
        await eventually(lambda: any(s.name.startswith("settle ")
                                     for s in exporter.get_finished_spans()),
                         within=20, what="the message settled")
    finally:
        await session.close()
    spans = list(exporter.get_finished_spans())
    (process,) = [s for s in spans if s.name.startswith("process ")]
    return process, spans


def assert_continues(process: ReadableSpan, system: str) -> None:
    """``process`` continues the publisher's trace and names the messaging system."""
    assert process.context.trace_id == TRACE_ID
    assert process.parent is not None
    assert process.parent.span_id == PUBLISHER_SPAN_ID
    assert process.attributes is not None
    assert process.attributes["messaging.system"] == system

"""Traces of a running triggerer on a real Kafka broker.

A record published with a ``traceparent`` header: its ``process`` span
continues that trace, the ``fan-out``, ``filter``, ``store`` and ``settle``
spans hang under it, and the stored event and the DAG run it queued carry
the filter span's context. Then the same through ``[traces]`` with the OTLP
exporter, received by a local OTLP/HTTP endpoint (the protobuf the real
exporter sends, decoded with OpenTelemetry's own message classes).
"""

from __future__ import annotations

import asyncio
import importlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sharedstream.engine.errors import SharedStreamError
from sharedstream.store.sqlite import SqliteStore
from sharedstream.testing.brokers.process import free_port
from sharedstream.testing.brokers.tansu import start_tansu, stop_tansu, tansu_binary
from sharedstream.testing.runner import eventually, eventually_async
from tests.ops.conftest import OpsClient, start_triggerer
from tests.ops.test_readiness import KAFKA_DEFS, create_topic

TRACE_ID = 0x5B8EFFF798038103D269B633813FC60C
PUBLISH_SPAN_ID = 0xEEE19B7EC3C1B174
TRACEPARENT = f"00-{TRACE_ID:032x}-{PUBLISH_SPAN_ID:016x}-01"


@pytest.fixture
async def kafka(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    try:
        binary = tansu_binary()
    except SharedStreamError as exc:
        pytest.skip(str(exc))
    process, address = start_tansu(binary, tmp_path, port=free_port())
    try:
        await create_topic(address, "orders")
        monkeypatch.setenv("OPS_KAFKA_BOOTSTRAP", address)
        monkeypatch.setenv("OPS_KAFKA_TOPIC", "orders")
        yield address
    finally:
        stop_tansu(process)


async def publish(address: str, value: bytes, headers: list[tuple[str, bytes]]) -> None:
    aiokafka: Any = importlib.import_module("aiokafka")  # untyped: held as Any
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=address)
    await producer.start()
    try:
        await producer.send_and_wait("orders", value, headers=headers)
    finally:
        await producer.stop()


def named(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    (span,) = [s for s in spans if s.name == name]
    return span


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


async def test_a_record_s_trace_runs_through_the_triggerer_into_the_store(
    kafka: str, tmp_path: Path
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    triggerer, task = await start_triggerer(tmp_path, definitions=KAFKA_DEFS,
                                            tracer_provider=provider)
    assert triggerer.api is not None
    assert triggerer.api.address is not None
    client = OpsClient("http://{}:{}".format(*triggerer.api.address))

    async def status_runs() -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = json.loads((await client.get("/status")).text)["dag_runs"]
        return runs

    try:
        await publish(kafka, b'{"order": 1}', [("traceparent", TRACEPARENT.encode())])
        await eventually(lambda: any(s.name == "settle orders"
                                     for s in exporter.get_finished_spans()),
                         within=30, what="the record settled")
        await eventually_async(lambda: _count(status_runs()), 1, within=10,
                               what="the run in /status")
        (shown,) = await status_runs()
    finally:
        triggerer.request_stop()
        assert await asyncio.wait_for(task, 60) == 0
    spans = list(exporter.get_finished_spans())
    process = named(spans, "process orders")
    assert process.context.trace_id == TRACE_ID
    assert parent_of(process) == PUBLISH_SPAN_ID
    assert process.attributes is not None
    assert process.attributes["messaging.system"] == "kafka"
    assert process.attributes["messaging.consumer.group.name"] == "ops-readiness"
    assert process.attributes["messaging.message.id"] == "orders/0/0"
    the_filter = named(spans, "filter")
    for child in ("fan-out orders", "filter", "settle orders"):
        assert parent_of(named(spans, child)) == process.context.span_id, child
    store = named(spans, "store")
    assert parent_of(store) == the_filter.context.span_id
    assert {s.context.trace_id for s in spans} == {TRACE_ID}
    # The stored event and the DAG run it queued carry the filter span's context.
    expected = f"00-{TRACE_ID:032x}-{the_filter.context.span_id:016x}-01"
    with SqliteStore(triggerer.config.sqlite_path()) as db:
        (event,) = db.list_events()
        (run,) = db.list_runs()
    assert event.trace_parent == expected
    assert run.trace_parent == expected
    assert shown["trace_parent"] == expected


async def _count(runs: Any) -> int:
    return len(await runs)


class OtlpReceiver:
    """``POST /v1/traces`` of OTLP/HTTP: keeps each decoded span as ``(name, trace id, parent)``."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, bytes, bytes]] = []
        self.requests = 0

    async def receive(self, request: web.Request) -> web.Response:
        self.requests += 1
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        for resource in message.resource_spans:
            for scope in resource.scope_spans:
                self.spans += [(s.name, s.trace_id, s.parent_span_id) for s in scope.spans]
        return web.Response(content_type="application/x-protobuf", body=b"")


async def test_traces_configured_with_otlp_reach_an_otlp_endpoint(
    kafka: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = OtlpReceiver()
    app = web.Application()
    app.router.add_post("/v1/traces", receiver.receive)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    try:
        triggerer, task = await start_triggerer(tmp_path, definitions=KAFKA_DEFS, environ={
            "SHAREDSTREAM__TRACES__ENABLED": "true", "SHAREDSTREAM__TRACES__EXPORTER": "otlp"})
        try:
            await publish(kafka, b'{"order": 2}', [("traceparent", TRACEPARENT.encode())])
            with SqliteStore(triggerer.config.sqlite_path()) as db:
                await eventually_async(lambda: asyncio.to_thread(lambda: len(db.list_runs())),
                                       1, within=30, what="the DAG run")
        finally:
            triggerer.request_stop()
            assert await asyncio.wait_for(task, 60) == 0  # the provider flushes on the way out
    finally:
        await runner.cleanup()
    names = {name for name, _trace, _parent in receiver.spans}
    assert {"process orders", "fan-out orders", "filter", "store", "settle orders"} <= names
    (process,) = [s for s in receiver.spans if s[0] == "process orders"]
    assert process[1] == TRACE_ID.to_bytes(16, "big")
    assert process[2] == PUBLISH_SPAN_ID.to_bytes(8, "big")

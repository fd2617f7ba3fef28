"""The operations endpoint of a running triggerer: probes, metrics, status, bad requests."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from sharedstream.testing.memory_broker import MemoryBroker
from sharedstream.testing.runner import eventually_async
from tests.ops.conftest import OpsClient, Running, start_triggerer
from tests.ops.held import BROKER, HELD, STREAM


def samples(text: str) -> dict[str, list[Sample]]:
    """Parse the exposition strictly (prometheus_client's parser raises on bad lines)."""
    found: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def value(found: dict[str, list[Sample]], name: str, **labels: str) -> float:
    matching = [s.value for s in found.get(name, [])
                if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matching) == 1, (name, labels, found.get(name))
    return matching[0]


async def test_probes_answer_and_the_endpoint_serves_metrics(ops_triggerer: Running) -> None:
    client = ops_triggerer.client
    health = await client.get("/healthz")
    assert (health.status, health.text) == (200, "ok\n")
    assert health.headers["Cache-Control"] == "no-store"

    async def ready() -> bool:
        return (await client.get("/readyz")).status == 200
    await eventually_async(ready, True, what="readiness")
    body = (await client.get("/readyz")).text
    assert body.splitlines() == ["store: ok - answers", "streams: ok - every stream is polling",
                                 "watchers: ok - none stuck"]
    metrics = await client.get("/metrics")
    assert metrics.status == 200
    assert metrics.headers["Content-Type"].startswith("text/plain; version=")
    found = samples(metrics.text)
    assert value(found, "sharedstream_triggers_running") == 2
    assert value(found, "sharedstream_stream_up") == 1


async def test_lag_rises_while_a_watcher_is_held_and_falls_after(ops_triggerer: Running) -> None:
    client, broker = ops_triggerer.client, ops_triggerer.broker
    HELD.clear()
    broker.produce(STREAM, [b"%d" % i for i in range(40)])

    async def held_lag() -> float:
        found = samples((await client.get("/metrics")).text)
        return value(found, "sharedstream_watcher_lag", watchers="held/slow")

    async def lagging() -> bool:
        return await held_lag() >= 30
    await eventually_async(lagging, True, what="the held watcher lagging")
    found = samples((await client.get("/metrics")).text)
    assert value(found, "sharedstream_watcher_lag", watchers="free/fast") == 0
    assert value(found, "sharedstream_stream_outstanding") >= 30
    assert value(found, "sharedstream_lane_outstanding", lane="0") >= 30
    status = json.loads((await client.get("/status")).text)
    (stream,) = status["streams"]
    by_name = {tuple(w["names"]): w for w in stream["watchers"]}
    assert by_name["held/slow",]["queued"] >= 30
    HELD.set()

    async def drained() -> tuple[float, float]:
        found = samples((await client.get("/metrics")).text)
        return (value(found, "sharedstream_watcher_lag", watchers="held/slow"),
                value(found, "sharedstream_stream_outstanding"))
    await eventually_async(drained, (0, 0), what="the lag gone")
    found = samples((await client.get("/metrics")).text)
    assert value(found, "sharedstream_stream_oldest_unresolved_age_seconds") == 0
    assert value(found, "sharedstream_events_stored_total") == 80  # 40 records, 2 watchers
    assert value(found, "sharedstream_raw_events_advanced_total", outcome="clean") == 40


async def test_bad_paths_and_methods_get_4xx(ops_triggerer: Running) -> None:
    client = ops_triggerer.client
    assert (await client.get("/nope")).status == 404
    assert (await client.get("/../etc/passwd")).status == 404
    assert (await client.request("POST", "/readyz")).status == 405
    assert (await client.request("DELETE", "/metrics")).status == 405
    assert (await client.request("POST", "/healthz", data=b"x" * 10_000)).status in (405, 413)
    assert (await client.request("HEAD", "/healthz")).status == 200


async def test_a_full_watcher_queue_pauses_the_poll_and_the_time_is_counted(
    tmp_path: Path,
) -> None:
    MemoryBroker.forget(BROKER)
    HELD.clear()
    triggerer, task = await start_triggerer(
        tmp_path, {"SHAREDSTREAM__TRIGGERER__SHARED_STREAM_SUBSCRIBER_QUEUE_SIZE": "8"})
    assert triggerer.api is not None
    assert triggerer.api.address is not None
    client = OpsClient("http://{}:{}".format(*triggerer.api.address))
    try:
        MemoryBroker.named(BROKER).produce(STREAM, [b"%d" % i for i in range(40)])

        async def paused() -> bool:
            found = samples((await client.get("/metrics")).text)
            return value(found, "sharedstream_stream_paused_seconds_total",
                         reason="watcher_behind") >= 0.3
        await eventually_async(paused, True, what="the poll paused for the held watcher")
        found = samples((await client.get("/metrics")).text)
        assert value(found, "sharedstream_watcher_lag", watchers="held/slow") == 8
        assert value(found, "sharedstream_stream_paused_seconds_total", reason="intake") == 0
    finally:
        HELD.set()
        triggerer.request_stop()
        assert await asyncio.wait_for(task, 30) == 0
        MemoryBroker.forget(BROKER)


async def test_nothing_secret_is_served(ops_triggerer: Running) -> None:
    triggerer, client = ops_triggerer.triggerer, ops_triggerer.client
    ops_triggerer.broker.produce(STREAM, [b"1"])
    key = triggerer.config.store.kwargs_key
    assert key
    secrets = [*key.split(","), BROKER]  # the key, and the broker name inside the stream's key
    for path in ("/", "/status", "/metrics", "/readyz", "/status.js"):
        body = (await client.get(path)).text
        for secret in secrets:
            assert secret not in body, (path, secret)
    status = json.loads((await client.get("/status")).text)
    assert "kwargs" not in json.dumps(status)

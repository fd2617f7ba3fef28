"""The broker's own backlog of a stream: Kafka group lag per partition, through the runtime.

Real parts: a Tansu broker, aiokafka, a triggerer running in this process
with its endpoint, and the ``sharedstream status`` command. The watcher's
filter is held while records are produced, so the group commits nothing:
the broker's lag is every record, per partition; released, it drains to 0.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from sharedstream.runtime.ops_view import stream_label
from sharedstream.testing.memory_broker import MemoryBroker
from sharedstream.testing.runner import eventually_async
from tests.ops.conftest import OpsClient, start_triggerer
from tests.ops.held import BROKER, HELD
from tests.ops.test_endpoint import samples
from tests.ops.test_readiness import create_topic, tansu  # noqa: F401 - tansu: the fixture
from tests.ops.test_why import sharedstream

BACKLOG_DEFS = Path(__file__).with_name("backlog_defs.py")
INTERVAL = "0.3"


async def produce(address: str, topic: str, per_partition: dict[int, int]) -> None:
    aiokafka: Any = importlib.import_module("aiokafka")
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=address)
    await producer.start()
    try:
        for partition, count in per_partition.items():
            for i in range(count):
                await producer.send_and_wait(topic, b"%d" % i, partition=partition)
    finally:
        await producer.stop()


async def lag_metrics(client: OpsClient, stream: str) -> dict[str, float]:
    found = samples((await client.get("/metrics")).text)
    return {s.labels["lane"]: s.value for s in found.get("sharedstream_broker_backlog", [])
            if s.labels["stream"] == stream and s.labels["kind"] == "lag"}


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
async def test_kafka_lag_per_partition_rises_while_held_and_drains_after(
    tansu: tuple[str, int, Path], monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    from sharedstream.testing.brokers.tansu import start_tansu, stop_tansu  # noqa: PLC0415

    binary, port, workdir = tansu
    process, address = start_tansu(binary, workdir, port=port)
    HELD.clear()
    try:
        await create_topic(address, "orders", 2)
        monkeypatch.setenv("OPS_KAFKA_BOOTSTRAP", address)
        monkeypatch.setenv("OPS_KAFKA_TOPIC", "orders")
        triggerer, task = await start_triggerer(
            workdir, definitions=BACKLOG_DEFS,
            environ={"SHAREDSTREAM__API__BACKLOG_INTERVAL": INTERVAL})
        assert triggerer.api is not None
        assert triggerer.api.address is not None
        client = OpsClient("http://{}:{}".format(*triggerer.api.address))
        ((key, _group, _members),) = triggerer.manager.streams()
        label = stream_label(key)
        try:
            await produce(address, "orders", {0: 3, 1: 5})

            async def lag() -> dict[str, float]:
                return await lag_metrics(client, label)
            await eventually_async(lag, {"orders/0": 3, "orders/1": 5}, within=60,
                                   what="the group's lag: every record, per partition")
            found = samples((await client.get("/metrics")).text)
            (known,) = found["sharedstream_broker_backlog_known"]
            assert (known.labels["stream"], known.value) == (label, 1)

            status = json.loads((await client.get("/status")).text)
            (stream,) = status["streams"]
            backlog = stream["broker_backlog"]
            assert (backlog["state"], backlog["detail"]) == ("ok", "")
            assert backlog["lanes"] == [{"lane": "orders/0", "lag": 3},
                                        {"lane": "orders/1", "lag": 5}]
            code, out, err = await sharedstream(workdir, "status", "--url", client.base)
            assert (code, err) == (0, "")
            lines = out.splitlines()
            table = lines[lines.index("BROKER BACKLOG") + 1:]
            assert table[0].split() == ["STREAM", "LANE", "BACKLOG", "AGE_S", "DETAIL"]
            assert all(line.startswith(f"  {label}  ") for line in table[1:3]), table
            rows = [line.removeprefix(f"  {label}").split() for line in table[1:3]]
            assert [tuple(r[:3]) for r in rows] == [("orders/0", "lag", "3"),
                                                    ("orders/1", "lag", "5")]

            HELD.set()
            await eventually_async(lag, {"orders/0": 0, "orders/1": 0}, within=60,
                                   what="the lag drained once the watcher ran")
        finally:
            HELD.set()
            triggerer.request_stop()
            assert await task == 0
    finally:
        HELD.set()
        stop_tansu(process)


async def test_a_broker_that_cannot_tell_shows_na_not_zero(tmp_path: Path) -> None:
    """The memory broker's producer says nothing of its backlog: n/a everywhere, never 0."""
    MemoryBroker.forget(BROKER)
    triggerer, task = await start_triggerer(
        tmp_path, environ={"SHAREDSTREAM__API__BACKLOG_INTERVAL": INTERVAL})
    assert triggerer.api is not None
    assert triggerer.api.address is not None
    client = OpsClient("http://{}:{}".format(*triggerer.api.address))
    try:
        async def state() -> str:
            (stream,) = json.loads((await client.get("/status")).text)["streams"]
            return str(stream["broker_backlog"]["state"])
        await eventually_async(state, "n/a", within=30, what="the backlog polled")
        found = samples((await client.get("/metrics")).text)
        assert "sharedstream_broker_backlog" not in found
        (known,) = found["sharedstream_broker_backlog_known"]
        assert known.value == 0
        code, out, err = await sharedstream(tmp_path, "status", "--url", client.base)
        assert (code, err) == (0, "")
        lines = out.splitlines()
        ((key, _group, _members),) = triggerer.manager.streams()
        line = lines[lines.index("BROKER BACKLOG") + 2]
        assert line.startswith(f"  {stream_label(key)}  "), line
        row = line.removeprefix(f"  {stream_label(key)}").split()
        assert row[:2] == ["-", "n/a"]
        assert " ".join(row[3:]) == "MemorySharedStreamProducer cannot tell its broker's backlog"
    finally:
        triggerer.request_stop()
        assert await task == 0
        MemoryBroker.forget(BROKER)

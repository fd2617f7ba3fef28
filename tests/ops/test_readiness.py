"""``/readyz`` flips when the broker or the store goes away, and back when it returns.

Real parts: a Tansu Kafka broker stopped and started again on its port,
and a PostgreSQL database whose connections are cut and refused (then
allowed again), each under a running triggerer.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sharedstream.engine.errors import SharedStreamError
from sharedstream.testing.brokers.process import free_port
from sharedstream.testing.brokers.tansu import start_tansu, stop_tansu, tansu_binary
from sharedstream.testing.memory_broker import MemoryBroker
from sharedstream.testing.runner import eventually_async
from tests.ops.conftest import OpsClient, start_triggerer
from tests.ops.held import BROKER
from tests.ops.test_endpoint import samples, value

KAFKA_DEFS = Path(__file__).with_name("kafka_defs.py")


async def readiness(client: OpsClient) -> tuple[int, str]:
    answer = await client.get("/readyz")
    return answer.status, answer.text


async def wait_for(client: OpsClient, status: int, line: str, within: float = 60) -> None:
    async def probe() -> bool:
        got, text = await readiness(client)
        return got == status and line in text.splitlines()
    await eventually_async(probe, True, within=within, what=f"/readyz {status} with {line!r}")


async def wait_for_any(client: OpsClient, status: int, lines: tuple[str, ...],
                       within: float = 60) -> str:
    """Wait until ``/readyz`` answers ``status`` with one of ``lines``; return that line."""
    seen: list[str] = []

    async def probe() -> bool:
        got, text = await readiness(client)
        seen[:] = [line for line in lines if line in text.splitlines()]
        return got == status and bool(seen)
    await eventually_async(probe, True, within=within, what=f"/readyz {status} with {lines!r}")
    return seen[0]


@pytest.fixture
def tansu(tmp_path: Path) -> tuple[str, int, Path]:
    try:
        binary = tansu_binary()
    except SharedStreamError as exc:
        pytest.skip(str(exc))
    return binary, free_port(), tmp_path


async def create_topic(address: str, topic: str, partitions: int = 1) -> None:
    admin_module: Any = importlib.import_module("aiokafka.admin")  # untyped: held as Any
    admin = admin_module.AIOKafkaAdminClient(bootstrap_servers=address)
    await admin.start()
    try:
        await admin.create_topics([admin_module.NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
@pytest.mark.timeout(180)  # a broker restart, and the trigger's restart backoff (up to 15 s)
async def test_readiness_follows_the_broker(
    tansu: tuple[str, int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    binary, port, workdir = tansu
    process, address = start_tansu(binary, workdir, port=port)
    try:
        await create_topic(address, "orders")
        monkeypatch.setenv("OPS_KAFKA_BOOTSTRAP", address)
        monkeypatch.setenv("OPS_KAFKA_TOPIC", "orders")
        triggerer, task = await start_triggerer(workdir, definitions=KAFKA_DEFS)
        assert triggerer.api is not None
        assert triggerer.api.address is not None
        client = OpsClient("http://{}:{}".format(*triggerer.api.address))
        try:
            await wait_for(client, 200, "streams: ok - every stream is polling")
            stop_tansu(process)
            # The poll retries in place for about 3 s ("not connected"), then stops and is
            # started again after a backoff ("restarting"); on a loaded machine a probe can
            # miss the first window, so either line is the broker's outage seen.
            away = "streams: FAILED - not connected to the broker: " + _name(triggerer)
            down = "streams: FAILED - restarting: " + _name(triggerer)
            seen = await wait_for_any(client, 503, (away, down))
            found = samples((await client.get("/metrics")).text)
            if seen == away and value(found, "sharedstream_stream_up") == 1:
                assert value(found, "sharedstream_stream_connected") == 0  # the poll rides it out
            process, _ = start_tansu(binary, workdir, port=port)
            await create_topic(address, "orders")  # in-memory storage: the topic is new
            await wait_for(client, 200, "streams: ok - every stream is polling")
            found = samples((await client.get("/metrics")).text)
            assert value(found, "sharedstream_stream_connected") == 1
        finally:
            triggerer.request_stop()
            assert await asyncio.wait_for(task, 60) == 0
    finally:
        stop_tansu(process)


def _name(triggerer: object) -> str:
    from sharedstream.runtime.ops_view import stream_label  # noqa: PLC0415

    ((key, _group, _members),) = triggerer.manager.streams()  # type: ignore[attr-defined]
    name = stream_label(key)
    assert name == "kafka orders (group ops-readiness)"  # the only stream: no digest needed
    return name


@pytest.fixture
async def memory_stream() -> AsyncIterator[None]:
    MemoryBroker.forget(BROKER)
    yield
    MemoryBroker.forget(BROKER)


def _admin(admin_url: str, sql: str, *params: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.encode(), params or None)  # a test database's name, quoted above


async def test_readiness_follows_the_store(
    tmp_path: Path, postgres_url: str, postgres_database: str, memory_stream: None
) -> None:
    name = postgres_database.rsplit("/", 1)[1]
    triggerer, task = await start_triggerer(tmp_path, store_url=postgres_database)
    assert triggerer.api is not None
    assert triggerer.api.address is not None
    client = OpsClient("http://{}:{}".format(*triggerer.api.address))
    try:
        await wait_for(client, 200, "store: ok - answers", within=20)
        _admin(postgres_url, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        _admin(postgres_url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
               "WHERE datname = %s AND pid <> pg_backend_pid()", name)
        got, text = 0, ""

        async def store_down() -> bool:
            nonlocal got, text
            got, text = await readiness(client)
            return got == 503 and text.startswith("store: FAILED - ")
        await eventually_async(store_down, True, within=20, what="the store check failing")
        assert "streams: ok" in text
        _admin(postgres_url, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        await wait_for(client, 200, "store: ok - answers", within=20)
    finally:
        _admin(postgres_url, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        triggerer.request_stop()
        assert await asyncio.wait_for(task, 30) == 0

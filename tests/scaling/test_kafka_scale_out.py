"""Three triggerers, one PostgreSQL, one Kafka topic of six partitions: the broker spreads them.

Every triggerer runs the demo's four watchers (one shared consumer, one
consumer group); Kafka gives each triggerer two partitions. One triggerer is
SIGKILLed mid-stream: the group rebalances its partitions to the other two,
which replay from the last committed offsets. The idempotency keys, unique
across the database, make the replayed records store nothing twice and queue
no DAG run twice; every record is stored exactly once per matching watcher.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from sharedstream.demo import DEFINITIONS, demo_message, matching_assets
from sharedstream.testing.harness import Stream, opened
from tests.kafka.conftest import KafkaHarness, aiokafka, demo_environment, kafka_bootstrap
from tests.scaling.conftest import Cluster

__all__ = ["kafka_bootstrap"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

PARTITIONS = 6
TOTAL = 3000


@pytest.fixture
async def harness(kafka_bootstrap: str) -> AsyncIterator[KafkaHarness]:
    async with opened(KafkaHarness(kafka_bootstrap)) as harness:
        yield harness


async def committed(reader: Any, stream: Stream) -> dict[int, int]:
    """The group's committed offset of each partition (0 before any commit).

    ``reader`` is a consumer of the group that never joins it (Tansu answers
    OffsetFetch, not the admin API's ListConsumerGroupOffsets).
    """
    found = {}
    for partition in range(PARTITIONS):
        offset = await reader.committed(aiokafka.TopicPartition(stream.name, partition))
        found[partition] = offset if offset is not None and offset > 0 else 0
    return found


async def produce(harness: KafkaHarness, stream: Stream, indexes: range) -> None:
    sends = []
    for index in indexes:
        key, value = demo_message(index)
        sends.append(await harness.client.send(stream.name, value, key=key,
                                               partition=index % PARTITIONS))
    await asyncio.gather(*sends)


async def wait_for(condition: Callable[[], Any], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not await condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_three_triggerers_share_the_partitions_and_take_over_a_killed_ones(
    postgres_database: str, harness: KafkaHarness, cluster_factory: Callable[..., Cluster],
) -> None:
    name = f"t-{uuid.uuid4().hex[:10]}"
    stream = Stream(name=name, dead_letter=f"{name}.dlq", group=f"g-{name}")
    await harness.create_topics(stream.name, partitions=PARTITIONS)
    await harness.create_topics(f"{name}.dlq")
    environment = {key: value for key, value in
                   demo_environment(harness.bootstrap, stream).items() if key.startswith("SHARED")}
    cluster = cluster_factory(postgres_database, **environment)
    reader = aiokafka.AIOKafkaConsumer(bootstrap_servers=harness.bootstrap, group_id=stream.group,
                                       enable_auto_commit=False)
    await reader.start()
    try:
        await _run(harness, stream, cluster, reader)
    finally:
        await reader.stop()


async def _run(harness: KafkaHarness, stream: Stream, cluster: Cluster, reader: Any) -> None:
    procs = [cluster.start(index, DEFINITIONS) for index in range(3)]

    async def three_members() -> bool:
        return await harness.consumers_in_group(stream) == 3

    await wait_for(three_members, 30, "three triggerers in the consumer group")
    await produce(harness, stream, range(TOTAL // 2))

    async def some_progress() -> bool:
        return sum((await committed(reader, stream)).values()) >= TOTAL // 5

    await wait_for(some_progress, 30, "a fifth of the records committed")
    victim = procs[1]
    victim.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    victim.wait(timeout=10)
    at_kill = await committed(reader, stream)
    await produce(harness, stream, range(TOTAL // 2, TOTAL))  # every partition gets more

    moved: dict[int, float] = {}
    ends = {p: len(range(p, TOTAL, PARTITIONS)) for p in range(PARTITIONS)}

    async def all_committed() -> bool:
        now = await committed(reader, stream)
        for partition, offset in now.items():
            if offset > at_kill[partition] and partition not in moved:
                moved[partition] = time.monotonic() - killed
        return now == ends

    await wait_for(all_committed, 45, "every record committed by the two survivors")
    takeover = max(moved.values())
    print(f"\nKafka partitions moving after SIGKILL (session timeout 2 s): every partition "
          f"committing again after {takeover:.2f} s; per partition: "
          + ", ".join(f"{p}: {moved[p]:.2f} s" for p in sorted(moved)))
    assert takeover < 15

    rows = {row["pid"]: row for row in cluster.json("triggerers", "list")}
    assert rows[victim.pid]["alive"] is False  # silent for longer than the threshold (3 s)
    for survivor in (procs[0], procs[2]):
        assert rows[survivor.pid]["alive"] is True
        assert len(rows[survivor.pid]["triggers"]) == 4  # every shared trigger, on every one
        survivor.send_signal(signal.SIGTERM)
    assert [proc.wait(timeout=30) for proc in (procs[0], procs[2])] == [0, 0]

    events = cluster.json("events", "list", "--limit", "100000")
    stored = Counter((asset, event["payload"]["value"]["id"])
                     for event in events for asset in event["assets"])
    wanted = Counter((asset, index) for index in range(TOTAL)
                     for asset in matching_assets(*demo_message(index)))
    assert stored == wanted  # every matching (watcher, record) exactly once
    assert len(events) == sum(wanted.values())

    runs = cluster.json("runs", "list", "--limit", "100000")
    assert len({(run["dag_id"], run["run_id"]) for run in runs}) == len(runs)
    for dag in ("ship", "reconcile", "notify"):
        consumed = [e for run in runs if run["dag_id"] == dag for e in run["asset_events"]]
        assert len(consumed) == len(set(consumed)), dag  # no asset event consumed twice
    ship = [run for run in runs if run["dag_id"] == "ship"]
    assert len(ship) == sum(1 for asset, _ in wanted if asset == "orders")  # one per order

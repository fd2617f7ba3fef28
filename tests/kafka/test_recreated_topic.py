"""New records of a recreated topic are not taken for redeliveries (issue 29, part 4).

A topic deleted and created again hands its offsets out anew, so a new
record gets the raw event name (``topic/partition/offset``) of one the
store holds. Through ``sharedstream triggerer`` (the demo definitions) and
Tansu: records are stored, the topic is recreated, new records at the same
offsets must all be stored too (with a warning saying a name was reused),
and reading them all again must store nothing.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest

from sharedstream.demo import demo_message, matching_assets
from sharedstream.testing.harness import Stream
from tests.cli import TriggererCli
from tests.kafka.conftest import KafkaHarness, demo_cli, demo_environment

aiokafka: Any = pytest.importorskip("aiokafka")

RECORDS = 20  # demo records 0..19: none of them malformed
WARNING = "new messages reused the names of stored messages"


def stored_keys(database: Path) -> list[str]:
    """The idempotency keys of the stored trigger events, in id order."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5) as db:
        return [key for (key,) in db.execute("SELECT idem_key FROM trigger_events ORDER BY id")]


def expected_events(indexes: range) -> int:
    return sum(len(matching_assets(*demo_message(i))) for i in indexes)


async def produce(harness: KafkaHarness, topic: str, indexes: range) -> list[int]:
    """Send demo records ``indexes`` to partition 0; their offsets."""
    offsets = []
    for index in indexes:
        key, value = demo_message(index)
        meta = await harness.client.send_and_wait(topic, value, key=key, partition=0)
        offsets.append(meta.offset)
    return offsets


async def consume_all(cli: TriggererCli, harness: KafkaHarness, stream: Stream,
                      events: int, run: int) -> None:
    """Run triggerer ``run`` until ``events`` are stored and the group committed every record."""
    database = cli.dir / "sharedstream.db"
    with cli.running(run) as process:
        async def done() -> bool:
            return (await harness.committed(stream) == RECORDS
                    and len(await asyncio.to_thread(stored_keys, database)) >= events)
        await cli.until(run, process, done)
        await asyncio.sleep(0.5)  # anything stored beyond ``events`` shows up meanwhile


async def reset_group(harness: KafkaHarness, stream: Stream) -> None:
    """Commit offset 0 for the (idle) group: its next member reads every record again."""
    consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=harness.bootstrap,
                                         group_id=stream.group, enable_auto_commit=False)
    await consumer.start()
    try:
        partition = aiokafka.TopicPartition(stream.name, 0)
        consumer.assign([partition])
        await consumer.commit({partition: 0})
    finally:
        await consumer.stop()


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
@pytest.mark.timeout(180)
async def test_new_records_of_a_recreated_topic_are_stored_and_redeliveries_are_not(
    harness: KafkaHarness, tmp_path: Path,
) -> None:
    name = f"recreated-{uuid.uuid4().hex[:10]}"
    stream = Stream(name=name, dead_letter=f"{name}.dlq", group=f"g-{name}")
    await harness.create_topics(stream.name, name + ".dlq")
    cli = demo_cli(tmp_path, demo_environment(harness.bootstrap, stream))
    cli.run("init", "--path", str(cli.config))
    database = cli.dir / "sharedstream.db"

    old = range(RECORDS)
    assert await produce(harness, stream.name, old) == list(range(RECORDS))
    await consume_all(cli, harness, stream, expected_events(old), run=0)
    first = stored_keys(database)
    assert len(first) == expected_events(old), cli.log(0)

    deleted = await harness.admin.delete_topics([stream.name])
    assert all(not error for _, error in deleted.topic_error_codes), deleted
    await harness.create_topics(stream.name)
    new = range(RECORDS, 2 * RECORDS)
    # the scenario itself: the new records take the old records' offsets
    assert await produce(harness, stream.name, new) == list(range(RECORDS))
    await consume_all(cli, harness, stream, len(first) + expected_events(new), run=1)
    second = stored_keys(database)
    assert second[:len(first)] == first
    assert len(second) - len(first) == expected_events(new), cli.log(1)
    # "<trigger>/<topic>/0/<offset>#<index>", and "#<fingerprint>" after it when an old
    # record's event of that trigger holds the name (the watchers matching differ)
    renamed = [key for key in second[len(first):] if key.count("#") == 2]
    assert len(renamed) >= RECORDS // 2, second
    assert all(key.rpartition("#")[0] in first for key in renamed), renamed
    assert not set(second[len(first):]) & set(first)
    warnings = [line for line in cli.log(1).splitlines() if WARNING in line]
    assert warnings, cli.log(1)
    assert all(f"raw_event={name}/0/" in line and "WARNING" in line for line in warnings)
    counts = [int(found[1]) for line in warnings if (found := re.search(r" count=(\d+)", line))]
    assert len(counts) == len(warnings)
    assert sum(counts) == len(renamed), warnings

    # a redelivery of everything (the group starts over): nothing new is stored
    await reset_group(harness, stream)
    await consume_all(cli, harness, stream, len(second), run=2)
    assert stored_keys(database) == second, cli.log(2)
    assert WARNING not in cli.log(2)

"""Re-driving kept dead letters on Kafka: ``KafkaSharedStreamProducer.republish`` on Tansu."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from sharedstream.engine.producer import DeadLetter
from sharedstream.producers.kafka import KafkaRepublishError
from sharedstream.triggers.kafka import KafkaSharedStreamTrigger
from tests.kafka.conftest import GROUP_SETTINGS, KafkaHarness, aiokafka

WITH_HEADERS = (("trace-id", b"4bf92f35"), ("blob", b"\xff\x00\x01"), ("trace-id", b"again"))
NOT_UTF8 = b"\xff\xfe\x00 not text"


def letter(source: str, payload: bytes,
           headers: tuple[tuple[str, bytes], ...] = ()) -> DeadLetter:
    return DeadLetter(stream="kafka orders (group g)", source=source,
                      reason="rejected; no dead_letter_topic configured", triggers=("3",),
                      payload=payload, headers=headers)


def kwargs_of(bootstrap: str, topic: str) -> dict[str, Any]:
    """The trigger's kwargs, as the store keeps them (``serialize()``)."""
    trigger = KafkaSharedStreamTrigger(bootstrap_servers=bootstrap, topics=[topic],
                                       group_id=f"g-{topic}", consumer_overrides=GROUP_SETTINGS)
    return trigger.serialize()[1]


async def read(bootstrap: str, topic: str, partitions: int, count: int,
               *, within: float = 5.0) -> list[Any]:
    """The first ``count`` records of ``topic``'s partitions, read with a plain consumer."""
    reader = aiokafka.AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                       auto_offset_reset="earliest")
    await reader.start()
    try:
        assigned = [aiokafka.TopicPartition(topic, p) for p in range(partitions)]
        reader.assign(assigned)
        await reader.seek_to_beginning(*assigned)
        records: list[Any] = []
        async with asyncio.timeout(within):
            while len(records) < count:
                chunks = await reader.getmany(timeout_ms=100)
                records.extend(r for chunk in chunks.values() for r in chunk)
    finally:
        await reader.stop()
    return records


async def test_letters_come_back_to_their_topic_and_partition(harness: KafkaHarness) -> None:
    topic = f"t-{uuid.uuid4().hex[:10]}"
    await harness.create_topics(topic, partitions=2)
    producer = KafkaSharedStreamTrigger.create_shared_stream_producer(
        kwargs_of(harness.bootstrap, topic))

    await producer.republish([letter(f"{topic}/1/41", b'{"order": 7731}', WITH_HEADERS),
                              letter(f"{topic}/0/42", NOT_UTF8)])

    records = sorted(await read(harness.bootstrap, topic, 2, 2), key=lambda r: r.partition)
    assert [(r.partition, r.value, list(r.headers), r.key) for r in records] == [
        (0, NOT_UTF8, [], None),
        (1, b'{"order": 7731}', list(WITH_HEADERS), None),
    ]
    assert all(r.offset == 0 for r in records)  # new records, not the kept offsets


@pytest.mark.parametrize("source", ["other-topic/0/1", "no-coordinates", "t/x/1"])
async def test_a_letter_of_another_stream_is_refused_before_connecting(source: str) -> None:
    # Nothing listens on port 1: a producer that tried to connect would fail otherwise.
    producer = KafkaSharedStreamTrigger.create_shared_stream_producer(kwargs_of("127.0.0.1:1", "t"))
    with pytest.raises(KafkaRepublishError, match="dead letter") as raised:
        await producer.republish([letter("t/0/1", b"fine"), letter(source, b"x")])
    assert raised.value.retryable is False


async def test_nothing_to_republish_connects_to_nothing() -> None:
    producer = KafkaSharedStreamTrigger.create_shared_stream_producer(kwargs_of("127.0.0.1:1", "t"))
    await producer.republish([])

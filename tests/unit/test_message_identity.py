"""Message fingerprints: the same record gives the same one, another record another one.

And the persistence gate says, once per event, that a new message reused a
stored message's name when the store reports it renamed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from sharedstream.brokerkit.message_identity import message_fingerprint
from sharedstream.producers._kafka_types import KafkaMessage, KafkaPayload, KafkaSettings
from sharedstream.producers._servicebus_types import ServiceBusMessage, ServiceBusPayload
from sharedstream.producers.kafka import KafkaSharedStreamProducer
from sharedstream.producers.servicebus import ServiceBusSharedStreamProducer
from sharedstream.runtime.persist import PersistGate
from sharedstream.store.base import PendingEvent, WriteResult
from tests.log_lines import fields_of, text_of
from tests.unit.test_servicebus_trigger import trigger as servicebus_trigger

KAFKA = KafkaSharedStreamProducer(KafkaSettings("a:1", ["orders"], "g"))


def record(offset: int = 42, key: bytes | None = b"eu", value: bytes | None = b'{"id": 1}',
           timestamp: int = 1_790_000_000_000, epoch: int = 0) -> KafkaPayload:
    message = KafkaMessage("orders", 3, offset, key, value, (), timestamp)
    return KafkaPayload("orders", 3, offset, epoch, message)


def test_a_redelivered_kafka_record_has_the_same_fingerprint() -> None:
    first = KAFKA.raw_event_fingerprint(record())
    # another fetch of the same record, under another assignment, with its own objects
    assert KAFKA.raw_event_fingerprint(record(epoch=3)) == first
    assert first is not None
    assert first.startswith("1790000000000-")


@pytest.mark.parametrize("change", [
    {"value": b'{"id": 2}'}, {"key": b"us"}, {"timestamp": 1_790_000_000_001},
    {"value": None}, {"key": None},
])
def test_another_kafka_record_at_the_same_offset_has_another_fingerprint(
    change: dict[str, object],
) -> None:
    other = record(**change)  # type: ignore[arg-type]
    assert KAFKA.raw_event_name(other) == KAFKA.raw_event_name(record())
    assert KAFKA.raw_event_fingerprint(other) != KAFKA.raw_event_fingerprint(record())


def test_a_kafka_payload_without_its_record_has_no_fingerprint() -> None:
    assert KAFKA.raw_event_fingerprint(KafkaPayload("orders", 3, 42, 0, None)) is None


def test_a_tombstone_and_an_empty_value_are_the_same_bytes() -> None:
    """Documented: ``None`` parts count as empty (the timestamp still tells them apart)."""
    assert message_fingerprint(5, None, None) == message_fingerprint(5, b"", b"") == "5-00000000"


def sb_message(sequence_number: int = 7, body: bytes = b"order 1",
               enqueued_time: str | None = "2026-11-28T10:00:00.123000+00:00",
               delivery_count: int = 0) -> ServiceBusPayload:
    message = ServiceBusMessage("orders", sequence_number=sequence_number, body=body,
                                enqueued_time=enqueued_time, delivery_count=delivery_count)
    return ServiceBusPayload(("message", sequence_number), message, object(), object())


def test_service_bus_fingerprints_tell_a_new_message_from_a_redelivery() -> None:
    producer = ServiceBusSharedStreamProducer(servicebus_trigger().settings())
    first = producer.raw_event_fingerprint(sb_message())
    assert producer.raw_event_fingerprint(sb_message(delivery_count=3)) == first  # redelivery
    for other in (sb_message(body=b"order 2"),
                  sb_message(enqueued_time="2026-11-28T10:05:00+00:00")):
        assert producer.raw_event_name(other) == producer.raw_event_name(sb_message())
        assert producer.raw_event_fingerprint(other) != first


async def test_the_gate_warns_once_per_trigger_and_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def write(batch: Sequence[PendingEvent]) -> WriteResult:
        renamed = tuple((e.trigger_id, str(e.idem_key)) for e in batch if e.fingerprint == "new")
        return WriteResult(stored=len(batch), duplicates=0, asset_events=0, dag_runs=(),
                           renamed=renamed)

    gate = PersistGate(write=write, confirm=lambda seqs: None, batch_max=100, linger=0)
    runner = asyncio.create_task(gate.run())
    for seq, (trigger_id, offset, fingerprint) in enumerate([
        (4, 42, "new"), (4, 43, "old"), (5, 42, "new"), (4, 44, "new"),
    ]):
        gate.offer(PendingEvent(trigger_id, f"{trigger_id}/orders/3/{offset}#0", b"{}",
                                fingerprint=fingerprint), seq)
    with caplog.at_level(logging.WARNING, logger="sharedstream.runtime"):
        await asyncio.wait_for(gate.flush(), 5)
    gate.stop()
    await runner
    lines = [r for r in caplog.records if "reused the names" in text_of(r)]
    assert all(line.levelno == logging.WARNING for line in lines)
    assert "topic or entity recreated?" in text_of(lines[0])
    assert [fields_of(line) for line in lines] == [
        {"trigger": 4, "count": 2, "raw_event": "orders/3/42", "last": "orders/3/44"},
        {"trigger": 5, "count": 1, "raw_event": "orders/3/42", "last": "orders/3/42"},
    ]
    assert (gate.stored, gate.renamed) == (4, 3)

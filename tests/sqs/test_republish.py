"""Re-driving kept dead letters on SQS: ``SqsSharedStreamProducer.republish`` on moto.

Each test runs on a standard and on a FIFO queue (the ``harness`` fixture).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from sharedstream.engine.producer import DeadLetter
from sharedstream.producers._sqs_types import attribute_bytes
from sharedstream.producers.sqs import SqsRepublishError
from sharedstream.testing.harness import Stream
from sharedstream.triggers.sqs import SqsSharedStreamTrigger
from tests.sqs.conftest import SqsHarness

# How the SQS producer keeps a message's attributes: values as bytes, types dropped.
WITH_HEADERS = (("trace-id", b"4bf92f35"), ("amount", b"12.5"), ("blob", b"\xff\x00\x01"))


def letter(source: str, payload: bytes,
           headers: tuple[tuple[str, bytes], ...] = ()) -> DeadLetter:
    return DeadLetter(stream="sqs orders", source=source,
                      reason="rejected; no dead_letter_queue configured", triggers=("3",),
                      payload=payload, headers=headers)


LETTERS = [letter("4f1c-original-id", '{"order": 7731, "city": "Zürich"}'.encode(), WITH_HEADERS),
           letter("9a0e-original-id", b"plain text")]


async def new_stream(harness: SqsHarness) -> Stream:
    """A queue of its own; a FIFO one without content-based deduplication (ids are ours)."""
    fifo = {"ContentBasedDeduplication": "false"} if harness.fifo else {}
    url = await harness.create_queue(f"q-{uuid.uuid4().hex[:10]}", **fifo)
    return Stream(name=url, dead_letter=None, group="")


def producer_for(harness: SqsHarness, stream: Stream) -> Any:
    """The stream's producer, built as the runtime builds it from the stored trigger."""
    kwargs = SqsSharedStreamTrigger(**harness.trigger_kwargs(stream)).serialize()[1]
    return SqsSharedStreamTrigger.create_shared_stream_producer(kwargs)


def headers_of(message: dict[str, Any]) -> list[tuple[str, bytes]]:
    """A received message's attributes as the producer would keep them."""
    return sorted((name, attribute_bytes(value))
                  for name, value in (message.get("MessageAttributes") or {}).items())


async def test_letters_come_back_as_new_messages(harness: SqsHarness) -> None:
    stream = await new_stream(harness)

    await producer_for(harness, stream).republish(LETTERS)

    received = await harness.drain(stream.name)
    if not harness.fifo:  # a standard queue keeps no order
        received.sort(key=lambda m: m["Body"] != LETTERS[0].payload.decode())
    assert [(m["Body"].encode(), headers_of(m)) for m in received] == [
        (LETTERS[0].payload, sorted(WITH_HEADERS)), (LETTERS[1].payload, [])]
    types = {name: value["DataType"] for name, value in received[0]["MessageAttributes"].items()}
    assert types == {"trace-id": "String", "amount": "String", "blob": "Binary"}
    assert {m["MessageId"] for m in received}.isdisjoint(letter.source for letter in LETTERS)
    if harness.fifo:
        assert {m["Attributes"]["MessageGroupId"] for m in received} == {"sharedstream-redrive"}


async def test_a_second_call_sends_again_unless_fifo_deduplicates(harness: SqsHarness) -> None:
    stream = await new_stream(harness)
    producer = producer_for(harness, stream)

    await producer.republish(LETTERS)
    await producer.republish(LETTERS)

    received = await harness.drain(stream.name)
    assert len(received) == (2 if harness.fifo else 4)


async def test_a_body_that_is_not_text_refuses_the_call_before_sending(
    harness: SqsHarness,
) -> None:
    stream = await new_stream(harness)

    with pytest.raises(SqsRepublishError, match=r"9a0e-original-id.*not UTF-8") as raised:
        await producer_for(harness, stream).republish(
            [LETTERS[0], letter("9a0e-original-id", b"\xff\xfe binary")])

    assert raised.value.retryable is False
    assert await harness.drain(stream.name) == []

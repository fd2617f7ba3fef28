"""Re-driving kept dead letters on Pub/Sub: ``PubSubSharedStreamProducer.republish``.

On the testing kit's server (in a thread, as the producer's other tests),
read back with the real ``google-cloud-pubsub`` async client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from sharedstream.engine.producer import DeadLetter
from sharedstream.producers.pubsub import PubSubRepublishError
from sharedstream.testing.harness import Stream, opened
from sharedstream.triggers.pubsub import PubSubSharedStreamTrigger
from tests.pubsub.harness import PubSubHarness, ThreadedPubSubServer

WITH_HEADERS = (("trace-id", b"4bf92f35"), ("city", "Zürich".encode()))
NOT_UTF8 = b"\xff\xfe\x00 not text"


def letter(source: str, payload: bytes,
           headers: tuple[tuple[str, bytes], ...] = ()) -> DeadLetter:
    return DeadLetter(stream="pubsub projects/p/subscriptions/s", source=source,
                      reason="rejected; no dead_letter_topic configured", triggers=("3",),
                      payload=payload, headers=headers)


LETTERS = [letter("1001", b'{"order": 7731}', WITH_HEADERS), letter("1002", NOT_UTF8)]


@pytest.fixture
async def harness(threaded_pubsub_server: ThreadedPubSubServer) -> AsyncIterator[PubSubHarness]:
    async with opened(PubSubHarness(threaded_pubsub_server, keyed=False)) as harness:
        yield harness


def producer_for(harness: PubSubHarness, stream: Stream) -> Any:
    """The stream's producer, built as the runtime builds it from the stored trigger."""
    kwargs = PubSubSharedStreamTrigger(**harness.trigger_kwargs(stream)).serialize()[1]
    return PubSubSharedStreamTrigger.create_shared_stream_producer(kwargs)


async def pull(harness: PubSubHarness, subscription: str, count: int) -> list[Any]:
    """Pull and ack ``count`` messages of ``subscription`` (fails after a few empty pulls)."""
    messages: list[Any] = []
    for _ in range(10):
        response = await harness.subscriber.pull(subscription=subscription, max_messages=count,
                                                 timeout=5)
        received = list(response.received_messages)
        if received:
            await harness.subscriber.acknowledge(subscription=subscription,
                                                 ack_ids=[r.ack_id for r in received])
            messages.extend(r.message for r in received)
        if len(messages) >= count:
            return messages
    raise AssertionError(f"{len(messages)} of {count} messages came")


async def test_letters_come_back_through_the_subscription_s_topic(
    harness: PubSubHarness,
) -> None:
    stream = await harness.create_stream(dead_letter=False)
    other = await harness.create_subscription(harness.topics[stream.name])

    await producer_for(harness, stream).republish(LETTERS)

    received = await pull(harness, stream.name, 2)
    by_data = {bytes(m.data): m for m in received}
    assert set(by_data) == {LETTERS[0].payload, NOT_UTF8}
    assert dict(by_data[LETTERS[0].payload].attributes) == {
        name: value.decode() for name, value in WITH_HEADERS}
    assert dict(by_data[NOT_UTF8].attributes) == {}
    assert {m.ordering_key for m in received} == {""}
    assert {m.message_id for m in received}.isdisjoint({"1001", "1002"})
    # The topic's other subscriptions get the copies too.
    assert {bytes(m.data) for m in await pull(harness, other, 2)} == set(by_data)


async def test_a_header_that_is_not_text_refuses_the_call(harness: PubSubHarness) -> None:
    stream = await harness.create_stream(dead_letter=False)

    with pytest.raises(PubSubRepublishError, match="1003") as raised:
        await producer_for(harness, stream).republish(
            [LETTERS[0], letter("1003", b"x", (("blob", b"\xff"),))])

    assert raised.value.retryable is False
    assert await harness.server.pending(stream.name) == 0

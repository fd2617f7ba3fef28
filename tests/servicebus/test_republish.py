"""Re-driving kept dead letters on Service Bus: ``ServiceBusSharedStreamProducer.republish``.

On the testing kit's server (in a thread, as the producer's other tests),
read back with the real ``azure-servicebus`` SDK.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

pytest.importorskip("azure.servicebus")
pytest.importorskip("proton")

from sharedstream.engine.producer import DeadLetter
from sharedstream.producers.servicebus import ServiceBusRepublishError
from sharedstream.testing.harness import opened
from sharedstream.triggers.servicebus import ServiceBusSharedStreamTrigger
from tests.servicebus.harness import ServiceBusHarness, ThreadedServiceBusServer

WITH_HEADERS = (("trace-id", b"4bf92f35"), ("city", "Zürich".encode()))
NOT_UTF8 = b"\xff\xfe\x00 not text"


def letter(source: str, payload: bytes,
           headers: tuple[tuple[str, bytes], ...] = ()) -> DeadLetter:
    return DeadLetter(stream="servicebus orders", source=source,
                      reason="rejected; kept by hand", triggers=("3",),
                      payload=payload, headers=headers)


LETTERS = [letter("17", b'{"order": 7731}', WITH_HEADERS), letter("18", NOT_UTF8)]


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadedServiceBusServer]:
    server = ThreadedServiceBusServer().start()
    yield server
    server.stop()


@pytest.fixture
async def harness(server: ThreadedServiceBusServer) -> AsyncIterator[ServiceBusHarness]:
    async with opened(ServiceBusHarness(server, sessions=False)) as harness:
        yield harness


def producer_for(kwargs: dict[str, Any]) -> Any:
    """The entity's producer, built as the runtime builds it from the stored trigger."""
    stored = ServiceBusSharedStreamTrigger(**kwargs).serialize()[1]
    return ServiceBusSharedStreamTrigger.create_shared_stream_producer(stored)


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def receive(receiver: Any, count: int) -> list[Any]:
    """``count`` messages of ``receiver`` (completed), in the order they came."""
    taken: list[Any] = []
    async with receiver:
        for _ in range(10):
            for message in await receiver.receive_messages(max_message_count=count,
                                                           max_wait_time=0.5):
                await receiver.complete_message(message)
                taken.append(message)
            if len(taken) >= count:
                return taken
    raise AssertionError(f"{len(taken)} of {count} messages came")


def assert_copies(received: list[Any], *, session: str | None) -> None:
    assert [b"".join(m.body) for m in received] == [LETTERS[0].payload, NOT_UTF8]
    assert [{text(k): text(v) for k, v in (m.application_properties or {}).items()}
            for m in received] == [{k: v.decode() for k, v in WITH_HEADERS}, {}]
    assert [m.message_id for m in received] == [
        hashlib.sha256(x.source.encode() + b"\0" + x.payload).hexdigest() for x in LETTERS]
    assert {m.session_id for m in received} == {session}


async def test_letters_come_back_to_the_queue(harness: ServiceBusHarness) -> None:
    queue = harness.server.take_queue(sessions=False)

    await producer_for({"connection_string": harness.server.connection_string,
                        "queue": queue}).republish(LETTERS)

    received = await receive(harness.client.get_queue_receiver(queue, keep_alive=None), 2)
    assert_copies(received, session=None)


async def test_on_a_session_queue_they_share_one_session(harness: ServiceBusHarness) -> None:
    queue = harness.server.take_queue(sessions=True)

    await producer_for({"connection_string": harness.server.connection_string, "queue": queue,
                        "sessions": True}).republish(LETTERS)

    received = await receive(harness.client.get_queue_receiver(
        queue, session_id="sharedstream-redrive", keep_alive=None), 2)
    assert_copies(received, session="sharedstream-redrive")


async def test_for_a_subscription_they_go_to_its_topic(harness: ServiceBusHarness) -> None:
    await producer_for({"connection_string": harness.server.connection_string,
                        "topic": "events", "subscription": "all"}).republish(LETTERS)

    received = await receive(harness.client.get_subscription_receiver("events", "all",
            keep_alive=None), 2)
    assert_copies(received, session=None)


async def test_a_letter_too_large_refuses_the_call(harness: ServiceBusHarness) -> None:
    queue = harness.server.take_queue(sessions=False)

    with pytest.raises(ServiceBusRepublishError, match="'19' is too large") as raised:
        await producer_for({"connection_string": harness.server.connection_string,
                            "queue": queue}).republish(
            [LETTERS[0], letter("19", b"x" * 2 * 1024 * 1024)])

    assert raised.value.retryable is False
    assert harness.server.unsettled(queue) == 0


async def test_a_header_that_is_not_text_refuses_the_call(harness: ServiceBusHarness) -> None:
    queue = harness.server.take_queue(sessions=False)

    with pytest.raises(ServiceBusRepublishError, match="'20': a header") as raised:
        await producer_for({"connection_string": harness.server.connection_string,
                            "queue": queue}).republish(
            [LETTERS[0], letter("20", b"x", (("blob", b"\xff\x00"),))])

    assert raised.value.retryable is False
    assert harness.server.unsettled(queue) == 0

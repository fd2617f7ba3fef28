"""The Pub/Sub producer when Pub/Sub misbehaves, on the kit's test server and its test hooks.

Each test makes the server do what Pub/Sub does now and then - fail an ack on
an exactly-once subscription, deliver a message that was delivered too often
already, break a stream - and checks what a user would notice: every message
stored once under its name, acked, nothing lost, and the poll going on. The
last one breaks every stream the same way, and checks that it is said.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from unittest import mock

import pytest

from sharedstream.producers import _pubsub_client
from sharedstream.producers.pubsub import (
    DLQ_ATTRIBUTE_DELIVERY_ATTEMPT,
    DLQ_ATTRIBUTE_MESSAGE_ID,
    DLQ_ATTRIBUTE_REASON,
    DLQ_ATTRIBUTE_SUBSCRIPTION,
    PubSubSharedStreamProducer,
)
from sharedstream.testing.conformance import Session, values
from sharedstream.testing.harness import Stream, opened
from sharedstream.testing.runner import eventually, eventually_async
from sharedstream.testing.scripts import Script
from tests.log_lines import fields_of, text_of
from tests.pubsub.harness import (
    PROJECT,
    ConformancePubSubTrigger,
    PubSubHarness,
    ThreadedPubSubServer,
)

PRODUCER_LOG = "sharedstream.producers.pubsub"


def event_names(names: list[str | None]) -> list[str]:
    """The raw event names of a runner's events (their keys less the event index)."""
    return [str(name).rsplit("#", 1)[0] for name in names]


@pytest.fixture
async def keyless(threaded_pubsub_server: ThreadedPubSubServer) -> AsyncIterator[PubSubHarness]:
    async with opened(PubSubHarness(threaded_pubsub_server, keyed=False)) as harness:
        yield harness


def producer_of(stream: Stream) -> PubSubSharedStreamProducer:
    producer = ConformancePubSubTrigger.last[stream.name]
    assert isinstance(producer, PubSubSharedStreamProducer)
    return producer


async def leased(harness: PubSubHarness, stream: Stream) -> int:
    """How many of the stream's messages the server has leased out right now."""
    return await harness.server.acall(lambda service: service.state.counts(stream.name).leased)


async def test_an_exactly_once_ack_that_fails_permanently_is_redelivered_and_stored_once(
    keyless: PubSubHarness, caplog: pytest.LogCaptureFixture,
) -> None:
    """The lease of a message lapses while its watcher works on it (the server ends it).

    The watcher's ack then names a stale ack id: Pub/Sub refuses it with
    ``PERMANENT_FAILURE_INVALID_ACK_ID``. The producer logs that and goes on;
    the message comes again under a new ack id, carries the same raw event
    name (so the store keeps one event), and is acked.
    """
    caplog.set_level(logging.WARNING, logger=PRODUCER_LOG)
    stream = await keyless.create_stream(enable_exactly_once_delivery=True)
    session = Session(keyless, stream)
    try:
        slow = session.run(Script(delay=0.5))
        await keyless.produce(stream, [b"lapses"])
        await eventually_async(lambda: leased(keyless, stream), 1, what="the first lease")
        stale = await keyless.server.acall(lambda service: service.state.lapse(stream.name))
        assert len(stale) == 1
        await eventually_async(lambda: keyless.committed(stream), 1, within=10, what="acked")
        name = keyless.raw_event_name(stream, 0)
        assert set(event_names(slow.names)) == {name}, "every delivery under the message's one name"
        refused = [r for r in caplog.records
                   if "PERMANENT_FAILURE_INVALID_ACK_ID" in r.getMessage()]
        message_id = keyless.sent[stream.name][0]
        assert refused, "the refused ack is logged"
        assert all(text_of(r).startswith("ack did not take") for r in refused), refused
        assert {fields_of(r)["message_id"] for r in refused} == {message_id}

        await keyless.produce(stream, [b"after"])  # the poll goes on, on the same stream
        await eventually(lambda: b"after" in slow.values(), what="a later message")
        await eventually_async(lambda: keyless.committed(stream), 2, what="both acked")
        assert producer_of(stream).calls["StreamingPull"] == 1
        assert await keyless.dead_letters(stream) == []
    finally:
        await session.close()


async def test_a_message_delivered_too_often_is_dead_lettered_on_arrival(
    keyless: PubSubHarness,
) -> None:
    """Poison by ``delivery_attempt``: never fanned out, dead-lettered with its attempt, acked.

    Three consumers before this one took the message and never settled it
    (their leases lapsed). With ``max_redeliveries=1`` the fourth delivery
    is past the limit (more than ``max_redeliveries + 1`` attempts).
    """
    pubsub_dlq = f"projects/{PROJECT}/topics/pubsub-dlq-{uuid.uuid4().hex[:8]}"
    await keyless.publisher.create_topic(name=pubsub_dlq)
    stream = await keyless.create_stream(dead_letter_policy={
        "dead_letter_topic": pubsub_dlq, "max_delivery_attempts": 10})
    await keyless.produce(stream, [b"poison"], attributes={"origin": "web"})
    for _ in range(3):  # a consumer takes it and dies: its lease lapses
        response = await keyless.subscriber.pull(subscription=stream.name, max_messages=1)
        assert len(response.received_messages) == 1
        await keyless.server.acall(lambda service: service.state.lapse(stream.name))

    session = Session(keyless, stream)
    try:
        runner = session.run(max_redeliveries=1)
        await eventually_async(lambda: keyless.committed(stream), 1, what="acked")
        [letter] = await keyless.dead_letters(stream)
        assert (letter.value, letter.reason) == (b"poison", "max_redeliveries")
        assert letter.source == keyless.raw_event_name(stream, 0)
        await keyless.produce(stream, [b"healthy"])  # delivered once: fanned out as usual
        await eventually(lambda: runner.values() == [b"healthy"], what="the healthy message")
        await eventually_async(lambda: keyless.committed(stream), 2, what="both acked")
        assert runner.values() == [b"healthy"], "the poison message never reached a watcher"
    finally:
        await session.close()


async def test_replays_of_a_key_while_its_copies_are_held_are_not_poison(
    threaded_pubsub_server: ThreadedPubSubServer,
) -> None:
    """A key's leases lapse twice while a slow watcher holds every message of the key.

    Pub/Sub replays the key from the lapsed message each time: every message
    comes a third time (``delivery_attempt`` 3) while this producer still
    holds its two earlier copies. With ``max_redeliveries=1`` that count
    alone is past the limit, but none of those deliveries failed: the
    producer discounts the copies it took itself, and nothing is
    dead-lettered (without that, all four were, as poison on arrival).
    """
    async with opened(PubSubHarness(threaded_pubsub_server, keyed=True)) as keyed:
        pubsub_dlq = f"projects/{PROJECT}/topics/pubsub-dlq-{uuid.uuid4().hex[:8]}"
        await keyed.publisher.create_topic(name=pubsub_dlq)
        stream = await keyed.create_stream(dead_letter_policy={
            "dead_letter_topic": pubsub_dlq, "max_delivery_attempts": 10})
        session = Session(keyed, stream)
        try:
            slow = session.run(Script(delay=0.3), max_redeliveries=1)
            await keyed.produce(stream, values(4))
            head = keyed.sent[stream.name][0]
            for _ in range(2):
                await eventually_async(lambda: leased(keyed, stream), 4, what="the key out")
                stale = await keyed.server.acall(
                    lambda service: service.state.lapse(stream.name, [head]))
                assert len(stale) == 4  # the head's lease, and its followers' revoked
            await eventually_async(lambda: keyed.committed(stream), 4, within=30,
                                   what="all acked")
            assert await keyed.dead_letters(stream) == []
            assert sorted(set(slow.values())) == values(4)
        finally:
            await session.close()


async def test_dead_lettered_on_arrival_carries_the_documented_attributes(
    keyless: PubSubHarness,
) -> None:
    """The copy on the dead-letter topic: data, original attributes and ours."""
    pubsub_dlq = f"projects/{PROJECT}/topics/pubsub-dlq-{uuid.uuid4().hex[:8]}"
    await keyless.publisher.create_topic(name=pubsub_dlq)
    stream = await keyless.create_stream(dead_letter_policy={
        "dead_letter_topic": pubsub_dlq, "max_delivery_attempts": 5})
    await keyless.produce(stream, [b"poison"], attributes={"origin": "web"})
    for _ in range(2):
        response = await keyless.subscriber.pull(subscription=stream.name, max_messages=1)
        assert len(response.received_messages) == 1
        await keyless.server.acall(lambda service: service.state.lapse(stream.name))
    session = Session(keyless, stream)
    try:
        runner = session.run(max_redeliveries=0)  # the third delivery is past 0 + 1
        await eventually_async(lambda: keyless.committed(stream), 1, what="acked")
        assert stream.dead_letter is not None
        reader = keyless.letter_readers[stream.dead_letter]
        response = await keyless.subscriber.pull(subscription=reader, max_messages=10)
        [letter] = response.received_messages
        assert letter.message.data == b"poison"
        assert dict(letter.message.attributes) == {
            "origin": "web",
            DLQ_ATTRIBUTE_SUBSCRIPTION: stream.name,
            DLQ_ATTRIBUTE_MESSAGE_ID: keyless.sent[stream.name][0],
            DLQ_ATTRIBUTE_DELIVERY_ATTEMPT: "3",
            DLQ_ATTRIBUTE_REASON: "max_redeliveries",
        }
        assert runner.events == []
        assert producer_of(stream).dead_lettered == 1
    finally:
        await session.close()


async def test_a_broken_stream_is_reopened_and_every_message_is_stored_once_and_acked(
    keyless: PubSubHarness, caplog: pytest.LogCaptureFixture,
) -> None:
    """The server ends the stream UNAVAILABLE mid-run, with messages in flight.

    The producer opens another; what the broken stream had delivered is
    still leased to it and acked by unary calls, and what is published
    later comes on the new stream: each message stored once, all acked.
    """
    caplog.set_level(logging.INFO, logger=PRODUCER_LOG)
    stream = await keyless.create_stream()
    session = Session(keyless, stream)
    try:
        runners = [session.run(Script(delay=0.02)), session.run()]
        await keyless.produce(stream, values(40))
        await eventually(lambda: len(runners[0].events) >= 5, what="some events stored")
        assert len(runners[0].events) < 40, "the break comes mid-run"
        broken = await keyless.server.acall(
            lambda service: service.break_streams(stream.name, status="UNAVAILABLE"))
        assert broken == 1
        await eventually(lambda: producer_of(stream).calls["StreamingPull"] == 2,
                         what="a second stream")
        await keyless.produce(stream, values(20, "late"))
        await eventually_async(lambda: keyless.committed(stream), 60, within=15,
                               what="all acked")
        expected = {keyless.raw_event_name(stream, i) for i in range(60)}
        for runner in runners:
            counts = Counter(event_names(runner.names))
            assert set(counts) == expected
            assert max(counts.values()) == 1, "no message delivered twice"
        assert any("opening another" in r.getMessage() for r in caplog.records)
        await asyncio.sleep(0.2)
        assert producer_of(stream).calls["StreamingPull"] == 2
    finally:
        await session.close()


async def test_a_stream_that_keeps_ending_the_same_way_is_a_warning_and_not_ready(
    keyless: PubSubHarness, caplog: pytest.LogCaptureFixture,
) -> None:
    """Messages larger than the channel takes end every stream that gets one, the same way.

    Our channels take any size; one with a 1 MiB receive limit stands in for
    a channel that does not (gRPC's default, 4 MiB, did that to 9 MB
    messages). With one message a stream, each 2 MiB message ends its
    stream with ``RESOURCE_EXHAUSTED``. The third end in a row is a WARNING
    naming the error and the count, and the producer is not ``connected``
    (the triggerer's readiness check fails) though its poll goes on, with a
    fourth stream open. (The call is counted before the stream is open, so
    that is waited for, not asserted at once.)
    """
    caplog.set_level(logging.INFO, logger=PRODUCER_LOG)
    narrow = (("grpc.max_receive_message_length", 1024 * 1024),)
    stream = await keyless.create_stream()
    session = Session(keyless, stream)
    try:
        with mock.patch.object(_pubsub_client, "CHANNEL_OPTIONS", narrow):
            for n in range(3):
                await keyless.produce(stream, [b"big%d" % n + b"x" * (2 * 1024 * 1024)])
            session.run(max_in_flight=1)

            def warned() -> list[logging.LogRecord]:
                return [r for r in caplog.records if r.levelname == "WARNING"
                        and text_of(r) == "streaming pull keeps ending with the same error; "
                                          "opening another"]

            await eventually(lambda: len(warned()) == 1, within=15, what="the warning")
            fields = fields_of(warned()[0])
            assert fields["times_in_a_row"] == 3
            assert fields["subscription"] == stream.name
            assert str(fields["error"]).startswith("ResourceExhausted: ")
            assert "larger than max" in str(fields["error"])
            producer = producer_of(stream)
            await eventually(lambda: producer.calls["StreamingPull"] >= 4,
                             what="a fourth stream")
            await eventually(lambda: producer._pull.open, what="a stream open")
            assert producer.connected is False
    finally:
        await session.close()

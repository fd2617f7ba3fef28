"""Pub/Sub producer and trigger: the conformance suite on the kit's test server, and more."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import pytest

from sharedstream.engine.producer import DeadLetter
from sharedstream.producers.pubsub import (
    DLQ_ATTRIBUTE_REASON,
    DLQ_ATTRIBUTE_SUBSCRIPTION,
    DLQ_ATTRIBUTE_TRIGGERS,
    PubSubSharedStreamProducer,
)
from sharedstream.testing.conformance import ProducerConformance, Session, values
from sharedstream.testing.harness import Stream, opened
from sharedstream.testing.runner import eventually, eventually_async
from sharedstream.testing.scripts import Script
from sharedstream.triggers.pubsub import PubSubSharedStreamTrigger
from tests.pubsub.harness import ConformancePubSubTrigger, PubSubHarness, ThreadedPubSubServer
from tests.traced import assert_continues, traced_process_span


@pytest.fixture(params=["keyed", "unkeyed"])
async def harness(request: pytest.FixtureRequest,
                  threaded_pubsub_server: ThreadedPubSubServer) -> AsyncIterator[PubSubHarness]:
    keyed = request.param == "keyed"
    async with opened(PubSubHarness(threaded_pubsub_server, keyed=keyed)) as harness:
        yield harness


class TestPubSubConformance(ProducerConformance):
    """The shared producer conformance suite: ordering-key lanes and keyless messages."""


# -- Pub/Sub specifics, on the test server ------------------------------------------------


@pytest.fixture
async def keyed(threaded_pubsub_server: ThreadedPubSubServer) -> AsyncIterator[PubSubHarness]:
    async with opened(PubSubHarness(threaded_pubsub_server, keyed=True)) as harness:
        yield harness


@pytest.fixture
async def keyless(threaded_pubsub_server: ThreadedPubSubServer) -> AsyncIterator[PubSubHarness]:
    async with opened(PubSubHarness(threaded_pubsub_server, keyed=False)) as harness:
        yield harness


def producer_of(stream: Stream) -> PubSubSharedStreamProducer:
    producer = ConformancePubSubTrigger.last[stream.name]
    assert isinstance(producer, PubSubSharedStreamProducer)
    return producer


async def test_ordering_key_lanes_keep_order(keyed: PubSubHarness) -> None:
    """A key whose message keeps failing holds only that key; the order within it is kept."""
    stream = await keyed.create_stream()
    session = Session(keyed, stream)
    try:
        runner = session.run(Script(fail={b"a1": 2}))
        await keyed.produce(stream, values(4, "a"), key="a")
        await keyed.produce(stream, values(4, "b"), key="b")
        await eventually(lambda: set(runner.values()) >= set(values(4, "b")),
                         what="key b, not held behind key a")
        await eventually_async(lambda: keyed.committed(stream), 8, what="committed")
        seen = runner.values()
        assert [v for v in seen if v.startswith(b"a")] == values(4, "a")
        assert [v for v in seen if v.startswith(b"b")] == values(4, "b")
        assert producer_of(stream).calls["ModifyAckDeadline"] >= 2  # the two nacks
    finally:
        await session.close()


async def test_messages_up_to_pubsubs_limit_flow_with_the_others(keyless: PubSubHarness,
                                                                   ) -> None:
    """9 MB messages among small ones: every one reaches the watcher and is acked.

    gRPC's default receive limit (4 MiB) on our channel to an emulator host
    failed every streaming pull whose response carried one: nothing was
    stored and nothing acked, for good.
    """
    stream = await keyless.create_stream()
    session = Session(keyless, stream)
    big = [f"big{i}".encode() + b"x" * (9 * 1024 * 1024) for i in range(3)]
    small = values(60)
    try:
        runner = session.run()
        await keyless.produce(stream, small[:30])
        for value in big:  # one per publish request: a request is at most 10 MB
            await keyless.produce(stream, [value])
        await keyless.produce(stream, small[30:])
        await eventually(lambda: len(runner.values()) == 63, within=60, what="all 63")
        await eventually_async(lambda: keyless.committed(stream), 63, within=30,
                               what="all acked")
        assert sorted(runner.values()) == sorted(small + big)
        assert await keyless.dead_letters(stream) == []
    finally:
        await session.close()


async def test_a_dead_letter_copy_pubsub_refuses_goes_to_the_fallback(
        keyless: PubSubHarness) -> None:
    """A rejected message with 99 attributes: the copy for the dead-letter topic carries ours
    too, past Pub/Sub's 100, and is refused. It goes to the engine's dead-letter fallback
    with its own attributes, and is acked; a rejected message with room left goes to the
    topic as usual (docs/pubsub.md, "no dead-letter topic, or Pub/Sub refuses the copy")."""
    stream = await keyless.create_stream()
    session = Session(keyless, stream)
    kept: list[DeadLetter] = []

    async def keep(letter: DeadLetter) -> None:
        kept.append(letter)

    session.manager.dead_letter_fallback = keep
    crowded = {f"a{i:02}": "v" for i in range(99)}
    try:
        session.run(Script(reject={b"crowded", b"roomy"}))
        await keyless.produce(stream, [b"crowded"], attributes=crowded)
        await keyless.produce(stream, [b"roomy"], attributes={"a": "v"})
        await eventually_async(lambda: keyless.committed(stream), 2, what="both acked")
        [letter] = kept
        assert (letter.payload, letter.source) == (b"crowded", keyless.sent[stream.name][0])
        assert "the dead_letter_topic refused it" in letter.reason
        assert "attribute_count is too large" in letter.reason
        assert {k: v.decode() for k, v in letter.headers} == crowded
        assert [d.value for d in await keyless.dead_letters(stream)] == [b"roomy"]
    finally:
        await session.close()


async def test_a_nacked_message_is_redelivered_and_stored_once(keyless: PubSubHarness) -> None:
    """A failure nacks the message: it comes again, to the failed watcher, under the same name.

    The healthy watcher may see the redelivered copy too; it carries the same
    raw event name, so the store keeps its event once.
    """
    stream = await keyless.create_stream()
    session = Session(keyless, stream)
    try:
        healthy = session.run()
        flaky_script = Script(fail={b"m1": 1})
        flaky = session.run(flaky_script)
        await keyless.produce(stream, values(3))
        await eventually(lambda: set(flaky.values()) == set(values(3)), what="the redelivery")
        await eventually_async(lambda: keyless.committed(stream), 3, what="committed")
        assert flaky_script.failures == 1
        assert sorted(flaky.values()) == values(3)  # m1 emitted once, after the redelivery
        assert len(set(healthy.names)) == 3
        assert await keyless.dead_letters(stream) == []
    finally:
        await session.close()


@pytest.mark.slow
async def test_a_watcher_slower_than_the_ack_deadline_causes_no_redelivery(
    keyless: PubSubHarness,
) -> None:
    """A filter spending 12 s on a message with a 10 s deadline: the lease is extended."""
    stream = await keyless.create_stream()
    session = Session(keyless, stream)
    try:
        slow = session.run(Script(delay=12.0), ack_deadline=10)
        fast = session.run(ack_deadline=10)
        await keyless.produce(stream, [b"slow"])
        await eventually(lambda: slow.values() == [b"slow"], within=30, what="the slow watcher")
        await eventually_async(lambda: keyless.committed(stream), 1, what="acked")
        assert fast.values() == [b"slow"], "delivered once: never redelivered"
        [event] = slow.events
        assert event.payload["delivery_attempt"] is None
        assert producer_of(stream).calls["ModifyAckDeadline"] >= 1  # the extensions
    finally:
        await session.close()


async def test_dead_letters_carry_the_original_and_the_verdict(keyless: PubSubHarness) -> None:
    """A rejected message is published to the dead-letter topic with its attributes, then acked."""
    stream = await keyless.create_stream()
    session = Session(keyless, stream)
    try:
        picky = session.run(Script(reject={b"m0"}))
        await keyless.produce(stream, values(1), attributes={"origin": "web"})
        await eventually_async(lambda: keyless.committed(stream), 1, what="acked")
        assert stream.dead_letter is not None
        reader = keyless.letter_readers[stream.dead_letter]
        response = await keyless.subscriber.pull(subscription=reader, max_messages=10)
        [letter] = response.received_messages
        attributes = dict(letter.message.attributes)
        assert letter.message.data == b"m0"
        assert attributes["origin"] == "web"
        assert attributes[DLQ_ATTRIBUTE_REASON] == "rejected"
        assert attributes[DLQ_ATTRIBUTE_TRIGGERS] == str(picky.trigger_id)
        assert attributes[DLQ_ATTRIBUTE_SUBSCRIPTION] == stream.name
        assert producer_of(stream).dead_lettered == 1
    finally:
        await session.close()


async def test_watchers_of_one_subscription_share_one_stream(keyless: PubSubHarness) -> None:
    """Three watchers with the same settings: one producer, one StreamingPull."""
    stream = await keyless.create_stream()
    session = Session(keyless, stream)
    try:
        runners = [session.run(), session.run(Script(skip={b"m0"})), session.run()]
        await keyless.produce(stream, values(3))
        await eventually_async(lambda: keyless.committed(stream), 3, what="committed")
        await eventually(lambda: all(len(r.events) >= 2 for r in runners), what="fan-out")
        assert keyless.producers_created(stream) == 1
        assert producer_of(stream).calls["StreamingPull"] == 1
    finally:
        await session.close()


async def test_other_settings_on_one_subscription_are_refused(keyless: PubSubHarness) -> None:
    """A second stream of one subscription with other settings would split it: refused."""
    stream = await keyless.create_stream()
    kwargs = keyless.trigger_kwargs(stream)
    first = PubSubSharedStreamTrigger(**kwargs)
    other = PubSubSharedStreamTrigger(**{**kwargs, "max_in_flight": 7})
    assert first.shared_stream_key() != other.shared_stream_key()
    short = PubSubSharedStreamTrigger(**{**kwargs, "subscription": stream.name.rsplit("/", 1)[1]})
    assert short.shared_stream_key() == first.shared_stream_key()
    with pytest.raises(ValueError, match=r"ack_deadline must be within 10\.\.600"):
        PubSubSharedStreamTrigger(**{**kwargs, "ack_deadline": 5})


async def test_a_message_s_trace_context_is_continued(keyless: PubSubHarness) -> None:
    """``traceparent`` in the attributes: the ``process`` span continues the publisher's trace."""
    stream = await keyless.create_stream()
    process, _ = await traced_process_span(keyless, stream, lambda traceparent: keyless.produce(
        stream, values(1), attributes={"googclient_traceparent": traceparent}))
    assert_continues(process, "gcp_pubsub")
    assert process.attributes is not None
    assert process.attributes["messaging.destination.name"] == stream.name



async def test_replays_of_a_key_do_not_make_its_healthy_messages_poison(
        keyed: PubSubHarness) -> None:
    """Each nack of a key's message replays every later message of the key, and Pub/Sub
    counts each replay as a delivery (``delivery_attempt``, with a dead-letter policy). Three
    messages that keep failing one after the other push the healthy ones behind them to 4
    deliveries and more, past ``max_redeliveries + 1``: none of those was their own failure,
    and they must not be dead-lettered. (The policy's own limit, 100, is never reached.)"""
    plain = await keyed.create_stream()
    topic = keyed.topics[plain.name]
    policy = await keyed.create_subscription(
        topic, enable_message_ordering=True, ack_deadline_seconds=10,
        dead_letter_policy={"dead_letter_topic": plain.dead_letter,
                            "max_delivery_attempts": 100})
    keyed.topics[policy] = topic
    stream = Stream(name=policy, dead_letter=plain.dead_letter, group="")
    session = Session(keyed, stream)
    try:
        script = Script(fail={b"m0": -1, b"m1": -1, b"m2": -1}, delay=0.2)
        runner = session.run(script, max_redeliveries=1)
        await keyed.produce(stream, values(6))
        await eventually_async(lambda: keyed.committed(stream), 6, within=30, what="committed")
        letters = await keyed.dead_letters(stream)
        assert Counter(letter.value for letter in letters) == Counter(values(3))
        assert set(runner.values()) == set(values(6)[3:])
    finally:
        await session.close()

"""Service Bus producer and trigger: the conformance suite on the kit's test server, and more.

The conformance suite runs four times: session lanes and plain messages,
each straight to the server and through the kit's latency proxy with a
20 ms round trip (``-20ms``, marked slow: a real network's latency, where
anything that takes a round trip per message shows).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any

import pytest

pytest.importorskip("azure.servicebus")
pytest.importorskip("proton")

from azure.servicebus import ServiceBusMessage

from sharedstream.engine.events import TriggerEvent
from sharedstream.engine.manager import SharedStreamManager
from sharedstream.producers.servicebus import (
    ServiceBusConfigError,
    ServiceBusRequestError,
    ServiceBusSharedStreamProducer,
)
from sharedstream.testing.conformance import ProducerConformance, Session, values
from sharedstream.testing.harness import Stream, opened
from sharedstream.testing.latency_proxy import latency_proxy
from sharedstream.testing.runner import SupervisedRunner, eventually, eventually_async
from sharedstream.testing.scripts import Script
from sharedstream.testing.servicebus.server import connection_string
from sharedstream.triggers.servicebus import ServiceBusSharedStreamTrigger
from tests.log_lines import fields_of
from tests.servicebus.harness import (
    SESSION,
    SHORT_LOCK,
    ConformanceServiceBusTrigger,
    ServiceBusHarness,
    ThreadedServiceBusServer,
)
from tests.traced import assert_continues, traced_process_span


@pytest.fixture(scope="module")
def threaded_servicebus_server() -> Iterator[ThreadedServiceBusServer]:
    server = ThreadedServiceBusServer().start()
    yield server
    server.stop()


FAR = 0.01
"""Seconds each way through the latency proxy of the ``-20ms`` harnesses."""


@pytest.fixture(scope="module")
def far_servicebus(threaded_servicebus_server: ThreadedServiceBusServer) -> Iterator[str]:
    """A connection string reaching the module's server through the latency proxy."""
    with latency_proxy("127.0.0.1", threaded_servicebus_server.port, delay=FAR,
                       jitter=FAR / 10, seed=20) as proxy:
        yield connection_string(proxy.host, proxy.port)


@pytest.fixture(params=["sessions", "plain",
                        pytest.param("sessions-20ms", marks=pytest.mark.slow),
                        pytest.param("plain-20ms", marks=pytest.mark.slow)])
async def harness(request: pytest.FixtureRequest,
                  threaded_servicebus_server: ThreadedServiceBusServer,
                  ) -> AsyncIterator[ServiceBusHarness]:
    kind = str(request.param)
    via = request.getfixturevalue("far_servicebus") if kind.endswith("-20ms") else None
    async with opened(ServiceBusHarness(threaded_servicebus_server,
                                        sessions=kind.startswith("sessions"), via=via)) as h:
        yield h


class TestServiceBusConformance(ProducerConformance):
    """The shared producer conformance suite: session lanes and plain messages."""


# -- Service Bus specifics, on the test server ------------------------------------------------


@pytest.fixture
async def plain(threaded_servicebus_server: ThreadedServiceBusServer,
                ) -> AsyncIterator[ServiceBusHarness]:
    async with opened(ServiceBusHarness(threaded_servicebus_server, sessions=False)) as h:
        yield h


@pytest.fixture
async def sessions(threaded_servicebus_server: ThreadedServiceBusServer,
                   ) -> AsyncIterator[ServiceBusHarness]:
    async with opened(ServiceBusHarness(threaded_servicebus_server, sessions=True)) as h:
        yield h


def producer_of(queue: str) -> ServiceBusSharedStreamProducer:
    producer = ConformanceServiceBusTrigger.last[queue]
    assert isinstance(producer, ServiceBusSharedStreamProducer)
    return producer


async def test_sessions_keep_their_order_while_other_sessions_proceed(
    sessions: ServiceBusHarness,
) -> None:
    """A failure holds its session only: its later messages come again after it, in order."""
    stream = await sessions.create_stream()
    session = Session(sessions, stream)
    try:
        healthy = session.run()
        flaky = session.run(Script(fail={b"a1": 1}))
        async with sessions.client.get_queue_sender(stream.name, keep_alive=None) as sender:
            for n in range(4):  # interleaved: a0 b0 c0 a1 b1 c1 ...
                for name in "abc":
                    await sender.send_messages(ServiceBusMessage(f"{name}{n}", session_id=name))
        sessions.sent[stream.name] = 12
        await eventually_async(lambda: sessions.committed(stream), 12, what="all completed")
        await eventually(lambda: len(set(flaky.values())) == 12, what="the flaky watcher")
        for runner in (healthy, flaky):
            seen = runner.values()
            for name in "abc":
                mine = [v for v in seen if v.startswith(name.encode())]
                firsts = list(dict.fromkeys(mine))
                assert firsts == [f"{name}{n}".encode() for n in range(4)], (name, mine)
        session_a = [v for v in healthy.values() if v.startswith(b"a")]
        rewind = session_a.index(b"a1", session_a.index(b"a1") + 1)  # a1 came again
        expected = [b"a0", b"a1", b"a2", b"a3"]
        assert session_a[:rewind] == expected[:rewind], session_a
        assert session_a[rewind:] == expected[1:], "session a again from a1, in order"
        assert sorted(v for v in healthy.values() if v.startswith((b"b", b"c"))) == sorted(
            f"{name}{n}".encode() for n in range(4) for name in "bc")
        assert await sessions.dead_letters(stream) == []
    finally:
        await session.close()


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
async def test_a_watcher_slower_than_the_lock_causes_no_redelivery(
    plain: ServiceBusHarness, caplog: pytest.LogCaptureFixture,
) -> None:
    """The entity's lock (2 s) is shorter than lock_duration: renewal follows the real one."""
    stream = Stream(name="short-lock", dead_letter="short-lock/$DeadLetterQueue", group="")
    session = Session(plain, stream)
    try:
        slow = session.run(Script(delay=SHORT_LOCK * 2.5), lock_duration=60)
        await plain.produce(stream, [b"slow"])
        await eventually(lambda: slow.values() == [b"slow"], within=15, what="the slow watcher")
        await eventually_async(lambda: plain.committed(stream), 1, what="completed")
        assert slow.values() == [b"slow"], "delivered once: its lock was renewed"
        assert slow.events[0].payload["delivery_count"] == 0
        assert producer_of("short-lock").calls["RenewLock"] >= 2
        [shorter] = [r for r in caplog.records
                     if r.getMessage().startswith("message locks are shorter than lock_duration")]
        assert fields_of(shorter)["lock_duration_s"] == 60
    finally:
        await session.close()


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
async def test_a_watcher_slower_than_the_session_lock_causes_no_redelivery(
    sessions: ServiceBusHarness,
) -> None:
    """The session's lock (2 s) is renewed on what the session shows, not on lock_duration."""
    stream = Stream(name="short-session-lock", dead_letter=None, group="")
    session = Session(sessions, stream)
    try:
        slow = session.run(Script(delay=SHORT_LOCK * 2.5), lock_duration=60)
        await sessions.produce(stream, [b"slow"])
        await eventually(lambda: slow.values() == [b"slow"], within=15, what="the slow watcher")
        await eventually_async(lambda: sessions.committed(stream), 1, what="completed")
        assert slow.values() == [b"slow"], "delivered once: the session lock held"
        assert slow.events[0].payload["delivery_count"] == 0
        assert producer_of("short-session-lock").calls["RenewSessionLock"] >= 2
    finally:
        await session.close()


async def test_a_message_delivered_too_often_is_dead_lettered_on_arrival(
    plain: ServiceBusHarness,
) -> None:
    """Poison by delivery count: never fanned out, dead-lettered with the reason, not lost."""
    stream = await plain.create_stream()
    await plain.produce(stream, [b"poison"])
    async with plain.client.get_queue_receiver(stream.name, max_wait_time=2,
            keep_alive=None) as taker:
        for _ in range(3):  # a consumer takes it and gives it back: delivery count 3
            [message] = await taker.receive_messages(max_message_count=1, max_wait_time=2)
            await taker.abandon_message(message)
    session = Session(plain, stream)
    try:
        runner = session.run(max_redeliveries=1)
        await eventually_async(lambda: plain.committed(stream), 1, what="dead-lettered")
        [letter] = await plain.dead_letters(stream)
        assert (letter.value, letter.reason) == (b"poison", "max_redeliveries")
        assert letter.source == plain.raw_event_name(stream, 0)
        await plain.produce(stream, [b"healthy"])
        await eventually(lambda: runner.values() == [b"healthy"], what="the healthy message")
        await eventually_async(lambda: plain.committed(stream), 2, what="both settled")
    finally:
        await session.close()


def nested(depth: int) -> dict[str, Any]:
    """A map ``depth`` maps deep: past the SDK's decoder (64) from 65 on."""
    value: dict[str, Any] = {"kind": "deep"}
    for _ in range(depth):
        value = {"x": value}
    return value


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
async def test_odd_bodies_neither_stall_nor_poison_their_neighbours(
    harness: ServiceBusHarness,
) -> None:
    """AMQP value and sequence bodies among data ones: each handled alone, the others untouched.

    A map body (a JMS ``MapMessage``) is its JSON, a sequence body the JSON
    array of its items; a map nested past the SDK's decoder (80 deep) is
    dead-lettered alone with ``sharedstream.rejected`` and the reason, the
    rest stored and completed. Before: the map failed the receive's whole
    batch, and the deep one shut the SDK's link and held the event loop.
    """
    amqp = pytest.importorskip("azure.servicebus.amqp")
    stream = await harness.create_stream()
    session = SESSION if harness.sessions else None
    group = {"group_id": session} if session else None

    def value(body: Any) -> Any:
        return amqp.AmqpAnnotatedMessage(value_body=body, properties=group)

    sent = [ServiceBusMessage(b'{"n": 0}', session_id=session), value({"n": 1, "kind": "map"}),
            ServiceBusMessage(b'{"n": 2}', session_id=session), value(nested(80)),
            amqp.AmqpAnnotatedMessage(sequence_body=[[3, "three"]], properties=group),
            ServiceBusMessage(b'{"n": 4}', session_id=session)]
    manager = SharedStreamManager(ack_timeout=30.0)
    runner = SupervisedRunner(manager, ServiceBusSharedStreamTrigger(
        **harness.trigger_kwargs(stream), payload_format="json"), 1).start()
    try:
        async with harness.client.get_queue_sender(stream.name, keep_alive=None) as sender:
            await sender.send_messages(sent)
        await eventually(lambda: len(runner.events) == 5, within=20, what="five events")
        await eventually(lambda: harness.server.unsettled(stream.name) == 0, within=20,
                         what="every message settled")
        assert [e.payload["value"] for e in runner.events] == [
            {"n": 0}, {"n": 1, "kind": "map"}, {"n": 2}, [3, "three"], {"n": 4}]
        receiver = harness.client.get_queue_receiver(
            stream.name, sub_queue="deadletter", max_wait_time=1, keep_alive=None)
        async with receiver:  # the producer guarded the SDK's decoder: the letter arrives
            [letter] = await receiver.receive_messages(max_message_count=10, max_wait_time=1)
            await receiver.complete_message(letter)
        assert letter.sequence_number == 4
        assert letter.dead_letter_reason == "sharedstream.rejected"
        assert letter.dead_letter_error_description.startswith(
            "undecodable body: the SDK could not decode the message (ValueError: AMQP value "
            "nesting exceeds maximum depth of 64)")
    finally:
        await runner.stop()
        await manager.stop_all()


async def test_a_receive_link_the_sdk_shut_down_ends_the_poll_without_holding_the_loop(
    plain: ServiceBusHarness, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the decoder guard, the deep map shuts the SDK's link: the poll ends, promptly.

    The shut-down receiver returns nothing at once, forever, never yielding
    to the event loop; receiving again and again held the loop (signals
    too). The producer takes three such receives in a row for what they
    are and ends the poll (the runtime restarts it), the loop never held.
    """
    receiver_async = pytest.importorskip("azure.servicebus._pyamqp.aio._receiver_async")
    decode = pytest.importorskip("azure.servicebus._pyamqp._decode")
    amqp = pytest.importorskip("azure.servicebus.amqp")
    monkeypatch.setattr(receiver_async, "decode_payload", decode.decode_payload)
    monkeypatch.setattr("sharedstream.producers.servicebus.guard_sdk_decoder", lambda _: False,
                        raising=False)
    stream = await plain.create_stream()
    async with plain.client.get_queue_sender(stream.name, keep_alive=None) as sender:
        await sender.send_messages([ServiceBusMessage(b"before"),
                                    amqp.AmqpAnnotatedMessage(value_body=nested(80))])
    producer = ServiceBusSharedStreamProducer(ServiceBusSharedStreamTrigger(
        **plain.trigger_kwargs(stream)).settings())
    loop, gaps = asyncio.get_running_loop(), [0.0]

    async def heartbeat() -> None:
        while True:
            before = loop.time()
            await asyncio.sleep(0.01)
            gaps.append(loop.time() - before)

    beating = asyncio.create_task(heartbeat(), name="heartbeat")
    polled = producer.open_stream()
    assert isinstance(polled, AsyncGenerator)
    try:
        message, _ = await asyncio.wait_for(anext(polled), 10)
        assert message.body == b"before"
        with pytest.raises(ServiceBusRequestError, match="receive link has shut down"):
            await asyncio.wait_for(anext(polled), 10)
        assert max(gaps) < 1.0, f"the event loop was held {max(gaps):.1f} s"
    finally:
        beating.cancel()
        await polled.aclose()
        await producer.aclose()


async def test_watchers_of_a_topic_subscription_match_on_properties(
    plain: ServiceBusHarness,
) -> None:
    """Two watchers of one subscription, one receiver: each fires for its tenant's messages."""
    manager = SharedStreamManager(ack_timeout=30.0)
    kwargs: dict[str, Any] = {
        "connection_string": plain.server.connection_string, "topic": "events",
        "subscription": "all", "lock_duration": 5, "max_wait_time": 0.5, "payload_format": "json"}
    runners = [SupervisedRunner(manager, ServiceBusSharedStreamTrigger(
        **kwargs, match={"properties": {"tenant": tenant}}), n).start()
        for n, tenant in enumerate(["t1", "t2"], 1)]
    try:
        async with plain.client.get_topic_sender("events", keep_alive=None) as sender:
            await sender.send_messages([
                ServiceBusMessage(json.dumps({"n": n}), application_properties={
                    "tenant": "t1" if n % 2 else "t2"}) for n in range(6)])
        await eventually(lambda: all(len(r.events) == 3 for r in runners), what="both tenants")
        assert [e.payload["value"]["n"] for e in runners[0].events] == [1, 3, 5]
        assert [e.payload["value"]["n"] for e in runners[1].events] == [0, 2, 4]
        assert runners[0].events[0].payload["properties"] == {"tenant": "t1"}
        await eventually(lambda: plain.server.unsettled("events/subscriptions/all") == 0,
                         what="all completed")
    finally:
        for runner in runners:
            await runner.stop()
        await manager.stop_all()


async def test_other_settings_on_one_entity_are_refused(plain: ServiceBusHarness) -> None:
    """A second receiver of one queue with other settings would split it: refused on open."""
    stream = await plain.create_stream()
    kwargs = plain.trigger_kwargs(stream)
    first = ServiceBusSharedStreamProducer(
        ServiceBusSharedStreamTrigger(**kwargs).settings())
    other = ServiceBusSharedStreamProducer(
        ServiceBusSharedStreamTrigger(**{**kwargs, "max_messages": 7}).settings())
    opened_stream = first.open_stream()
    assert isinstance(opened_stream, AsyncGenerator)
    try:
        await plain.produce(stream, [b"m0"])
        message, _ = await asyncio.wait_for(anext(opened_stream), 10)
        assert message.body == b"m0"
        with pytest.raises(ServiceBusConfigError, match="already consumed in this process"):
            await anext(other.open_stream())
    finally:
        await opened_stream.aclose()
        await first.aclose()
        await other.aclose()


async def test_a_missing_queue_is_one_clear_configuration_error(
    plain: ServiceBusHarness,
) -> None:
    """No such queue: the poll ends with a configuration error naming it (not retried)."""
    producer = ServiceBusSharedStreamProducer(ServiceBusSharedStreamTrigger(
        connection_string=plain.server.connection_string, queue="no-such-queue").settings())
    try:
        with pytest.raises(ServiceBusConfigError, match=r"no-such-queue.*not found"):
            await asyncio.wait_for(anext(producer.open_stream()), 30)
    finally:
        await producer.aclose()


class _SlowOnFirstDelivery(ServiceBusSharedStreamTrigger):
    """Spends 8 s on a message's first delivery, none on a redelivery."""

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        async for message in shared_stream:
            if message.delivery_count == 0:
                await asyncio.sleep(8)
            yield TriggerEvent({"delivery_count": message.delivery_count})


@pytest.mark.slow
async def test_a_lost_lock_is_a_redelivery_stored_once_never_a_loss(
    plain: ServiceBusHarness,
) -> None:
    """Renewal stops at max_lock_renewal; the lock lapses; the copy that comes is the same event.

    The 2 s lock is renewed for 5 s, then lost while the watcher still
    works (8 s). Service Bus delivers the message again (delivery count 1);
    both copies' events have one name (a store keeps one), the first
    copy's completion does not take, the second's does: nothing is lost,
    nothing is dead-lettered.
    """
    manager = SharedStreamManager(ack_timeout=30.0)
    runner = SupervisedRunner(manager, _SlowOnFirstDelivery(
        connection_string=plain.server.connection_string, queue="short-lock",
        lock_duration=5, max_lock_renewal=5, max_wait_time=0.5), 1).start()
    stream = Stream(name="short-lock", dead_letter=None, group="")
    try:
        await plain.produce(stream, [b"slow"])
        await eventually(lambda: len(runner.events) == 2, within=20, what="both deliveries")
        await eventually(lambda: plain.server.unsettled("short-lock") == 0, within=10,
                         what="completed")
        assert sorted(e.payload["delivery_count"] for e in runner.events) == [0, 1]
        assert len(set(runner.names)) == 1, "one name for both copies: stored once"
        assert await plain.dead_letters(stream) == []
    finally:
        await runner.stop()
        await manager.stop_all()


async def test_a_message_s_trace_context_is_continued(plain: ServiceBusHarness) -> None:
    """Azure's ``Diagnostic-Id`` property: the ``process`` span continues the sender's trace."""
    stream = await plain.create_stream()
    process, _ = await traced_process_span(plain, stream, lambda traceparent: plain.produce(
        stream, values(1), properties={"Diagnostic-Id": traceparent}))
    assert_continues(process, "servicebus")

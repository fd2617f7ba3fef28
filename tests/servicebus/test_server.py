"""The Service Bus test server, driven by the real ``azure-servicebus`` SDK only.

One client for the module (opening a link costs the SDK about half a
second); each test has its own entities (``conftest.ENTITIES``) and leaves
them empty. The same tests run against a real namespace or the official
emulator when ``SHAREDSTREAM_SERVICEBUS_CONNECTION_STRING`` names one.
"""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import pytest_asyncio

from tests.servicebus.conftest import LOCK_SECONDS

servicebus: Any = pytest.importorskip("azure.servicebus")
servicebus_aio: Any = pytest.importorskip("azure.servicebus.aio")
exceptions: Any = pytest.importorskip("azure.servicebus.exceptions")

pytestmark = pytest.mark.asyncio(loop_scope="module")

Message = servicebus.ServiceBusMessage
WAIT = 1.0  # seconds a receive waits when a message is expected at once
# Senders are opened with keep_alive=None: the SDK's keep-alive task sleeps a second at a
# time and closing a sender waits for it. (A receiver without prefetch always has one.)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(servicebus_connection_string: str) -> AsyncIterator[Any]:
    """One async client for the module's tests."""
    async with servicebus_aio.ServiceBusClient.from_connection_string(
            servicebus_connection_string) as sb_client:
        yield sb_client


async def send(client: Any, queue: str, messages: Any) -> None:
    async with client.get_queue_sender(queue, keep_alive=None) as sender:
        await sender.send_messages(messages)


async def receive(receiver: Any, count: int, wait: float = WAIT) -> list[Any]:
    """Receive until ``count`` messages came, or ``wait`` seconds passed without one."""
    received: list[Any] = []
    while len(received) < count:
        batch = await receiver.receive_messages(max_message_count=count - len(received),
                                                max_wait_time=wait)
        if not batch:
            break
        received.extend(batch)
    return received


def bodies(messages: Sequence[Any]) -> list[str]:
    return [str(message) for message in messages]


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


# -- send, receive, settle -------------------------------------------------------------------


async def test_a_sent_message_is_received_with_the_broker_facts_then_completed(
        client: Any) -> None:
    started = now() - datetime.timedelta(seconds=1)
    await send(client, "complete", [
        Message("one", application_properties={"kind": "order"}, subject="new",
                message_id="m-1", correlation_id="c-1"),
        Message("two")])
    async with client.get_queue_receiver("complete", keep_alive=None) as receiver:
        first, second = await receive(receiver, 2)
        assert bodies([first, second]) == ["one", "two"]
        assert first.application_properties == {b"kind": b"order"}
        assert (first.subject, first.message_id, first.correlation_id) == ("new", "m-1", "c-1")
        assert second.sequence_number > first.sequence_number
        assert first.delivery_count == 0
        assert isinstance(first.lock_token, uuid.UUID)
        assert first._delivery_tag == first.lock_token.bytes_le
        assert first.lock_token != second.lock_token
        assert started <= first.enqueued_time_utc <= now()
        assert now() < first.locked_until_utc <= now() + datetime.timedelta(seconds=61)
        await receiver.complete_message(first)
        await receiver.complete_message(second)
        with pytest.raises(exceptions.MessageAlreadySettled):
            await receiver.complete_message(first)
        assert await receiver.receive_messages(max_wait_time=0.3) == []
        assert await receiver.peek_messages(10, sequence_number=1) == []


async def test_an_abandoned_message_comes_back_with_its_delivery_count_one_higher(
        client: Any) -> None:
    await send(client, "abandon", Message("flaky"))
    async with client.get_queue_receiver("abandon", keep_alive=None) as receiver:
        [first] = await receive(receiver, 1)
        await receiver.abandon_message(first)
        [second] = await receive(receiver, 1)
        assert (str(second), second.delivery_count) == ("flaky", 1)
        assert second.sequence_number == first.sequence_number
        assert second.lock_token != first.lock_token
        await receiver.complete_message(second)


async def test_a_dead_lettered_message_is_in_the_dead_letter_queue_with_its_reason(
        client: Any) -> None:
    await send(client, "dead-letter", [Message("poison", application_properties={"n": 1}),
                                       Message("plain")])
    async with client.get_queue_receiver("dead-letter", keep_alive=None) as receiver:
        poison, plain = await receive(receiver, 2)
        await receiver.dead_letter_message(poison, reason="rejected",
                                           error_description="the watcher refused it")
        await receiver.dead_letter_message(plain)
        assert await receiver.receive_messages(max_wait_time=0.3) == []
    async with client.get_queue_receiver("dead-letter", sub_queue="deadletter",
            keep_alive=None) as dlq:
        letters = await receive(dlq, 2)
        assert bodies(letters) == ["poison", "plain"]
        assert (letters[0].dead_letter_reason,
                letters[0].dead_letter_error_description) == ("rejected", "the watcher refused it")
        assert letters[0].application_properties[b"n"] == 1
        assert letters[0].sequence_number == poison.sequence_number
        for letter in letters:
            await dlq.complete_message(letter)


async def test_value_and_sequence_bodies_are_carried_as_sent(client: Any) -> None:
    """AMQP value and sequence bodies (JMS map messages, other clients) arrive as they left.

    Sent alone and in a batch; received, peeked, and dead-lettered with the
    body intact. The SDK hands AMQP strings over as bytes.
    """
    amqp = servicebus.amqp
    order = {"id": 7, "kind": "order", "lines": [{"sku": "a", "qty": 2}]}
    await send(client, "bodies", [amqp.AmqpAnnotatedMessage(value_body=order),
                                  amqp.AmqpAnnotatedMessage(sequence_body=[[1, "two"], [3]]),
                                  amqp.AmqpAnnotatedMessage(value_body="text")])
    async with client.get_queue_sender("bodies", keep_alive=None) as sender:
        batch = await sender.create_message_batch()
        batch.add_message(amqp.AmqpAnnotatedMessage(value_body={"batched": True}))
        batch.add_message(Message("data"))
        await sender.send_messages(batch)
    kinds = amqp.AmqpMessageBodyType
    wanted = [(kinds.VALUE, {b"id": 7, b"kind": b"order", b"lines": [{b"sku": b"a", b"qty": 2}]}),
              (kinds.SEQUENCE, [[1, b"two"], [3]]), (kinds.VALUE, b"text"),
              (kinds.VALUE, {b"batched": True}), (kinds.DATA, [b"data"])]

    def shown(messages: Sequence[Any]) -> list[tuple[Any, Any]]:
        return [(m.body_type, m.body if m.body_type == kinds.VALUE else list(m.body))
                for m in messages]

    async with client.get_queue_receiver("bodies", keep_alive=None) as receiver:
        assert shown(await receiver.peek_messages(10)) == wanted
        received = await receive(receiver, 5)
        assert shown(received) == wanted
        await receiver.dead_letter_message(received[0], reason="kept")
        for message in received[1:]:
            await receiver.complete_message(message)
    async with client.get_queue_receiver("bodies", sub_queue="deadletter", keep_alive=None) as dlq:
        [letter] = await receive(dlq, 1)
        assert shown([letter]) == wanted[:1]
        assert letter.dead_letter_reason == "kept"
        await dlq.complete_message(letter)


# -- locks -----------------------------------------------------------------------------------


async def test_an_expired_lock_redelivers_and_the_old_lock_token_is_lost(client: Any) -> None:
    await send(client, "expiry", Message("slow"))
    async with client.get_queue_receiver("expiry", keep_alive=None) as receiver:
        [first] = await receive(receiver, 1)
        assert first.locked_until_utc <= now() + datetime.timedelta(seconds=LOCK_SECONDS)
        [second] = await receive(receiver, 1, wait=LOCK_SECONDS + 2)
        assert (str(second), second.delivery_count) == ("slow", 1)
        assert second.sequence_number == first.sequence_number
        with pytest.raises(exceptions.MessageLockLostError):
            await receiver.complete_message(first)
        await receiver.complete_message(second)


async def test_renewing_the_lock_keeps_the_message_past_its_lock_duration(client: Any) -> None:
    await send(client, "renew", Message("long job"))
    async with client.get_queue_receiver("renew", keep_alive=None) as receiver:
        [message] = await receive(receiver, 1)
        first_until = message.locked_until_utc
        for _ in range(3):
            await asyncio.sleep(LOCK_SECONDS / 2)
            until = await receiver.renew_message_lock(message)
        assert until > first_until
        assert until == message.locked_until_utc
        await receiver.complete_message(message)  # 1.5 lock durations later: still locked
        assert await receiver.receive_messages(max_wait_time=0.3) == []


async def test_one_renew_lock_request_renews_many_locks_and_a_lost_one_fails_it_all(
        client: Any) -> None:
    """``com.microsoft:renew-lock`` with a list of lock tokens: an expiration for each, in
    order; a token whose lock is gone (here: completed) fails the whole request with
    ``message-lock-lost``, as Service Bus answers one status per request.

    The request is the one the SDK's private ``_renew_locks(*tokens)`` sends (its public
    ``renew_message_lock`` sends it with one token), which the producer batches with.
    """
    await send(client, "renew-batch", [Message(f"r{i}") for i in range(3)])
    async with client.get_queue_receiver("renew-batch", keep_alive=None) as receiver:
        messages = await receive(receiver, 3)
        tokens = [m.lock_token for m in messages]
        before = [m.locked_until_utc for m in messages]
        await asyncio.sleep(1.1)  # expirations are in milliseconds: later ones show
        answer = await receiver._renew_locks(*tokens)
        ends = [datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
                for ms in answer[b"expirations"]]
        assert len(ends) == 3
        assert all(end > old for end, old in zip(ends, before, strict=True))
        await receiver.complete_message(messages[0])
        with pytest.raises(exceptions.MessageLockLostError):
            await receiver._renew_locks(*tokens)
        answer = await receiver._renew_locks(*tokens[1:])  # the live ones alone
        assert len(answer[b"expirations"]) == 2
        for message in messages[1:]:
            await receiver.complete_message(message)


async def test_a_message_abandoned_max_delivery_count_times_is_dead_lettered(
        client: Any) -> None:
    await send(client, "poison", Message("never works"))
    async with client.get_queue_receiver("poison", keep_alive=None) as receiver:
        counts = []
        for _ in range(3):  # the queue's max_delivery_count
            [message] = await receive(receiver, 1)
            counts.append(message.delivery_count)
            await receiver.abandon_message(message)
        assert counts == [0, 1, 2]
        assert await receiver.receive_messages(max_wait_time=0.3) == []
    async with client.get_queue_receiver("poison", sub_queue="deadletter", keep_alive=None) as dlq:
        [letter] = await receive(dlq, 1)
        assert str(letter) == "never works"
        assert letter.dead_letter_reason == "MaxDeliveryCountExceeded"
        await dlq.complete_message(letter)


# -- peek, batches, receive modes, credit ------------------------------------------------------


async def test_peek_shows_messages_without_locking_them(client: Any) -> None:
    await send(client, "peek", [Message(f"p{i}") for i in range(3)])
    async with client.get_queue_receiver("peek", keep_alive=None) as receiver:
        peeked = await receiver.peek_messages(10, sequence_number=1)
        assert bodies(peeked) == ["p0", "p1", "p2"]
        assert [m.lock_token for m in peeked] == [None] * 3
        assert bodies(await receiver.peek_messages(1, sequence_number=peeked[1].sequence_number)
                      ) == ["p1"]
        received = await receive(receiver, 3)
        assert bodies(received) == ["p0", "p1", "p2"]
        assert [m.delivery_count for m in received] == [0, 0, 0]
        for message in received:
            await receiver.complete_message(message)


async def test_a_batch_arrives_as_separate_messages(client: Any) -> None:
    async with client.get_queue_sender("batch", keep_alive=None) as sender:
        batch = await sender.create_message_batch()
        for i in range(5):
            batch.add_message(Message(f"b{i}", application_properties={"i": i}))
        await sender.send_messages(batch)
        await sender.send_messages([Message("list-1"), Message("list-2")])
    async with client.get_queue_receiver("batch", keep_alive=None) as receiver:
        received = await receive(receiver, 7)
        assert bodies(received) == [*(f"b{i}" for i in range(5)), "list-1", "list-2"]
        assert [m.application_properties[b"i"] for m in received[:5]] == list(range(5))
        assert len({m.sequence_number for m in received}) == 7
        for message in received:
            await receiver.complete_message(message)


async def test_receive_and_delete_removes_messages_on_delivery(client: Any) -> None:
    await send(client, "receive-and-delete", [Message("gone-1"), Message("gone-2")])
    mode = servicebus.ServiceBusReceiveMode.RECEIVE_AND_DELETE
    async with client.get_queue_receiver("receive-and-delete", receive_mode=mode,
            keep_alive=None) as receiver:
        received = await receive(receiver, 2)
        assert bodies(received) == ["gone-1", "gone-2"]
        assert [m.lock_token for m in received] == [None, None]
        # as Service Bus: a settled delivery has an empty tag, and delivery annotations
        # (empty) are there all the same
        assert [(m._delivery_tag, m.raw_amqp_message.delivery_annotations)
                for m in received] == [(None, {}), (None, {})]
        assert await receiver.peek_messages(10, sequence_number=1) == []


async def test_a_receiver_gets_no_more_than_its_credit(client: Any) -> None:
    await send(client, "credit", [Message(f"c{i}") for i in range(4)])
    async with client.get_queue_receiver("credit", keep_alive=None) as first, \
            client.get_queue_receiver("credit", prefetch_count=2, keep_alive=None) as second:
        [one] = await receive(first, 1)
        rest = await receive(second, 3)
        assert sorted(bodies([one, *rest])) == ["c0", "c1", "c2", "c3"]  # none locked twice
        for message in rest:
            await second.complete_message(message)
        await first.complete_message(one)


# -- sessions --------------------------------------------------------------------------------


async def test_sessions_keep_their_order_and_have_one_receiver_each(
        client: Any, servicebus_connection_string: str) -> None:
    # The SDK retries a session it cannot lock (for 15 s by default): once is enough here.
    async with servicebus_aio.ServiceBusClient.from_connection_string(
            servicebus_connection_string, retry_total=0) as once:
        await check_sessions(client, once)


async def check_sessions(client: Any, once: Any) -> None:
    await send(client, "sessions", [Message(f"{s}{i}", session_id=s)
                                    for i in range(3) for s in ("a", "b")])
    async with client.get_queue_receiver("sessions", session_id="a", keep_alive=None) as session_a:
        assert session_a.session.session_id == "a"
        first = await receive(session_a, 3)
        assert bodies(first) == ["a0", "a1", "a2"]
        assert {m.session_id for m in first} == {"a"}
        await session_a.abandon_message(first[0])
        again = await receive(session_a, 1)
        assert (bodies(again), again[0].delivery_count) == (["a0"], 1)  # back first
        with pytest.raises(exceptions.SessionCannotBeLockedError):
            async with once.get_queue_receiver("sessions", session_id="a",
                    keep_alive=None) as second:
                await second.receive_messages(max_wait_time=0.3)
        next_session = servicebus.NEXT_AVAILABLE_SESSION
        async with client.get_queue_receiver("sessions", session_id=next_session,
                                             max_wait_time=5, keep_alive=None) as session_b:
            received = await receive(session_b, 3)
            assert session_b.session.session_id == "b"
            assert bodies(received) == ["b0", "b1", "b2"]
            for message in received:
                await session_b.complete_message(message)
        for message in [*again, *first[1:]]:
            await session_a.complete_message(message)


async def test_a_session_lock_is_renewed_and_keeps_state(client: Any) -> None:
    await send(client, "session-lock", Message("x", session_id="s"))
    async with client.get_queue_receiver("session-lock", session_id="s",
            keep_alive=None) as receiver:
        session = receiver.session
        before = session.locked_until_utc
        await asyncio.sleep(0.1)
        assert await session.renew_lock() > before
        await session.set_state(b"progress: 1")
        assert await session.get_state() == b"progress: 1"
        [message] = await receive(receiver, 1)
        await receiver.complete_message(message)


async def test_an_expired_session_lock_hands_the_session_over_with_counts_raised(
        client: Any, servicebus_connection_string: str) -> None:
    await send(client, "session-expiry", [Message("first", session_id="s"),
                                          Message("second", session_id="s")])
    async with servicebus_aio.ServiceBusClient.from_connection_string(
            servicebus_connection_string, retry_total=0) as once:
        async with once.get_queue_receiver("session-expiry", session_id="s",
                keep_alive=None) as lapsed:
            [held] = await receive(lapsed, 1)
            await asyncio.sleep(LOCK_SECONDS + 0.3)
            with pytest.raises(exceptions.SessionLockLostError):
                await lapsed.complete_message(held)
        next_session = servicebus.NEXT_AVAILABLE_SESSION
        async with once.get_queue_receiver("session-expiry", session_id=next_session,
                                           max_wait_time=2, keep_alive=None) as taker:
            received = await receive(taker, 2)
            assert [(str(m), m.delivery_count) for m in received] == [("first", 1),
                                                                       ("second", 0)]
            for message in received:
                await taker.complete_message(message)
        started = time.monotonic()
        with pytest.raises(exceptions.OperationTimeoutError):  # no session has messages now
            async with once.get_queue_receiver("session-expiry", session_id=next_session,
                                               max_wait_time=1, keep_alive=None) as nobody:
                await nobody.receive_messages(max_wait_time=0.3)
        assert time.monotonic() - started < 5


# -- topics ----------------------------------------------------------------------------------


async def test_a_topic_copies_each_message_to_the_subscriptions_whose_filter_it_passes(
        client: Any) -> None:
    async with client.get_topic_sender("events", keep_alive=None) as sender:
        await sender.send_messages([
            Message("plain"), Message("alarm", subject="urgent"),
            Message("paris", application_properties={"region": "eu"}),
            Message("order", correlation_id="eu-order"),
        ])
    expected = {"all": ["plain", "alarm", "paris", "order"], "urgent": ["alarm"],
                "eu": ["paris", "order"]}

    async def drain(subscription: str) -> list[str]:
        async with client.get_subscription_receiver("events", subscription,
                keep_alive=None) as receiver:
            received = await receive(receiver, len(expected[subscription]))
            for message in received:
                await receiver.complete_message(message)
            assert await receiver.receive_messages(max_wait_time=0.2) == []
            return bodies(received)

    got = await asyncio.gather(*(drain(name) for name in expected))  # opening takes a while
    assert dict(zip(expected, got, strict=True)) == expected


# -- connections and errors ----------------------------------------------------------------


async def test_the_sync_sdk_sends_receives_and_settles(servicebus_connection_string: str) -> None:
    def use_the_sync_sdk() -> list[str]:
        with servicebus.ServiceBusClient.from_connection_string(
                servicebus_connection_string, keep_alive=None) as sync_client:
            with sync_client.get_queue_sender("sync", keep_alive=None) as sender:
                sender.send_messages([Message("sync-1"), Message("sync-2")])
            with sync_client.get_queue_receiver("sync", keep_alive=None) as receiver:
                received = receiver.receive_messages(max_message_count=2, max_wait_time=WAIT)
                receiver.abandon_message(received[0])
                receiver.complete_message(received[1])
                [again] = receiver.receive_messages(max_message_count=1, max_wait_time=WAIT)
                receiver.complete_message(again)
                return [*bodies(received), f"{again}:{again.delivery_count}"]

    assert await asyncio.to_thread(use_the_sync_sdk) == ["sync-1", "sync-2", "sync-1:1"]

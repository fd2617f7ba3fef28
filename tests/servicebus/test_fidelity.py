"""Where the kit's Service Bus server behaves like Service Bus (issue 30), through the real SDK.

The server of these tests has three keys (``admin`` with every right, a
``Listen``-only and a ``Send``-only one) and the Standard tier's 256 KB
message limit; the Premium test starts its own. The SDK retries nothing
here (``retry_total=0``): a refusal must come back as the SDK's own
exception, at once.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sharedstream.testing.brokers.servicebus import servicebus_server
from sharedstream.testing.fixtures import running_or_skip
from sharedstream.testing.servicebus import auth
from sharedstream.testing.servicebus.model import AccessKey

servicebus: Any = pytest.importorskip("azure.servicebus")
exceptions: Any = pytest.importorskip("azure.servicebus.exceptions")

Message = servicebus.ServiceBusMessage
KEYS = [{"name": "admin", "key": "s3cret"},
        {"name": "listener", "key": "l1sten", "rights": ["Listen"]},
        {"name": "sender", "key": "s3nd", "rights": ["Send"]}]
ENTITIES = {"keys": KEYS, "queues": [
    {"name": "auth"}, {"name": "size"}, {"name": "annotations"}, {"name": "scheduled"},
    {"name": "sessions-only", "requires_session": True},
    {"name": "ttl", "dead_lettering_on_message_expiration": True},
    {"name": "dedupe", "duplicate_detection_window": 60},
    {"name": "deferred"}, {"name": "deferred-sessions", "requires_session": True},
    {"name": "to-schedule"}, {"name": "listed-sessions", "requires_session": True}],
    "topics": [{"name": "fanout", "subscriptions": [{"name": "all"}]}]}
STANDARD_LIMIT = 256 * 1024


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    """``127.0.0.1:<port>`` of a server with :data:`ENTITIES`."""
    with running_or_skip(servicebus_server(entities=ENTITIES)) as string:
        yield string.split("sb://", 1)[1].split(";", 1)[0]


def with_key(endpoint: str, name: str, key: str) -> str:
    return (f"Endpoint=sb://{endpoint};SharedAccessKeyName={name};SharedAccessKey={key};"
            "UseDevelopmentEmulator=true;")


def with_token(endpoint: str, token: str) -> str:
    return f"Endpoint=sb://{endpoint};SharedAccessSignature={token};UseDevelopmentEmulator=true;"


def client(connection_string: str) -> Any:
    return servicebus.ServiceBusClient.from_connection_string(connection_string, retry_total=0)


def send(connection_string: str, queue: str, *messages: Any) -> None:
    with client(connection_string) as sb, sb.get_queue_sender(queue, keep_alive=None) as sender:
        sender.send_messages(messages[0] if len(messages) == 1 else list(messages))


def receive(connection_string: str, queue: str, count: int = 1) -> list[Any]:
    with client(connection_string) as sb, sb.get_queue_receiver(queue, keep_alive=None) as receiver:
        received = receiver.receive_messages(max_message_count=count, max_wait_time=2)
        for message in received:
            receiver.complete_message(message)
        return [str(message) for message in received]


# -- authentication (item 4) -------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("name", "key"), [("admin", "wrong"), ("nobody", "s3cret")],
                         ids=["wrong-key", "unknown-key-name"])
def test_a_token_signed_with_a_wrong_key_is_refused_as_an_authentication_error(
        endpoint: str, name: str, key: str) -> None:
    started = time.monotonic()
    with pytest.raises(exceptions.ServiceBusAuthenticationError):
        send(with_key(endpoint, name, key), "auth", Message("x"))
    with pytest.raises(exceptions.ServiceBusAuthenticationError):
        receive(with_key(endpoint, name, key), "auth")
    assert time.monotonic() - started < 10


@pytest.mark.timeout(60)
def test_an_expired_token_or_one_for_another_entity_is_refused(endpoint: str) -> None:
    admin = AccessKey("admin", "s3cret")
    expired = auth.sign(f"sb://{endpoint}/auth", admin, int(time.time()) - 5)
    elsewhere = auth.sign(f"sb://{endpoint}/size", admin, int(time.time()) + 600)
    for token in (expired, elsewhere):
        with pytest.raises(exceptions.ServiceBusAuthenticationError):
            send(with_token(endpoint, token), "auth", Message("x"))
    namespace_wide = auth.sign(f"sb://{endpoint}", admin, int(time.time()) + 600)
    send(with_token(endpoint, namespace_wide), "auth", Message("by a namespace token"))
    assert receive(with_token(endpoint, namespace_wide), "auth") == ["by a namespace token"]


@pytest.mark.timeout(60)
def test_a_missing_entity_is_refused_at_put_token_with_404(endpoint: str) -> None:
    """As Service Bus: the token's audience names no entity, so ``put-token`` answers 404.

    The SDK raises that as ``ServiceBusAuthenticationError`` (and retries
    it as one; not here), before any link is attached.
    """
    admin = with_key(endpoint, "admin", "s3cret")
    started = time.monotonic()
    with pytest.raises(exceptions.ServiceBusAuthenticationError) as refused:
        send(admin, "no-such-queue", Message("lost"))
    assert "Status code: 404" in str(refused.value.inner_exception)
    assert "no-such-queue' could not be found" in str(refused.value.inner_exception)
    with client(admin) as sb, pytest.raises(exceptions.ServiceBusAuthenticationError) as refused, \
            sb.get_subscription_receiver("fanout", "no-such-subscription",
                    keep_alive=None) as receiver:
        receiver.receive_messages(max_wait_time=0.3)
    assert "Status code: 404" in str(refused.value.inner_exception)
    assert time.monotonic() - started < 5  # refused at once, not at a timeout


@pytest.mark.timeout(60)
def test_a_listen_key_cannot_send_and_a_send_key_cannot_receive(endpoint: str) -> None:
    listener = with_key(endpoint, "listener", "l1sten")
    sender = with_key(endpoint, "sender", "s3nd")
    with pytest.raises(exceptions.ServiceBusAuthorizationError, match="'Send'"):
        send(listener, "auth", Message("x"))
    with pytest.raises(exceptions.ServiceBusAuthorizationError, match="'Listen'"):
        receive(sender, "auth")
    send(sender, "auth", Message("sent with Send"))
    assert receive(listener, "auth") == ["sent with Send"]


# -- message size (item 3) ---------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_message_over_256_kb_is_refused_with_the_sdk_s_size_error(endpoint: str) -> None:
    admin = with_key(endpoint, "admin", "s3cret")
    started = time.monotonic()
    with pytest.raises(exceptions.MessageSizeExceededError):
        send(admin, "size", Message(b"x" * (STANDARD_LIMIT + 1)))
    assert time.monotonic() - started < 10, "the refusal must not hang the SDK"
    with client(admin) as sb, sb.get_queue_sender("size", keep_alive=None) as sender:
        batch = sender.create_message_batch()
        assert batch.max_size_in_bytes == STANDARD_LIMIT
        with pytest.raises(exceptions.MessageSizeExceededError):
            batch.add_message(Message(b"x" * (STANDARD_LIMIT + 1)))
        sender.send_messages(Message(b"y" * (STANDARD_LIMIT - 1024)))
    assert [len(body) for body in receive(admin, "size")] == [STANDARD_LIMIT - 1024]


@pytest.mark.timeout(60)
def test_a_premium_limit_takes_a_larger_message() -> None:
    entities = {"max_message_size": 100 * 1024 * 1024, "queues": [{"name": "big"}]}
    with running_or_skip(servicebus_server(entities=entities)) as string:
        send(string, "big", Message(b"z" * (STANDARD_LIMIT * 4)))
        assert [len(body) for body in receive(string, "big")] == [STANDARD_LIMIT * 4]


# -- deviations in implemented features (item 5) -----------------------------------------------


@pytest.fixture(scope="module")
def admin(endpoint: str) -> str:
    return with_key(endpoint, "admin", "s3cret")


@pytest.mark.timeout(60)
def test_a_refused_send_raises_at_once_rather_than_hanging(admin: str) -> None:
    started = time.monotonic()
    with pytest.raises(exceptions.ServiceBusError, match="requires sessions"):
        send(admin, "sessions-only", Message("no session id"))
    assert time.monotonic() - started < 10


@pytest.mark.timeout(60)
def test_a_received_message_carries_its_lock_token_as_a_delivery_annotation(admin: str) -> None:
    send(admin, "annotations", Message("x"))
    with client(admin) as sb, sb.get_queue_receiver("annotations", keep_alive=None) as receiver:
        [message] = receiver.receive_messages(max_wait_time=2)
        annotations = message.raw_amqp_message.delivery_annotations
        assert annotations[b"x-opt-lock-token"] == message.lock_token
        receiver.complete_message(message)


@pytest.mark.timeout(60)
def test_the_sender_s_delivery_annotations_arrive_with_the_lock_token(admin: str) -> None:
    """The SDK writes delivery annotations after the body; alone or in a batch, they arrive."""
    amqp: Any = pytest.importorskip("azure.servicebus.amqp")

    def annotated(body: bytes) -> Any:
        return amqp.AmqpAnnotatedMessage(data_body=[body, b"!"],
                                         delivery_annotations={"trace": body})

    with client(admin) as sb, sb.get_queue_sender("annotations", keep_alive=None) as sender:
        batch = sender.create_message_batch()
        batch.add_message(annotated(b"in a batch"))
        sender.send_messages(batch)
        sender.send_messages(annotated(b"alone"))
    with client(admin) as sb, sb.get_queue_receiver("annotations", keep_alive=None) as receiver:
        received = receiver.receive_messages(max_message_count=2, max_wait_time=2)
        seen = []
        for message in received:
            raw = message.raw_amqp_message
            seen.append((list(raw.body), raw.delivery_annotations[b"trace"]))
            assert raw.delivery_annotations[b"x-opt-lock-token"] == message.lock_token
            receiver.complete_message(message)
    assert seen == [([b"in a batch", b"!"], b"in a batch"), ([b"alone", b"!"], b"alone")]


@pytest.mark.timeout(60)
def test_a_non_session_receiver_on_a_session_queue_is_refused_when_it_opens(admin: str) -> None:
    with client(admin) as sb:
        receiver = sb.get_queue_receiver("sessions-only", keep_alive=None)
        with pytest.raises(exceptions.ServiceBusError, match="requires a session receiver"):
            receiver.__enter__()
        receiver.close()


@pytest.mark.timeout(60)
def test_a_session_receiver_for_a_session_id_that_is_no_string_is_refused(admin: str) -> None:
    started = time.monotonic()
    with client(admin) as sb:
        receiver = sb.get_queue_receiver("sessions-only", session_id=1, keep_alive=None)
        with pytest.raises(exceptions.ServiceBusError, match="must be a string"):
            receiver.__enter__()
        receiver.close()
    assert time.monotonic() - started < 10


@pytest.mark.timeout(60)
def test_a_scheduled_message_is_delivered_at_its_time_not_before(admin: str) -> None:
    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=3)
    send(admin, "scheduled", Message("later", scheduled_enqueue_time_utc=at), Message("now"))
    with client(admin) as sb, sb.get_queue_receiver("scheduled", keep_alive=None) as receiver:
        [now] = receiver.receive_messages(max_message_count=2, max_wait_time=1)
        assert str(now) == "now"
        receiver.complete_message(now)
        [later] = receiver.receive_messages(max_wait_time=10)
        arrived = datetime.datetime.now(datetime.UTC)
        assert str(later) == "later"
        assert at <= arrived < at + datetime.timedelta(seconds=2)
        assert later.enqueued_time_utc >= at - datetime.timedelta(milliseconds=1)
        receiver.complete_message(later)


@pytest.mark.timeout(60)
def test_an_expired_message_is_not_delivered_but_dead_lettered_as_the_queue_says(
        admin: str) -> None:
    send(admin, "ttl", Message("brief", time_to_live=datetime.timedelta(seconds=1)),
         Message("lasting", time_to_live=datetime.timedelta(hours=1)))
    time.sleep(1.2)
    assert receive(admin, "ttl", 2) == ["lasting"]
    with client(admin) as sb, sb.get_queue_receiver("ttl", sub_queue="deadletter",
            keep_alive=None) as letters:
        [letter] = letters.receive_messages(max_wait_time=2)
        assert (str(letter), letter.dead_letter_reason) == ("brief", "TTLExpiredException")
        letters.complete_message(letter)


@pytest.mark.timeout(60)
def test_a_queue_with_duplicate_detection_drops_a_repeated_message_id(admin: str) -> None:
    send(admin, "dedupe", Message("first", message_id="order-1"))
    send(admin, "dedupe", Message("again", message_id="order-1"),
         Message("other", message_id="order-2"))
    assert receive(admin, "dedupe", 3) == ["first", "other"]


# -- management operations: deferral, scheduling, session listing ------------------------------


@pytest.mark.timeout(60)
def test_a_deferred_message_is_received_only_by_its_sequence_number(admin: str) -> None:
    send(admin, "deferred", Message("kept aside"), Message("other"))
    with client(admin) as sb, sb.get_queue_receiver("deferred", keep_alive=None) as receiver:
        aside, other = receiver.receive_messages(max_message_count=2, max_wait_time=2)
        receiver.defer_message(aside)
        receiver.complete_message(other)
        assert receiver.receive_messages(max_wait_time=1) == []
        [peeked] = receiver.peek_messages(sequence_number=aside.sequence_number)
        assert peeked.state == servicebus.ServiceBusMessageState.DEFERRED
        [again] = receiver.receive_deferred_messages([aside.sequence_number])
        assert (str(again), again.state) == (
            "kept aside", servicebus.ServiceBusMessageState.DEFERRED)
        assert again.lock_token is not None
        assert again.locked_until_utc is not None
        receiver.renew_message_lock(again)
        receiver.abandon_message(again)  # settled through the management node, as the SDK does
        assert receiver.receive_messages(max_wait_time=1) == []  # still deferred
        [third] = receiver.receive_deferred_messages([aside.sequence_number])
        assert third.delivery_count == 1
        receiver.complete_message(third)
        with pytest.raises(exceptions.MessageNotFoundError):
            receiver.receive_deferred_messages([aside.sequence_number])
        with pytest.raises(exceptions.MessageNotFoundError):
            receiver.receive_deferred_messages([other.sequence_number])  # completed, not deferred


@pytest.mark.timeout(60)
def test_deferred_messages_received_in_receive_and_delete_mode_are_gone(admin: str) -> None:
    send(admin, "deferred", Message("a"), Message("b"))
    with client(admin) as sb:
        with sb.get_queue_receiver("deferred", keep_alive=None) as receiver:
            received = receiver.receive_messages(max_message_count=2, max_wait_time=2)
            for message in received:
                receiver.defer_message(message)
        numbers = [message.sequence_number for message in received]
        with sb.get_queue_receiver("deferred", receive_mode="receiveanddelete",
                keep_alive=None) as deleting:
            taken = deleting.receive_deferred_messages(numbers)
            assert [str(message) for message in taken] == ["a", "b"]
            assert taken[0].lock_token is None
            with pytest.raises(exceptions.MessageNotFoundError):
                deleting.receive_deferred_messages(numbers)
            assert deleting.peek_messages(max_message_count=5) == []


@pytest.mark.timeout(60)
def test_a_session_receiver_receives_only_its_own_session_s_deferred_messages(admin: str) -> None:
    send(admin, "deferred-sessions", Message("mine", session_id="s1"),
         Message("theirs", session_id="s2"))
    numbers = {}
    with client(admin) as sb:
        for session in ("s1", "s2"):
            with sb.get_queue_receiver("deferred-sessions", session_id=session,
                    keep_alive=None) as receiver:
                [message] = receiver.receive_messages(max_wait_time=2)
                receiver.defer_message(message)
                numbers[session] = message.sequence_number
        with sb.get_queue_receiver("deferred-sessions", session_id="s1",
                keep_alive=None) as receiver:
            with pytest.raises(exceptions.MessageNotFoundError):
                receiver.receive_deferred_messages([numbers["s2"]])
            [mine] = receiver.receive_deferred_messages([numbers["s1"]])
            assert (str(mine), mine.locked_until_utc) == ("mine", None)  # the session's lock
            receiver.complete_message(mine)
        with sb.get_queue_receiver("deferred-sessions", session_id="s2",
                keep_alive=None) as receiver:
            [theirs] = receiver.receive_deferred_messages([numbers["s2"]])
            receiver.complete_message(theirs)


@pytest.mark.timeout(60)
def test_scheduled_messages_get_sequence_numbers_and_a_cancelled_one_never_comes(
        admin: str) -> None:
    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=3)
    with client(admin) as sb:
        with sb.get_queue_sender("to-schedule", keep_alive=None) as sender:
            first, second = sender.schedule_messages([Message("cancelled"), Message("kept")], at)
            assert second == first + 1
            sender.cancel_scheduled_messages(first)
            with pytest.raises(exceptions.MessageNotFoundError):
                sender.cancel_scheduled_messages(first)
        with sb.get_queue_receiver("to-schedule", keep_alive=None) as receiver:
            [peeked] = receiver.peek_messages(max_message_count=5)
            assert (peeked.sequence_number, peeked.state) == (
                second, servicebus.ServiceBusMessageState.SCHEDULED)
            assert receiver.receive_messages(max_wait_time=1) == []
            [kept] = receiver.receive_messages(max_message_count=2, max_wait_time=10)
            assert str(kept) == "kept"
            assert kept.enqueued_time_utc >= at - datetime.timedelta(milliseconds=1)
            receiver.complete_message(kept)
            assert receiver.receive_messages(max_wait_time=1) == []


@pytest.mark.timeout(60)
def test_a_message_scheduled_on_a_topic_is_cancelled_in_its_subscriptions(admin: str) -> None:
    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=5)
    with client(admin) as sb:
        with sb.get_topic_sender("fanout", keep_alive=None) as sender:
            [number] = sender.schedule_messages(Message("later"), at)
        with sb.get_subscription_receiver("fanout", "all", keep_alive=None) as receiver:
            assert [m.sequence_number for m in receiver.peek_messages()] == [number]
            with sb.get_topic_sender("fanout", keep_alive=None) as sender:
                sender.cancel_scheduled_messages(number)
            assert receiver.peek_messages() == []


@pytest.mark.timeout(60)
def test_listing_sessions_gives_those_with_messages_or_state_and_filters_by_update(
        admin: str) -> None:
    with client(admin) as sb:
        assert list(sb.list_queue_sessions("listed-sessions")) == []
        send(admin, "listed-sessions", Message("x", session_id="with-message"))
        with sb.get_queue_receiver("listed-sessions", session_id="with-state",
                keep_alive=None) as receiver:
            receiver.session.set_state("before")
        time.sleep(0.05)
        cutoff = datetime.datetime.now(datetime.UTC)
        time.sleep(0.05)
        with sb.get_queue_receiver("listed-sessions", session_id="updated",
                keep_alive=None) as receiver:
            receiver.session.set_state("after")
        assert sorted(sb.list_queue_sessions("listed-sessions")) == [
            "updated", "with-message", "with-state"]
        assert list(sb.list_queue_sessions("listed-sessions", state_updated_after=cutoff)) == [
            "updated"]


@pytest.mark.timeout(60)
def test_a_next_session_attach_without_a_timeout_waits_the_namespace_s_wait() -> None:
    """Service Bus holds such an attach 65 s (``next_session_wait``: 2 s here), then refuses it.

    The SDK sends no ``com.microsoft:timeout`` for a receiver without
    ``max_wait_time``; the refusal quotes the wait as the service does.
    """
    entities = {"next_session_wait": 2, "queues": [{"name": "idle", "requires_session": True}]}
    with running_or_skip(servicebus_server(entities=entities)) as string, client(string) as sb:
        started = time.monotonic()
        with pytest.raises(exceptions.OperationTimeoutError, match="timeout of 00:00:02"), \
                sb.get_queue_receiver("idle", session_id=servicebus.NEXT_AVAILABLE_SESSION,
                        keep_alive=None):
            pass
        assert 1.5 < time.monotonic() - started < 10

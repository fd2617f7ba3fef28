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
    {"name": "dedupe", "duplicate_detection_window": 60}]}
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
    with client(connection_string) as sb, sb.get_queue_sender(queue) as sender:
        sender.send_messages(messages[0] if len(messages) == 1 else list(messages))


def receive(connection_string: str, queue: str, count: int = 1) -> list[Any]:
    with client(connection_string) as sb, sb.get_queue_receiver(queue) as receiver:
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
    with client(admin) as sb, sb.get_queue_sender("size") as sender:
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
    with client(admin) as sb, sb.get_queue_receiver("annotations") as receiver:
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

    with client(admin) as sb, sb.get_queue_sender("annotations") as sender:
        batch = sender.create_message_batch()
        batch.add_message(annotated(b"in a batch"))
        sender.send_messages(batch)
        sender.send_messages(annotated(b"alone"))
    with client(admin) as sb, sb.get_queue_receiver("annotations") as receiver:
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
        receiver = sb.get_queue_receiver("sessions-only")
        with pytest.raises(exceptions.ServiceBusError, match="requires a session receiver"):
            receiver.__enter__()
        receiver.close()


@pytest.mark.timeout(60)
def test_a_session_receiver_for_a_session_id_that_is_no_string_is_refused(admin: str) -> None:
    started = time.monotonic()
    with client(admin) as sb:
        receiver = sb.get_queue_receiver("sessions-only", session_id=1)
        with pytest.raises(exceptions.ServiceBusError, match="must be a string"):
            receiver.__enter__()
        receiver.close()
    assert time.monotonic() - started < 10


@pytest.mark.timeout(60)
def test_a_scheduled_message_is_delivered_at_its_time_not_before(admin: str) -> None:
    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=3)
    send(admin, "scheduled", Message("later", scheduled_enqueue_time_utc=at), Message("now"))
    with client(admin) as sb, sb.get_queue_receiver("scheduled") as receiver:
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
    with client(admin) as sb, sb.get_queue_receiver("ttl", sub_queue="deadletter") as letters:
        [letter] = letters.receive_messages(max_wait_time=2)
        assert (str(letter), letter.dead_letter_reason) == ("brief", "TTLExpiredException")
        letters.complete_message(letter)


@pytest.mark.timeout(60)
def test_a_queue_with_duplicate_detection_drops_a_repeated_message_id(admin: str) -> None:
    send(admin, "dedupe", Message("first", message_id="order-1"))
    send(admin, "dedupe", Message("again", message_id="order-1"),
         Message("other", message_id="order-2"))
    assert receive(admin, "dedupe", 3) == ["first", "other"]

"""The Pub/Sub test server, driven by the real ``google-cloud-pubsub`` client only.

The same tests run against Google's emulator when ``PUBSUB_EMULATOR_HOST``
names one (those on dead letters, retry policies and flow control need
what the emulator may lack).
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import grpc
import pytest
from google.api_core import exceptions
from google.pubsub_v1.services.publisher import PublisherAsyncClient, PublisherClient
from google.pubsub_v1.services.publisher.transports import (
    PublisherGrpcAsyncIOTransport,
    PublisherGrpcTransport,
)
from google.pubsub_v1.services.subscriber import SubscriberAsyncClient
from google.pubsub_v1.services.subscriber.transports import (
    SubscriberGrpcAsyncIOTransport,
    SubscriberGrpcTransport,
)
from google.pubsub_v1.types import (
    PublishRequest,
    PubsubMessage,
    StreamingPullRequest,
    StreamingPullResponse,
)

from sharedstream.producers._pubsub_types import CHANNEL_OPTIONS
from sharedstream.testing.pubsub.service import PubSubService, _Stream
from sharedstream.testing.pubsub.state import Consumer, SubscriptionSettings
from tests.pubsub.conftest import PROJECT, pubsub_v1, streaming
from tests.pubsub.harness import ThreadedPubSubServer

DEAD_LETTER_ATTEMPTS = 5  # Pub/Sub's least max_delivery_attempts


def publish(publisher: Any, topic: str, values: Sequence[bytes], **fields: Any) -> list[str]:
    """Publish each value (with the same attributes/ordering key); their message ids."""
    futures = [publisher.publish(topic, value, **fields) for value in values]
    return [future.result(timeout=10) for future in futures]


def pull(subscriber: Any, subscription: str, *, max_messages: int = 100,
         timeout: float = 3.0) -> list[Any]:
    """One unary Pull: what it returned (empty if nothing came within about ``timeout``)."""
    response = subscriber.pull(request={"subscription": subscription,
                                        "max_messages": max_messages}, timeout=timeout)
    return list(response.received_messages)


def wait_for(condition: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class Received:
    """A thread-safe record of what a ``subscribe()`` callback saw."""

    def __init__(self, decide: Callable[[Any], str] = lambda message: "ack") -> None:
        self.decide = decide
        self.messages: list[Any] = []
        self._lock = threading.Lock()

    def __call__(self, message: Any) -> None:
        with self._lock:
            self.messages.append(message)
        if self.decide(message) == "ack":
            message.ack()
        else:
            message.nack()

    def data(self) -> list[bytes]:
        with self._lock:
            return [message.data for message in self.messages]


# -- publish, receive, ack -----------------------------------------------------


def test_published_messages_arrive_with_ids_attributes_and_publish_time(
        publisher: Any, subscriber: Any, topic: str,
        new_subscription: Callable[..., str]) -> None:
    subscription = new_subscription()
    started = time.time()
    ids = publish(publisher, topic, [b"one", b"two", b"three"], origin="test")
    received = Received()
    with streaming(subscriber, subscription, received):
        wait_for(lambda: len(received.data()) == 3, 10, "three messages")
    assert sorted(received.data()) == [b"one", b"three", b"two"]
    assert sorted(m.message_id for m in received.messages) == sorted(ids)
    for message in received.messages:
        assert dict(message.attributes) == {"origin": "test"}
        assert started - 1 <= message.publish_time.timestamp() <= time.time() + 1
        assert message.delivery_attempt is None  # no dead-letter policy: not reported
    assert pull(subscriber, subscription, timeout=1.5) == []  # acked: nothing comes back


def test_a_9_mb_message_is_delivered_with_the_small_one_published_with_it(
        publisher: Any, pubsub_emulator_host: str, topic: str,
        new_subscription: Callable[..., str]) -> None:
    subscription = new_subscription()
    big = b"x" * (9 * 1024 * 1024)
    publish(publisher, topic, [big, b"small"])
    # The SDK's own subscriber keeps gRPC's 4 MiB receive limit with an emulator host
    # (RESOURCE_EXHAUSTED on this response); one on a channel without it, as ours:
    unbounded = pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(
        channel=grpc.insecure_channel(pubsub_emulator_host, options=CHANNEL_OPTIONS)))
    try:
        received = pull(unbounded, subscription)  # one response: the big one, then the rest
        received += pull(unbounded, subscription)
    finally:
        unbounded.close()
    assert sorted(len(m.message.data) for m in received) == [5, len(big)]


def test_a_publish_request_over_10_mb_is_refused_as_pubsub_refuses_it(
        pubsub_emulator_host: str, topic: str) -> None:
    """Pub/Sub's limit is on the serialized request: 10,000,000 bytes (Google's publisher
    batches against that number); past 10 MiB the front end refuses it with other words."""
    with PublisherClient(transport=PublisherGrpcTransport(  # one request, unbatched
            channel=grpc.insecure_channel(pubsub_emulator_host, options=CHANNEL_OPTIONS),
    )) as direct:
        def request_of(*sizes: int) -> list[PubsubMessage]:
            return [PubsubMessage(data=b"y" * size) for size in sizes]

        just_under = request_of(10_000_000 - 100)
        assert PublishRequest(topic=topic, messages=just_under)._pb.ByteSize() <= 10_000_000
        assert len(direct.publish(topic=topic, messages=just_under).message_ids) == 1
        over = request_of(10_000_000)
        size = PublishRequest(topic=topic, messages=over)._pb.ByteSize()
        with pytest.raises(exceptions.InvalidArgument, match=(
                f"The value for request_size is too large. You passed {size} in the request, "
                "but the maximum value is 10000000.")):
            direct.publish(topic=topic, messages=over)
        with pytest.raises(exceptions.InvalidArgument,
                           match="Request payload size exceeds the limit: 10485760 bytes"):
            direct.publish(topic=topic, messages=request_of(6 * 1024 * 1024, 6 * 1024 * 1024))


@pytest.mark.parametrize(("message", "refusal"), [
    ({"data": b"x", "attributes": {f"a{i}": "v" for i in range(101)}},
     "attribute_count is too large. You passed 101"),
    ({"data": b"x", "attributes": {"k" * 257: "v"}}, "has a key that is too long. The length "
     "is 257 characters, but the maximum allowed is 256"),
    ({"data": b"x", "attributes": {"city": "é" * 513}}, 'The attribute "city" in the request '
     "has a value that is too long. The length is 1026 characters, but the maximum allowed "
     "is 1024"),
    ({"data": b"x", "attributes": {"goog-origin": "x"}},
     r"attribute key that is not valid \(key=goog-origin\)"),
    ({"data": b"x", "ordering_key": "k" * 1025}, "ordering key in the request is too long"),
], ids=["attributes", "key", "value", "goog", "ordering-key"])
def test_a_message_past_pubsubs_limits_refuses_the_whole_request(
        *, pubsub_emulator_host: str, subscriber: Any, topic: str,
        new_subscription: Callable[..., str], message: dict[str, Any], refusal: str) -> None:
    subscription = new_subscription()
    with PublisherClient(transport=PublisherGrpcTransport(  # one request, unbatched
            channel=grpc.insecure_channel(pubsub_emulator_host))) as direct:
        with pytest.raises(exceptions.InvalidArgument, match=refusal):
            direct.publish(topic=topic, messages=[PubsubMessage(data=b"fine"),
                                                  PubsubMessage(**message)])
        at_the_limits = PubsubMessage(
            data=b"x", ordering_key="k" * 1024,
            attributes={"k" * 256: "v" * 1024, "googclient_traceparent": "00-a-b-01",
                        **{f"a{i}": "v" for i in range(98)}})
        assert len(direct.publish(topic=topic, messages=[at_the_limits]).message_ids) == 1
        with pytest.raises(exceptions.InvalidArgument, match=re.escape(
                "The value for message_count is too large. You passed 1001 in the request, "
                "but the maximum value is 1000.")):
            direct.publish(topic=topic, messages=[PubsubMessage(data=b"m")] * 1001)
        assert len(direct.publish(topic=topic, messages=[PubsubMessage(data=b"m")] * 1000
                                  ).message_ids) == 1000
    received = pull(subscriber, subscription, max_messages=1000)
    received += pull(subscriber, subscription, max_messages=1000, timeout=1.5)
    assert len(received) == 1001  # nothing of a refused request, all of an accepted one


def test_messages_published_before_a_subscription_exists_are_not_delivered_to_it(
        publisher: Any, subscriber: Any, topic: str,
        new_subscription: Callable[..., str]) -> None:
    publish(publisher, topic, [b"early"])
    subscription = new_subscription()
    publish(publisher, topic, [b"late"])
    assert [m.message.data for m in pull(subscriber, subscription)] == [b"late"]


# -- redelivery ---------------------------------------------------------------------


def test_a_nacked_message_is_redelivered_with_its_delivery_attempt_counted(
        publisher: Any, subscriber: Any, topic: str,
        new_subscription: Callable[..., str]) -> None:
    dead_letters = f"{topic}-dlq"
    publisher.create_topic(name=dead_letters)
    subscription = new_subscription(dead_letter_policy={
        "dead_letter_topic": dead_letters, "max_delivery_attempts": DEAD_LETTER_ATTEMPTS})
    publish(publisher, topic, [b"flaky"])
    received = Received(lambda m: "nack" if m.delivery_attempt < 3 else "ack")
    with streaming(subscriber, subscription, received):
        wait_for(lambda: len(received.data()) == 3, 10, "three deliveries")
        time.sleep(0.3)  # acked on the third: no fourth
    assert [m.delivery_attempt for m in received.messages] == [1, 2, 3]
    assert len({m.ack_id for m in received.messages}) == 3  # each delivery its own ack id
    assert len({m.message_id for m in received.messages}) == 1


def test_an_expired_ack_deadline_redelivers(publisher: Any, subscriber: Any, topic: str,
                                            new_subscription: Callable[..., str]) -> None:
    subscription = new_subscription()
    [message_id] = publish(publisher, topic, [b"slow"])
    [first] = pull(subscriber, subscription)
    subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[first.ack_id],
                                   ack_deadline_seconds=1)
    started = time.monotonic()
    [again] = pull(subscriber, subscription, timeout=5)
    assert time.monotonic() - started >= 0.8
    assert (again.message.message_id, again.message.data) == (message_id, b"slow")
    assert again.ack_id != first.ack_id
    subscriber.acknowledge(subscription=subscription, ack_ids=[first.ack_id])  # stale: ignored
    assert pull(subscriber, subscription, timeout=1.5) == []  # still leased to `again`


def test_extending_the_deadline_prevents_redelivery(
        publisher: Any, subscriber: Any, topic: str,
        new_subscription: Callable[..., str]) -> None:
    subscription = new_subscription()
    publish(publisher, topic, [b"long job"])
    [first] = pull(subscriber, subscription)
    subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[first.ack_id],
                                   ack_deadline_seconds=1)
    time.sleep(0.5)
    subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[first.ack_id],
                                   ack_deadline_seconds=30)
    assert pull(subscriber, subscription, timeout=2.0) == []  # past the first deadline
    subscriber.acknowledge(subscription=subscription, ack_ids=[first.ack_id])


def test_the_retry_policy_delays_redelivery_after_a_nack(
        publisher: Any, subscriber: Any, topic: str,
        new_subscription: Callable[..., str]) -> None:
    subscription = new_subscription(retry_policy={"minimum_backoff": {"seconds": 1},
                                                  "maximum_backoff": {"seconds": 2}})
    publish(publisher, topic, [b"backoff"])
    [first] = pull(subscriber, subscription)
    nacked = time.monotonic()
    subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[first.ack_id],
                                   ack_deadline_seconds=0)
    [second] = pull(subscriber, subscription, timeout=5)
    assert 0.9 <= time.monotonic() - nacked < 1.8  # the minimum backoff
    nacked = time.monotonic()
    subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[second.ack_id],
                                   ack_deadline_seconds=0)
    [third] = pull(subscriber, subscription, timeout=5)
    assert 1.8 <= time.monotonic() - nacked < 3  # doubled, up to the maximum
    subscriber.acknowledge(subscription=subscription, ack_ids=[third.ack_id])


def test_a_message_goes_to_the_dead_letter_topic_after_max_delivery_attempts(
        publisher: Any, subscriber: Any, topic: str,
        new_subscription: Callable[..., str]) -> None:
    dead_letters = f"{topic}-dlq"
    publisher.create_topic(name=dead_letters)
    letters = new_subscription(of=dead_letters)
    subscription = new_subscription(dead_letter_policy={
        "dead_letter_topic": dead_letters, "max_delivery_attempts": DEAD_LETTER_ATTEMPTS})
    publish(publisher, topic, [b"poison"], kind="bad")
    attempts = []
    for _ in range(DEAD_LETTER_ATTEMPTS):
        [delivery] = pull(subscriber, subscription)
        attempts.append(delivery.delivery_attempt)
        subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[delivery.ack_id],
                                       ack_deadline_seconds=0)
    assert attempts == [1, 2, 3, 4, 5]
    [letter] = pull(subscriber, letters)
    assert letter.message.data == b"poison"
    assert letter.message.attributes["kind"] == "bad"
    assert letter.message.attributes["CloudPubSubDeadLetterSourceDeliveryCount"] == "5"
    assert letter.message.attributes["CloudPubSubDeadLetterSourceSubscription"] == (
        subscription.rsplit("/", 1)[-1])
    assert pull(subscriber, subscription, timeout=1.5) == []  # gone from the source


# -- ordering keys ----------------------------------------------------------------


def test_several_messages_of_a_key_are_out_at_once_and_a_nack_replays_the_key_from_it(
        publisher: Any, subscriber: Any, topic: str,
        new_subscription: Callable[..., str]) -> None:
    """As Pub/Sub: a key's messages are delivered together, in order; a nacked one comes
    again with every later message of its key - leased or acked - under new ack ids."""
    subscription = new_subscription(enable_message_ordering=True)
    publish(publisher, topic, [b"a0", b"a1", b"a2", b"a3"], ordering_key="a")
    publish(publisher, topic, [b"b0", b"b1"], ordering_key="b")
    first = pull(subscriber, subscription)
    by_data = {m.message.data: m for m in first}
    assert sorted(by_data) == [b"a0", b"a1", b"a2", b"a3", b"b0", b"b1"]
    for key in ("a", "b"):
        assert [m.message.data for m in first if m.message.ordering_key == key] == sorted(
            v for v in by_data if v.startswith(key.encode()))
    subscriber.acknowledge(subscription=subscription, ack_ids=[by_data[b"a3"].ack_id])

    subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[by_data[b"a1"].ack_id],
                                   ack_deadline_seconds=0)
    again = pull(subscriber, subscription)
    assert [m.message.data for m in again] == [b"a1", b"a2", b"a3"]  # a0 and b are still out
    assert {m.ack_id for m in again}.isdisjoint(m.ack_id for m in first)
    subscriber.acknowledge(subscription=subscription, ack_ids=[
        *(by_data[v].ack_id for v in (b"a0", b"b0", b"b1")), *(m.ack_id for m in again)])
    assert pull(subscriber, subscription, timeout=1.5) == []


def test_ordering_keys_keep_their_order_through_streaming_pull(
        publisher: Any, subscriber: Any, topic: str,
        new_subscription: Callable[..., str]) -> None:
    subscription = new_subscription(enable_message_ordering=True)
    keys = ["red", "green", "blue"]
    for key in keys:
        publish(publisher, topic, [f"{key}-{i}".encode() for i in range(40)], ordering_key=key)
    received = Received()
    with streaming(subscriber, subscription, received):
        wait_for(lambda: len(received.data()) == 120, 20, "120 messages")
    per_key: dict[str, list[bytes]] = defaultdict(list)
    for message in received.messages:
        per_key[message.ordering_key].append(message.data)
    assert per_key == {key: [f"{key}-{i}".encode() for i in range(40)] for key in keys}


# -- streams and flow control -------------------------------------------------------


def test_two_streams_of_one_subscription_share_its_messages_without_duplicates(
        publisher: Any, subscriber: Any, topic: str,
        new_subscription: Callable[..., str]) -> None:
    subscription = new_subscription()
    values = [f"m{i}".encode() for i in range(300)]

    def slow_ack(message: Any) -> str:
        time.sleep(0.002)
        return "ack"

    left, right = Received(slow_ack), Received(slow_ack)
    other = pubsub_v1.SubscriberClient()
    try:
        with (streaming(subscriber, subscription, left, max_messages=5),
              streaming(other, subscription, right, max_messages=5)):
            time.sleep(0.5)  # both streams open before anything is published
            publish(publisher, topic, values)
            wait_for(lambda: len(left.data()) + len(right.data()) >= 300, 20, "300 messages")
            time.sleep(0.3)  # any duplicate would show up now
    finally:
        other.close()
    everything = left.data() + right.data()
    assert sorted(everything) == sorted(values)
    assert left.data(), "the first stream had no share"
    assert right.data(), "the second stream had no share"


async def test_flow_control_limits_the_outstanding_messages_of_a_stream(
        publisher: Any, subscriber: Any, topic: str,
        new_subscription: Callable[..., str]) -> None:
    subscription = new_subscription()
    publish(publisher, topic, [f"m{i}".encode() for i in range(10)])
    client = SubscriberAsyncClient()
    writes: asyncio.Queue[StreamingPullRequest] = asyncio.Queue()
    await writes.put(StreamingPullRequest(subscription=subscription,
                                          stream_ack_deadline_seconds=30,
                                          max_outstanding_messages=3))

    async def requests() -> AsyncIterator[StreamingPullRequest]:
        while True:
            yield await writes.get()

    arrived: asyncio.Queue[Any] = asyncio.Queue()

    async def read(stream: AsyncIterable[StreamingPullResponse]) -> None:
        async for response in stream:  # never cancelled mid-read: that would end the call
            for message in response.received_messages:
                arrived.put_nowait(message)

    try:
        async with asyncio.TaskGroup() as tasks:
            reader = tasks.create_task(
                read(await client.streaming_pull(requests=requests())), name="test-reader")
            try:
                outstanding = await _receive(arrived, 3)
                assert len(outstanding) == 3
                assert await _receive(arrived, 1, within=0.5) == []  # the stream is full
                await writes.put(StreamingPullRequest(ack_ids=[outstanding[0].ack_id]))
                [fourth] = await _receive(arrived, 1)  # acked on the stream: room for one
                await client.acknowledge(subscription=subscription,  # unary, as the 2.x
                                         ack_ids=[outstanding[1].ack_id])  # client acks
                [fifth] = await _receive(arrived, 1)
                assert await _receive(arrived, 1, within=0.5) == []
                await writes.put(StreamingPullRequest(modify_deadline_ack_ids=[fifth.ack_id],
                                                      modify_deadline_seconds=[1]))
                [again] = await _receive(arrived, 1, within=5)  # its stream deadline expired
                assert again.message.message_id == fifth.message.message_id
                assert again.ack_id != fifth.ack_id
                assert fourth.message.message_id not in {
                    m.message.message_id for m in outstanding}
            finally:
                reader.cancel()
    finally:
        close: Callable[[], Awaitable[None]] = client.transport.close  # untyped in the client
        await close()


async def _receive(arrived: asyncio.Queue[Any], count: int, within: float = 5.0) -> list[Any]:
    """Take ``count`` received messages, or what came within ``within`` seconds."""
    got: list[Any] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while len(got) < count:
        try:
            got.append(await asyncio.wait_for(arrived.get(), deadline - loop.time()))
        except TimeoutError:
            break
    return got


def test_exactly_once_acks_of_live_ack_ids_succeed_and_of_stale_ones_fail(
        publisher: Any, subscriber: Any, topic: str,
        new_subscription: Callable[..., str]) -> None:
    """The streaming client's ack futures: SUCCESS, then INVALID_ACK_ID once the lease ended.

    The retry policy delays the redelivery past the stale ack: the Python
    client reports every other ack id of a request that failed as ``OTHER``
    (although the server applied them), so the two must not share a request.
    """
    subscription = new_subscription(enable_exactly_once_delivery=True, retry_policy={
        "minimum_backoff": {"seconds": 1}, "maximum_backoff": {"seconds": 1}})
    publish(publisher, topic, [b"once", b"nacked first"])
    statuses: dict[bytes, list[Any]] = defaultdict(list)
    lock = threading.Lock()
    nacked: set[bytes] = set()

    def settle(message: Any) -> None:
        with lock:
            first = message.data == b"nacked first" and message.data not in nacked
            nacked.add(message.data)
        if first:
            result = message.nack_with_response().result(timeout=10)
            try:  # the lease ended with the nack: this ack id is stale now
                message.ack_with_response().result(timeout=10)
            except pubsub_v1.subscriber.exceptions.AcknowledgeError as exc:
                result = exc.error_code
        else:
            result = message.ack_with_response().result(timeout=10)
        with lock:
            statuses[message.data].append(result)

    with streaming(subscriber, subscription, settle):
        wait_for(lambda: sum(map(len, statuses.values())) == 3, 10, "three settlements")
    status = pubsub_v1.subscriber.exceptions.AcknowledgeStatus
    assert statuses == {b"once": [status.SUCCESS],
                        b"nacked first": [status.INVALID_ACK_ID, status.SUCCESS]}


def test_exactly_once_stale_ack_ids_fail_with_an_error_info_naming_each(
        publisher: Any, subscriber: Any, topic: str,
        new_subscription: Callable[..., str]) -> None:
    """Acknowledge / ModifyAckDeadline with stale ack ids: INVALID_ARGUMENT, per-id ErrorInfo.

    The live ack ids of the same request take; only the stale ones are named.
    """
    subscription = new_subscription(enable_exactly_once_delivery=True)
    publish(publisher, topic, [b"expires", b"live"])
    first = {r.message.data: r for r in pull(subscriber, subscription, max_messages=2)}
    expired = first[b"expires"].ack_id
    subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[expired],
                                   ack_deadline_seconds=1)
    [again] = pull(subscriber, subscription, timeout=5)  # redelivered: `expired` is stale
    assert again.message.data == b"expires"

    with pytest.raises(exceptions.InvalidArgument) as failed:
        subscriber.acknowledge(subscription=subscription,
                               ack_ids=[expired, first[b"live"].ack_id, "never-issued"])
    error = failed.value
    assert (error.reason, error.domain) == ("EXACTLY_ONCE_ACKID_FAILURE",
                                            "pubsub.googleapis.com")
    assert dict(error.metadata) == {expired: "PERMANENT_FAILURE_INVALID_ACK_ID",
                                    "never-issued": "PERMANENT_FAILURE_INVALID_ACK_ID"}
    [info] = error.details  # the ErrorInfo, parsed from grpc-status-details-bin
    assert info.reason == "EXACTLY_ONCE_ACKID_FAILURE"

    with pytest.raises(exceptions.InvalidArgument) as failed:  # "live" was acked above
        subscriber.modify_ack_deadline(subscription=subscription,
                                       ack_ids=[first[b"live"].ack_id, again.ack_id],
                                       ack_deadline_seconds=30)
    assert dict(failed.value.metadata) == {
        first[b"live"].ack_id: "PERMANENT_FAILURE_INVALID_ACK_ID"}
    subscriber.acknowledge(subscription=subscription, ack_ids=[again.ack_id])  # still live
    assert pull(subscriber, subscription, timeout=1.5) == []


def test_without_exactly_once_stale_ack_ids_are_ignored(
        publisher: Any, subscriber: Any, topic: str,
        new_subscription: Callable[..., str]) -> None:
    subscription = new_subscription()
    publish(publisher, topic, [b"best effort"])
    [first] = pull(subscriber, subscription)
    subscriber.acknowledge(subscription=subscription, ack_ids=[first.ack_id])
    subscriber.acknowledge(subscription=subscription, ack_ids=[first.ack_id, "never-issued"])
    subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[first.ack_id],
                                   ack_deadline_seconds=0)


# -- test hooks (the kit's server on a thread of this process) ------------------------


async def test_broken_streams_end_with_the_status_and_their_leases_live_on(
        threaded_pubsub_server: ThreadedPubSubServer) -> None:
    """``break_streams``: the stream ends UNAVAILABLE; its leases can still be acked."""
    server = threaded_pubsub_server
    publisher = PublisherAsyncClient(transport=PublisherGrpcAsyncIOTransport(
        channel=grpc.aio.insecure_channel(server.host)))
    client = SubscriberAsyncClient(transport=SubscriberGrpcAsyncIOTransport(
        channel=grpc.aio.insecure_channel(server.host)))
    topic = f"projects/{PROJECT}/topics/broken-{os.getpid()}-{time.monotonic_ns()}"
    subscription = topic.replace("/topics/", "/subscriptions/")
    try:
        await publisher.create_topic(name=topic)
        await client.create_subscription(request={
            "name": subscription, "topic": topic, "enable_exactly_once_delivery": True})
        await publisher.publish(topic=topic, messages=[PubsubMessage(data=b"held")])

        async def requests() -> AsyncIterator[StreamingPullRequest]:
            yield StreamingPullRequest(subscription=subscription, stream_ack_deadline_seconds=60)
            await asyncio.Event().wait()  # the client writes nothing more

        stream = await client.streaming_pull(requests=requests())
        responses = aiter(stream)
        [held] = (await anext(responses)).received_messages
        other = await server.acall(lambda s: s.break_streams("projects/x/subscriptions/none"))
        assert other == 0  # another subscription's streams only
        assert await server.acall(lambda s: s.break_streams(subscription)) == 1
        with pytest.raises(exceptions.ServiceUnavailable, match="broke the stream"):
            await anext(responses)
        assert (await server.pending(subscription)) == 1  # leased still, not redelivered
        await client.acknowledge(subscription=subscription, ack_ids=[held.ack_id])  # live
        assert (await server.pending(subscription)) == 0
        with pytest.raises(KeyError):
            await server.acall(lambda s: s.break_streams(status="NO_SUCH_STATUS"))
    finally:
        for closing in (publisher, client):
            close: Callable[[], Awaitable[None]] = closing.transport.close
            await close()


# -- administration ------------------------------------------------------------------


def test_topics_and_subscriptions_are_created_listed_got_and_deleted(
        publisher: Any, subscriber: Any, topic: str,
        new_subscription: Callable[..., str]) -> None:
    project = f"projects/{PROJECT}"
    subscription = new_subscription(ack_deadline_seconds=42)
    got = subscriber.get_subscription(subscription=subscription)
    assert (got.topic, got.ack_deadline_seconds) == (topic, 42)
    assert publisher.get_topic(topic=topic).name == topic
    with pytest.raises(exceptions.AlreadyExists):
        publisher.create_topic(name=topic)
    assert topic in [t.name for t in publisher.list_topics(project=project)]
    assert list(publisher.list_topic_subscriptions(topic=topic)) == [subscription]
    listed = subscriber.list_subscriptions(request={"project": project, "page_size": 1})
    assert subscription in [s.name for s in listed]  # the pager follows the page tokens

    publisher.delete_topic(topic=topic)
    with pytest.raises(exceptions.NotFound):
        publisher.get_topic(topic=topic)
    assert subscriber.get_subscription(subscription=subscription).topic == "_deleted-topic_"
    subscriber.delete_subscription(subscription=subscription)
    with pytest.raises(exceptions.NotFound):
        subscriber.get_subscription(subscription=subscription)
    with pytest.raises(exceptions.NotFound):
        pull(subscriber, subscription)


def test_invalid_settings_are_refused(publisher: Any, subscriber: Any, topic: str,
                                      new_subscription: Callable[..., str]) -> None:
    with pytest.raises(exceptions.InvalidArgument):
        new_subscription(ack_deadline_seconds=5)
    with pytest.raises(exceptions.NotFound):
        new_subscription(of=f"projects/{PROJECT}/topics/no-such-topic")
    with pytest.raises(exceptions.InvalidArgument):
        publisher.create_topic(name="not a topic name")


@pytest.mark.parametrize("bad_id", ["9lives", "googly", "ab", "s" * 256, "with space",
                                    "sübscription", "a/b"])
def test_a_malformed_name_is_invalid_argument_a_missing_one_not_found(
        publisher: Any, subscriber: Any, topic: str, bad_id: str) -> None:
    """As Pub/Sub: an id starts with a letter, has 3 to 255 ASCII letters, digits and
    ``-_.~+%``, and does not start with ``goog``; a well-formed name that names nothing
    is NOT_FOUND."""
    malformed = f"projects/{PROJECT}/subscriptions/{bad_id}"
    for call in (lambda: subscriber.get_subscription(subscription=malformed),
                 lambda: pull(subscriber, malformed),
                 lambda: subscriber.acknowledge(subscription=malformed, ack_ids=["1-1"]),
                 lambda: subscriber.create_subscription(name=malformed, topic=topic),
                 lambda: publisher.create_topic(name=f"projects/{PROJECT}/topics/{bad_id}"),
                 lambda: publisher.get_topic(topic=f"projects/{PROJECT}/topics/{bad_id}")):
        with pytest.raises(exceptions.InvalidArgument, match="Invalid resource name given"):
            call()
    with pytest.raises(exceptions.InvalidArgument, match="Invalid resource name given"):
        list(subscriber.streaming_pull(requests=iter([StreamingPullRequest(
            subscription=malformed, stream_ack_deadline_seconds=10)])))
    longest = f"projects/{PROJECT}/subscriptions/s{'~' * 254}"
    with pytest.raises(exceptions.NotFound):
        subscriber.get_subscription(subscription=longest)
    with pytest.raises(exceptions.NotFound):
        pull(subscriber, longest)


# -- volume ------------------------------------------------------------------------------


def test_five_thousand_messages_through_streaming_pull_none_lost_or_duplicated(
        publisher: Any, subscriber: Any, topic: str,
        new_subscription: Callable[..., str]) -> None:
    subscription = new_subscription()
    values = [f"m{i}".encode() for i in range(5000)]
    received = Received()
    with streaming(subscriber, subscription, received):
        publish(publisher, topic, values)
        wait_for(lambda: len(received.data()) >= 5000, 40, "5000 messages")
        time.sleep(0.5)  # a duplicate or a redelivery would show up now
    counts = Counter(received.data())
    assert sorted(counts) == sorted(values)
    assert counts.most_common(1)[0][1] == 1
    assert pull(subscriber, subscription, timeout=1.5) == []


# -- the optional state file (--state-file) ----------------------------------------------


def test_a_state_file_keeps_topics_subscriptions_and_unacked_messages_across_a_kill(
    tmp_path: Path,
) -> None:
    """SIGKILL and a start on the same file: what was not acked comes again under its id."""
    from tests.pubsub.test_crash import pubsub_process  # noqa: PLC0415 - a test's helper

    server = pubsub_process(tmp_path, state_file=tmp_path / "state.json").start()
    try:
        with mock.patch.dict(os.environ, {"PUBSUB_EMULATOR_HOST": f"127.0.0.1:{server.port}"}):
            publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
        try:
            topic = f"projects/{PROJECT}/topics/kept"
            subscription = f"projects/{PROJECT}/subscriptions/kept"
            publisher.create_topic(name=topic)
            subscriber.create_subscription(request={"name": subscription, "topic": topic})
            ids = publish(publisher, topic, [b"acked", b"leased", b"waiting"], colour="red")
            first = pull(subscriber, subscription, max_messages=2)
            assert [r.message.data for r in first] == [b"acked", b"leased"]
            subscriber.acknowledge(subscription=subscription, ack_ids=[first[0].ack_id])
            server.kill()
            server.start()
            assert subscriber.get_subscription(subscription=subscription).topic == topic
            again = pull(subscriber, subscription)
            assert [(r.message.message_id, r.message.data) for r in again] == [
                (ids[1], b"leased"), (ids[2], b"waiting")]
            assert {r.message.attributes["colour"] for r in again} == {"red"}
            [later] = publish(publisher, topic, [b"after the restart"])
            assert later not in ids  # ids go on after the saved ones
        finally:
            publisher.stop()
            subscriber.close()
    finally:
        server.stop()


async def test_a_client_gone_during_a_write_ends_its_stream_without_an_error() -> None:
    """A stream whose client went away mid-write ends quietly; any other write error is raised.

    (A stopping process used to leave a traceback from gRPC here: the write failed, the
    handler raised, and sending that error status to nobody failed too.)
    """
    service = PubSubService()
    topic, name = f"projects/{PROJECT}/topics/gone-t", f"projects/{PROJECT}/subscriptions/gone-s"
    service.state.create_topic(topic, object())
    service.state.create_subscription(name, SubscriptionSettings(topic=topic), object())

    class Context:
        def __init__(self, *, gone: bool) -> None:
            self.gone = gone

        async def write(self, response: object) -> None:
            raise RuntimeError("Failed execute_batch")

        def done(self) -> bool:
            return self.gone

    service.state.publish(topic, [(b"one", {}, "")])
    stream = _Stream(name, Consumer(10, 0), deadline=10.0)
    await asyncio.wait_for(service._deliver(stream, Context(gone=True)), 5)  # type: ignore[arg-type]
    service.state.publish(topic, [(b"two", {}, "")])
    with pytest.raises(RuntimeError, match="execute_batch"):
        await service._deliver(_Stream(name, Consumer(10, 0), deadline=10.0),
                               Context(gone=False))  # type: ignore[arg-type]

"""The Pub/Sub harness of the conformance suite, over the testing kit's test server.

The server runs in a thread of this process (the kit's ``PubSubService`` on a
``grpc.aio`` server, on the thread's own event loop), so that the harness can
read what the broker itself holds: Pub/Sub has no API that says how many
messages of a subscription are acked while a consumer holds leases, and the
suite asks exactly that (``committed``), and so that tests can use the
server's test hooks (ending leases, breaking streams). Everything else the harness does goes
through real ``google-cloud-pubsub`` async clients of its own (publishing,
reading the dead-letter topic); nothing goes through the producer under test.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import grpc
from google.api_core import exceptions
from google.pubsub_v1.services.publisher import PublisherAsyncClient
from google.pubsub_v1.services.publisher.transports import PublisherGrpcAsyncIOTransport
from google.pubsub_v1.services.subscriber import SubscriberAsyncClient
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcAsyncIOTransport
from google.pubsub_v1.types import PubsubMessage

from sharedstream import BaseEventTrigger
from sharedstream.producers._pubsub_types import CHANNEL_OPTIONS
from sharedstream.producers.pubsub import (
    DLQ_ATTRIBUTE_MESSAGE_ID,
    DLQ_ATTRIBUTE_REASON,
    DLQ_ATTRIBUTE_SUBSCRIPTION,
    DLQ_ATTRIBUTE_TRIGGERS,
)
from sharedstream.testing.harness import DeadLetter, Features, Stream
from sharedstream.testing.pubsub.server import SERVER_OPTIONS
from sharedstream.testing.pubsub.service import PubSubService
from sharedstream.testing.scripts import ScriptedTrigger
from sharedstream.triggers.pubsub import PubSubSharedStreamTrigger

__all__ = ["PROJECT", "ConformancePubSubTrigger", "PubSubHarness", "ThreadedPubSubServer"]

PROJECT = "sharedstream-test"
ORDERING_KEY = "k"

_T = TypeVar("_T")


class ThreadedPubSubServer:
    """The kit's Pub/Sub test server on a thread of its own.

    :meth:`pending` reads its state; :meth:`call` and :meth:`acall` run
    anything else on the server's event loop (the state and the service are
    not thread-safe: they must only be touched there).
    """

    def __init__(self) -> None:
        self.host = ""
        self._loop = asyncio.new_event_loop()
        self._service: PubSubService | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._loop.run_until_complete,
                                        args=(self._serve(),), name="pubsub-test-server",
                                        daemon=True)

    def start(self) -> ThreadedPubSubServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the Pub/Sub test server did not start within 10 s")
        return self

    async def _serve(self) -> None:
        self._service = PubSubService(pull_wait=0.5)
        self._stop = asyncio.Event()
        server = grpc.aio.server(handlers=self._service.handlers(), options=SERVER_OPTIONS)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self.host = f"127.0.0.1:{port}"
        try:
            async with asyncio.TaskGroup() as tasks:
                sweep = tasks.create_task(self._service.sweep(), name="pubsub-sweep")
                self._ready.set()
                await self._stop.wait()
                sweep.cancel()
        finally:
            await server.stop(grace=None)

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _submit(self, action: Callable[[PubSubService], _T]) -> Future[_T]:
        async def run() -> _T:
            assert self._service is not None
            return action(self._service)

        return asyncio.run_coroutine_threadsafe(run(), self._loop)

    def call(self, action: Callable[[PubSubService], _T]) -> _T:
        """``action(service)`` on the server's loop, from a thread with no loop; its result."""
        return self._submit(action).result(timeout=10)

    async def acall(self, action: Callable[[PubSubService], _T]) -> _T:
        """``action(service)`` on the server's loop, awaited from another loop; its result."""
        return await asyncio.wait_for(asyncio.wrap_future(self._submit(action)), 10)

    async def pending(self, subscription: str) -> int:
        """Messages of ``subscription`` not acked nor dead-lettered (queued, delayed, leased)."""
        return await self.acall(lambda service: service.state.counts(subscription).unacked)


class ConformancePubSubTrigger(ScriptedTrigger, PubSubSharedStreamTrigger):
    """The Pub/Sub trigger with a scripted filter (see ``sharedstream.testing.scripts``)."""

    @classmethod
    def stream_of(cls, kwargs: dict[str, Any]) -> str:
        return str(kwargs["subscription"])

    def scripted_value(self, message: Any) -> bytes:
        return bytes(message.data)


class PubSubHarness:
    """The conformance harness: a topic, a subscription and a dead-letter topic per stream.

    ``keyed``: the subscription has message ordering on and every message is
    published with one ordering key, so a stream is one ordered lane;
    otherwise messages have no key and each is its own lane.
    """

    def __init__(self, server: ThreadedPubSubServer, *, keyed: bool) -> None:
        self.server, self.keyed = server, keyed
        # With a key, delivery is ordered: the key's messages come in order and a nacked
        # one comes again with every later one of its key, after them (as Kafka's rewind).
        self.features = Features(ordered_lanes=keyed, ordered_delivery=keyed,
                                 refuses_lossy_settings=False)
        self.publisher: Any = None
        self.subscriber: Any = None
        self.topics: dict[str, str] = {}  # subscription -> its topic
        self.letter_readers: dict[str, str] = {}  # dead-letter topic -> its subscription
        self.sent: dict[str, list[str]] = {}  # subscription -> message ids, in publish order
        self.letters: dict[str, list[DeadLetter]] = {}

    async def start(self) -> None:
        host = self.server.host
        self.publisher = PublisherAsyncClient(transport=PublisherGrpcAsyncIOTransport(
            channel=grpc.aio.insecure_channel(host, options=CHANNEL_OPTIONS)))
        self.subscriber = SubscriberAsyncClient(transport=SubscriberGrpcAsyncIOTransport(
            channel=grpc.aio.insecure_channel(host, options=CHANNEL_OPTIONS)))

    async def close(self) -> None:
        for client in (self.publisher, self.subscriber):
            if client is not None:
                await client.transport.close()

    async def create_subscription(self, topic: str, **fields: Any) -> str:
        name = f"projects/{PROJECT}/subscriptions/s-{uuid.uuid4().hex[:12]}"
        await self.subscriber.create_subscription(request={"name": name, "topic": topic,
                                                           **fields})
        return name

    async def create_stream(self, *, dead_letter: bool = True, **fields: Any) -> Stream:
        topic = f"projects/{PROJECT}/topics/t-{uuid.uuid4().hex[:12]}"
        await self.publisher.create_topic(name=topic)
        subscription = await self.create_subscription(
            topic, enable_message_ordering=self.keyed, ack_deadline_seconds=10, **fields)
        self.topics[subscription] = topic
        dlq = None
        if dead_letter:
            dlq = f"{topic}-dlq"
            await self.publisher.create_topic(name=dlq)
            self.letter_readers[dlq] = await self.create_subscription(dlq)
        return Stream(name=subscription, dead_letter=dlq, group="")

    async def produce(self, stream: Stream, values: Sequence[bytes], *,
                      key: str | None = None, attributes: dict[str, str] | None = None) -> None:
        ordering_key = key if key is not None else (ORDERING_KEY if self.keyed else "")
        messages = [PubsubMessage(data=value, attributes=attributes or {},
                                  ordering_key=ordering_key) for value in values]
        response = await self.publisher.publish(topic=self.topics[stream.name],
                                                messages=messages)
        self.sent.setdefault(stream.name, []).extend(response.message_ids)

    def trigger_kwargs(self, stream: Stream, **overrides: Any) -> dict[str, Any]:
        return {"project": PROJECT, "subscription": stream.name,
                "dead_letter_topic": stream.dead_letter, "emulator_host": self.server.host,
                **overrides}

    def trigger(self, stream: Stream, *, script: str, max_redeliveries: int = 5,
                **overrides: Any) -> BaseEventTrigger:
        return ConformancePubSubTrigger(script=script, **self.trigger_kwargs(
            stream, max_redeliveries=max_redeliveries, **overrides))

    def lossy_trigger(self, stream: Stream) -> BaseEventTrigger:  # pragma: no cover
        raise NotImplementedError("the Pub/Sub producer has no setting that acks early")

    async def committed(self, stream: Stream) -> int:
        """How many of the stream's messages are acked (or dead-lettered) on the server."""
        return len(self.sent.get(stream.name, [])) - await self.server.pending(stream.name)

    async def dead_letters(self, stream: Stream) -> list[DeadLetter]:
        assert stream.dead_letter is not None
        letters = self.letters.setdefault(stream.dead_letter, [])
        reader = self.letter_readers[stream.dead_letter]
        while True:
            try:
                response = await self.subscriber.pull(subscription=reader, max_messages=100,
                                                      timeout=5)
            except exceptions.DeadlineExceeded:
                break
            received = list(response.received_messages)
            if not received:
                break
            await self.subscriber.acknowledge(subscription=reader,
                                              ack_ids=[r.ack_id for r in received])
            for r in received:
                attributes = r.message.attributes
                source = (f"{attributes[DLQ_ATTRIBUTE_SUBSCRIPTION]}/"
                          f"{attributes[DLQ_ATTRIBUTE_MESSAGE_ID]}")
                letters.append(DeadLetter(r.message.data, source,
                                          attributes[DLQ_ATTRIBUTE_REASON],
                                          attributes.get(DLQ_ATTRIBUTE_TRIGGERS, "")))
        return list(letters)

    def producers_created(self, stream: Stream) -> int:
        return ConformancePubSubTrigger.producers.get(stream.name, 0)

    async def consumers_in_group(self, stream: Stream) -> int | None:
        return None  # Pub/Sub does not say how many streams a subscription has

    def raw_event_name(self, stream: Stream, index: int) -> str:
        return f"{stream.name}/{self.sent[stream.name][index]}"

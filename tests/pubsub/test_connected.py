"""The Pub/Sub producer's ``connected`` follows the server: away, and back on the same port.

The kit's test server runs as a child process of this test with a state
file, is stopped under a polling producer and started again on its port
with what it held. The producer's streaming pull breaks, is reopened per
its retry policy (``connected`` ``False`` meanwhile), and the same poll
receives again once the server is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sharedstream.producers.pubsub import PubSubSettings, PubSubSharedStreamProducer
from sharedstream.testing.brokers.process import BrokerNotInstalled, free_port
from sharedstream.testing.brokers.pubsub import start_pubsub, stop_pubsub
from sharedstream.testing.runner import eventually

grpc: Any = pytest.importorskip("grpc")
publisher_module: Any = pytest.importorskip("google.pubsub_v1.services.publisher")
subscriber_module: Any = pytest.importorskip("google.pubsub_v1.services.subscriber")
types: Any = pytest.importorskip("google.pubsub_v1.types")

PROJECT = "sharedstream-test"


@contextlib.asynccontextmanager
async def clients(host: str) -> AsyncIterator[tuple[Any, Any]]:
    """A publisher and a subscriber client of the server at ``host`` for the block."""
    publisher = publisher_module.PublisherAsyncClient(
        transport=publisher_module.transports.PublisherGrpcAsyncIOTransport(
            channel=grpc.aio.insecure_channel(host)))
    subscriber = subscriber_module.SubscriberAsyncClient(
        transport=subscriber_module.transports.SubscriberGrpcAsyncIOTransport(
            channel=grpc.aio.insecure_channel(host)))
    try:
        yield publisher, subscriber
    finally:
        await publisher.transport.close()
        await subscriber.transport.close()


@contextlib.asynccontextmanager
async def polling(producer: PubSubSharedStreamProducer) -> AsyncIterator[
    tuple[asyncio.Task[None], asyncio.Queue[bytes]]
]:
    """The producer's poll as a task for the block, and the data of what it yields."""
    received: asyncio.Queue[bytes] = asyncio.Queue()

    async def poll() -> None:
        async for message, _payload in producer.open_stream():
            received.put_nowait(message.data)

    task = asyncio.create_task(poll(), name="pubsub connected poll")
    try:
        yield task, received
    finally:
        task.cancel()
        await asyncio.wait([task])
        await producer.aclose()


async def test_connected_follows_the_server(tmp_path: Path) -> None:
    port, state = free_port(), tmp_path / "pubsub-state.json"
    try:
        process, host = start_pubsub(tmp_path, port=port, state_file=state)
    except BrokerNotInstalled as exc:
        pytest.skip(str(exc))
    topic = f"projects/{PROJECT}/topics/t-{uuid.uuid4().hex[:12]}"
    subscription = f"projects/{PROJECT}/subscriptions/s-{uuid.uuid4().hex[:12]}"
    try:
        async with clients(host) as (publisher, subscriber):
            await publisher.create_topic(name=topic)
            await subscriber.create_subscription(request={"name": subscription, "topic": topic})
        producer = PubSubSharedStreamProducer(PubSubSettings(
            project=PROJECT, subscription=subscription, emulator_host=host,
            retries=100, retry_backoff=0.1))
        assert producer.connected is False  # no stream yet
        async with polling(producer) as (task, received):
            await eventually(lambda: producer.connected is True, within=10,
                             what="connected while the streaming pull is open")
            stop_pubsub(process)
            await eventually(lambda: producer.connected is False, within=10,
                             what="not connected with the server stopped")
            assert not task.done()  # reopening, per the retry policy
            process, _ = start_pubsub(tmp_path, port=port, state_file=state)
            await eventually(lambda: producer.connected is True, within=20,
                             what="connected again once the server is back")
            async with clients(host) as (publisher, _):
                await publisher.publish(topic=topic, messages=[types.PubsubMessage(data=b"x")])
            assert await asyncio.wait_for(received.get(), 10) == b"x"  # the same poll
            assert not task.done()
    finally:
        stop_pubsub(process)

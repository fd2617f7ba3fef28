"""A Pub/Sub server for the session (the testing kit's, or the emulator in PUBSUB_EMULATOR_HOST).

The tests drive it with the real ``google-cloud-pubsub`` client only;
without that package they skip. Every test makes its own topics and
subscriptions, under the project :data:`PROJECT`.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sharedstream.testing.fixtures import pubsub_emulator_host

pubsub_v1: Any = pytest.importorskip("google.cloud.pubsub_v1")

__all__ = ["pubsub_emulator_host"]

PROJECT = "sharedstream-test"


@pytest.fixture(scope="session")
def publisher(pubsub_emulator_host: str) -> Any:
    """One publisher for the session, with ordering keys enabled (created after the host is set)."""
    options = pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    return pubsub_v1.PublisherClient(publisher_options=options)


@pytest.fixture(scope="session")
def subscriber(pubsub_emulator_host: str) -> Iterator[Any]:
    """One subscriber client for the session's unary calls and streams."""
    client = pubsub_v1.SubscriberClient()
    yield client
    client.close()


@pytest.fixture
def topic(publisher: Any) -> str:
    """A new topic for this test."""
    name = f"projects/{PROJECT}/topics/t-{uuid.uuid4().hex[:12]}"
    publisher.create_topic(name=name)
    return name


@pytest.fixture
def new_subscription(subscriber: Any, topic: str) -> Callable[..., str]:
    """Make a subscription to ``topic`` (or ``of=``) with the given Subscription fields."""

    def make(of: str | None = None, **fields: Any) -> str:
        name = f"projects/{PROJECT}/subscriptions/s-{uuid.uuid4().hex[:12]}"
        subscriber.create_subscription(request={"name": name, "topic": of or topic, **fields})
        return name

    return make


@contextlib.contextmanager
def streaming(subscriber: Any, subscription: str, callback: Callable[[Any], None],
              **flow_control: Any) -> Iterator[Any]:
    """``subscriber.subscribe`` for the block: the streaming-pull future, cancelled at the end."""
    settings = pubsub_v1.types.FlowControl(**flow_control) if flow_control else ()
    future = subscriber.subscribe(subscription, callback, flow_control=settings)
    try:
        yield future
    finally:
        future.cancel()
        future.result(timeout=10)  # the stream's threads have stopped


# -- the producer's tests (tests/pubsub/test_pubsub.py) -----------------------------------


@pytest.fixture(scope="session")
def threaded_pubsub_server() -> Iterator[Any]:
    """The kit's test server on a thread of this process, for the producer's harness."""
    from tests.pubsub.harness import ThreadedPubSubServer  # noqa: PLC0415 - needs the SDK

    server = ThreadedPubSubServer().start()
    yield server
    server.stop()

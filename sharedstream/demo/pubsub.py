"""The demo on Google Pub/Sub: the testing kit's Pub/Sub test server, on a thread of the demo.

The demo's records go to topic :data:`TOPIC` with their region as the
``region`` attribute and no ordering key (each message is a lane of its own);
the watchers share one streaming pull of the subscription of the same name,
and rejected records go to topic ``demo.orders.dlq``.

**How far the broker advanced** is *messages acked*: what the demo published
minus what the server still holds for the subscription (queued, backing off,
waiting behind a key, or leased). Pub/Sub has no API for that count (only
Cloud Monitoring's ``num_undelivered_messages``, and the test server does not
serve it), so the server runs in this process, on a thread with its own event
loop, and the count is read on that loop from its state's public read-only
``counts`` - the same reading the Pub/Sub conformance harness makes. The
progress line says so: ``acked (server count)``. Everything else goes
through the real ``google-cloud-pubsub`` async clients. The SDK is imported only inside methods.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, ClassVar

from sharedstream.brokerkit.sending import OutgoingMessage
from sharedstream.demo import demo_message
from sharedstream.demo.brokers import (
    DEAD_LETTERS,
    TOPIC,
    WatcherTriggers,
    produce_with,
    require_modules,
)
from sharedstream.engine.errors import SharedStreamError

__all__ = ["INSTALL_HINT", "PROJECT", "PubSubDemoBroker"]

PROJECT = "sharedstream-demo"
INSTALL_HINT = "pip install 'sharedstream[pubsub]'"
_SUBSCRIPTION = f"projects/{PROJECT}/subscriptions/{TOPIC}"
_LETTERS_READER = f"projects/{PROJECT}/subscriptions/{DEAD_LETTERS}.reader"


def _topic(name: str) -> str:
    return f"projects/{PROJECT}/topics/{name}"


class PubSubDemoBroker:
    """The kit's Pub/Sub test server on a thread; acked = published - outstanding on it."""

    name: ClassVar[str] = "pubsub"
    advanced_label: ClassVar[str] = "consumed and acked (server count)"
    waiting_label: ClassVar[str] = "waiting for the streaming pull to start..."
    dead_letters_at: ClassVar[str] = f"topic {DEAD_LETTERS}"

    def __init__(self) -> None:
        self.host = ""
        self._loop = asyncio.new_event_loop()
        self._service: Any = None
        self._stop_serving: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._serve_until_stopped,
                                        name="sharedstream-demo-pubsub", daemon=True)
        self._published = 0
        self._advanced = 0
        self._publisher: Any = None
        self._subscriber: Any = None

    @classmethod
    def check_installed(cls) -> None:
        """``google-cloud-pubsub`` (with grpcio), or one line with :data:`INSTALL_HINT`."""
        require_modules(("grpc", "google.pubsub_v1"), support="Pub/Sub", hint=INSTALL_HINT)

    @classmethod
    def watcher_triggers(cls, environ: Mapping[str, str]) -> WatcherTriggers:
        """``PubSubSharedStreamTrigger`` on ``SHAREDSTREAM_DEMO_PUBSUB_HOST`` and ``_TOPIC``."""
        from sharedstream.triggers.pubsub import PubSubSharedStreamTrigger  # noqa: PLC0415

        topic = environ.get("SHAREDSTREAM_DEMO_TOPIC", TOPIC)
        common: dict[str, Any] = {
            "project": environ.get("SHAREDSTREAM_DEMO_PROJECT", PROJECT),
            "subscription": topic,
            "dead_letter_topic": f"{topic}.dlq",
            "emulator_host": environ.get("SHAREDSTREAM_DEMO_PUBSUB_HOST") or None,
            "payload_format": "json",
        }
        return WatcherTriggers(PubSubSharedStreamTrigger, common,
                               region=lambda region: {"attributes": {"region": region}})

    # -- the server thread ----------------------------------------------------------------

    def _serve_until_stopped(self) -> None:
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - handed to start(), which raises it
            self._failed = exc
            self._ready.set()
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        grpc_aio: Any = importlib.import_module("grpc.aio")
        from sharedstream.testing.pubsub.server import (  # noqa: PLC0415
            SERVER_OPTIONS,
            quiet_gone_clients,
        )
        from sharedstream.testing.pubsub.service import PubSubService  # noqa: PLC0415

        self._service = PubSubService(pull_wait=0.5)
        self._stop_serving = asyncio.Event()
        server = grpc_aio.server(handlers=self._service.handlers(), options=SERVER_OPTIONS)
        port = server.add_insecure_port("127.0.0.1:0")
        quiet_gone_clients()  # a second Ctrl-C leaves the publisher's last answer untaken
        await server.start()
        self.host = f"127.0.0.1:{port}"
        try:
            async with asyncio.TaskGroup() as tasks:
                sweep = tasks.create_task(self._service.sweep(), name="pubsub-demo-sweep")
                self._ready.set()
                await self._stop_serving.wait()
                sweep.cancel()
        finally:
            await server.stop(grace=None)

    def start(self, workdir: Path) -> str:
        """Start the server thread; return once it accepts calls (10 s at most)."""
        self._thread.start()
        if not self._ready.wait(10) or self._failed is not None:
            raise SharedStreamError(f"the Pub/Sub test server did not start: {self._failed}")
        return f"pubsub test server on {self.host}"

    def stop(self, *, at_once: bool = False) -> None:
        """Stop the server and join its thread (5 s at most; ``at_once``: no join); idempotent.

        ``at_once`` does not wait: the process exits right after, and the
        thread with it.
        """
        if self._stop_serving is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop_serving.set)
            if not at_once:
                self._thread.join(5)

    def environment(self) -> dict[str, str]:
        """The server's ``host:port``, topic and project for the definitions."""
        return {"SHAREDSTREAM_DEMO_PUBSUB_HOST": self.host, "SHAREDSTREAM_DEMO_TOPIC": TOPIC,
                "SHAREDSTREAM_DEMO_PROJECT": PROJECT}

    # -- the clients ----------------------------------------------------------------------

    async def create_stream(self) -> None:
        """The topic, its subscription (60 s ack deadline), the ``.dlq`` topic and its reader."""
        from sharedstream.producers.pubsub import pubsub_clients  # noqa: PLC0415 - the extra

        self._publisher = pubsub_clients(self.host, "publisher")
        self._subscriber = pubsub_clients(self.host, "subscriber")
        for name in (TOPIC, DEAD_LETTERS):
            await self._publisher.create_topic(name=_topic(name))
        await self._subscriber.create_subscription(request={
            "name": _SUBSCRIPTION, "topic": _topic(TOPIC), "ack_deadline_seconds": 60})
        await self._subscriber.create_subscription(request={
            "name": _LETTERS_READER, "topic": _topic(DEAD_LETTERS)})

    async def produce(self, messages: int, sent: Callable[[int], None]) -> None:
        """Publish the records with a ``region`` attribute (``sharedstream send``'s sender)."""
        from sharedstream.producers._pubsub_send import PubSubSender  # noqa: PLC0415

        def published(count: int) -> None:
            self._published += count
            sent(count)

        sender = PubSubSender(project=PROJECT, topic=TOPIC, emulator_host=self.host)
        records = (OutgoingMessage(value, properties=(("region", key.decode()),))
                   for key, value in map(demo_message, range(messages)))
        await produce_with(sender, records, published)

    async def advanced(self) -> int:
        """Messages acked: published minus outstanding on the server, never decreasing."""
        published = self._published  # before the count: a later publish cannot inflate it
        future: Future[int] = asyncio.run_coroutine_threadsafe(self._outstanding(), self._loop)
        outstanding = await asyncio.wait_for(asyncio.wrap_future(future), 5)
        self._advanced = max(self._advanced, published - outstanding)
        return self._advanced

    async def _outstanding(self) -> int:
        """On the server's loop: the subscription's messages not acked nor dead-lettered."""
        unacked: int = self._service.state.counts(_SUBSCRIPTION).unacked
        return unacked

    async def dead_letters(self, at_least: int) -> int:
        """Messages pulled (and acked) from the ``.dlq`` reader, for up to 3 s."""
        exceptions: Any = importlib.import_module("google.api_core.exceptions")
        count = 0
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                response = await self._subscriber.pull(subscription=_LETTERS_READER,
                                                       max_messages=500, timeout=2)
            except exceptions.DeadlineExceeded:
                received = []
            else:
                received = list(response.received_messages)
            if received:
                await self._subscriber.acknowledge(subscription=_LETTERS_READER,
                                                   ack_ids=[r.ack_id for r in received])
            count += len(received)
            if not received and count >= at_least:
                break
        return count

    async def close(self) -> None:
        """Close the publisher and subscriber channels; idempotent."""
        for client in (self._publisher, self._subscriber):
            if client is not None:
                await client.transport.close()
        self._publisher = self._subscriber = None

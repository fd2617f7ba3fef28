"""The demo on Azure Service Bus: the testing kit's Service Bus test server, as its own process.

The demo's records go to queue :data:`TOPIC` with their region as the
``region`` application property; the watchers share one peek-lock receiver
of it, and rejected records go to the queue's dead-letter sub-queue
(``demo.orders/$DeadLetterQueue``: Service Bus has one per entity, so there
is no ``.dlq`` entity to create). The server creates the queue when it
starts (it takes its entities from a document, see
:mod:`sharedstream.testing.servicebus.config`).

**How far the broker advanced** is *completed below the queue's oldest
message*: the server runs in a process of its own and Service Bus has no
message count over AMQP (only the management REST API, which the test
server does not serve), so the demo peeks the queue's oldest message (a
peek sees locked messages too) and counts every message sent before it as
done, the way a Kafka consumer group's committed offset counts. It lags
the true count by the messages completed out of order above the oldest
one, never overstates it, never decreases, and is exact once the queue is
empty. The progress line says so. Everything goes through the real
``azure-servicebus`` SDK, imported only inside methods; its receivers and
sender run without the keep-alive pinger (closing would wait for it).
"""

from __future__ import annotations

import importlib
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from sharedstream.brokerkit.sending import OutgoingMessage
from sharedstream.demo import demo_message
from sharedstream.demo.brokers import TOPIC, WatcherTriggers, produce_with, require_modules

__all__ = ["INSTALL_HINT", "ServiceBusDemoBroker"]

INSTALL_HINT = "pip install 'sharedstream[servicebus,testing]'"


class ServiceBusDemoBroker:
    """The kit's Service Bus test server process; completed = sent before the oldest message."""

    name: ClassVar[str] = "servicebus"
    advanced_label: ClassVar[str] = "completed (below the oldest in the queue)"
    waiting_label: ClassVar[str] = "waiting for the receiver to open..."
    dead_letters_at: ClassVar[str] = f"{TOPIC}/$DeadLetterQueue"

    def __init__(self) -> None:
        self.connection_string = ""
        self._process: subprocess.Popen[bytes] | None = None
        self._sent = 0
        self._advanced = 0
        self._client: Any = None
        self._peeker: Any = None

    @classmethod
    def check_installed(cls) -> None:
        """``azure-servicebus`` and ``python-qpid-proton``, or one line naming the extra."""
        require_modules(("azure.servicebus", "proton"), support="Service Bus", hint=INSTALL_HINT)

    @classmethod
    def watcher_triggers(cls, environ: Mapping[str, str]) -> WatcherTriggers:
        """``ServiceBusSharedStreamTrigger`` on the queue ``SHAREDSTREAM_DEMO_TOPIC``.

        The namespace is ``SHAREDSTREAM_DEMO_SERVICEBUS_CONNECTION_STRING``.
        """
        from sharedstream.triggers.servicebus import ServiceBusSharedStreamTrigger  # noqa: PLC0415

        common: dict[str, Any] = {
            "connection_string": environ.get("SHAREDSTREAM_DEMO_SERVICEBUS_CONNECTION_STRING", ""),
            "queue": environ.get("SHAREDSTREAM_DEMO_TOPIC", TOPIC),
            "payload_format": "json",
            # The producer's completions wait behind its pending receive (docs/benchmarks.md,
            # Service Bus end to end): on a queue gone quiet, up to max_wait_time each.
            "max_wait_time": 0.5,
        }
        return WatcherTriggers(ServiceBusSharedStreamTrigger, common,
                               region=lambda region: {"properties": {"region": region}})

    # -- the server process ---------------------------------------------------------------

    def start(self, workdir: Path) -> str:
        """Start the server with the demo's queue; return once it accepts connections.

        Raises the testing kit's ``LocalBrokerError`` (a ``SharedStreamError``)
        when it does not start; its log is ``workdir/servicebus.log``.
        """
        from sharedstream.testing.brokers.servicebus import start_servicebus  # noqa: PLC0415

        self._process, self.connection_string = start_servicebus(
            workdir, entities={"queues": [{"name": TOPIC}]})
        endpoint = self.connection_string.split(";", 1)[0].removeprefix("Endpoint=")
        return f"servicebus test server on {urlsplit(endpoint).netloc}"

    def stop(self, *, at_once: bool = False) -> None:
        """Stop the server process (SIGTERM, a kill after 5 s; ``at_once``: a kill); idempotent."""
        from sharedstream.testing.brokers.process import stop_process  # noqa: PLC0415
        from sharedstream.testing.brokers.servicebus import stop_servicebus  # noqa: PLC0415

        if self._process is None:
            return
        if at_once:
            stop_process(self._process, at_once=True)
        else:
            stop_servicebus(self._process)

    def environment(self) -> dict[str, str]:
        """The server's connection string and the queue for the definitions."""
        return {"SHAREDSTREAM_DEMO_SERVICEBUS_CONNECTION_STRING": self.connection_string,
                "SHAREDSTREAM_DEMO_TOPIC": TOPIC}

    # -- the clients ----------------------------------------------------------------------

    async def create_stream(self) -> None:
        """Open a client and a receiver that only peeks (the queue exists already)."""
        aio: Any = importlib.import_module("azure.servicebus.aio")
        self._client = aio.ServiceBusClient.from_connection_string(self.connection_string)
        self._peeker = self._client.get_queue_receiver(queue_name=TOPIC, keep_alive=None)
        await self._peeker.__aenter__()

    async def produce(self, messages: int, sent: Callable[[int], None]) -> None:
        """Send the records with a ``region`` application property (``sharedstream send``'s).

        Ends at the first batch boundary after it is cancelled, even where the
        SDK lost the cancellation (the sender sees to it).
        """
        from sharedstream.producers._servicebus_send import ServiceBusSender  # noqa: PLC0415

        def counted(count: int) -> None:
            self._sent += count
            sent(count)

        sender = ServiceBusSender.from_options(
            {"queue": TOPIC, "connection_string": self.connection_string})
        records = (OutgoingMessage(value, properties=(("region", key.decode()),))
                   for key, value in map(demo_message, range(messages)))
        await produce_with(sender, records, counted)

    async def advanced(self) -> int:
        """Messages sent before the queue's oldest (all sent once it is empty); never decreasing.

        The queue's sequence numbers start at 1 and only the demo sends to it,
        so the oldest message's number less one counts the messages gone.
        """
        sent = self._sent  # before the peek: a later send cannot inflate it
        oldest = await self._peeker.peek_messages(max_message_count=1,
                                                  sequence_number=self._advanced + 1)
        gone = sent if not oldest else min(sent, oldest[0].sequence_number - 1)
        self._advanced = max(self._advanced, gone)
        return self._advanced

    async def dead_letters(self, at_least: int) -> int:
        """Messages received (and deleted) from the dead-letter sub-queue, for up to 3 s."""
        servicebus: Any = importlib.import_module("azure.servicebus")
        count = 0
        deadline = time.monotonic() + 3
        async with self._client.get_queue_receiver(
                queue_name=TOPIC, sub_queue=servicebus.ServiceBusSubQueue.DEAD_LETTER,
                receive_mode=servicebus.ServiceBusReceiveMode.RECEIVE_AND_DELETE,
                keep_alive=None) as letters:
            while time.monotonic() < deadline:
                received = await letters.receive_messages(max_message_count=500,
                                                          max_wait_time=0.5)
                count += len(received)
                if not received and count >= at_least:
                    break
        return count

    async def close(self) -> None:
        """Close the receiver and the client; idempotent."""
        for handle in (self._peeker, self._client):
            if handle is not None:
                await handle.close()
        self._peeker = self._client = None

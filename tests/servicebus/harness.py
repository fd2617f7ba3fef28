"""The Service Bus harness of the conformance suite, over the testing kit's test server.

The server runs on a thread of this process (the kit's ``serve`` on a state
made here), so that the harness can read what the broker itself holds:
Service Bus has no call that counts a queue's locked messages without
taking a lock, and the suite asks exactly that (``committed``). Its queues
are made before it starts (the state is the reactor thread's once it runs):
a pool handed out one per stream. Everything else goes through the real
``azure-servicebus`` SDK (sending, reading the dead-letter sub-queue);
nothing goes through the producer under test.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from typing import Any

from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient

from sharedstream import BaseEventTrigger
from sharedstream.testing.harness import DeadLetter, Features, Stream
from sharedstream.testing.scripts import ScriptedTrigger
from sharedstream.testing.servicebus.model import EntitySettings
from sharedstream.testing.servicebus.server import ServerControl, connection_string, serve
from sharedstream.testing.servicebus.state import ServiceBusState
from sharedstream.triggers.servicebus import ServiceBusSharedStreamTrigger

__all__ = ["SESSION", "ConformanceServiceBusTrigger", "ServiceBusHarness",
           "ThreadedServiceBusServer"]

POOL = 160
"""Queues of each kind made before the server starts (one per stream the tests create)."""
SESSION = "k"
"""The one session every message of a session queue is sent to: one ordered lane."""
LOCK_SECONDS = 5
SHORT_LOCK = 2.0
"""The lock of the ``short-lock`` queue: shorter than any ``lock_duration`` a trigger takes."""


class ThreadedServiceBusServer:
    """The kit's Service Bus test server on a thread, with pools of plain and session queues."""

    def __init__(self) -> None:
        self.state = ServiceBusState()
        for n in range(POOL):
            # Service Bus's own limit well above every test's max_redeliveries: ours rules.
            self.state.create_queue(f"q-{n:03d}", EntitySettings(
                lock_duration=LOCK_SECONDS, max_delivery_count=100))
            self.state.create_queue(f"s-{n:03d}", EntitySettings(
                lock_duration=LOCK_SECONDS, max_delivery_count=100, requires_session=True))
        # Entities of the Service Bus specific tests (tests/servicebus/test_servicebus.py).
        self.state.create_queue("short-lock", EntitySettings(lock_duration=SHORT_LOCK,
                                                             max_delivery_count=100))
        self.state.create_queue("short-session-lock", EntitySettings(
            lock_duration=SHORT_LOCK, max_delivery_count=100, requires_session=True))
        self.state.create_topic("events")
        self.state.create_subscription("events", "all", EntitySettings(
            lock_duration=LOCK_SECONDS, max_delivery_count=100))
        self._control = ServerControl()
        self._port: list[int] = []
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="servicebus-test-server",
                                        daemon=True)
        self._next = {"q": itertools.count(), "s": itertools.count()}
        self.connection_string = ""

    def _serve(self) -> None:
        serve(state=self.state, control=self._control, ready=self._bound)

    def _bound(self, port: int) -> None:
        self._port.append(port)
        self._ready.set()

    def start(self) -> ThreadedServiceBusServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the Service Bus test server did not start within 10 s")
        self.connection_string = connection_string("127.0.0.1", self._port[0])
        return self

    @property
    def port(self) -> int:
        """The port the server listens on (``127.0.0.1``), once started."""
        return self._port[0]

    def stop(self) -> None:
        self._control.stop()
        self._thread.join(10)

    def take_queue(self, *, sessions: bool) -> str:
        """A queue nobody has used yet."""
        kind = "s" if sessions else "q"
        n = next(self._next[kind])
        if n >= POOL:
            raise RuntimeError(f"the harness's pool of {POOL} queues is used up")
        return f"{kind}-{n:03d}"

    def unsettled(self, queue: str) -> int:
        """Messages of ``queue`` neither completed nor dead-lettered (available or locked).

        Read from another thread than the server's: a read that meets a
        change in progress is tried again.
        """
        for _ in range(100):
            try:
                counts = self.state.counts(queue)
            except RuntimeError:  # the dict changed size while counted
                time.sleep(0.001)
                continue
            return counts.available + counts.locked + counts.deferred
        raise RuntimeError(f"could not count {queue}")


class ConformanceServiceBusTrigger(ScriptedTrigger, ServiceBusSharedStreamTrigger):
    """The Service Bus trigger with a scripted filter (see ``sharedstream.testing.scripts``)."""

    @classmethod
    def stream_of(cls, kwargs: dict[str, Any]) -> str:
        return str(kwargs["queue"])

    def scripted_value(self, message: Any) -> bytes:
        return bytes(message.body)


class ServiceBusHarness:
    """The conformance harness: a queue of the server's pool per stream.

    ``sessions``: session queues, every message in one session (one ordered
    lane, redelivered in order behind a failure); otherwise each message is
    its own lane. ``via``: the connection string the triggers use, when it
    is not the server's own (a :func:`~sharedstream.testing.latency_proxy.latency_proxy`
    in front of it); the harness's own client always goes straight to the server.
    """

    def __init__(self, server: ThreadedServiceBusServer, *, sessions: bool,
                 via: str | None = None) -> None:
        self.server, self.sessions = server, sessions
        self.trigger_connection_string = via or server.connection_string
        self.features = Features(ordered_lanes=sessions, ordered_delivery=sessions,
                                 refuses_lossy_settings=False)
        self.client: Any = None
        self.sent: dict[str, int] = {}  # queue -> messages sent
        self.numbers: dict[str, list[int]] = {}  # queue -> sequence numbers, in send order
        self.letters: dict[str, list[DeadLetter]] = {}

    async def start(self) -> None:
        self.client = ServiceBusClient.from_connection_string(self.server.connection_string)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()

    async def create_stream(self, *, dead_letter: bool = True) -> Stream:
        queue = self.server.take_queue(sessions=self.sessions)
        # Service Bus always has the dead-letter sub-queue: ``dead_letter`` changes nothing.
        return Stream(name=queue, dead_letter=f"{queue}/$DeadLetterQueue", group="")

    async def produce(self, stream: Stream, values: Sequence[bytes], *,
                      session: str | None = None,
                      properties: dict[str, str] | None = None) -> None:
        """Send ``values`` in order (on a session queue to ``session``, default :data:`SESSION`).

        ``properties``: application properties of every message.
        """
        if self.sessions:
            session = session or SESSION
        async with self.client.get_queue_sender(stream.name, keep_alive=None) as sender:
            await sender.send_messages([
                ServiceBusMessage(value, session_id=session,
                                  application_properties=properties)  # type: ignore[arg-type]
                for value in values])
        first = self.sent.get(stream.name, 0)
        self.sent[stream.name] = first + len(values)
        # The server numbers a queue's messages 1, 2, ... in the order they are sent.
        self.numbers.setdefault(stream.name, []).extend(
            range(first + 1, first + len(values) + 1))

    def trigger_kwargs(self, stream: Stream, **overrides: Any) -> dict[str, Any]:
        return {"connection_string": self.trigger_connection_string, "queue": stream.name,
                "sessions": self.sessions, "lock_duration": LOCK_SECONDS,
                "max_wait_time": 0.5, **overrides}

    def trigger(self, stream: Stream, *, script: str, max_redeliveries: int = 5,
                **overrides: Any) -> BaseEventTrigger:
        return ConformanceServiceBusTrigger(script=script, **self.trigger_kwargs(
            stream, max_redeliveries=max_redeliveries, **overrides))

    def lossy_trigger(self, stream: Stream) -> BaseEventTrigger:  # pragma: no cover
        raise NotImplementedError("the Service Bus producer has no setting that settles early")

    async def committed(self, stream: Stream) -> int:
        """How many of the stream's messages are completed or dead-lettered on the server."""
        return self.sent.get(stream.name, 0) - self.server.unsettled(stream.name)

    async def dead_letters(self, stream: Stream) -> list[DeadLetter]:
        letters = self.letters.setdefault(stream.name, [])
        receiver = self.client.get_queue_receiver(
            stream.name, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=0.5,
            keep_alive=None)
        async with receiver:
            while received := await receiver.receive_messages(max_message_count=50,
                                                               max_wait_time=0.5):
                for message in received:
                    reason = str(message.dead_letter_reason or "")
                    described = str(message.dead_letter_error_description or "")
                    triggers = (described.split(";", maxsplit=1)[0].removeprefix("triggers ")
                                if described.startswith("triggers ") else "")
                    letters.append(DeadLetter(
                        b"".join(message.body), f"{stream.name}/{message.sequence_number}",
                        reason.removeprefix("sharedstream."), triggers))
                    await receiver.complete_message(message)
        return list(letters)

    def producers_created(self, stream: Stream) -> int:
        return ConformanceServiceBusTrigger.producers.get(stream.name, 0)

    async def consumers_in_group(self, stream: Stream) -> int | None:
        return None  # Service Bus does not say how many receivers an entity has

    def raw_event_name(self, stream: Stream, index: int) -> str:
        return f"{stream.name}/{self.numbers[stream.name][index]}"

"""The Service Bus test server's ``--state-file``: what survives a restart, and when it is written.

The first tests use the state and :class:`StateFile` alone (a clock the
test moves); each names the invariant of
:mod:`sharedstream.testing.servicebus.state_file` (or :mod:`.state`'s
invariant 8) it checks. The last one kills a real server process with
SIGKILL and restarts it on its file, reached by the real SDK.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("proton")

from proton import Message as ProtonMessage

from sharedstream.testing.servicebus.model import (
    NEXT_SESSION,
    CorrelationFilter,
    EntitySettings,
    Message,
    NextSession,
    Outcome,
)
from sharedstream.testing.servicebus.state import MAX_DELIVERY_COUNT_EXCEEDED, ServiceBusState
from sharedstream.testing.servicebus.state_file import DEBOUNCE, StateFile
from sharedstream.testing.servicebus.wire import message_facts
from tests.crash_kit import RestartableServer, running


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def msg(body: str, session: str | None = None, **properties: Any) -> Message:
    """A message as the SDK encodes one (the state file reads messages back from their bytes)."""
    encoded = ProtonMessage(body=body, group_id=session, properties=properties or None).encode()
    return message_facts(bytes(encoded))


def body(state: ServiceBusState, path: str,
         session: str | NextSession | None = None) -> tuple[str, int, int]:
    """Receive one message of ``path``: its body, sequence number and delivery count."""
    receiver = state.open_receiver(path, session=session)
    assert receiver is not None
    delivery = state.receive(receiver)
    assert delivery is not None
    decoded = ProtonMessage()
    decoded.decode(delivery.message.encoded)
    state.close_receiver(receiver)
    return str(decoded.body), delivery.sequence_number, delivery.delivery_count


def restarted(state: ServiceBusState, tmp_path: Path) -> ServiceBusState:
    """``state`` saved to a file and loaded into a new state, as a restarted server does."""
    StateFile(tmp_path / "state.json").save(state)
    again = ServiceBusState()
    assert StateFile(tmp_path / "state.json").load(again)
    return again


def test_a_restored_state_has_the_entities_sequence_numbers_and_unsettled_entries(
    tmp_path: Path,
) -> None:
    """Invariant 6: entities, settings, filters, entries, dead letters and session states."""
    state = ServiceBusState()
    state.create_queue("Orders", EntitySettings(lock_duration=5, max_delivery_count=3))
    state.create_queue("sessions", EntitySettings(requires_session=True))
    state.create_topic("events")
    state.create_subscription("events", "eu", filters=[CorrelationFilter(properties={"r": "eu"})])
    state.send("Orders", [msg("a"), msg("b"), msg("c")])
    state.send("events", [msg("us", r="us"), msg("eu", r="eu")])
    state.send("sessions", [msg("s1", session="s")])
    receiver = state.open_receiver("Orders")
    assert receiver is not None
    first, second = state.receive(receiver), state.receive(receiver)
    assert first is not None
    assert second is not None
    assert first.lock_token is not None
    assert second.lock_token is not None
    state.settle(first.lock_token, Outcome.COMPLETE)
    state.settle(second.lock_token, Outcome.DEAD_LETTER, reason="bad", description="why")
    state.set_session_state("sessions", "s", b"progress")

    again = restarted(state, tmp_path)
    assert again.settings("orders") == EntitySettings(lock_duration=5, max_delivery_count=3)
    assert body(again, "Orders") == ("c", 3, 0)
    assert body(again, "Orders/$DeadLetterQueue") == ("b", 2, 0)
    assert body(again, "events/Subscriptions/eu") == ("eu", 2, 0)
    assert again.counts("events/subscriptions/eu").available == 0  # "us" never matched
    assert body(again, "sessions", NEXT_SESSION) == ("s1", 1, 0)
    assert again.session_state("sessions", "s") == b"progress"
    assert again.send("Orders", [msg("d")]) == [4]  # numbering goes on
    assert again.send("events", [msg("eu2", r="eu")]) == [3]


def test_what_was_locked_comes_back_with_one_more_delivery_or_dead_lettered_at_the_maximum(
    tmp_path: Path,
) -> None:
    """Invariant 6 with 4: a lock lost with the server is a failed delivery."""
    state = ServiceBusState()
    state.create_queue("q", EntitySettings(max_delivery_count=2))
    state.create_queue("s", EntitySettings(requires_session=True))
    state.send("q", [msg("once"), msg("twice")])
    state.send("s", [msg("in-session", session="x")])
    receiver = state.open_receiver("q")
    assert receiver is not None
    held = state.receive(receiver)
    assert held is not None
    assert held.lock_token is not None
    state.settle(held.lock_token, Outcome.ABANDON)  # "once" has failed once
    assert state.receive(receiver) is not None  # both locked now
    assert state.receive(receiver) is not None
    session = state.open_receiver("s", session="x")
    assert session is not None
    assert state.receive(session) is not None

    again = restarted(state, tmp_path)
    assert body(again, "q") == ("twice", 2, 1)
    letter = body(again, "q/$DeadLetterQueue")
    assert letter == ("once", 1, 0)
    assert again.peek("q/$DeadLetterQueue", 0, 1)[0].extra_properties[
        "DeadLetterReason"] == MAX_DELIVERY_COUNT_EXCEEDED
    assert body(again, "s", "x") == ("in-session", 1, 1)


def test_changes_are_written_once_per_debounce_atomically(tmp_path: Path) -> None:
    """Invariants 1 and 3: one write covers every change of its interval; no partial file."""
    clock = Clock()
    state = ServiceBusState()
    state.create_queue("q")
    kept = StateFile(tmp_path / "state.json", delay=0.2, clock=clock)
    for _ in range(5):
        kept.changed()
        clock.now += 0.03
        kept.save_if_due(state)
    assert kept.writes == 0
    assert kept.pending
    clock.now += 0.1
    kept.save_if_due(state)
    kept.save_if_due(state)
    assert (kept.writes, kept.pending) == (1, False)
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # the temporary file renamed
    again = ServiceBusState()
    assert kept.load(again)
    assert again.counts("q").available == 0


def test_no_state_file_yet_loads_nothing(tmp_path: Path) -> None:
    assert not StateFile(tmp_path / "absent.json").load(ServiceBusState())


# -- a real server process, killed and restarted on its file ----------------------------------

_SEND_THEN_KILL = """
import os, signal, sys
from azure.servicebus import ServiceBusClient, ServiceBusMessage
string, queue, body, pid = sys.argv[1:]
sender = ServiceBusClient.from_connection_string(string).get_queue_sender(queue)
sender.send_messages(ServiceBusMessage(body))
os.kill(int(pid), signal.SIGKILL)
os._exit(0)
"""


def send_then_kill(string: str, queue: str, body: str, pid: int) -> None:
    """Send ``body``, then SIGKILL the server at once, from a process that dies with its client.

    At once: before the server's next debounced write. From a process of
    its own: the SDK's client, cut off mid-connection, is not closed.
    """
    subprocess.run([sys.executable, "-c", _SEND_THEN_KILL, string, queue, body, str(pid)],
                   check=True, timeout=30)



@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
def test_a_sigkilled_server_restarts_with_every_accepted_send_and_no_completed_message(
    tmp_path: Path,
) -> None:
    """Invariants 2 (a send kept before it is accepted), 3 (a completion within the
    debounce) and 6 (locks lost: one more delivery), through the real SDK, killed twice."""
    servicebus: Any = pytest.importorskip("azure.servicebus")
    from sharedstream.testing.brokers.servicebus import start_servicebus  # noqa: PLC0415

    queue = f"q-{uuid.uuid4().hex[:8]}"
    entities = {"queues": [{"name": queue, "lock_duration": 30}]}
    server = RestartableServer(lambda port: start_servicebus(
        tmp_path, entities=entities, port=port, state_file=tmp_path / "state.json")[0])
    with running(server):
        string = (f"Endpoint=sb://127.0.0.1:{server.port};SharedAccessKeyName=k;"
                  "SharedAccessKey=v;UseDevelopmentEmulator=true;")
        with servicebus.ServiceBusClient.from_connection_string(
                string, keep_alive=None, retry_total=0) as client:
            with client.get_queue_sender(queue, keep_alive=None) as sender:
                sender.send_messages([servicebus.ServiceBusMessage(f"m{i}") for i in range(6)])
            with client.get_queue_receiver(queue,
                    keep_alive=None) as receiver:  # its locks outlive it
                received = receiver.receive_messages(max_message_count=3, max_wait_time=2)
                assert len(received) == 3
                receiver.complete_message(received[0])
        time.sleep(3 * DEBOUNCE)  # the completion is written after its debounce
        server.kill()
        server.start()
        assert server.process is not None
        send_then_kill(string, queue, "last", server.process.pid)  # within the debounce
        server.process.wait(timeout=10)
        server.start()
        with servicebus.ServiceBusClient.from_connection_string(
                string,
                        keep_alive=None) as client, client.get_queue_receiver(queue,
                                keep_alive=None) as receiver:
            again = receiver.receive_messages(max_message_count=10, max_wait_time=2)
            seen = {str(m): (m.sequence_number, m.delivery_count) for m in again}
            for message in again:
                receiver.complete_message(message)
    assert seen == {"m1": (2, 1), "m2": (3, 1), "m3": (4, 0), "m4": (5, 0), "m5": (6, 0),
                    "last": (7, 0)}

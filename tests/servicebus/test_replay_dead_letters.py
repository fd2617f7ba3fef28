"""Replaying the dead letters one watcher caused, through it alone (issue 33), on Service Bus.

The Service Bus producer dead-letters into the entity's own dead-letter
sub-queue, which takes every message: it keeps nothing in the store's
``dead_letters`` table itself. A replay reads that table, so here the test
plays the operator's tool that keeps letters there (the shape
:mod:`sharedstream.producers._servicebus_republish` documents: ``source``
the sequence number, ``payload`` the body, ``headers`` the application
properties): it moves what the sub-queue holds into the table, read with
the real ``azure-servicebus`` SDK, and adds one letter of a message the
watcher had stored live.

The real ``sharedstream triggerer`` (a subprocess) runs
``replay_dead_letters_defs.py`` on the kit's server (a thread here): two
watchers of one queue, ``audit/all`` rejecting three messages. Once it is
fixed, ``watchers replay audit/all --dead-letters`` stores exactly the three
missing events, under the live keys (``<trigger>/<queue>/<sequence
number>#0``) and with the live payloads; the letter of the message stored
live is "already stored" although its rebuilt message has no fingerprint;
``orders/all`` stores nothing and gets no run; a second replay stores nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("azure.servicebus")
pytest.importorskip("proton")

from sharedstream.engine.producer import DeadLetter
from sharedstream.producers._servicebus_received import read_message
from sharedstream.producers._servicebus_types import ServiceBusMessage
from sharedstream.store import SqliteStore
from sharedstream.triggers.servicebus import ServiceBusSharedStreamTrigger
from tests.cli import ROOT, TriggererCli
from tests.dead_letter_replay_kit import counts, events, replay, trigger_of
from tests.servicebus.harness import ThreadedServiceBusServer

servicebus: Any = pytest.importorskip("azure.servicebus")
amqp: Any = pytest.importorskip("azure.servicebus.amqp")

DEFINITIONS = Path(__file__).with_name("replay_dead_letters_defs.py")
IDS = range(10)
AUDIT_REJECTS = (1, 5, 8)
STORED_LIVE = 2
"""A message ``audit/all`` stored live whose letter is kept too: its event is not stored again."""
CITIES = ("Zürich", "Lyon", "Porto")


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadedServiceBusServer]:
    server = ThreadedServiceBusServer().start()
    yield server
    server.stop()


def send(server: ThreadedServiceBusServer, queue: str) -> None:
    """Messages ``{"id": i}`` with a ``city`` property, in order: ``i`` is sequence ``i + 1``."""
    with servicebus.ServiceBusClient.from_connection_string(
            server.connection_string, keep_alive=None) as client, \
            client.get_queue_sender(queue, keep_alive=None) as sender:
        sender.send_messages([servicebus.ServiceBusMessage(
            json.dumps({"id": i}), application_properties={"city": CITIES[i % len(CITIES)]})
            for i in IDS])


def letter_of(message: Any, trigger_id: int) -> DeadLetter:
    """A received message as the table keeps it (what the operator's tool writes)."""
    return DeadLetter(
        stream=f"servicebus {message.sequence_number}", source=str(message.sequence_number),
        reason=str(message.dead_letter_reason or "kept by hand"), triggers=(str(trigger_id),),
        payload=b"".join(message.body),
        headers=tuple((_text(name), _text(value).encode())
                      for name, value in (message.application_properties or {}).items()))


def _text(value: Any) -> str:
    """A received property's key or value as text (the SDK hands received text as bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def keep_dead_letters(server: ThreadedServiceBusServer, queue: str, database: Path,
                      trigger_id: int) -> list[int]:
    """Move the queue's dead-letter sub-queue into the store's table; the sequence numbers."""
    kept: list[int] = []
    with servicebus.ServiceBusClient.from_connection_string(
            server.connection_string, keep_alive=None) as client, SqliteStore(database) as store, \
            client.get_queue_receiver(queue, sub_queue=servicebus.ServiceBusSubQueue.DEAD_LETTER,
                                      max_wait_time=1, keep_alive=None) as receiver:
        for message in receiver.receive_messages(max_message_count=50, max_wait_time=1):
            assert store.add_dead_letter(letter_of(message, trigger_id))
            receiver.complete_message(message)
            kept.append(message.sequence_number)
    return kept


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
@pytest.mark.timeout(240)
async def test_a_fixed_watcher_gets_its_dead_letters_and_the_other_nothing(
    server: ThreadedServiceBusServer, tmp_path: Path,
) -> None:
    queue = server.take_queue(sessions=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DLR_CONNECTION_STRING":
           server.connection_string, "DLR_QUEUE": queue,
           "SHAREDSTREAM__DISPATCH__ENABLED": "false", "ORDERS_REJECT": "",
           "AUDIT_REJECT": ",".join(map(str, AUDIT_REJECTS))}
    buggy = TriggererCli(tmp_path, env, DEFINITIONS)
    await asyncio.to_thread(buggy.run, "init", "--path", str(buggy.config))
    database = tmp_path / "sharedstream.db"
    await asyncio.to_thread(send, server, queue)

    live = ({"orders": len(IDS), "audit": len(IDS) - len(AUDIT_REJECTS)},
            {"on_orders": len(IDS), "on_audit": len(IDS) - len(AUDIT_REJECTS)}, 0)
    with buggy.running(0) as process:
        async def settled() -> bool:
            return (database.exists() and counts(database) == live
                    and server.unsettled(queue) == 0)
        await buggy.until(0, process, settled)

    audit, orders = trigger_of(database, "audit"), trigger_of(database, "orders")
    kept = await asyncio.to_thread(keep_dead_letters, server, queue, database, audit)
    assert sorted(kept) == [i + 1 for i in AUDIT_REJECTS]
    stored = events(database)
    with SqliteStore(database) as store:  # the live message audit stored: kept as well
        live_event = stored["audit"][f"{audit}/{queue}/{STORED_LIVE + 1}#0"]
        assert store.add_dead_letter(DeadLetter(
            stream="servicebus", source=str(STORED_LIVE + 1), reason="kept by hand",
            triggers=(str(audit),), payload=json.dumps({"id": STORED_LIVE}).encode(),
            headers=(("city", CITIES[STORED_LIVE % len(CITIES)].encode()),)))

    fixed = TriggererCli(tmp_path, {**env, "AUDIT_REJECT": ""}, DEFINITIONS)
    with fixed.running(1, log_level="INFO"):
        result = await asyncio.to_thread(replay, fixed, "audit/all", "--dead-letters")
        assert result.returncode == 0, (result.stdout, result.stderr, fixed.log(1))
        assert result.stdout.strip().splitlines()[-1] == (
            "replay 1 (audit/all): done, 4 of 4 messages (100%), 3 new events, "
            "1 already stored"), result.stdout
        per_asset, runs, _ = counts(database)
        assert per_asset == {"orders": len(IDS), "audit": len(IDS)}
        assert runs == {"on_orders": len(IDS), "on_audit": len(IDS)}

        stored = events(database)
        assert set(stored["audit"]) == {f"{audit}/{queue}/{i + 1}#0" for i in IDS}
        for i in AUDIT_REJECTS:  # what the fixed watcher got is what the other got live
            assert stored["audit"][f"{audit}/{queue}/{i + 1}#0"] == stored["orders"][
                f"{orders}/{queue}/{i + 1}#0"] == {
                    "id": i, "city": CITIES[i % len(CITIES)], "sequence_number": i + 1}
        assert stored["audit"][f"{audit}/{queue}/{STORED_LIVE + 1}#0"] == live_event

        again = await asyncio.to_thread(replay, fixed, "audit/all", "--dead-letters")
        assert again.returncode == 0, (again.stdout, again.stderr)
        assert again.stdout.strip().splitlines()[-1].endswith(
            "0 new events, 4 already stored"), again.stdout
        assert counts(database)[:2] == (per_asset, runs)


async def test_a_rebuilt_letter_is_the_message_the_filter_got(
    server: ThreadedServiceBusServer,
) -> None:
    queue = server.take_queue(sessions=False)
    async with servicebus.aio.ServiceBusClient.from_connection_string(
            server.connection_string) as client:
        async with client.get_queue_sender(queue, keep_alive=None) as sender:
            await sender.send_messages(servicebus.ServiceBusMessage(
                b'{"id": 7}', application_properties={"city": "Zürich", "note": "ok"}))
        async with client.get_queue_receiver(queue, max_wait_time=2, keep_alive=None) as receiver:
            (received,) = await receiver.receive_messages(max_message_count=1)
            await receiver.complete_message(received)
    live = read_message(queue, received, amqp.AmqpMessageBodyType)
    kwargs = ServiceBusSharedStreamTrigger(connection_string=server.connection_string,
                                           queue=queue).serialize()[1]
    producer = ServiceBusSharedStreamTrigger.create_shared_stream_producer(kwargs)
    letter = DeadLetter(stream="servicebus q", source=str(live.sequence_number),
                        reason="rejected", triggers=("3",), payload=live.body,
                        headers=(("city", "Zürich".encode()), ("note", b"ok")))

    rebuilt = producer.dead_letter_event(letter)

    assert rebuilt is not None
    message, payload = rebuilt
    assert type(message) is ServiceBusMessage
    assert (message.sequence_number, message.body, message.properties, message.entity) == (
        live.sequence_number, live.body, live.properties, live.entity)
    assert producer.raw_event_name(payload) == producer.raw_event_name(
        _Payload(live)) == f"{queue}/{live.sequence_number}"
    assert producer.raw_event_fingerprint(_Payload(live)) is not None
    assert producer.raw_event_fingerprint(payload) is None  # no enqueued time: by name alone
    assert message.decoded("json", json.loads) == {"id": 7}
    binary = producer.dead_letter_event(
        DeadLetter("q", "5", "r", ("3",), b"", (("blob", b"\xff\x00"),)))
    assert binary is not None
    assert binary[0].properties == {"blob": b"\xff\x00"}  # not text: bytes, as received
    assert producer.dead_letter_event(DeadLetter("q", "other/3", "r", ("3",), b"")) is None
    assert producer.dead_letter_event(DeadLetter("q", "not-a-number", "r", ("3",), b"")) is None
    assert producer.dead_letter_event(
        DeadLetter("q", f"{queue}/4", "r", ("3",), b"")) is not None


class _Payload:
    """A live payload as the producer's naming reads it (its ``message``)."""

    def __init__(self, message: ServiceBusMessage) -> None:
        self.message = message

"""The real ``sharedstream triggerer`` on Service Bus: odd message bodies among healthy ones.

One odd message must neither stall nor poison its neighbours. The
triggerer runs as a subprocess over ``servicebus_defs.py`` (three watchers
sharing one queue's receiver, ``payload_format="json"``) against the kit's
test server in a process of its own, as in ``test_crash.py``. Among
healthy JSON messages, received in the same batch:

* an AMQP value body holding a map (what a JMS ``MapMessage`` sends): its
  JSON is the payload's value, so it is an order like the others;
* a map nested 80 deep: the SDK's decoder refuses it (64 at most), so it
  is dead-lettered alone, ``sharedstream.rejected`` with the reason.

Accounting is exact: every event stored once, ``ship`` run once per
order, the queue empty, and in its dead-letter sub-queue the deep message
only. The triggerer stops on SIGTERM with status 0.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("azure.servicebus")
pytest.importorskip("proton")

from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus._pyamqp import receiver as sync_receiver_module
from azure.servicebus.amqp import AmqpAnnotatedMessage
from azure.servicebus.exceptions import ServiceBusError

from sharedstream.producers._servicebus_received import guard_sdk_decoder
from tests.chaos_accounting import (
    Expected,
    Reality,
    compare,
    compare_runs,
    count_stored_events,
    read_dag_runs,
    read_stored_events,
    watcher_triggers,
)
from tests.crash_kit import kill, running, stop_cleanly, wait_until
from tests.servicebus.test_crash import Deployment, message, servicebus_process, watchers_for

MAP = 42
"""The index of the map body: ``message(42)`` is an order from the EU (two watchers)."""
DEEP = MAP + 1
"""The index of the map nested past the SDK's decoder."""
TOTAL = DEEP + 1 + 40


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"id": DEEP, "kind": "order"}
    for _ in range(depth):
        value = {"x": value}
    return value


def send_all(d: Deployment) -> None:
    """Every message in one batch, in index order: message ``i`` is sequence number ``i + 1``."""
    batch: list[Any] = []
    for index in range(TOTAL):
        region, body = message(index)
        properties: Any = {"region": region}  # the two classes type it apart
        if index == MAP:  # the same order, as a map
            batch.append(AmqpAnnotatedMessage(value_body=json.loads(body),
                                              application_properties=properties))
        elif index == DEEP:
            batch.append(AmqpAnnotatedMessage(value_body=nested(80),
                                              application_properties=properties))
        else:
            batch.append(ServiceBusMessage(body, application_properties=properties))
    with d.client() as client, client.get_queue_sender(d.queue, keep_alive=None) as sender:
        sender.send_messages(batch)
    d.sent = TOTAL


def queue_is_empty(d: Deployment) -> bool:
    """Nothing on the queue (a peek of the deep message fails in the SDK: not yet empty)."""
    try:
        with d.client() as client, client.get_queue_receiver(d.queue, keep_alive=None) as receiver:
            return not receiver.peek_messages(max_message_count=1000)
    except ServiceBusError:
        return False


def dead_letters(d: Deployment) -> list[Any]:
    """Every message of the dead-letter sub-queue, received and completed.

    Through the sync SDK with its decoder guarded as the producer guards the
    async one, so a letter the SDK cannot decode arrives all the same.
    """
    assert guard_sdk_decoder(sync_receiver_module)
    with ServiceBusClient.from_connection_string(d.string, keep_alive=None) as client, \
            client.get_queue_receiver(d.queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER,
                                      max_wait_time=1, keep_alive=None) as receiver:
        letters = receiver.receive_messages(max_message_count=100, max_wait_time=1)
        for letter in letters:
            receiver.complete_message(letter)
    return list(letters)


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
@pytest.mark.timeout(180)
def test_a_map_body_is_an_order_and_a_too_deep_one_is_dead_lettered_alone(
        tmp_path: Path) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    with running(servicebus_process(tmp_path, queue)) as server:
        d = Deployment(server, tmp_path, queue)
        process = None
        try:
            send_all(d)
            healthy = [i for i in range(TOTAL) if i != DEEP]
            wanted = sum(len(watchers_for(i)) for i in healthy)
            process = d.cli.start(0, log_level=None)
            wait_until(lambda: count_stored_events(d.db) >= wanted, 60,
                       "every healthy message's events stored", process, d.cli.log_path(0))
            wait_until(lambda: queue_is_empty(d), 30, "every message settled", process,
                       d.cli.log_path(0))
            stop_cleanly(process, d.cli.log_path(0))

            ids = watcher_triggers(d.db)
            expected = Expected(events={ids[w]: set() for w in ("orders/all", "eu_orders/eu",
                                                                 "refunds/all")})
            for index in healthy:  # the map body is message(MAP)'s order, sent as a map
                for watcher in watchers_for(index):
                    expected.events[ids[watcher]].add(f"{queue}/{index + 1}")
            orders = expected.events[ids["orders/all"]]
            problems = compare(expected, Reality(read_stored_events(d.db), []))
            problems += compare_runs("ship", ids["orders/all"], orders,
                                     read_dag_runs(d.db, "ship"))
            assert not problems, "\n  ".join(problems)
            assert watchers_for(MAP) == ["orders/all", "eu_orders/eu"]

            [letter] = dead_letters(d)  # the deep one only: no healthy message
            assert letter.sequence_number == DEEP + 1
            assert letter.dead_letter_reason == "sharedstream.rejected"
            assert letter.dead_letter_error_description.startswith(
                "undecodable body: the SDK could not decode the message (ValueError: AMQP "
                "value nesting exceeds maximum depth of 64)")
        finally:
            kill(process)

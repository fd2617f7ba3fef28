"""A killed triggerer dead-letters no healthy message on Service Bus (issue 29, part 3).

Service Bus counts every delivery of a message, also the ones that ended
because the triggerer holding it was killed. The watcher here
(``crash_loop_defs.py``) tolerates no failure (``max_redeliveries`` 0) and
is slow, so a killed triggerer held messages, some of them already stored:
each comes back with a delivery count of 2, which the broker's count alone
makes poison. The store counts each message's own failures, so the
restarted triggerer fans them out again instead: the stored ones are
completed as duplicates, the others stored. The one poison message (the
filter raises on it) is still dead-lettered, once. Plain and session
queues; through the real CLI, SDK and the kit's server.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("azure.servicebus")
pytest.importorskip("proton")

from tests.chaos_accounting import count_stored_events, read_stored_events
from tests.cli import ROOT, TriggererCli
from tests.crash_kit import TRIGGERER_ENV, kill, running, stop_cleanly, wait_until
from tests.servicebus.test_crash import Deployment, servicebus_process

servicebus: Any = pytest.importorskip("azure.servicebus")

DEFINITIONS = Path(__file__).with_name("crash_loop_defs.py")
TOTAL = 40
POISON = 7
"""The index of the one message the watcher raises on."""
SESSIONS = 4


def body(index: int) -> bytes:
    return json.dumps({"id": index, "poison": index == POISON}).encode()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sessions", [False, True], ids=["plain", "sessions"])
def test_a_killed_triggerer_dead_letters_no_healthy_message(tmp_path: Path,
                                                            sessions: bool) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    with running(servicebus_process(tmp_path, queue, sessions=sessions)) as server:
        d = Deployment(server, tmp_path, queue, sessions=sessions)
        d.cli = TriggererCli(tmp_path, {**os.environ, "PYTHONPATH": str(ROOT), **TRIGGERER_ENV,
                                        "SERVICEBUS_TEST_CONNECTION_STRING": d.string,
                                        "SERVICEBUS_TEST_QUEUE": queue,
                                        "SERVICEBUS_TEST_SESSIONS": "1" if sessions else ""},
                             DEFINITIONS)
        with d.client() as client, client.get_queue_sender(queue) as sender:
            sender.send_messages([servicebus.ServiceBusMessage(
                body(i), session_id=f"s{i % SESSIONS}" if sessions else None)
                for i in range(TOTAL)])
        d.sent = TOTAL
        first = second = None
        try:
            first = d.cli.start(0)
            wait_until(lambda: count_stored_events(d.db) >= 4, 60, "a few events stored", first,
                       d.cli.log(0)[-2000:])
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
            at_kill = count_stored_events(d.db)
            assert at_kill < TOTAL - 1, "everything was stored before the kill"

            second = d.cli.start(1, log_level="INFO")
            # Settled: completed, or dead-lettered (as every message the killed one held
            # was, by the broker's count alone, before the store counted failures).
            wait_until(lambda: d.left()[0] == 0, 90, "every message settled", second,
                       d.cli.log(1)[-3000:])
            stop_cleanly(second, d.cli.log_path(1))
            log = d.cli.log(1)
        finally:
            kill(first)
            kill(second)
        stored = sorted(int(e.source.rpartition("/")[2]) - 1 for e in read_stored_events(d.db)
                        if e.source is not None)
        with d.client() as client, client.get_queue_receiver(
                queue, sub_queue=servicebus.ServiceBusSubQueue.DEAD_LETTER) as receiver:
            dead = sorted(json.loads(b"".join(m.body))["id"]
                          for m in receiver.peek_messages(max_message_count=100))
        assert dead == [POISON], f"dead-lettered: {dead} ({at_kill} stored at the kill)"
        assert stored == [i for i in range(TOTAL) if i != POISON], (at_kill, log[-3000:])
        assert "fanning out again messages delivered more than" in log, log[-3000:]

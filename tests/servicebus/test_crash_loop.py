"""Killed triggerers dead-letter no healthy message on Service Bus (issue 29, part 3).

Service Bus counts every delivery of a message, also the ones that ended
because the triggerer holding it was killed. The watcher here
(``crash_loop_defs.py``) is slow, so a killed triggerer held messages,
some of them already stored: each comes back with its delivery count one
higher, and the broker's count alone would soon make it poison. The store
counts each message's own failures, so a restarted triggerer fans such a
message out again: what was stored is completed as a duplicate, the rest
stored. The one poison message (the filter raises on it) is still
dead-lettered, once. Plain and session queues; through the real CLI, SDK
and the kit's server.

* one kill with ``max_redeliveries`` 0: every message the killed one held
  comes back a suspect (before the store counted failures: 6 of 40
  healthy messages dead-lettered plain, 6 with sessions);
* a storm (slow suite): ``STORM_KILLS`` kills (10) at random moments with
  ``max_redeliveries`` ``STORM_MAX_REDELIVERIES`` (1) and ``max_in_flight``
  ``STORM_IN_FLIGHT`` (50: each kill leaves that many to come again), over
  300 messages.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
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
POISON = 7
"""The index of the one message the watcher raises on."""
SESSIONS = 4


def body(index: int) -> bytes:
    return json.dumps({"id": index, "poison": index == POISON}).encode()


class Storm:
    """A queue of ``total`` messages (one poison), and the CLI over ``crash_loop_defs.py``."""

    def __init__(self, server: Any, workdir: Path, queue: str, *, sessions: bool, total: int,
                 max_redeliveries: int, max_in_flight: int = 10) -> None:
        self.d = d = Deployment(server, workdir, queue, sessions=sessions)
        d.cli = TriggererCli(workdir, {
            **os.environ, "PYTHONPATH": str(ROOT), **TRIGGERER_ENV,
            "SERVICEBUS_TEST_CONNECTION_STRING": d.string, "SERVICEBUS_TEST_QUEUE": queue,
            "SERVICEBUS_TEST_SESSIONS": "1" if sessions else "",
            "SERVICEBUS_TEST_MAX_REDELIVERIES": str(max_redeliveries),
            "SERVICEBUS_TEST_MAX_IN_FLIGHT": str(max_in_flight)}, DEFINITIONS)
        self.total = total
        with d.client() as client, client.get_queue_sender(queue, keep_alive=None) as sender:
            for start in range(0, total, 100):
                sender.send_messages([servicebus.ServiceBusMessage(
                    body(i), session_id=f"s{i % SESSIONS}" if sessions else None)
                    for i in range(start, min(start + 100, total))])
        d.sent = total

    def kill_after(self, index: int, ready: float, then: float) -> int:
        """Start triggerer ``index``, let it store ``ready`` events or run ``then`` s, SIGKILL it.

        Returns the events stored by then.
        """
        d = self.d
        process = d.cli.start(index)
        try:
            if ready:
                wait_until(lambda: count_stored_events(d.db) >= ready, 60, "events stored",
                           process, d.cli.log_path(index))
            time.sleep(then)
            assert process.poll() is None, d.cli.log(index)[-2000:]
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=10)
        return count_stored_events(d.db)

    def finish(self, index: int) -> str:
        """Run triggerer ``index`` until nothing is left on the queue; stop it; its log."""
        d = self.d
        process = d.cli.start(index, log_level="INFO")
        try:
            # Settled: each message stored or dead-lettered (as every message a killed
            # triggerer held could be, by the broker's count alone, before the store counted
            # failures), and none left. (A session a killed triggerer held stays locked
            # until its lock lapses, and a peek does not see it meanwhile.)
            def settled() -> bool:
                queued, dead = d.left()
                return queued == 0 and count_stored_events(d.db) + dead >= self.total

            wait_until(settled, 180, "every message settled", process, d.cli.log_path(index))
            stop_cleanly(process, d.cli.log_path(index))
        finally:
            kill(process)
        return d.cli.log(index)

    def check(self, context: str, log: str) -> None:
        """Only the poison dead-lettered; one event per healthy message."""
        d = self.d
        with d.client() as client, client.get_queue_receiver(
                d.queue, sub_queue=servicebus.ServiceBusSubQueue.DEAD_LETTER,
                        keep_alive=None) as receiver:
            dead = sorted(json.loads(b"".join(m.body))["id"]
                          for m in receiver.peek_messages(max_message_count=1000))
        assert dead == [POISON], f"dead-lettered: {dead} ({context})"
        stored = sorted(int(e.source.rpartition("/")[2]) - 1 for e in read_stored_events(d.db)
                        if e.source is not None)
        assert stored == [i for i in range(self.total) if i != POISON], (context, log[-3000:])


@pytest.mark.slow  # a SIGKILL chaos case (13-31 s each): the slow CI step
@pytest.mark.timeout(180)
@pytest.mark.parametrize("sessions", [False, True], ids=["plain", "sessions"])
def test_a_killed_triggerer_dead_letters_no_healthy_message(tmp_path: Path,
                                                            sessions: bool) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    with running(servicebus_process(tmp_path, queue, sessions=sessions)) as server:
        storm = Storm(server, tmp_path, queue, sessions=sessions, total=40, max_redeliveries=0)
        at_kill = storm.kill_after(0, ready=4, then=0)
        assert at_kill < 39, "everything was stored before the kill"
        log = storm.finish(1)
        storm.check(f"{at_kill} stored at the kill", log)
        assert "fanning out again messages delivered more than" in log, log[-3000:]


STORM_KILLS = int(os.environ.get("STORM_KILLS", "10"))
STORM_MAX_REDELIVERIES = int(os.environ.get("STORM_MAX_REDELIVERIES", "1"))
STORM_IN_FLIGHT = int(os.environ.get("STORM_IN_FLIGHT", "50"))


@pytest.mark.slow  # about a minute each
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sessions", [False, True], ids=["plain", "sessions"])
def test_a_kill_storm_dead_letters_no_healthy_message(tmp_path: Path, sessions: bool) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    chance = random.Random(29)
    with running(servicebus_process(tmp_path, queue, sessions=sessions,
                                    max_delivery_count=2000)) as server:
        storm = Storm(server, tmp_path, queue, sessions=sessions, total=300,
                      max_redeliveries=STORM_MAX_REDELIVERIES, max_in_flight=STORM_IN_FLIGHT)
        stored = [storm.kill_after(i, ready=0, then=chance.uniform(1.5, 3.0))
                  for i in range(STORM_KILLS)]
        log = storm.finish(STORM_KILLS)
        storm.check(f"{STORM_KILLS} kills, events stored after each: {stored}", log)


@pytest.mark.slow  # about 20 s: the slow CI step
@pytest.mark.timeout(300)
def test_a_session_goes_on_after_its_floor_is_dead_lettered_on_arrival(tmp_path: Path) -> None:
    """A session's message that failed here, then arrives poison by the store's count.

    The first triggerer fails on the poison message once (the store counts
    it) and is killed while its trigger waits to run again. The second
    fails on it once more: the message becomes its session's floor (the
    session's later messages are abandoned behind it), and it comes back
    delivered too often, with two failures in the store for a
    ``max_redeliveries`` of 1: it is dead-lettered on arrival, never placed
    again. Its floor must go with it: before, it held the session, whose
    healthy messages were abandoned over and over until the delivery
    ceiling dead-lettered them too (a kill storm's livelock, 1 run in 6 on
    a loaded machine).
    """
    queue = f"q-{uuid.uuid4().hex[:8]}"
    with running(servicebus_process(tmp_path, queue, sessions=True)) as server:
        storm = Storm(server, tmp_path, queue, sessions=True, total=40, max_redeliveries=1)
        cli = storm.d.cli
        plain = cli.env
        cli.env = {**plain, "SHAREDSTREAM__TRIGGERER__RESTART_BACKOFF_INITIAL": "60",
                   "SHAREDSTREAM__TRIGGERER__RESTART_BACKOFF_MAX": "60"}
        first = cli.start(0, log_level="INFO")
        try:
            wait_until(lambda: f"cannot handle message {POISON}" in cli.log(0), 60,
                       "the poison message's first failure", first, cli.log_path(0))
        finally:
            kill(first)
        cli.env = plain
        log = storm.finish(1)
        storm.check("the poison failed once before a kill", log)

"""A killed triggerer dead-letters no healthy message on Pub/Sub (issue 29, part 3).

Pub/Sub reports ``delivery_attempt`` on a subscription with a dead-letter
policy, and counts every delivery, also the ones that ended because the
triggerer holding the message was killed (its lease lapsed). The watcher
here (``crash_loop_defs.py``) tolerates no failure (``max_redeliveries``
0) and is slow, so a killed triggerer held messages, some of them already
stored: each comes back with an attempt of 2, which the broker's count
alone makes poison. The store counts each message's own failures, so the
restarted triggerer fans them out again instead: the stored ones are acked
as duplicates, the others stored. The one poison message (the filter
raises on it) is still dead-lettered, to the producer's ``dead_letter_topic``.
Through the real CLI, the real client and the kit's server in its own
process; the subscription's own dead-letter policy allows 100 attempts, so
the server never forwards a message itself.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

from tests.chaos_accounting import DeadLetterRecord, count_stored_events, read_stored_events
from tests.cli import TriggererCli
from tests.crash_kit import RestartableServer, distinct, kill, running, stop_cleanly, wait_until
from tests.pubsub.test_crash import Deployment, pubsub_process

DEFINITIONS = Path(__file__).with_name("crash_loop_defs.py")
TOTAL = 40
POISON = 7
"""The index of the one message the watcher raises on."""
MAX_DELIVERY_ATTEMPTS = 100
"""The subscription's dead-letter policy: Pub/Sub's most, so the server never forwards one."""


def message(index: int) -> tuple[str, bytes]:
    """Message ``index`` as ``(region, data)`` (the region is not used here)."""
    return "eu", json.dumps({"id": index, "poison": index == POISON}).encode()


class CrashLoopDeployment(Deployment):
    """:class:`Deployment` over ``crash_loop_defs.py``, its subscription with a dead-letter
    policy (without one Pub/Sub reports no ``delivery_attempt``), ``total`` messages sent."""

    def __init__(self, server: RestartableServer, workdir: Path, *, total: int,
                 max_redeliveries: int = 0, max_in_flight: int = 10) -> None:
        super().__init__(server, workdir, body=message)
        self.total = total
        self.cli = TriggererCli(workdir, {
            **self.cli.env, "PUBSUB_TEST_MAX_REDELIVERIES": str(max_redeliveries),
            "PUBSUB_TEST_MAX_IN_FLIGHT": str(max_in_flight)}, DEFINITIONS)
        self.letters: list[DeadLetterRecord] = []

    def create(self) -> None:
        assert self.dlq is not None
        self.publisher.create_topic(name=self.topic)
        self.publisher.create_topic(name=self.dlq)
        self.subscriber.create_subscription(request={
            "name": self.subscription, "topic": self.topic, "ack_deadline_seconds": 10,
            "dead_letter_policy": {"dead_letter_topic": self.dlq,
                                   "max_delivery_attempts": MAX_DELIVERY_ATTEMPTS}})
        self.subscriber.create_subscription(request={"name": self.dlq_reader,
                                                     "topic": self.dlq})
        self.cli.run("init", "--path", str(self.cli.config))
        self.publish(range(self.total))

    def kill_after(self, index: int, ready: int, then: float) -> int:
        """Start triggerer ``index``, let it store ``ready`` events and run ``then`` s more,
        SIGKILL it; the events stored by then."""
        process = self.cli.start(index)
        try:
            wait_until(lambda: count_stored_events(self.db) >= ready, 60, "events stored",
                       process, self.cli.log_path(index))
            time.sleep(then)
            assert process.poll() is None, self.cli.log(index)[-2000:]
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=10)
        return count_stored_events(self.db)

    def finish(self, index: int) -> tuple[str, list[object]]:
        """Run triggerer ``index`` until every message is stored or dead-lettered (as every
        message a killed one held could be, by the broker's count alone, before the store
        counted failures); stop it. Its log, and what a pull then still gets."""
        def settled() -> bool:
            self.letters.extend(self.dead_letters())  # read so far: kept
            done = {e.source for e in read_stored_events(self.db)}
            done |= {letter.source for letter in self.letters}
            return done >= self.sent.keys()

        process = self.cli.start(index, log_level="INFO")
        try:
            wait_until(settled, 180, "every message settled", process,
                       self.cli.log_path(index))
            time.sleep(1.0)  # the last acks go out
            stop_cleanly(process, self.cli.log_path(index))
        finally:
            kill(process)
        return self.cli.log(index), list(self.pull_once(self.subscription))

    def check(self, context: str, log: str, left: list[object]) -> None:
        """Only the poison dead-lettered; one event per healthy message; nothing unacked."""
        stored = sorted(self.sent[e.source] for e in read_stored_events(self.db)
                        if e.source is not None)
        # A dead letter is published, then its message acked: a kill in between publishes it
        # again on redelivery (at-least-once), so one copy per source is counted.
        dead = sorted(self.sent[letter.source] for letter in distinct(self.letters))
        assert dead == [POISON], f"dead-lettered: {dead} ({context})"
        assert stored == [i for i in range(self.total) if i != POISON], (context, log[-3000:])
        assert not left, f"{len(left)} messages still unacked on the subscription"


@pytest.mark.slow  # a SIGKILL chaos case (about 16 s): the slow CI step
@pytest.mark.timeout(180)
def test_a_killed_triggerer_dead_letters_no_healthy_message(tmp_path: Path) -> None:
    with running(pubsub_process(tmp_path)) as server:
        d = CrashLoopDeployment(server, tmp_path, total=TOTAL)
        try:
            d.create()
            at_kill = d.kill_after(0, ready=4, then=0)
            assert at_kill < TOTAL - 1, "everything was stored before the kill"
            # The killed one's leases lapse within 10 s; its messages come again, attempt 2.
            log, left = d.finish(1)
        finally:
            d.close()
        d.check(f"{at_kill} stored at the kill", log, left)
        assert "fanning out again messages delivered more than" in log, log[-3000:]


STORM_KILLS = int(os.environ.get("STORM_KILLS", "10"))
STORM_MAX_REDELIVERIES = int(os.environ.get("STORM_MAX_REDELIVERIES", "1"))
STORM_IN_FLIGHT = int(os.environ.get("STORM_IN_FLIGHT", "50"))


@pytest.mark.slow  # about a minute and a half
@pytest.mark.timeout(900)
def test_a_kill_storm_dead_letters_no_healthy_message(tmp_path: Path) -> None:
    """``STORM_KILLS`` kills (10) at random moments, ``max_redeliveries``
    ``STORM_MAX_REDELIVERIES`` (1), ``max_in_flight`` ``STORM_IN_FLIGHT`` (50), 300
    messages: only the poison is dead-lettered."""
    chance = random.Random(29)
    with running(pubsub_process(tmp_path)) as server:
        d = CrashLoopDeployment(server, tmp_path, total=300,
                                max_redeliveries=STORM_MAX_REDELIVERIES,
                                max_in_flight=STORM_IN_FLIGHT)
        try:
            d.create()
            stored = [d.kill_after(i, ready=0, then=chance.uniform(1.5, 3.0))
                      for i in range(STORM_KILLS)]
            log, left = d.finish(STORM_KILLS)
        finally:
            d.close()
        d.check(f"{STORM_KILLS} kills, events stored after each: {stored}", log, left)

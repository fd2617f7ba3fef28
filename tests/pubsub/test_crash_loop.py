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
    policy (without one Pub/Sub reports no ``delivery_attempt``)."""

    def __init__(self, server: RestartableServer, workdir: Path) -> None:
        super().__init__(server, workdir, body=message)
        self.cli = TriggererCli(workdir, self.cli.env, DEFINITIONS)

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


@pytest.mark.timeout(180)
def test_a_killed_triggerer_dead_letters_no_healthy_message(tmp_path: Path) -> None:
    with running(pubsub_process(tmp_path)) as server:
        d = CrashLoopDeployment(server, tmp_path)
        letters: list[DeadLetterRecord] = []
        first = second = None
        try:
            d.create()
            d.publish(range(TOTAL))

            def settled() -> bool:
                """Every message stored or dead-lettered (the dead letters read so far kept)."""
                letters.extend(d.dead_letters())
                done = {e.source for e in read_stored_events(d.db)}
                done |= {letter.source for letter in letters}
                return done >= d.sent.keys()

            first = d.cli.start(0)
            wait_until(lambda: count_stored_events(d.db) >= 4, 60, "a few events stored", first,
                       d.cli.log(0)[-2000:])
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
            at_kill = count_stored_events(d.db)
            assert at_kill < TOTAL - 1, "everything was stored before the kill"

            # The killed one's leases lapse within 10 s; its messages come again, attempt 2.
            second = d.cli.start(1, log_level="INFO")
            # Settled: stored, or dead-lettered (as every message the killed one held was,
            # by the broker's count alone, before the store counted failures).
            wait_until(settled, 90, "every message settled", second, d.cli.log(1)[-3000:])
            time.sleep(1.0)  # the last acks go out
            stop_cleanly(second, d.cli.log_path(1))
            log = d.cli.log(1)
            left = d.pull_once(d.subscription)
        finally:
            kill(first)
            kill(second)
            d.close()
        stored = sorted(d.sent[e.source] for e in read_stored_events(d.db)
                        if e.source is not None)
        # A dead letter is published, then its message acked: a kill in between publishes it
        # again on redelivery (at-least-once), so one copy per source is counted.
        dead = sorted(d.sent[letter.source] for letter in distinct(letters))
        assert dead == [POISON], f"dead-lettered: {dead} ({at_kill} stored at the kill)"
        assert stored == [i for i in range(TOTAL) if i != POISON], (at_kill, log[-3000:])
        assert not left, f"{len(left)} messages still unacked on the subscription"
        assert "fanning out again messages delivered more than" in log, log[-3000:]
